"""The fused fp8 codec: encode and decode of ``[k, m]`` chunk rows as graphs compiled by ``torch.compile``
(inductor: Triton kernels on CUDA, C++ on CPU), bit for bit the eager codec (:mod:`commbench.measure.fp8_eager`).

Why: the eager path is a handful of torch ops, each a pass over memory: counted with a dispatch mode, 25 bytes
read and written per element to encode e4m3 with a scale (31 unscaled e5m2) and 13 to decode, so on a GPU it runs at
a quarter of copy bandwidth. One graph lets inductor fuse the abs-max, the scale, the cast and the packing of the
codes and scales into one kernel per encode (a block's amax is a per-row reduction in the same kernel; one
scale per tensor needs a split reduction over the whole chunk first: :func:`_row_amax`), and the unpacking, the
scale, the cast and the all_reduce's fp32 sum of the k decoded chunks into one kernel per decode: 4 + 1 (+ 4 for a
whole-tensor amax) bytes per element to encode, 1 + 4 to decode and 1 + 4/k to decode and sum k chunks, plus 4
bytes per scale: what ``benchmarks/bench_codec_launches.py`` counts.

Bits. The graphs compute what the eager path computes, in float32 with the same operations (the division by a
power-of-two scale, the cast, the scale multiply), with two differences of form that cannot change a bit:

- the scale rule (:func:`commbench.measure.fp8_format.pow2_scales`) by integer ops on the amax's bits instead of
  a table lookup: for ``amax = (1 + a) 2**e`` and ``max = (1 + b) 2**E`` the smallest ``k`` with
  ``amax <= max * 2**k`` is ``e - E`` when ``a <= b`` and one more otherwise (a subnormal amax gives ``k < -126``,
  clamped like the rule);
- the special values are written as codes instead of being left to the backend's cast (Triton's fp8 cast
  saturates infinities, torch's on the host does not): NaN, +-inf get the codes the eager path gives
  (e4m3 ``0x7F``, -inf ``0xFF``; e5m2 ``0x7F``/``0x7C`` with the sign).

The all_reduce's sum of decoded chunks adds them in source order 0..k-1 from +0.0 (up to 64 chunks), which is
what eager ``torch.sum`` over the chunk dimension does on CPU (tested); on CUDA eager's reduction order may differ
from it in the last bit for k > 2 (within the fp32 term of the error bound; the C kernel differs alike).

Compiling: one graph per (codec, chunk count, layout: dense or packed rows, alignment, a short last block or
not), its sizes symbolic (``dynamic=True``), so a sweep's sizes share it; compiled on its first call (the check
pass, before any timed call) and kept for the process; each has its own dynamo cache (a fresh code object per
key), so no key evicts another or meets dynamo's recompile limit. The seconds spent compiling are kept
(:func:`compile_report`). When compiling is unavailable (``COMMBENCH_FP8_FUSED=0``, no Triton on CUDA, no C++ compiler on CPU) or fails, the
eager path runs, and :func:`note` says so once per process.
"""

from __future__ import annotations

import math
import os
import shutil
import struct
import sys
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from commbench.measure.fp8_format import K_MAX, K_MIN

if TYPE_CHECKING:
    import torch

    from commbench.measure.fp8_format import Fp8Format, Scaling

ENV = "COMMBENCH_FP8_FUSED"

_SEQUENTIAL_MAX = 64
"""Chunks up to which the decode's sum is written as a chain of adds (source order, one fused kernel); above, one
``sum`` over the chunk dimension in the graph (the compiled code's order)."""

_AMAX_SPLIT = 4096
"""Elements per partial maximum of a whole-row (tensor-scaled) amax: :func:`_row_amax`."""

Graph = Callable[..., None]

_GRAPHS: dict[tuple[Any, ...], Graph] = {}
COMPILE_S: dict[tuple[Any, ...], float] = {}
"""Seconds each graph's first call took (compiling it, then one run), by key."""

IO: dict[str, int] = {"read": 0, "written": 0}
"""Bytes the graphs' inputs and outputs cover, summed over every call (what one fused kernel would move; the
counterpart of :class:`commbench.measure.opcount.ByteCounter` for the compiled path)."""

_failed: str | None = None
_noted = False


def _cxx() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++") or shutil.which("clang++")


_REASON: dict[str, str | None] = {}


def unavailable_reason(device: torch.device) -> str | None:
    """Why the fused path does not run on ``device`` (None when it does); asked once per device type."""
    if os.environ.get(ENV, "1") == "0":
        return f"disabled by {ENV}=0"
    if _failed is not None:
        return _failed
    if device.type not in _REASON:
        _REASON[device.type] = _reason(device)
    return _REASON[device.type]


def _reason(device: torch.device) -> str | None:
    import torch

    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch.compile needs Triton on CUDA (not installed)"
        return None
    if device.type == "cpu":
        return None if _cxx() is not None else "torch.compile needs a C++ compiler on CPU (none found)"
    return f"no fused fp8 codec for {device.type} tensors"


def available(device: torch.device) -> bool:
    return unavailable_reason(device) is None


def describe(device: torch.device) -> str:
    """What compiles the graphs on ``device`` (for the run's metadata)."""
    return "torch.compile (inductor, Triton)" if device.type == "cuda" else "torch.compile (inductor, C++)"


def note(text: str) -> None:
    """Say once per process that the fused path is not running and why (the run's console note)."""
    global _noted
    if not _noted:
        _noted = True
        print(f"commbench: note: fused fp8 codec unavailable ({text}); the eager torch codec runs", file=sys.stderr)


def compile_report() -> dict[str, float | int | str | None]:
    """How many graphs this process compiled and the seconds their first calls took (compile + one run), for
    the run's metadata; ``fallback`` is why the eager path runs instead (None while the fused one does)."""
    return {"graphs": len(COMPILE_S), "compile_s": round(sum(COMPILE_S.values()), 3), "fallback": _failed}


def reset(enabled: bool = True) -> None:
    """Forget every graph and any failure (tests); ``enabled=False`` turns the path off for this process."""
    global _failed, _noted
    _GRAPHS.clear()
    COMPILE_S.clear()
    _REASON.clear()
    IO.update(read=0, written=0)
    _failed = None if enabled else f"disabled by {ENV}=0"
    _noted = False


def _layout(t: torch.Tensor | None) -> tuple[Any, ...] | None:
    """What a graph is specialised on besides the sizes, which it takes as symbols: dtype, device, whether the rows
    are dense (a split wire) or strided (the packed one), the byte alignment."""
    if t is None:
        return None
    dense = t.dim() < 2 or t.stride(0) == t.shape[1]
    return (t.dim(), t.dtype, t.device.type, dense, t.storage_offset() * t.element_size() % 16)


def _run(
    key: tuple[Any, ...], build: Callable[[], Graph], reads: int, *args: torch.Tensor | None, reread: int = 0
) -> bool:
    """Run the graph of ``key`` (compiling it first on its first call) on ``args``, of which the first ``reads``
    are read and the others written; False when the fused path is unavailable or compiling fails (then it stays
    off for this process, said once, and the caller runs eager). A graph takes its sizes as symbols
    (``dynamic=True``), so one compile serves every size of a sweep with the same ``key`` and layouts."""
    global _failed
    if _failed is not None:
        return False
    full = (*key, *(_layout(a) for a in args))
    graph = _GRAPHS.get(full)
    first = graph is None
    if graph is None:
        import torch

        fn = build()
        # a fresh code object: dynamo caches per code object, so this key gets its own cache (one compile,
        # no recompile limit shared with other shapes)
        fresh = types.FunctionType(
            fn.__code__.replace(co_name=f"{fn.__name__}_{len(_GRAPHS)}"),
            fn.__globals__,
            fn.__name__,
            None,
            fn.__closure__,
        )
        graph = torch.compile(fresh, dynamic=True, fullgraph=True)
    from torch.utils._python_dispatch import _disable_current_modes

    t0 = time.perf_counter()
    try:
        # a dispatch mode (a counter) would make dynamo trace the graph again under it: the graph runs without
        # it, and its inputs and outputs are counted in IO instead
        with _disable_current_modes():
            graph(*args)
    except Exception as e:  # noqa: BLE001  # any compiler failure: the eager path gives the same bits
        _failed = f"torch.compile failed: {type(e).__name__}: {e}".splitlines()[0][:300]
        note(_failed)
        return False
    if first:
        COMPILE_S[full] = time.perf_counter() - t0
        _GRAPHS[full] = graph
    from commbench.measure.opcount import footprint

    IO["read"] += reread + sum(footprint(a) for a in args[:reads] if a is not None)
    IO["written"] += sum(footprint(a) for a in args[reads:] if a is not None)
    return True


def moved_bytes(fn: Callable[[], object]) -> tuple[int, int]:
    """(bytes read, bytes written) by ``fn()``, whichever codec path runs it: its dispatched compute ops
    (:class:`commbench.measure.opcount.ByteCounter`), plus the inputs and outputs of the fused graphs it runs (a
    graph's own intermediate buffers, such as a whole-chunk amax's partial maxima, are not seen; an input a graph
    reads twice, as the whole-row amax does, is counted twice)."""
    from commbench.measure.opcount import ByteCounter

    before = dict(IO)
    with ByteCounter() as c:
        fn()
    return c.read + IO["read"] - before["read"], c.written + IO["written"] - before["written"]


def _bits_of(v: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", v))[0])


def _scale_fn(f: Fp8Format) -> Callable[[torch.Tensor], torch.Tensor]:
    """THE scale rule on an amax tensor (finite, >= 0) by integer ops on its bits (see the module docstring)."""
    import torch

    mb = _bits_of(f.max)
    e_max, mant_max = (mb >> 23) - 127, mb & 0x7FFFFF

    # the format's constants as defaults: dynamo specialises an inlined function's default ints, where it would
    # make closure ints symbolic under dynamic=True (on Triton a 64-bit kernel argument, and then a shift whose
    # bits cannot be reinterpreted as float32)
    def scale(amax: torch.Tensor, e_max: int = e_max, mant_max: int = mant_max) -> torch.Tensor:
        bits = amax.view(torch.int32)
        k = (bits >> 23) - (127 + e_max) + ((bits & 0x7FFFFF) > mant_max).to(torch.int32)
        s = ((k.clamp(K_MIN, K_MAX) + 127) << 23).view(torch.float32)
        return torch.where(amax > 0, s, 1.0)

    return scale


def _special_codes(f: Fp8Format, sc: Scaling, x: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """``codes`` with NaN and +-inf elements of ``x`` replaced by the eager path's codes for them: e5m2 NaN
    ``0x7F`` and inf ``0x7C`` with x's sign; e4m3 (no inf) ``0x7F`` for +inf, ``0xFF`` for -inf, and for NaN
    ``0x7F``, with x's sign when unscaled (the eager saturating cast keeps a NaN's sign, the scaled one does not)."""
    import torch

    sign = (x.view(torch.int32) < 0).to(torch.uint8) << 7
    if f.has_inf:
        special = torch.where(torch.isnan(x), 0x7F, 0x7C).to(torch.uint8) | sign
    elif sc.scaled:
        special = torch.where(x == -math.inf, 0xFF, 0x7F).to(torch.uint8)
    else:
        special = torch.where(torch.isinf(x) & (x > 0), 0x7F, 0x7F | sign).to(torch.uint8)
    return torch.where(torch.isfinite(x), codes, special)


def _parts(m: int, run: int) -> list[tuple[int, int, int, int]]:
    """The row ``[0, m)`` as runs of whole blocks: ``(lo, hi, first scale, blocks)`` for the full blocks and, when
    ``run`` does not divide ``m``, the short last block. Each part is a plain ``[k, blocks, len]`` view (no pad, no
    per-element index: inductor's C++ loops drop a padded row's tail, seen with torch 2.13)."""
    full = m // run
    parts = [(0, full * run, 0, full)] if full else []
    if m % run:
        parts.append((full * run, m, full, 1))
    return parts


def _row_amax(x: torch.Tensor, k: int, m: int) -> torch.Tensor:
    """The ``[k, 1]`` amax of the finite elements of each row of ``x``, as two reductions: over runs of
    :data:`_AMAX_SPLIT` elements, then over their maxima and the short run left over (with a 0 beside it, so that
    an empty one reduces too). One reduction over a whole row would be one kernel program per row on Triton (with
    sizes symbolic, inductor splits a reduction by the size it was compiled at, the sweep's smallest), fused with
    the cast into one pass that a single SM runs. No branch on the size: every size shares the graph. The
    maximum is exact in any order and every |x| >= 0, so the scale's bits do not change."""
    import torch

    def finite_abs(t: torch.Tensor) -> torch.Tensor:
        return torch.where(torch.isfinite(t), t, 0.0).abs()

    full = m // _AMAX_SPLIT
    runs = finite_abs(x[:, : full * _AMAX_SPLIT]).view(k, full, _AMAX_SPLIT).amax(dim=2)
    rest = finite_abs(x[:, full * _AMAX_SPLIT :])
    return torch.cat([runs, rest, torch.zeros(k, 1, dtype=x.dtype, device=x.device)], dim=1).amax(dim=1, keepdim=True)


def encode_rows(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor | None, f: Fp8Format, sc: Scaling) -> bool:
    """Quantise ``x`` ``[k, m]`` float32 into ``codes`` ``[k, m]`` uint8 and (scaled modes) ``scales``
    ``[k, num_scales(m)]`` float32, as :func:`commbench.measure.fp8_eager.encode_rows` does, in one graph.
    False when the fused path did not run (the caller runs the eager one)."""
    k, m = x.shape
    block = sc.run_length(m) if sc.name == "block" else None  # None: the whole row shares one scale
    scaled = sc.scaled

    def build() -> Graph:
        import torch

        to_scale = _scale_fn(f)

        def body(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor | None, block: int | None = block) -> None:
            k, m = x.shape
            if not scaled:
                fin = torch.where(torch.isfinite(x), x, 0.0)
                y = torch.clamp(fin, -f.max, f.max)
                codes.copy_(_special_codes(f, sc, x, y.to(f.dtype).view(torch.uint8)))
                return
            assert scales is not None
            for lo, hi, first, nb in _parts(m, m if block is None else block):
                xp = x[:, lo:hi]
                fin = torch.where(torch.isfinite(xp), xp, 0.0).view(k, nb, -1)
                s = to_scale(fin.abs().amax(dim=2) if block is not None else _row_amax(x, k, m))
                scales[:, first : first + nb].copy_(s)
                y = (fin / s.unsqueeze(2)).view(k, hi - lo)
                codes[:, lo:hi].copy_(_special_codes(f, sc, xp, y.to(f.dtype).view(torch.uint8)))

        def fp8_encode(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor | None) -> None:
            body(x, codes, scales)  # `block` a constant: see _scale_fn

        return fp8_encode

    tail = block is not None and m % block != 0
    short = block is not None and m < block
    key = ("enc", f.name, sc.name, block, k, tail, short, m == 1)
    # a whole-row amax reads x once more, in its own kernels, before the cast's pass (_row_amax)
    reread = x.numel() * x.element_size() if scaled and block is None else 0
    return _run(key, build, 1, x, codes, scales if scaled else None, reread=reread)


def decode_rows(
    codes: torch.Tensor, scales: torch.Tensor | None, out: torch.Tensor, f: Fp8Format, sc: Scaling, reduce: bool
) -> bool:
    """Decode ``codes`` ``[k, m]`` with float32 ``scales`` ``[k, num_scales(m)]`` (None when unscaled) into
    ``out`` ``[k, m]``, or with ``reduce`` the float32 sum of the k decoded rows into ``out`` ``[m]``, in one
    graph; False when the fused path did not run."""
    k, m = codes.shape
    block = sc.run_length(m) if sc.name == "block" else None
    scaled = sc.scaled

    def build() -> Graph:
        import torch

        def body(
            codes: torch.Tensor, scales: torch.Tensor | None, out: torch.Tensor, block: int | None = block
        ) -> None:
            k, m = codes.shape
            parts = _parts(m, m if block is None else block) if scaled else [(0, m, 0, 0)]
            for lo, hi, first, nb in parts:
                v = codes[:, lo:hi].view(f.dtype).to(torch.float32)
                if scaled:
                    assert scales is not None
                    v = (v.view(k, nb, -1) * scales[:, first : first + nb].unsqueeze(2)).view(k, hi - lo)
                if not reduce:
                    out[:, lo:hi].copy_(v)
                    continue
                if k <= _SEQUENTIAL_MAX:
                    acc = v[0] + 0.0  # torch.sum starts from +0.0: a sum of -0.0s is +0.0 on the eager path too
                    for i in range(1, k):
                        acc = acc + v[i]
                else:
                    acc = v.sum(dim=0)
                out[lo:hi].copy_(acc)

        def fp8_decode(codes: torch.Tensor, scales: torch.Tensor | None, out: torch.Tensor) -> None:
            body(codes, scales, out)  # `block` a constant: see _scale_fn

        return fp8_decode

    tail = block is not None and m % block != 0
    key = ("dec", f.name, sc.name, block, reduce, k, tail, block is not None and m < block, m == 1)
    return _run(key, build, 2, codes, scales if scaled else None, out)
