"""The FP8 numerics every fp8 path shares: the formats, the three scaling modes, THE scale rule
(:func:`pow2_scales`) and the format-derived error bound (:func:`error_bound`). Torch-free to import (the
precision registry and ``commbench list`` describe formats without tensors); :mod:`commbench.measure.fp8` is the
codec built on these and re-exports them.

Formats (OCP FP8): ``e4m3`` is torch's ``float8_e4m3fn`` (max 448, no inf, NaN code 0x7F/0xFF, 3 mantissa
bits), ``e5m2`` is ``float8_e5m2`` (max 57344, has inf, 2 mantissa bits).

Scaling modes and the scale rule (``x ~= fp8_value(q) * scale``):

- ``tensor``: one scale for the whole tensor; ``block``: one scale per run of ``block`` consecutive elements
  (the last block may be shorter); ``none``: scale 1, a plain *saturating* cast (finite values beyond the
  format's max clamp to +-max). ``none`` still returns a 1-element scale tensor ``[1.0]`` so the call shape is
  uniform, but that scale never travels: :func:`wire_scale_count` is 0 for it.
- A scale is the power of two ``2**k`` with the smallest ``k`` such that ``amax / 2**k <= max`` (amax over the
  finite values of the tensor or block), ``k`` clamped to [-126, 127]; an all-zero (or all non-finite) tensor or
  block gets scale 1, so nothing ever divides by zero. Power-of-two scales make ``x / scale`` and
  ``fp8 * scale`` exact in float32, so the codes are bit-identical to ``(x * (1/scale)).to(float8)`` and the
  decoded values to ``q.view(float8).float() * scale`` (torch's own casts); a non-power-of-two scale would add
  a second rounding and buy nothing for a floating-point format (the relative step is scale-invariant).

Special values: NaN encodes to the format's NaN and decodes to NaN. +-inf stays non-finite: e5m2 encodes it
as +-inf; e4m3 has no inf, so it becomes NaN (torch's own e4m3fn cast would saturate inf to 448 -- silently
finite -- which this codec refuses). Non-finite elements do not poison the scale of their tensor/block.

Error bound (:func:`error_bound`), used for the ``wrong`` count. Per element and per quantisation:
``|x - deq(q(x))| <= rel * |x| + floor`` with ``rel`` the format's relative step (e4m3 ``2**-3``, e5m2
``2**-2``: one full step, twice the round-to-nearest half step, so it also covers the subnormal/normal seam) and
``floor = sub * scale`` the subnormal spacing (e4m3 ``2**-9``, e5m2 ``2**-16``) times the scale. The scale is
``<= 2 * amax / max`` and every amax is ``<= A = max(abs_sum)``, so ``floor <= sub * 2 * A / max``.
A reduction of ``c`` contributions then errs by at most ``rel * abs_sum + c * floor`` plus fp32 summation
(``c * 2**-23 * abs_sum``); all_reduce quantises twice (the partial sums are re-encoded), which adds
``rel * (abs_sum + e1) + floor'`` on top of the first-stage error ``e1``. With ``none`` scaling the floor uses
scale 1 and saturated values are *not* covered: they count as wrong, which is the point of that mode.
"""

from __future__ import annotations

import math
from abc import ABC
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class Fp8Format:
    """Constants of one FP8 format."""

    name: str
    dtype_name: str
    """torch's name of the dtype (``torch.<dtype_name>``)."""
    max: float
    """Largest finite magnitude."""
    rel_step: float
    """Relative spacing of normal numbers (2**-mantissa_bits): the per-element relative error bound used."""
    sub_step: float
    """Spacing of the subnormals (the absolute error floor at scale 1)."""
    has_inf: bool
    kernel_code: int
    """The format's code in ``kernels/fp8.c``."""

    @property
    def dtype(self) -> torch.dtype:
        import torch

        dtype: torch.dtype = getattr(torch, self.dtype_name)
        return dtype


FORMATS: dict[str, Fp8Format] = {
    "e4m3": Fp8Format("e4m3", "float8_e4m3fn", 448.0, 2.0**-3, 2.0**-9, has_inf=False, kernel_code=0),
    "e5m2": Fp8Format("e5m2", "float8_e5m2", 57344.0, 2.0**-2, 2.0**-16, has_inf=True, kernel_code=1),
}

K_MIN, K_MAX = -126, 127
"""The exponent range of a scale ``2**k``."""


def get_format(fmt: str) -> Fp8Format:
    """The format named ``fmt`` or a ``ValueError`` naming the valid choices."""
    try:
        return FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown fp8 format {fmt!r}; valid choices: {', '.join(FORMATS)}") from None


# ----------------------------------------------------------------------------------------------------------
# Scaling modes: each knows how many scales it needs, which of them travel, and how to apply them.


class Scaling(ABC):
    """One scaling mode bound to its block size (the run of elements that share one scale)."""

    name: str
    scaled: bool
    """False for a plain saturating cast: scale 1, nothing travels."""
    kernel_mode: int
    """The mode's code in ``kernels/fp8.c``."""

    def __init__(self, block: int) -> None:
        self.block = block

    def num_scales(self, numel: int) -> int:
        """Length of the scale tensor :func:`quantize` returns for ``numel`` elements (one, like the other
        defaults here: the whole tensor is one run; a mode with several runs overrides them together)."""
        return 1

    def wire_scale_count(self, numel: int) -> int:
        """How many float32 scales travel with ``numel`` quantised elements."""
        return self.num_scales(numel) if self.scaled else 0

    def run_length(self, numel: int) -> int:
        """Elements sharing one scale (the kernel's ``block`` argument)."""
        return max(numel, 1)

    def rows(self, t: torch.Tensor) -> list[tuple[torch.Tensor, slice]]:
        """Views of ``t`` as 2-D row groups sharing one scale per row, with the slice of scales they use."""
        return [(t.view(1, t.numel()), slice(0, 1))]

    def floor_scale(self, fmt: str, amax: float) -> float:
        """Largest scale the mode may pick for data whose amax is ``<= amax`` (the error bound's floor)."""
        return scale_bound(fmt, amax)

    def apply(self, dst: torch.Tensor, scales: torch.Tensor) -> None:
        """``dst *= scale`` of each element's run, in place."""
        dst.mul_(scales[0])

    def describe(self) -> str:
        return "one scale per tensor"

    @property
    def option(self) -> str:
        """The canonical option text after a precision's colon ('' for the default, tensor scaling)."""
        return ""


class TensorScaling(Scaling):
    name = "tensor"
    scaled = True
    kernel_mode = 0


class BlockScaling(Scaling):
    name = "block"
    scaled = True
    kernel_mode = 1

    def __init__(self, block: int) -> None:
        if not isinstance(block, int) or isinstance(block, bool) or block <= 0:
            raise ValueError(f"fp8 block size must be a positive integer, got {block!r}")
        super().__init__(block)

    def num_scales(self, numel: int) -> int:
        return -(-numel // self.block)

    def run_length(self, numel: int) -> int:
        return self.block

    def rows(self, t: torch.Tensor) -> list[tuple[torch.Tensor, slice]]:
        n, block = t.numel(), self.block
        full = n // block
        parts: list[tuple[torch.Tensor, slice]] = []
        if full:
            parts.append((t[: full * block].view(full, block), slice(0, full)))
        if n % block:
            parts.append((t[full * block :].view(1, n - full * block), slice(full, full + 1)))
        return parts

    def apply(self, dst: torch.Tensor, scales: torch.Tensor) -> None:
        for rows, sl in self.rows(dst):
            rows.mul_(scales[sl].unsqueeze(1))

    def describe(self) -> str:
        return f"one scale per {self.block} elements"

    @property
    def option(self) -> str:
        return f"block{self.block}"


class NoScaling(Scaling):
    name = "none"
    scaled = False
    kernel_mode = 2

    def floor_scale(self, fmt: str, amax: float) -> float:
        return 1.0

    def apply(self, dst: torch.Tensor, scales: torch.Tensor) -> None:
        pass  # the scale is 1: skip a pass over memory

    def describe(self) -> str:
        return "no scaling"

    @property
    def option(self) -> str:
        return "none"


_SCALINGS: dict[str, type[Scaling]] = {c.name: c for c in (TensorScaling, BlockScaling, NoScaling)}
SCALINGS: tuple[str, ...] = tuple(_SCALINGS)


def get_scaling(scaling: str, block: int = 128) -> Scaling:
    """The scaling mode named ``scaling`` or a ``ValueError`` naming the valid choices."""
    try:
        cls = _SCALINGS[scaling]
    except (KeyError, TypeError):
        raise ValueError(f"unknown fp8 scaling {scaling!r}; valid choices: {', '.join(SCALINGS)}") from None
    return cls(block)


def num_scales(numel: int, scaling: str, block: int = 128) -> int:
    """Length of the scale tensor :func:`quantize` returns for ``numel`` elements."""
    return get_scaling(scaling, block).num_scales(numel)


def wire_scale_count(numel: int, scaling: str, block: int = 128) -> int:
    """How many float32 scales travel with ``numel`` quantised elements (0 for ``none``)."""
    return get_scaling(scaling, block).wire_scale_count(numel)


def scale_bound(fmt: str, amax: float) -> float:
    """Upper bound on any scale chosen for data whose amax is ``<= amax`` (used by the error bound)."""
    f = get_format(fmt)
    return max(2.0 * amax / f.max, 2.0**K_MIN)


def error_bound(
    fmt: str, scaling: str, abs_sum: torch.Tensor, contributions: int, quantisations: int = 1
) -> torch.Tensor:
    """Per-element bound on ``|decoded - exact|`` for a result that sums ``contributions`` quantised terms.

    ``abs_sum`` (float64) is the sum of ``|x|`` over the contributing terms of each element; ``quantisations``
    is 2 when the partial sums are re-quantised (all_reduce). The derivation is in the module docstring.
    """
    import torch

    f = get_format(fmt)
    sc = get_scaling(scaling, 128)
    abs_sum = abs_sum.to(torch.float64)
    big = float(abs_sum.max()) if abs_sum.numel() else 0.0
    if not math.isfinite(big):
        big = 0.0
    fp32 = contributions * 2.0**-23 * abs_sum
    floor1 = f.sub_step * sc.floor_scale(fmt, big)
    err = f.rel_step * abs_sum + contributions * floor1 + fp32
    for _ in range(quantisations - 1):
        # The re-encoded value is the partial sum, whose magnitude is at most abs_sum + err.
        mag = abs_sum + err
        top = float(mag.max()) if mag.numel() else 0.0
        floor2 = f.sub_step * sc.floor_scale(fmt, top if math.isfinite(top) else 0.0)
        err = err + f.rel_step * mag + floor2 + 2.0**-23 * mag
    return err


def pow2_scales(amax: torch.Tensor, f: Fp8Format) -> torch.Tensor:
    """THE scale rule of every fp8 path: power-of-two scales ``2**k``, smallest k with ``amax / 2**k <= max``,
    k clamped to [-126, 127]; 1 where amax is 0."""
    import torch

    a = amax.to(torch.float64)
    # float64 log2 of the exact ratio: powers of two come out exact, anything else is >= 2**-24 away from
    # the next integer, far above float64 rounding, so ceil() is right.
    k = torch.ceil(torch.log2(a / f.max)).clamp_(K_MIN, K_MAX)
    k = torch.where(a > 0, k, torch.zeros_like(k))
    return torch.exp2(k).to(torch.float32)
