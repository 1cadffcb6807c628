"""FP8 codecs: float32 <-> (uint8 codes, float32 scales) for the e4m3 and e5m2 formats; no communication.

This module owns the numerics of every FP8 precision: the formats, the three scaling modes, the scale rule,
the special values, and the format-derived error bound. ``commbench.measure.fp8_ops`` builds collectives on top; the
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

Speed: torch's CPU e4m3 -> float32 cast is many times slower than bf16's (figures:
benchmarks/results/2026-12-01_2core-vm_gloo.md), and a scale multiply is one more pass over memory. When a C
compiler is available, the codec builds a small C kernel (``commbench/measure/kernels/fp8.c``, built by
:mod:`commbench.measure.kernel`) on first use (``cc -O3 -march=native -fopenmp``, cached under
``$XDG_CACHE_HOME/commbench`` or ``~/.cache/commbench``, loaded with ctypes; OpenMP resolves to torch's own
libgomp, and it uses ``torch.get_num_threads()`` threads above 256K elements). Encode is branch-free vectorised
round-to-nearest-even (one float add rounds to the fp8 step, integer ops on the sum give the code) and reads the
input once in the common case: tensor scaling encodes each chunk
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
from abc import ABC
from dataclasses import dataclass
from typing import TYPE_CHECKING

from commbench.measure.kernel import Fp8Kernel, NoFp8Kernel

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
# Constants of the vectorised torch path: read-only tables built once per (format, device), never scratch, so
# ops on different streams can share them. A blocking host-to-device copy has completed when it returns, so
# a table is ready on every stream once built.

_TABLES: dict[tuple[str, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

_FLT_MAX = 3.4028234663852886e38


def _scale_table(f: Fp8Format, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(bounds, lut)`` of :func:`pow2_scales` as a bucket lookup: ``lut[bucketize(amax, bounds)]`` is the scale.

    ``bounds = [0, max * 2**-126, max * 2**-125, ...]`` (every finite one; each exact in float32) and
    ``bucketize`` (``bounds[i-1] < amax <= bounds[i]``) gives bucket 0 for amax 0 (scale 1) and bucket
    ``i = k + 127`` for ``max * 2**(k-1) < amax <= max * 2**k``, which is the smallest k with
    ``amax / 2**k <= max``; bucket 1 holds everything up to ``max * 2**-126`` (k clamped to -126). The
    largest finite amax lands in the last bucket, far below the k = 127 clamp. Comparisons only: exact."""
    import torch

    key = (f.name, device)
    got = _TABLES.get(key)
    if got is None:
        bounds = [0.0] + [f.max * 2.0**k for k in range(_K_MIN, _K_MAX + 1) if f.max * 2.0**k <= _FLT_MAX]
        lut = [1.0] + [2.0 ** min(i - 127, _K_MAX) for i in range(1, len(bounds) + 1)]
        got = (
            torch.tensor(bounds, dtype=torch.float32).to(device),
            torch.tensor(lut, dtype=torch.float32).to(device),
        )
        _TABLES[key] = got
    return got


def _f32_view(b: torch.Tensor | None) -> torch.Tensor | None:
    """Scale bytes ``[k, 4 s]`` (little-endian float32 on the wire) as a float32 ``[k, s]`` view, or None where
    they are not 4-byte aligned (the packed layout when a chunk's code bytes are not a multiple of 4)."""
    import torch

    if b is None or b.dim() != 2 or b.stride(1) != 1 or b.shape[1] % 4 or b.storage_offset() % 4:
        return None
    if b.shape[0] > 1 and b.stride(0) % 4:
        return None
    return b.view(torch.float32)


def vectorised(device: torch.device) -> bool:
    """THE choice of codec path: True where the pure-torch path runs (every CUDA tensor; CPU without the C
    kernel), False where the fused C kernel does. Every function here asks this and nothing else."""
    return not _kernel.available(device)


# ----------------------------------------------------------------------------------------------------------
# Scales


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
    if not vectorised(x.device):
        _kernel.quantize(x, q, scales, f.kernel_code, sc.kernel_mode, sc.run_length(n))
        return q, scales
    if not sc.scaled:
        scales.fill_(1.0)
    # one chunk of n elements: the batched path, its scales written straight into `scales`
    _encode_rows(x.view(1, n), q.view(1, n), f, sc, scales.view(1, ns) if sc.scaled else None, None, None)
    return q, scales


def quantize_chunks(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    wire_scales: torch.Tensor | None,
    fmt: str,
    scaling: str,
    block: int = 128,
    *,
    workspace: dict[str, torch.Tensor] | None = None,
) -> None:
    """Quantise ``k`` chunks at once: ``x`` is ``[k, m]`` float32 (rows contiguous), ``codes`` ``[k, m]`` uint8
    (rows contiguous, any row stride: a wire's code slots), ``scales`` the ``[k, num_scales(m)]`` float32 home,
    ``wire_scales`` ``[k, 4 * wire_scale_count(m)]`` uint8 where the travelling scales go (None when none
    travel). Each chunk is quantised exactly as :func:`quantize` would quantise it alone.

    On the torch path (:func:`vectorised`) this is a fixed handful of device ops whatever ``k``, ``m`` and the
    block size (no per-chunk or per-block loop); where the scale bytes are float-aligned they are written in
    place and ``scales`` is left as it was. ``workspace`` is scratch the caller owns (a
    :class:`~commbench.measure.chunked.ChunkWire`'s): it keeps a zero-padded buffer when blocks do not divide ``m``."""
    import torch

    f = get_format(fmt)
    sc = get_scaling(scaling, block)
    k, m = x.shape
    if not vectorised(x.device):
        for i in range(k):
            quantize(x[i], fmt, scaling, block, out=(codes[i], scales[i]))
        if wire_scales is not None and k:
            wire_scales.copy_(scales[:, : wire_scales.shape[1] // 4].view(torch.uint8))
        return
    if m == 0 or k == 0:
        if wire_scales is not None and wire_scales.numel():  # tensor scaling of nothing: scale 1, as quantize()
            one = torch.ones(wire_scales.shape[1] // 4, dtype=torch.float32, device=x.device)
            wire_scales.copy_(one.view(torch.uint8).expand_as(wire_scales))
        return
    _encode_rows(x, codes, f, sc, None, wire_scales, workspace)


def _encode_rows(
    x: torch.Tensor,
    codes: torch.Tensor,
    f: Fp8Format,
    sc: Scaling,
    dest: torch.Tensor | None,
    wire_scales: torch.Tensor | None,
    workspace: dict[str, torch.Tensor] | None,
) -> None:
    """The vectorised encode of ``[k, m]`` rows (the path CUDA takes). Scales go to ``dest`` (float32
    ``[k, s]``) or, when None, to ``wire_scales`` (bytes; viewed as float32 where aligned).

    Dispatched ops (views not counted), whatever k, m and block: ``none`` clamp, isinf, where, cast (+1 for
    e4m3); scaled 4 for the scales (nan_to_num, an inf-norm reduction = the finite amax per block,
    bucketize, one table lookup) + 1 (e4m3: 2) for the codes (one division whose output is the fp8 cast),
    + 1 when the scales cannot be written where they go in that lookup (misaligned wire bytes, or blocks
    that do not divide m: then the lookup yields a per-element scale tensor and the block scales are copied
    out of it). No host synchronisation: nothing reads a device value back."""
    import torch

    k, m = x.shape
    cf = codes.view(f.dtype)
    nan = math.nan
    if not sc.scaled:
        # saturate finite values; clamp would make inf finite, so infinities are put back (e4m3: as NaN)
        sat = torch.clamp(x, -f.max, f.max)
        src = x if f.has_inf else torch.nan_to_num(x, nan=nan, posinf=nan, neginf=-nan)
        cf.copy_(torch.where(torch.isinf(x), src, sat))
        return
    run = sc.run_length(m)
    nb = -(-m // run)
    pad = nb * run - m
    bounds, lut = _scale_table(f, x.device)
    if pad:
        # blocks do not divide m: the finite values go into a zero-padded [k, nb, run] buffer the caller owns
        # (the pad is written once, at allocation, and never again), so one reduction covers every block
        ws = workspace if workspace is not None else {}
        key = f"fp8_pad:{k}x{nb * run}"
        tp = ws.get(key)
        if tp is None or tp.device != x.device:
            tp = ws[key] = torch.zeros(k, nb * run, dtype=torch.float32, device=x.device)
        torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0, out=tp[:, :m])
        finite = tp.view(k, nb, run)
    else:
        finite = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).view(k, nb, run)
    # max |x| over each block's finite values, then THE scale rule (pow2_scales) as a bucket lookup
    amax = torch.linalg.vector_norm(finite, ord=math.inf, dim=2)
    bucket = torch.bucketize(amax, bounds)
    # e4m3 has no inf: torch's cast saturates it to 448 (silently finite), so +-inf become +-NaN first. A NaN
    # input keeps its sign on e5m2 (CPU); on e4m3 it becomes the positive NaN (one op instead of three).
    src = x if f.has_inf else torch.nan_to_num(x, nan=nan, posinf=nan, neginf=-nan)
    out_f32 = dest if dest is not None else _f32_view(wire_scales)
    if pad:
        per_elem = torch.take(lut, bucket.unsqueeze(2).expand(k, nb, run))
        torch.div(src, per_elem.view(k, nb * run)[:, :m], out=cf)
        first = per_elem[:, :, :1]  # [k, nb, 1]: each block's scale
        if out_f32 is not None:
            out_f32.view(k, nb, 1).copy_(first)
        elif wire_scales is not None:
            wire_scales.view(k, nb, 4).copy_(first.view(torch.uint8))
        return
    if out_f32 is None:
        out_f32 = torch.take(lut, bucket)
        if wire_scales is not None:
            wire_scales.copy_(out_f32.view(torch.uint8))
    else:
        torch.take(lut, bucket, out=out_f32)
    # x / 2**k is exact (or the one rounding of a float32 subnormal), the same bits as x * 2**-k
    torch.div(src.view(k, nb, run), out_f32.unsqueeze(2), out=cf.view(k, nb, run))


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
    if not vectorised(q.device):
        _kernel.dequantize(q, scales, out, f.kernel_code, sc.run_length(n), accumulate)
        return out
    if accumulate:
        out.add_(_decode_rows(q.view(1, n), None, scales.view(1, ns), f, sc, reduce=False).view(n))
    else:
        _decode_rows(q.view(1, n), out.view(1, n), scales.view(1, ns), f, sc, reduce=False)
    return out


def dequantize_chunks(
    codes: torch.Tensor,
    scales: torch.Tensor,
    wire_scales: torch.Tensor | None,
    out: torch.Tensor,
    fmt: str,
    scaling: str,
    block: int = 128,
    *,
    reduce: bool = False,
) -> None:
    """Decode ``k`` chunks at once (``codes`` ``[k, m]``; scales read from ``wire_scales``, the bytes that
    travelled, or from the float32 home ``scales`` when None travel): into ``out`` ``[k, m]``, or with
    ``reduce`` the float32 sum of the k decoded chunks into ``out`` ``[m]``.

    The decode is vectorised over chunks and blocks; the reduction then adds the decoded ``[k, m]`` rows in
    in one reduction (:func:`sum_chunks`: deterministic, but in the device's association order)."""
    import torch

    f = get_format(fmt)
    sc = get_scaling(scaling, block)
    k, m = codes.shape
    if not vectorised(codes.device):
        if wire_scales is not None and k:
            scales[:, : wire_scales.shape[1] // 4].view(torch.uint8).copy_(wire_scales)
        for i in range(k):
            dequantize(
                codes[i], scales[i], fmt, scaling, block, out=out if reduce else out[i], accumulate=reduce and i > 0
            )
        return
    if m == 0 or k == 0:
        if reduce and k == 0:
            out.zero_()
        return
    src = _f32_view(wire_scales) if wire_scales is not None else scales
    if src is None:
        assert wire_scales is not None
        src = wire_scales  # misaligned bytes: _decode_rows copies them
    _decode_rows(codes, out, src, f, sc, reduce=reduce)


def _decode_rows(
    codes: torch.Tensor,
    out: torch.Tensor | None,
    scales: torch.Tensor,
    f: Fp8Format,
    sc: Scaling,
    reduce: bool,
) -> torch.Tensor:
    """The vectorised decode (the path CUDA takes): a direct fp8 -> float32 cast times the scale, no table.
    ``scales`` is float32 ``[k, s]``, or uint8 ``[k, 4 s]`` (misaligned wire bytes, copied in the same op
    that lays them out). Dispatched ops: cast, scale multiply, (+1 when the scale bytes are misaligned; with
    ``reduce``, +1 for the sum over chunks). torch has no fp8 x float32 promotion, so the cast is its own op."""
    import torch

    k, m = codes.shape
    cf = codes.view(f.dtype)
    if not sc.scaled:
        if reduce:
            assert out is not None
            sum_chunks(cf.to(torch.float32), out)
            return out
        if out is None:
            return cf.to(torch.float32)
        out.copy_(cf)
        return out
    run = sc.run_length(m)
    nb = -(-m // run)
    pad = nb * run - m
    if pad and not reduce and out is not None:
        # blocks do not divide m: lay each block's scale out per element (one copy, from bytes or floats),
        # then the cast and the multiply run over plain [k, m] rows
        per_elem = torch.empty(k, nb, run, dtype=torch.float32, device=codes.device)
        if scales.dtype == torch.uint8:
            per_elem.view(torch.uint8).view(k, nb, run, 4).copy_(scales.view(k, nb, 1, 4).expand(k, nb, run, 4))
        else:
            per_elem.copy_(scales.view(k, nb, 1).expand(k, nb, run))
        out.copy_(cf)
        out.mul_(per_elem.view(k, nb * run)[:, :m])
        return out
    if scales.dtype == torch.uint8:
        s = torch.empty(k, nb, dtype=torch.float32, device=codes.device)
        s.view(torch.uint8).copy_(scales)
        scales = s
    if out is not None and not reduce:
        o3 = out.view(k, nb, run)
        o3.copy_(cf.view(k, nb, run))
        o3.mul_(scales.view(k, nb, 1))
        return out
    # a temporary (the caching allocator's, so stream-safe): [k, nb, run], its pad never read out
    dec = torch.empty(k, nb * run, dtype=torch.float32, device=codes.device)
    dec[:, :m].copy_(cf)
    dec.view(k, nb, run).mul_(scales.view(k, nb, 1))
    rows = dec[:, :m]
    if not reduce:
        return rows
    assert out is not None
    sum_chunks(rows, out)
    return out


def sum_chunks(rows: torch.Tensor, out: torch.Tensor) -> None:
    """``out = rows[0] + ... + rows[k-1]`` in float32, as ONE reduction over the chunk dimension, so the op count
    of a reduce-scatter's decode does not grow with the world size (a Python loop of k adds would be k launches
    on a GPU: 1,024 at a 1,024-rank world).

    The association order is the device's reduction order (deterministic for a given shape and device: torch's
    sum uses no atomics), not the C kernel's sequential 0..k-1 order, so a sum of more than two chunks may differ
    from the CPU kernel in the last bit (and an all -0.0 sum reads +0.0). Both are within the fp32 summation term
    of :func:`error_bound` (``contributions * 2**-23 * abs_sum`` covers any order), and every rank decodes the
    same bytes with the same shape, so results stay identical across ranks."""
    import torch

    torch.sum(rows, dim=0, out=out)


# ----------------------------------------------------------------------------------------------------------
# Optional fused C kernel (commbench/kernels/fp8.c, built by commbench.measure.kernel); any failure falls back to the
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
    return f"torch ({_kernel.unavailable_reason(device)})"


def use_kernel(enabled: bool) -> None:
    """Switch the fused C kernel on or off for this process (tests compare both paths bit for bit)."""
    global _kernel
    _kernel = Fp8Kernel() if enabled else NoFp8Kernel()
