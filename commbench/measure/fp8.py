"""FP8 codecs: float32 <-> (uint8 codes, float32 scales) for the e4m3 and e5m2 formats; no communication.

This module is the codec's public API (:func:`quantize` / :func:`dequantize` and their ``_chunks`` forms, used by
``commbench.measure.fp8_ops`` and the training helpers' fp8 DDP comm hook, so stable) and THE choice of the path
that runs them. The numerics every path shares (formats, scaling modes, the scale rule, special values, the
error bound) are :mod:`commbench.measure.fp8_format`, re-exported here; the paths are

- the fused C kernel on CPU (below), when a C compiler is available;
- the fused compiled graphs (:mod:`commbench.measure.fused`: ``torch.compile``, Triton on CUDA), on CUDA, and on
  CPU without the C kernel where inductor's C++ compiler is;
- the eager vectorised torch path (:mod:`commbench.measure.fp8_eager`) everywhere else, and as the fallback
  when compiling fails.

All three give the same bits (tested on CPU: C kernel, inductor and eager against each other and against
torch's casts).

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

import os
from typing import TYPE_CHECKING

from commbench.measure import fp8_eager, fused
from commbench.measure.fp8_eager import sum_chunks
from commbench.measure.fp8_format import (
    FORMATS,
    SCALINGS,
    Fp8Format,
    Scaling,
    error_bound,
    get_format,
    get_scaling,
    num_scales,
    pow2_scales,
    scale_bound,
    wire_scale_count,
)
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
    "dequantize_chunks",
    "error_bound",
    "codec_info",
    "get_format",
    "num_scales",
    "quantize",
    "quantize_chunks",
    "scale_bound",
    "sum_chunks",
    "wire_scale_count",
]


def fused_on(device: torch.device) -> bool:
    """Whether the vectorised calls on ``device`` run the fused compiled graphs (:mod:`commbench.measure.fused`):
    on CUDA unless ``COMMBENCH_FP8_FUSED=0`` or compiling is unavailable or failed; on CPU only when asked for
    (``COMMBENCH_FP8_FUSED=1`` or :func:`use_fused`), as the C kernel is the CPU's fused codec."""
    want = _fused_wanted if _fused_wanted is not None else os.environ.get(fused.ENV, "auto")
    if want in ("0", False) or (want not in ("1", True) and device.type == "cpu"):
        return False
    why = fused.unavailable_reason(device)
    if why is not None:
        fused.note(why)
    return why is None


def vectorised(device: torch.device) -> bool:
    """THE choice of codec path: True where the pure-torch path runs (every CUDA tensor; CPU without the C
    kernel), False where the fused C kernel does. Every function here asks this and nothing else."""
    return not _kernel.available(device)


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
    _encode_rows(f, sc, x.view(1, n), q.view(1, n), scales.view(1, ns) if sc.scaled else None, None, None)
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
    _encode_rows(f, sc, x, codes, scales, wire_scales, workspace)


def _encode_rows(
    f: Fp8Format,
    sc: Scaling,
    x: torch.Tensor,
    codes: torch.Tensor,
    home: torch.Tensor | None,
    wire_scales: torch.Tensor | None,
    workspace: dict[str, torch.Tensor] | None,
) -> None:
    """The vectorised encode of ``[k, m]`` rows: the fused graph where it runs, else the eager ops
    (:func:`commbench.measure.fp8_eager.encode_rows`). The scales go to the wire's bytes when they travel
    (``wire_scales``), else to ``home`` (float32 ``[k, s]``); the fused graph always writes them to ``home`` (it
    cannot write through a float view of the wire's bytes: aot_autograd refuses input mutations of views of
    another dtype), then they are copied into the wire (4 bytes per block)."""
    import torch

    to = home[:, : sc.num_scales(x.shape[1])] if sc.scaled and home is not None else None
    if fused_on(x.device) and (to is not None or not sc.scaled):
        if fused.encode_rows(x, codes, to, f, sc):
            if wire_scales is not None and to is not None:
                wire_scales.copy_(to[:, : wire_scales.shape[1] // 4].contiguous().view(torch.uint8))
            return
    dest = home if wire_scales is None else None
    fp8_eager.encode_rows(x, codes, f, sc, dest, wire_scales, workspace)


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
        out.add_(fp8_eager.decode_rows(q.view(1, n), None, scales.view(1, ns), f, sc, reduce=False).view(n))
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
    src = fp8_eager.f32_view(wire_scales) if wire_scales is not None else scales
    if src is None:
        assert wire_scales is not None
        src = wire_scales  # misaligned bytes: decode_rows copies them
    _decode_rows(codes, out, src, f, sc, reduce=reduce)


def _decode_rows(
    codes: torch.Tensor, out: torch.Tensor, scales: torch.Tensor, f: Fp8Format, sc: Scaling, reduce: bool
) -> None:
    """The vectorised decode into ``out`` (arguments of :func:`commbench.measure.fp8_eager.decode_rows`): the
    fused graph where it runs (misaligned scale bytes copied to float32 first), else the eager ops."""
    import torch

    if fused_on(codes.device):
        s: torch.Tensor | None = None
        if sc.scaled:
            s = scales
            if scales.dtype == torch.uint8:
                s = torch.empty(codes.shape[0], scales.shape[1] // 4, dtype=torch.float32, device=codes.device)
                s.view(torch.uint8).copy_(scales)
        if fused.decode_rows(codes, s, out, f, sc, reduce):
            return
    fp8_eager.decode_rows(codes, out, scales, f, sc, reduce=reduce)


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
    """Which fp8 codec runs on ``device``, for the run's metadata: ``kernel (<compiler and version>)``,
    ``fused (<what compiles it>)`` or ``torch (<why neither>)``. They differ several-fold in encode/decode time,
    so crossovers depend on it. (A compile that fails later falls back to torch, said in a note and in
    :func:`compile_report`.)"""
    if _kernel.available(device):
        return f"kernel ({_kernel.compiler or 'compiler unknown'})"
    if fused_on(device):
        return f"fused ({fused.describe(device)})"
    why = fused.unavailable_reason(device) or "fused graphs not asked for on CPU"
    return f"torch ({_kernel.unavailable_reason(device)}; {why})"


def compile_report() -> dict[str, float | int | str | None]:
    """The fused graphs this process compiled and the seconds it took, paid on each graph's first call (outside
    the timed region): :func:`commbench.measure.fused.compile_report`."""
    return fused.compile_report()


_fused_wanted: bool | None = None


def use_fused(enabled: bool | None) -> None:
    """Ask for the fused compiled graphs (True), forbid them (False) or leave it to ``COMMBENCH_FP8_FUSED`` and the
    device (None) in this process; forgets compiled graphs and a past failure (tests compare paths bit for bit)."""
    global _fused_wanted
    _fused_wanted = enabled
    fused.reset()


def use_kernel(enabled: bool) -> None:
    """Switch the fused C kernel on or off for this process (tests compare both paths bit for bit)."""
    global _kernel
    _kernel = Fp8Kernel() if enabled else NoFp8Kernel()
