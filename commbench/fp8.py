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
over memory. When a C compiler is available, the codec builds a small C kernel on first use (``cc -O3
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

import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "FORMATS",
    "SCALINGS",
    "Fp8Format",
    "dequantize",
    "error_bound",
    "get_format",
    "num_scales",
    "quantize",
    "scale_bound",
    "wire_scale_count",
]

SCALINGS: tuple[str, ...] = ("tensor", "block", "none")


@dataclass(frozen=True, slots=True)
class Fp8Format:
    """Constants of one FP8 format."""

    name: str
    dtype: torch.dtype
    max: float
    """Largest finite magnitude."""
    rel_step: float
    """Relative spacing of normal numbers (2**-mantissa_bits): the per-element relative error bound used."""
    sub_step: float
    """Spacing of the subnormals (the absolute error floor at scale 1)."""
    has_inf: bool


FORMATS: dict[str, Fp8Format] = {
    "e4m3": Fp8Format("e4m3", torch.float8_e4m3fn, 448.0, 2.0**-3, 2.0**-9, has_inf=False),
    "e5m2": Fp8Format("e5m2", torch.float8_e5m2, 57344.0, 2.0**-2, 2.0**-16, has_inf=True),
}

_K_MIN, _K_MAX = -126, 127


def get_format(fmt: str) -> Fp8Format:
    """The format named ``fmt`` or a ``ValueError`` naming the valid choices."""
    try:
        return FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown fp8 format {fmt!r}; valid choices: {', '.join(FORMATS)}") from None


def _check_scaling(scaling: str, block: int) -> None:
    if scaling not in SCALINGS:
        raise ValueError(f"unknown fp8 scaling {scaling!r}; valid choices: {', '.join(SCALINGS)}")
    if scaling == "block" and (not isinstance(block, int) or block <= 0):
        raise ValueError(f"fp8 block size must be a positive integer, got {block!r}")


def num_scales(numel: int, scaling: str, block: int = 128) -> int:
    """Length of the scale tensor :func:`quantize` returns for ``numel`` elements."""
    _check_scaling(scaling, block)
    if scaling == "block":
        return -(-numel // block)
    return 1


def wire_scale_count(numel: int, scaling: str, block: int = 128) -> int:
    """How many float32 scales travel with ``numel`` quantised elements (0 for ``none``)."""
    return 0 if scaling == "none" else num_scales(numel, scaling, block)


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
    f = get_format(fmt)
    _check_scaling(scaling, 128)
    abs_sum = abs_sum.to(torch.float64)
    big = float(abs_sum.max()) if abs_sum.numel() else 0.0
    if not math.isfinite(big):
        big = 0.0
    fp32 = contributions * 2.0**-23 * abs_sum
    floor1 = f.sub_step * (1.0 if scaling == "none" else scale_bound(fmt, big))
    err = f.rel_step * abs_sum + contributions * floor1 + fp32
    for _ in range(quantisations - 1):
        # The re-encoded value is the partial sum, whose magnitude is at most abs_sum + err.
        mag = abs_sum + err
        top = float(mag.max()) if mag.numel() else 0.0
        floor2 = f.sub_step * (1.0 if scaling == "none" else scale_bound(fmt, top if math.isfinite(top) else 0.0))
        err = err + f.rel_step * mag + floor2 + 2.0**-23 * mag
    return err


# ----------------------------------------------------------------------------------------------------------
# Workspaces: the pure-torch path needs float32/int32 scratch the size of the tensor; allocating it on every
# call would dominate small messages, so each thread keeps one growing buffer per kind (threads: DDP hooks).

_local = threading.local()


def _workspace(kind: str, numel: int, dtype: torch.dtype, device: torch.device, zero: bool = False) -> torch.Tensor:
    cache: dict[tuple[str, torch.device], torch.Tensor] = _local.__dict__.setdefault("ws", {})
    buf = cache.get((kind, device))
    if buf is None or buf.numel() < numel:
        buf = (torch.zeros if zero else torch.empty)(max(numel, 1024), dtype=dtype, device=device)
        cache[(kind, device)] = buf
    return buf[:numel]


_LUT_CACHE: dict[tuple[str, torch.device], torch.Tensor] = {}


def _lut(fmt: str, device: torch.device) -> torch.Tensor:
    """The 256 float32 values of the format's codes, from torch's own cast (NaN codes decode to NaN)."""
    key = (fmt, device)
    lut = _LUT_CACHE.get(key)
    if lut is None:
        codes = torch.arange(256, dtype=torch.uint8, device=device)
        lut = codes.view(FORMATS[fmt].dtype).to(torch.float32)
        _LUT_CACHE[key] = lut
    return lut


# ----------------------------------------------------------------------------------------------------------
# Scales


def _row_amax(rows: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """max |x| per row over finite values (0 when a row has none), and whether any value was non-finite."""
    # amax/amin along a dim are vectorised reductions; abs() would materialise a full-size temporary.
    # A row holds inf or NaN exactly when this max is not finite (max/min propagate NaN and reach +-inf).
    amax = torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg())
    bad = ~torch.isfinite(amax)
    if not bool(bad.any()):
        return amax, False
    # Rare: recompute those rows over finite values only, so one inf does not poison its neighbours' scale.
    sub = rows[bad]
    sub = torch.where(torch.isfinite(sub), sub.abs(), torch.zeros((), dtype=sub.dtype, device=sub.device))
    amax[bad] = sub.amax(dim=1)
    return amax, True


def _scales_from_amax(amax: torch.Tensor, f: Fp8Format) -> torch.Tensor:
    """Power-of-two scales ``2**k``, smallest k with ``amax / 2**k <= max``; 1 where amax is 0."""
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


def _rows(t: torch.Tensor, scaling: str, block: int) -> list[tuple[torch.Tensor, slice]]:
    """Views of ``t`` as 2-D row groups sharing one scale per row, with the slice of scales they use."""
    n = t.numel()
    if scaling != "block":
        return [(t.view(1, n), slice(0, 1))]
    full = n // block
    parts: list[tuple[torch.Tensor, slice]] = []
    if full:
        parts.append((t[: full * block].view(full, block), slice(0, full)))
    if n % block:
        parts.append((t[full * block :].view(1, n - full * block), slice(full, full + 1)))
    return parts


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
    f = get_format(fmt)
    _check_scaling(scaling, block)
    _check_input(x, "x", torch.float32)
    n = x.numel()
    ns = num_scales(n, scaling, block)
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
        _kernel.quantize(x, q, scales, f, scaling, block)
        return q, scales

    tmp = _workspace("f32", n, torch.float32, x.device)
    nonfinite = False
    if scaling == "none":
        scales.fill_(1.0)
        mn, mx = torch.aminmax(x)
        lo, hi = float(mn), float(mx)
        nonfinite = not (math.isfinite(lo) and math.isfinite(hi))
        if lo < -f.max or hi > f.max or nonfinite:
            # Saturate finite values (inf/NaN are fixed below, clamp would make inf finite).
            torch.clamp(x, -f.max, f.max, out=tmp)
            src = tmp
        else:
            src = x
        q.view(f.dtype).copy_(src)
    else:
        for rows, sl in _rows(x, scaling, block):
            amax, bad = _row_amax(rows)
            nonfinite = nonfinite or bad
            scales[sl].copy_(_scales_from_amax(amax, f))
        for rows, sl in _rows(x, scaling, block):
            torch.mul(rows, scales[sl].reciprocal().unsqueeze(1), out=tmp[: rows.numel()].view_as(rows))
            q[_offset(rows, x) : _offset(rows, x) + rows.numel()].view(f.dtype).copy_(tmp[: rows.numel()])
    if nonfinite:
        _fix_nonfinite(x, q, f)
    return q, scales


def _offset(view: torch.Tensor, base: torch.Tensor) -> int:
    return int(view.storage_offset()) - int(base.storage_offset())


def _fix_nonfinite(x: torch.Tensor, q: torch.Tensor, f: Fp8Format) -> None:
    """Codes of non-finite inputs: NaN -> NaN; inf -> inf (e5m2) or NaN (e4m3 has no inf)."""
    sign = torch.signbit(x).to(torch.uint8) << 7
    nan = ~torch.isfinite(x) if not f.has_inf else torch.isnan(x)
    nan_code = 0x7F
    q[nan] = nan_code | sign[nan]
    if f.has_inf:
        inf = torch.isinf(x)
        q[inf] = 0x7C | sign[inf]


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
    f = get_format(fmt)
    _check_scaling(scaling, block)
    _check_input(q, "q", torch.uint8)
    _check_input(scales, "scales", torch.float32)
    n = q.numel()
    ns = num_scales(n, scaling, block)
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
        _kernel.dequantize(q, scales, out, f, scaling, block, accumulate)
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
    if scaling == "block":
        for rows, sl in _rows(dst, scaling, block):
            rows.mul_(scales[sl].unsqueeze(1))
    elif scaling == "tensor":
        dst.mul_(scales[0])
    if accumulate:
        out.add_(dst)
    return out


# ----------------------------------------------------------------------------------------------------------
# Optional fused C kernel. Compiled on first use with the system C compiler and loaded through ctypes (which
# releases the GIL); any failure falls back to the pure-torch path above, which gives identical bits.

_C_SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <float.h>

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* fp32 -> fp8 code, round to nearest even, as straight-line integer/float ops so the loops vectorise (selects
   written as ?: on values, which gcc turns into masked blends; no table, no branch).
   Rounding: let E be the exponent field of a = |y|, raised to the format's smallest normal exponent EMIN (below
   it the fp8 step is the subnormal step). M = 2^(E - 127 + 23 - MBITS) has a float32 ulp equal to the fp8 step at
   a's magnitude, so the single float add a + M rounds a to that step, ties to even, and leaves the number of
   steps in the low bits of the sum: code = bits(a + M) - bits(M) + ((E - EMIN) << MBITS). A carry into the next
   binade comes out right because the code's exponent and mantissa fields are contiguous, as in fp32.
   FAST: valid only for |y| <= the format's max (no saturation, no inf/NaN); the loop returns max |y| as bits so
   the caller can check that and redo a chunk with the full encoder. FULL: E is also capped (EMIN + 32) so M
   cannot overflow, finite values saturate to the largest finite code, inf -> inf (e5m2) or NaN (e4m3fn),
   NaN -> NaN, the sign kept throughout. */
#define FP8_ENCODERS(FMT, MBITS, EMIN, MAXCODE, INFCODE)                                                      \
static uint32_t enc_fast_##FMT(const float* __restrict x, uint8_t* __restrict q, int64_t n, float inv) {      \
    uint32_t mx = 0;                                                                                          \
    for (int64_t i = 0; i < n; i++) {                                                                         \
        uint32_t b = f2u(x[i] * inv), a = b & 0x7FFFFFFFu;                                                   \
        mx = a > mx ? a : mx;                                                                                 \
        uint32_t e = a & 0x7F800000u;                                                                         \
        e = e < ((uint32_t)(EMIN) << 23) ? ((uint32_t)(EMIN) << 23) : e;                                      \
        uint32_t m = e + ((uint32_t)(23 - MBITS) << 23);                                                      \
        uint32_t r = f2u(u2f(a) + u2f(m)) - m + (e >> (23 - MBITS)) - ((uint32_t)(EMIN) << MBITS);           \
        q[i] = (uint8_t)(r | ((b >> 24) & 0x80u));                                                            \
    }                                                                                                         \
    return mx;                                                                                                \
}                                                                                                             \
static void enc_full_##FMT(const float* __restrict x, uint8_t* __restrict q, int64_t n, float inv) {          \
    for (int64_t i = 0; i < n; i++) {                                                                         \
        uint32_t b = f2u(x[i] * inv), a = b & 0x7FFFFFFFu;                                                   \
        uint32_t e = a & 0x7F800000u;                                                                         \
        e = e < ((uint32_t)(EMIN) << 23) ? ((uint32_t)(EMIN) << 23) : e;                                      \
        e = e > ((uint32_t)(EMIN + 32) << 23) ? ((uint32_t)(EMIN + 32) << 23) : e;                            \
        uint32_t m = e + ((uint32_t)(23 - MBITS) << 23);                                                      \
        uint32_t r = f2u(u2f(a) + u2f(m)) - m + (e >> (23 - MBITS)) - ((uint32_t)(EMIN) << MBITS);           \
        r = r > (MAXCODE) ? (MAXCODE) : r;                                                                    \
        r = a > 0x7F800000u ? 0x7Fu : r;                                                                      \
        r = a == 0x7F800000u ? (INFCODE) : r;                                                                 \
        q[i] = (uint8_t)(r | ((b >> 24) & 0x80u));                                                            \
    }                                                                                                         \
}
FP8_ENCODERS(e4m3, 3, 121, 0x7Eu, 0x7Fu)
FP8_ENCODERS(e5m2, 2, 113, 0x7Bu, 0x7Cu)

/* Bits of each format's max and half its max (positive floats order like their bit patterns). */
static const uint32_t MAXBITS[2] = {0x43E00000u, 0x47600000u};   /* 448, 57344 */
static const uint32_t HALFBITS[2] = {0x43600000u, 0x46E00000u};  /* 224, 28672 */

static inline uint32_t enc_fast(const float* x, uint8_t* q, int64_t n, float inv, int fmt) {
    return fmt == 0 ? enc_fast_e4m3(x, q, n, inv) : enc_fast_e5m2(x, q, n, inv);
}
static inline void enc_full(const float* x, uint8_t* q, int64_t n, float inv, int fmt) {
    if (fmt == 0) enc_full_e4m3(x, q, n, inv); else enc_full_e5m2(x, q, n, inv);
}
/* Any chunk: the fast encoder, redone with the full one when some |y| is beyond max (or not finite). */
static inline void enc_checked(const float* x, uint8_t* q, int64_t n, float inv, int fmt) {
    if (enc_fast(x, q, n, inv, fmt) > MAXBITS[fmt]) enc_full(x, q, n, inv, fmt);
}

/* max |x| over finite values; *nonfinite set when any element is inf or NaN. The magnitudes' bit patterns
   order like the values (and inf/NaN sort above every finite one), so an integer max vectorises. */
static float amax_range(const float* x, int64_t n, int* nonfinite) {
    const uint32_t* u = (const uint32_t*)x;
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = u[i] & 0x7FFFFFFFu;
        m = a > m ? a : m;
    }
    if (m < 0x7F800000u) return u2f(m);
    *nonfinite = 1;
    m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = u[i] & 0x7FFFFFFFu;
        a = a < 0x7F800000u ? a : 0u;
        m = a > m ? a : m;
    }
    return u2f(m);
}

/* Power-of-two scale exponent: smallest k with amax / 2^k <= fmax, clamped to [-126, 127]; 0 for amax 0.
   fmax = 1.75 * 2^emax for both formats, so with amax = m * 2^e (1 <= m < 2): k = e - emax, plus 1 when
   m > 1.75 (mantissa bits above 0x600000). Subnormal amax is below 2^-126 * fmax: clamped to -126. */
static inline int scale_exp(float amax, int emax) {
    uint32_t b = f2u(amax);
    if (b == 0) return 0;
    int e = (int)(b >> 23) - 127;
    if (e == -127) return -126;
    int k = e - emax + ((b & 0x7FFFFFu) > 0x600000u ? 1 : 0);
    return k < -126 ? -126 : (k > 127 ? 127 : k);
}

static inline float pow2(int k) { return u2f((uint32_t)(k + 127) << 23); }  /* -126 <= k <= 127 */

#define CHUNK 16384  /* elements (64 KiB of input): stays in L2 for a re-encode */

/* Tensor scaling over x[lo, hi), one pass in the common case: each chunk is encoded with the scale of the
   running amax, the encoder's max |y| says whether the chunk fits (|y| <= max); only when it does not is the
   chunk's amax taken and the chunk re-encoded (from cache) with the raised scale. Chunks encoded before the
   scale last changed are stale: [lo, *stale_end) is re-encoded once the final scale is known. While the
   running amax is 0 the scale is not monotone yet (amax 0 -> scale 1), so those chunks take the amax first. */
static float tensor_pass(const float* x, uint8_t* q, int64_t lo, int64_t hi, int fmt, int emax, int* nonfinite,
                         int64_t* stale_end) {
    float m = 0.0f;
    int k = 0;
    *stale_end = lo;
    for (int64_t c = lo; c < hi; c += CHUNK) {
        int64_t len = hi - c < CHUNK ? hi - c : CHUNK;
        if (m > 0.0f && enc_fast(x + c, q + c, len, pow2(-k), fmt) <= MAXBITS[fmt]) continue;
        int nf = 0;
        float a = amax_range(x + c, len, &nf);
        *nonfinite |= nf;
        if (a > m) {
            m = a;
            int nk = scale_exp(m, emax);
            if (nk != k) { k = nk; *stale_end = c; }
        }
        if (nf) enc_full(x + c, q + c, len, pow2(-k), fmt);
        else enc_fast(x + c, q + c, len, pow2(-k), fmt);
    }
    return m;
}

/* Block scaling over blocks [b0, b1): each block is first encoded with the previous block's scale; the
   encoder's max |y| tells whether that is also this block's scale (max/2 < max|y| <= max, or the smallest
   scale). Otherwise the block is re-encoded (it is in L1 by then) with its own scale, computed from that max
   |y| when it says the block is finite and is a normal float (then it is exactly amax * 2^-k), else from the
   block's amax. */
static int block_pass(const float* x, uint8_t* q, float* scales, int64_t n, int64_t block, int64_t b0, int64_t b1,
                      int fmt, int emax) {
    int nonfinite = 0, k = 0, have = 0;
    for (int64_t b = b0; b < b1; b++) {
        int64_t s = b * block;
        int64_t len = n - s < block ? n - s : block;
        if (have) {
            uint32_t mx = enc_fast(x + s, q + s, len, pow2(-k), fmt);
            if (mx <= MAXBITS[fmt] && (mx > HALFBITS[fmt] || (k == -126 && mx != 0))) {
                scales[b] = pow2(k);
                continue;
            }
            if (mx >= 0x00800000u && mx < 0x7F800000u) {
                /* All finite and the largest |y| a normal float, so exactly the block's amax times 2^-k. */
                k = scale_exp(u2f(mx) * pow2(k), emax);
                scales[b] = pow2(k);
                enc_fast(x + s, q + s, len, pow2(-k), fmt);
                continue;
            }
        }
        int nf = 0;
        k = scale_exp(amax_range(x + s, len, &nf), emax);
        have = 1;
        nonfinite |= nf;
        scales[b] = pow2(k);
        if (nf) enc_full(x + s, q + s, len, pow2(-k), fmt);
        else enc_fast(x + s, q + s, len, pow2(-k), fmt);
    }
    return nonfinite;
}

#define MAX_THREADS 256

/* mode 0 tensor, 1 block, 2 none. Returns 1 when any input was non-finite. */
int cb_fp8_quantize(const float* x, uint8_t* q, float* scales, int64_t n, int64_t block, int fmt, int mode,
                    int nthreads) {
    int emax = fmt == 0 ? 8 : 15;
    int nonfinite = 0;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    if (mode == 2) {
        scales[0] = 1.0f;
        #pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t c = 0; c < n; c += CHUNK) {
            int64_t len = n - c < CHUNK ? n - c : CHUNK;
            enc_checked(x + c, q + c, len, 1.0f, fmt);
        }
        return 0;
    }
    if (mode == 1) {
        int64_t nb = (n + block - 1) / block;
        int64_t nt = nthreads < nb ? nthreads : nb;
        #pragma omp parallel for num_threads(nthreads) schedule(static) reduction(|:nonfinite)
        for (int64_t t = 0; t < nt; t++)
            nonfinite |= block_pass(x, q, scales, n, block, nb * t / nt, nb * (t + 1) / nt, fmt, emax);
        return nonfinite;
    }
    /* Tensor: each thread runs the one-pass scheme on its own range (whole chunks), then the final scale
       (from the overall amax) is known and every thread re-encodes what it encoded with another one. */
    int64_t nch = (n + CHUNK - 1) / CHUNK;
    int64_t nt = nthreads < nch ? nthreads : nch;
    float tm[MAX_THREADS];
    int64_t stale[MAX_THREADS];
    int tnf[MAX_THREADS];
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < nt; t++) {
        int64_t lo = nch * t / nt * CHUNK, hi = nch * (t + 1) / nt * CHUNK;
        hi = hi < n ? hi : n;
        tnf[t] = 0;
        tm[t] = tensor_pass(x, q, lo, hi, fmt, emax, &tnf[t], &stale[t]);
    }
    float m = 0.0f;
    for (int64_t t = 0; t < nt; t++) {
        m = tm[t] > m ? tm[t] : m;
        nonfinite |= tnf[t];
    }
    int k = scale_exp(m, emax);
    scales[0] = pow2(k);
    float inv = pow2(-k);
    int redo = 0;
    for (int64_t t = 0; t < nt; t++) {
        int64_t lo = nch * t / nt * CHUNK;
        if (scale_exp(tm[t], emax) != k) stale[t] = n;  /* this thread's range is all stale */
        redo |= stale[t] > lo;
    }
    if (!redo) return nonfinite;
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < nt; t++) {
        int64_t lo = nch * t / nt * CHUNK, hi = nch * (t + 1) / nt * CHUNK;
        hi = hi < n ? hi : n;
        int64_t end = stale[t] < hi ? stale[t] : hi;
        for (int64_t c = lo; c < end; c += CHUNK) {
            int64_t len = end - c < CHUNK ? end - c : CHUNK;
            if (tnf[t]) enc_full(x + c, q + c, len, inv, fmt);
            else enc_fast(x + c, q + c, len, inv, fmt);
        }
    }
    return nonfinite;
}

/* fp8 code -> float32 by bit arithmetic (vectorises; a table gather does not): normals re-bias the exponent,
   subnormals are mantissa * step, specials map to inf/NaN. */
static inline float dec_e4m3(uint32_t c) {
    uint32_t sign = (c & 0x80u) << 24, mag = c & 0x7Fu;
    uint32_t nb = (mag << 20) + ((uint32_t)(127 - 7) << 23);
    uint32_t sb = f2u((float)(int)(mag & 7u) * 0x1p-9f);
    uint32_t sub = 0u - (uint32_t)(mag < 8u);
    uint32_t r = (sb & sub) | (nb & ~sub);
    uint32_t nan = 0u - (uint32_t)(mag == 0x7Fu);
    r = (r & ~nan) | (0x7FC00000u & nan);
    return u2f(r | sign);
}

static inline float dec_e5m2(uint32_t c) {
    uint32_t sign = (c & 0x80u) << 24, mag = c & 0x7Fu;
    uint32_t nb = (mag << 21) + ((uint32_t)(127 - 15) << 23);
    uint32_t sb = f2u((float)(int)(mag & 3u) * 0x1p-16f);
    uint32_t sub = 0u - (uint32_t)(mag < 4u);
    uint32_t r = (sb & sub) | (nb & ~sub);
    uint32_t spec = 0u - (uint32_t)(mag >= 0x7Cu);
    r = (r & ~spec) | ((0x7F800000u | ((mag & 3u) << 21)) & spec);
    return u2f(r | sign);
}

static void decode_range(const uint8_t* __restrict q, float* __restrict o, int64_t n, float sc, int fmt, int acc) {
    if (fmt == 0) {
        if (acc) for (int64_t i = 0; i < n; i++) o[i] += dec_e4m3(q[i]) * sc;
        else for (int64_t i = 0; i < n; i++) o[i] = dec_e4m3(q[i]) * sc;
    } else {
        if (acc) for (int64_t i = 0; i < n; i++) o[i] += dec_e5m2(q[i]) * sc;
        else for (int64_t i = 0; i < n; i++) o[i] = dec_e5m2(q[i]) * sc;
    }
}

/* out[i] (+)= fp8(q[i]) * scale of i's block (block = n for one scale). */
void cb_fp8_dequantize(const uint8_t* q, const float* scales, float* out, int64_t n, int64_t block, int fmt,
                       int accumulate, int nthreads) {
    int64_t nb = (n + block - 1) / block;
    if (nb == 1) {
        float sc = scales[0];
        #pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t c = 0; c < n; c += 65536) {
            int64_t len = n - c < 65536 ? n - c : 65536;
            decode_range(q + c, out + c, len, sc, fmt, accumulate);
        }
        return;
    }
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t s = b * block;
        int64_t len = n - s < block ? n - s : block;
        decode_range(q + s, out + s, len, scales[b], fmt, accumulate);
    }
}
"""


class _NoKernel:
    """Stand-in when the C kernel is disabled or could not be built."""

    error: str | None = "disabled"

    def available(self, device: torch.device) -> bool:
        return False

    def quantize(
        self, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, f: Fp8Format, scaling: str, block: int
    ) -> None:
        raise RuntimeError("fp8 kernel unavailable")

    def dequantize(
        self,
        q: torch.Tensor,
        scales: torch.Tensor,
        out: torch.Tensor,
        f: Fp8Format,
        scaling: str,
        block: int,
        accumulate: bool,
    ) -> None:
        raise RuntimeError("fp8 kernel unavailable")


_PARALLEL_MIN = 1 << 18
"""Elements below which the kernel stays on the calling thread: waking an OpenMP team costs more than it saves
(and on a loaded machine can cost a scheduler tick)."""


def _threads(n: int) -> int:
    return torch.get_num_threads() if n >= _PARALLEL_MIN else 1


def _cpu_signature() -> str:
    """What -march=native depends on (model and flags; not the ever-changing MHz line)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.machine()
    keep = [
        ln
        for ln in text.split("\n\n")[0].splitlines()
        if ln.split(":")[0].strip() in ("model name", "flags", "Features")
    ]
    return platform.machine() + "\n".join(keep)


class _CKernel(_NoKernel):
    """ctypes binding of :data:`_C_SOURCE`; built lazily, CPU tensors only."""

    _MODES = {"tensor": 0, "block": 1, "none": 2}

    def __init__(self) -> None:
        self._lib: ctypes.CDLL | None = None
        self._tried = False
        self.error = None

    def _load(self) -> ctypes.CDLL | None:
        self._tried = True
        if os.environ.get("COMMBENCH_FP8_KERNEL", "1") == "0":
            self.error = "disabled by COMMBENCH_FP8_KERNEL=0"
            return None
        cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
        if cc is None:
            self.error = "no C compiler found"
            return None
        flags = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-fast-math", "-ffp-contract=off"]
        key = hashlib.sha256("\0".join([_C_SOURCE, cc, *flags, _cpu_signature()]).encode()).hexdigest()[:16]
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "commbench"
        so = cache / f"fp8_{key}.so"
        try:
            if not so.exists():
                cache.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory() as tmp:
                    src = Path(tmp) / "fp8.c"
                    src.write_text(_C_SOURCE)
                    built = Path(tmp) / "fp8.so"
                    cmd = [cc, *flags, str(src), "-o", str(built), "-lm"]
                    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
                    # Atomic publish: concurrent ranks may build at the same time.
                    part = cache / f".{so.name}.{os.getpid()}"
                    shutil.copyfile(built, part)
                    os.replace(part, so)
            lib = ctypes.CDLL(str(so))
        except (OSError, subprocess.SubprocessError) as e:
            self.error = f"could not build the fp8 kernel: {e}"
            return None
        i64, ptr, cint = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        lib.cb_fp8_quantize.argtypes = [ptr, ptr, ptr, i64, i64, cint, cint, cint]
        lib.cb_fp8_quantize.restype = cint
        lib.cb_fp8_dequantize.argtypes = [ptr, ptr, ptr, i64, i64, cint, cint, cint]
        lib.cb_fp8_dequantize.restype = None
        return lib

    def available(self, device: torch.device) -> bool:
        if device.type != "cpu":
            return False
        if not self._tried:
            self._lib = self._load()
        return self._lib is not None

    def quantize(
        self, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, f: Fp8Format, scaling: str, block: int
    ) -> None:
        assert self._lib is not None  # callers check available() first
        n = x.numel()
        self._lib.cb_fp8_quantize(
            x.data_ptr(),
            q.data_ptr(),
            scales.data_ptr(),
            n,
            block if scaling == "block" else max(n, 1),
            0 if f.name == "e4m3" else 1,
            self._MODES[scaling],
            _threads(n),
        )

    def dequantize(
        self,
        q: torch.Tensor,
        scales: torch.Tensor,
        out: torch.Tensor,
        f: Fp8Format,
        scaling: str,
        block: int,
        accumulate: bool,
    ) -> None:
        assert self._lib is not None
        n = q.numel()
        self._lib.cb_fp8_dequantize(
            q.data_ptr(),
            scales.data_ptr(),
            out.data_ptr(),
            n,
            block if scaling == "block" else max(n, 1),
            0 if f.name == "e4m3" else 1,
            int(accumulate),
            _threads(n),
        )


_kernel: _NoKernel = _CKernel()


def kernel_status() -> str:
    """Which codec path runs on CPU: ``"c"`` (fused kernel) or ``"torch (<reason>)"``."""
    if _kernel.available(torch.device("cpu")):
        return "c"
    return f"torch ({_kernel.error})"


def use_kernel(enabled: bool) -> None:
    """Switch the fused C kernel on or off for this process (tests compare both paths bit for bit)."""
    global _kernel
    _kernel = _CKernel() if enabled else _NoKernel()
