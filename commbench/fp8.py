"""FP8 codecs: float32 <-> (uint8 codes, float32 scales) for the e4m3 and e5m2 formats; no communication.

This module owns the numerics of every FP8 precision: the formats, the three scaling modes, the scale rule,
the special values, and the format-derived error bound. ``commbench.fp8_ops`` builds collectives on top; the
training helpers use :func:`quantize` / :func:`dequantize` for an fp8 DDP comm hook, so both are stable API.

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

Speed: torch's CPU e4m3 -> float32 cast is about 20x slower than bf16's, and a scale multiply is one more pass
over memory. When a C compiler is available, the codec builds a small C kernel (``commbench/kernels/fp8.c``, built by
:mod:`commbench.kernel`) on first use (``cc -O3
-march=native -fopenmp``, cached under ``$XDG_CACHE_HOME/commbench`` or ``~/.cache/commbench``, loaded with
ctypes; OpenMP resolves to torch's own libgomp, and it uses ``torch.get_num_threads()`` threads above 256K
elements). Encode is branch-free vectorised round-to-nearest-even (one float add rounds to the fp8 step, integer
ops on the sum give the code) and reads the input once in the common case: tensor scaling encodes each chunk
with the running amax's scale and redoes a chunk (from cache) only when it raises the scale, plus any earlier
chunks at the end; block scaling encodes each block with the previous block's scale and redoes it only when the
encoder's max |y| shows the block needs another one. Decode rebuilds the float32 bits arithmetically and
multiplies by the scale in the same pass (``accumulate=True`` adds instead, which the reduce-scatter uses to sum
in fp32 without a temporary). If the build fails, or with
``COMMBENCH_FP8_KERNEL=0``, the pure-torch path runs; :func:`kernel_status` says which. Both paths are tested
bit-exact against torch's casts (and against each other on random bit patterns).
"""

from __future__ import annotations

import math
import threading
from abc import ABC
from dataclasses import dataclass
from typing import TYPE_CHECKING

from commbench.kernel import Fp8Kernel, NoFp8Kernel

if TYPE_CHECKING:
    import torch

# torch is imported by the functions that handle tensors: the formats and scaling modes (what the precision
# registry and `commbench list` describe) need none.

__all__ = [
    "FORMATS",
    "SCALINGS",
    "Scaling",
    "get_scaling",
    "pow2_scales",
    "Fp8Format",
    "dequantize",
    "error_bound",
    "codec_info",
    "get_format",
    "num_scales",
    "quantize",
    "scale_bound",
    "wire_scale_count",
]


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

_K_MIN, _K_MAX = -126, 127


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
    return max(2.0 * amax / f.max, 2.0**_K_MIN)


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


# ----------------------------------------------------------------------------------------------------------
# Workspaces: the pure-torch path needs float32/int32 scratch the size of the tensor; allocating it on every
# call would dominate small messages, so each thread keeps one growing buffer per kind (threads: DDP hooks).

_local = threading.local()


def _workspace(kind: str, numel: int, dtype: torch.dtype, device: torch.device, zero: bool = False) -> torch.Tensor:
    import torch

    cache: dict[tuple[str, torch.device], torch.Tensor] = _local.__dict__.setdefault("ws", {})
    buf = cache.get((kind, device))
    if buf is None or buf.numel() < numel:
        buf = (torch.zeros if zero else torch.empty)(max(numel, 1024), dtype=dtype, device=device)
        cache[(kind, device)] = buf
    return buf[:numel]


_LUT_CACHE: dict[tuple[str, torch.device], torch.Tensor] = {}


def _lut(fmt: str, device: torch.device) -> torch.Tensor:
    """The 256 float32 values of the format's codes, from torch's own cast (NaN codes decode to NaN)."""
    import torch

    key = (fmt, device)
    lut = _LUT_CACHE.get(key)
    if lut is None:
        codes = torch.arange(256, dtype=torch.uint8, device=device)
        lut = codes.view(FORMATS[fmt].dtype).to(torch.float32)
        _LUT_CACHE[key] = lut
    return lut


# ----------------------------------------------------------------------------------------------------------
# Scales


def _row_amax(rows: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """max |x| per row over the finite values (0 when a row has none).

    Non-finite values are zeroed into ``scratch`` first, unconditionally: testing whether any exist would read
    a flag back to the host, a device synchronisation inside the timed encode on a GPU."""
    import torch

    clean = scratch.view_as(rows)
    torch.nan_to_num(rows, nan=0.0, posinf=0.0, neginf=0.0, out=clean)
    # amax/amin along a dim are vectorised reductions; abs() would materialise another full-size temporary.
    return torch.maximum(clean.amax(dim=1), clean.amin(dim=1).neg())


def _inf_to_nan(t: torch.Tensor, scratch: torch.Tensor) -> None:
    """``t``'s infinities become NaN of the same sign, in place, finite values and NaNs unchanged, without
    a data-dependent branch: ``t - t`` is 0 for finite values and NaN otherwise, ``copysign`` keeps the sign.
    (e4m3 has no inf, and torch's e4m3fn cast would saturate inf to 448: silently finite.)"""
    import torch

    torch.sub(t, t, out=scratch)
    scratch.add_(t)
    torch.copysign(scratch, t, out=t)


def pow2_scales(amax: torch.Tensor, f: Fp8Format) -> torch.Tensor:
    """THE scale rule of every fp8 path: power-of-two scales ``2**k``, smallest k with ``amax / 2**k <= max``,
    k clamped to [-126, 127]; 1 where amax is 0."""
    import torch

    a = amax.to(torch.float64)
    # float64 log2 of the exact ratio: powers of two come out exact, anything else is >= 2**-24 away from
    # the next integer, far above float64 rounding, so ceil() is right.
    k = torch.ceil(torch.log2(a / f.max)).clamp_(_K_MIN, _K_MAX)
    k = torch.where(a > 0, k, torch.zeros_like(k))
    return torch.exp2(k).to(torch.float32)


# ----------------------------------------------------------------------------------------------------------
# Public codec


def _check_input(x: torch.Tensor, name: str, dtype: torch.dtype) -> None:
    if x.dtype != dtype or x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"{name} must be a contiguous 1-D {dtype} tensor, got {x.dtype} with shape {tuple(x.shape)}")


def quantize(
    x: torch.Tensor,
    fmt: str,
    scaling: str,
    block: int = 128,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a contiguous 1-D float32 tensor to fp8 codes (uint8, same numel) and float32 scales.

    ``out=(q, scales)`` writes into preallocated tensors (``q``: uint8 with ``x.numel()`` elements, may be a
    slice of a wire buffer; ``scales``: float32 with :func:`num_scales` elements) and returns them.
    """
    import torch

    f = get_format(fmt)
    sc = get_scaling(scaling, block)
    _check_input(x, "x", torch.float32)
    n = x.numel()
    ns = sc.num_scales(n)
    if out is None:
        q = torch.empty(n, dtype=torch.uint8, device=x.device)
        scales = torch.empty(ns, dtype=torch.float32, device=x.device)
    else:
        q, scales = out
        _check_input(q, "out[0]", torch.uint8)
        _check_input(scales, "out[1]", torch.float32)
        if q.numel() != n or scales.numel() != ns:
            raise ValueError(f"out tensors must have {n} codes and {ns} scales, got {q.numel()} and {scales.numel()}")
    if n == 0:
        scales.fill_(1.0)
        return q, scales
    if _kernel.available(x.device):
        _kernel.quantize(x, q, scales, f.kernel_code, sc.kernel_mode, sc.run_length(n))
        return q, scales

    # No host synchronisation below (no data-dependent branch): on a GPU this runs inside timed phases.
    tmp = _workspace("f32", n, torch.float32, x.device)
    spare = _workspace("f32b", n, torch.float32, x.device)
    if not sc.scaled:
        scales.fill_(1.0)
        # Saturate finite values; clamp would make inf finite, so infinities are put back.
        torch.clamp(x, -f.max, f.max, out=tmp)
        torch.where(torch.isinf(x), x, tmp, out=tmp)
    else:
        for rows, sl in sc.rows(x):
            scales[sl].copy_(pow2_scales(_row_amax(rows, spare[: rows.numel()]), f))
        for rows, sl in sc.rows(x):
            off = _offset(rows, x)
            torch.mul(rows, scales[sl].reciprocal().unsqueeze(1), out=tmp[off : off + rows.numel()].view_as(rows))
    if not f.has_inf:
        _inf_to_nan(tmp, spare)
    # NaN (either sign) casts to the format's NaN code with its sign; e5m2 keeps +-inf as +-inf.
    q.view(f.dtype).copy_(tmp)
    return q, scales


def _offset(view: torch.Tensor, base: torch.Tensor) -> int:
    return int(view.storage_offset()) - int(base.storage_offset())


def dequantize(
    q: torch.Tensor,
    scales: torch.Tensor,
    fmt: str,
    scaling: str,
    block: int = 128,
    *,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
) -> torch.Tensor:
    """Decode fp8 codes: ``out = fp8_value(q) * scale`` per tensor or per block (float32, ``q.numel()``).

    With ``accumulate=True`` the decoded values are *added* to ``out`` (float32 sum of several sources, as the
    reduce-scatter needs) instead of overwriting it.
    """
    import torch

    f = get_format(fmt)
    sc = get_scaling(scaling, block)
    _check_input(q, "q", torch.uint8)
    _check_input(scales, "scales", torch.float32)
    n = q.numel()
    ns = sc.num_scales(n)
    if scales.numel() != ns:
        raise ValueError(f"{scaling} scaling of {n} codes needs {ns} scales, got {scales.numel()}")
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs an out tensor to add into")
        out = torch.empty(n, dtype=torch.float32, device=q.device)
    else:
        _check_input(out, "out", torch.float32)
        if out.numel() != n:
            raise ValueError(f"out must have {n} elements, got {out.numel()}")
    if n == 0:
        return out
    if _kernel.available(q.device):
        _kernel.dequantize(q, scales, out, f.kernel_code, sc.run_length(n), accumulate)
        return out

    dst = _workspace("f32dec", n, torch.float32, q.device) if accumulate else out
    if f.has_inf:
        # e5m2 -> float32 is a vectorised cast in torch; e4m3's is not (about 20x slower), hence the table.
        dst.copy_(q.view(f.dtype))
    else:
        idx = _workspace("idx", n, torch.int32, q.device, zero=True)
        # Writing only the low byte of each (zero-initialised, never otherwise written) int32 turns the codes
        # into table indices without torch's slow uint8 -> int32 conversion.
        idx.view(torch.uint8)[0::4].copy_(q)
        torch.index_select(_lut(fmt, q.device), 0, idx, out=dst)
    sc.apply(dst, scales)
    if accumulate:
        out.add_(dst)
    return out


# ----------------------------------------------------------------------------------------------------------
# Optional fused C kernel (commbench/kernels/fp8.c, built by commbench.kernel); any failure falls back to the
# pure-torch path above, which gives identical bits.

_kernel: NoFp8Kernel = Fp8Kernel()


def kernel_status() -> str:
    """Which codec path runs on CPU: ``"c"`` (fused kernel) or ``"torch (<reason>)"``."""
    import torch

    if _kernel.available(torch.device("cpu")):
        return "c"
    return f"torch ({_kernel.error})"


def codec_info(device: torch.device) -> str:
    """Which fp8 codec runs on ``device``, for the run's metadata: ``kernel (<compiler and version>)`` or
    ``torch (<why not the kernel>)``. The two differ several-fold in encode/decode time, so crossovers depend
    on it."""
    if _kernel.available(device):
        return f"kernel ({_kernel.compiler or 'compiler unknown'})"
    reason = _kernel.error if device.type == "cpu" else f"the C kernel is CPU-only, this is {device.type}"
    return f"torch ({reason})"


def use_kernel(enabled: bool) -> None:
    """Switch the fused C kernel on or off for this process (tests compare both paths bit for bit)."""
    global _kernel
    _kernel = Fp8Kernel() if enabled else NoFp8Kernel()
