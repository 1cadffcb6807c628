"""The eager (pure-torch, vectorised) fp8 codec of ``[k, m]`` chunk rows: the path CUDA tensors take when the
fused one (:mod:`commbench.measure.fused`) is unavailable, and CPU without the C kernel. A fixed handful of device
ops whatever ``k``, ``m`` and the block size; its bits are the reference the fused and C paths are tested against.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from commbench.measure.fp8_format import K_MAX, K_MIN

if TYPE_CHECKING:
    import torch

    from commbench.measure.fp8_format import Fp8Format, Scaling

# Constants of the vectorised torch path: read-only tables built once per (format, device), never scratch, so
# ops on different streams can share them. A blocking host-to-device copy has completed when it returns, so
# a table is ready on every stream once built.

TABLES: dict[tuple[str, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

_FLT_MAX = 3.4028234663852886e38


def scale_table(f: Fp8Format, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(bounds, lut)`` of :func:`pow2_scales` as a bucket lookup: ``lut[bucketize(amax, bounds)]`` is the scale.

    ``bounds = [0, max * 2**-126, max * 2**-125, ...]`` (every finite one; each exact in float32) and
    ``bucketize`` (``bounds[i-1] < amax <= bounds[i]``) gives bucket 0 for amax 0 (scale 1) and bucket
    ``i = k + 127`` for ``max * 2**(k-1) < amax <= max * 2**k``, which is the smallest k with
    ``amax / 2**k <= max``; bucket 1 holds everything up to ``max * 2**-126`` (k clamped to -126). The
    largest finite amax lands in the last bucket, far below the k = 127 clamp. Comparisons only: exact."""
    import torch

    key = (f.name, device)
    got = TABLES.get(key)
    if got is None:
        bounds = [0.0] + [f.max * 2.0**k for k in range(K_MIN, K_MAX + 1) if f.max * 2.0**k <= _FLT_MAX]
        lut = [1.0] + [2.0 ** min(i - 127, K_MAX) for i in range(1, len(bounds) + 1)]
        got = (
            torch.tensor(bounds, dtype=torch.float32).to(device),
            torch.tensor(lut, dtype=torch.float32).to(device),
        )
        TABLES[key] = got
    return got


def f32_view(b: torch.Tensor | None) -> torch.Tensor | None:
    """Scale bytes ``[k, 4 s]`` (little-endian float32 on the wire) as a float32 ``[k, s]`` view, or None where
    they are not 4-byte aligned (the packed layout when a chunk's code bytes are not a multiple of 4)."""
    import torch

    if b is None or b.dim() != 2 or b.stride(1) != 1 or b.shape[1] % 4 or b.storage_offset() % 4:
        return None
    if b.shape[0] > 1 and b.stride(0) % 4:
        return None
    return b.view(torch.float32)


def encode_rows(
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
    bounds, lut = scale_table(f, x.device)
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
    out_f32 = dest if dest is not None else f32_view(wire_scales)
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


def decode_rows(
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
