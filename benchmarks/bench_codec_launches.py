"""Dispatched compute ops (≈ kernel launches on a GPU) of the fp8 codec path CUDA tensors take, counted on CPU.

Runs the pure-torch codec (the C kernel is CPU-only, so it is what CUDA runs; here it is forced with
``fp8.use_kernel(False)``) under a ``TorchDispatchMode`` that counts every aten op except views/metadata and
uninitialised allocations. Prints, at worlds 2, 4 and 8:

- ops per encode and per decode of one wire of n chunks (the ``ChunkWire`` of ``commbench.measure.chunked``, packed
  and split layouts), and
- bytes read + written per element of one wire (encode / decode / decode + the fp32 sum of the n chunks), on the
  eager path (every dispatched op's tensor arguments and outputs, :class:`commbench.measure.opcount.ByteCounter`)
  and on the fused path (the compiled graphs' inputs and outputs, ``torch.compile`` through inductor's C++ backend
  here, Triton on CUDA; the graphs are the same), against the targets encode <= 10, decode <= 5 B per element;
- ops per fp8 all_reduce / all_gather / reduce_scatter: the chunked op's load + encode + comm-side local work
  (all_reduce's reduce and re-encode between its two transfers) + decode, with the collective calls counted
  apart. No world is needed: the op objects are built with world size and rank patched in, and the
  collectives are stubbed (counted, not run), so the numbers are exactly the host-side work of one call.

Works against any checkout with the same chunked-op API: ``PYTHONPATH=/tmp/base python
benchmarks/bench_codec_launches.py`` measures the code before a change.

    python benchmarks/bench_codec_launches.py [--m 4096] [--worlds 2 4 8] [--no-fused]

The fused graphs compile on first use (a few seconds each, inductor's cache makes a rerun fast).
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

NON_COMPUTE = {
    "view", "_unsafe_view", "as_strided", "slice", "select", "expand", "unsqueeze", "squeeze", "t", "transpose",
    "permute", "alias", "detach", "narrow", "_reshape_alias", "lift_fresh", "resize_", "set_", "split",
    "split_with_sizes", "unbind", "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided",
}  # fmt: skip


class Counting(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.__name__).split(".")[0]
        if name not in NON_COMPUTE:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def count(fn: Any) -> int:
    with Counting() as c:
        fn()
    return sum(c.ops.values())


def wire_counts(codec: Any, n: int, m: int, packed: bool) -> tuple[int, int, int]:
    """(encode n chunks, decode n chunks, decode + fp32 sum of n chunks) of one wire."""
    from commbench.measure import chunked

    w = chunked.ChunkWire(codec, n, m, torch.device("cpu"), packed)
    x, y, acc = torch.randn(n * m), torch.empty(n * m), torch.empty(m)
    if hasattr(w, "encode_chunks"):
        enc = lambda: w.encode_chunks(x)  # noqa: E731
        dec = lambda: w.decode_chunks(y)  # noqa: E731
        red = lambda: w.decode_chunks(acc, reduce=True)  # noqa: E731
    else:  # the per-chunk wire of the code before this change: what chunked.py looped over
        enc = lambda: [w.encode(i, x[i * m : (i + 1) * m]) for i in range(n)]  # noqa: E731
        dec = lambda: [w.decode(i, y[i * m : (i + 1) * m]) for i in range(n)]  # noqa: E731
        red = lambda: [w.decode(i, acc, accumulate=i > 0) for i in range(n)]  # noqa: E731
    enc()  # warm: one-off allocations (scratch, tables) are not per-call work
    red()
    return count(enc), count(dec), count(red)


def wire_bytes(codec: Any, n: int, m: int, packed: bool) -> tuple[float, float, float]:
    """Bytes read + written per element (of the n chunks) by encode, decode and decode+sum of one wire, on
    whichever path runs (dispatched ops plus fused graphs' inputs and outputs: ``fused.moved_bytes``)."""
    from commbench.measure import chunked
    from commbench.measure.fused import moved_bytes

    w = chunked.ChunkWire(codec, n, m, torch.device("cpu"), packed)
    x, y, acc = torch.randn(n * m), torch.empty(n * m), torch.empty(m)
    calls = (lambda: w.encode_chunks(x), lambda: w.decode_chunks(y), lambda: w.decode_chunks(acc, reduce=True))
    for fn in calls:
        fn()  # warm: scratch and, on the fused path, the compile
    e, d, r = (sum(moved_bytes(fn)) / (n * m) for fn in calls)
    return e, d, r


def eager_bytes_by_op(codec: Any, n: int, m: int) -> dict[str, dict[str, float]]:
    """Bytes read + written per element by each dispatched op of encode / decode / decode+sum (packed wire)."""
    from commbench.measure import chunked
    from commbench.measure.opcount import ByteCounter

    w = chunked.ChunkWire(codec, n, m, torch.device("cpu"), True)
    x, y, acc = torch.randn(n * m), torch.empty(n * m), torch.empty(m)
    calls = {
        "encode": lambda: w.encode_chunks(x),
        "decode": lambda: w.decode_chunks(y),
        "decode+sum": lambda: w.decode_chunks(acc, reduce=True),
    }
    out = {}
    for what, fn in calls.items():
        fn()
        with ByteCounter() as c:
            fn()
        out[what] = {op: b / (n * m) for op, b in c.by_op.items()}
    return out


def op_counts(codec: Any, coll: str, n: int, total: int, packed: bool) -> dict[str, int]:
    """Compute ops per phase and collective calls of one chunked collective at world n (rank 0)."""
    from commbench.measure import chunked

    calls = Counter[str]()

    def fake_exchange(collective: Any, send: Any, recv: Any, group: Any, async_op: bool) -> list[Any]:
        calls[collective.name] += len(send.buffers())
        return []

    cpu = torch.device("cpu")
    with (
        mock.patch("torch.distributed.get_world_size", return_value=n),
        mock.patch("torch.distributed.get_rank", return_value=0),
        mock.patch("torch.distributed.get_backend", return_value="nccl"),
        mock.patch.object(chunked, "exchange", fake_exchange),
    ):
        if coll == "all_reduce":
            op: Any = chunked.ChunkedAllReduce(codec, total, None, cpu, packed, gather_by_all_to_all=False)
        elif coll == "reduce_scatter":
            op = chunked.ChunkedReduceScatter(codec, total, None, cpu, packed)
        else:
            op = chunked.ChunkedAllGather(codec, total // n, None, cpu, packed)
        inp = torch.randn(op.x.numel() if coll != "all_reduce" else total)
        phases = {"load": lambda: op.load(inp), "encode": op.encode, "comm": op.comm, "decode": op.decode}
        for fn in phases.values():  # warm
            fn()
        calls.clear()
        out = {name: count(fn) for name, fn in phases.items()}
    out["total"] = sum(out.values())
    out["collectives"] = sum(calls.values())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=4096, help="elements per chunk (default 4096)")
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--codecs", nargs="+", default=["fp8_e4m3", "fp8_e5m2", "fp8_e4m3:block128", "fp8_e5m2:none"])
    ap.add_argument("--no-fused", action="store_true", help="skip the fused (compiled) path's byte counts")
    args = ap.parse_args(argv)

    from commbench.measure import fp8
    from commbench.measure.codec import get_codec

    fp8.use_kernel(False)  # the torch path: what CUDA tensors run
    torch.set_num_threads(1)
    print(f"dispatched compute ops (views and empty allocations not counted), torch path, m = {args.m} per chunk")
    print("\nper wire of n chunks: encode / decode / decode+sum")
    print(f"{'codec':<20} {'layout':<7}" + "".join(f"{'n=' + str(n):>16}" for n in args.worlds))
    for name in args.codecs:
        codec = get_codec(name)
        for packed in (True, False):
            cells = [wire_counts(codec, n, args.m, packed) for n in args.worlds]
            row = "".join(f"{f'{e} / {d} / {r}':>16}" for e, d, r in cells)
            print(f"{name:<20} {'packed' if packed else 'split':<7}{row}")
    has_bytes = hasattr(fp8, "use_fused")  # the code before the fused codec counts eager bytes only
    paths = ["eager"] + (["fused"] if has_bytes and not args.no_fused else [])
    print(
        "\nbytes read + written per element, packed wire: encode / decode / decode+sum (targets fused: <= 10 / <= 5 + scales)"
    )
    print(f"{'codec':<20} {'path':<7}" + "".join(f"{'n=' + str(n):>22}" for n in args.worlds))
    for name in args.codecs:
        codec = get_codec(name)
        for path in paths:
            if has_bytes:
                fp8.use_fused(path == "fused")
            cells = [wire_bytes(codec, n, args.m, True) for n in args.worlds]
            row = "".join(f"{f'{e:.2f} / {d:.2f} / {r:.2f}':>22}" for e, d, r in cells)
            note = ""
            if path == "fused":
                ok = all(e <= 10 + 0.1 and d <= 5 + 0.1 for e, d, _ in cells)  # + the scales' 4 B per block
                note = "  ok" if ok else "  ABOVE TARGET"
                if fp8.compile_report()["fallback"]:
                    note = f"  (fused unavailable: {fp8.compile_report()['fallback']})"
            print(f"{name:<20} {path:<7}{row}{note}")
    if has_bytes:
        fp8.use_fused(False)
        print(f"eager, per op (bytes read + written per element, n={args.worlds[-1]}, packed):")
        for name in args.codecs:
            for what, by_op in eager_bytes_by_op(get_codec(name), args.worlds[-1], args.m).items():
                ops = ", ".join(f"{op} {b:.1f}" for op, b in by_op.items())
                print(f"  {name:<18} {what:<10} {ops}")
        fp8.use_fused(None)
        print(
            "fused: the graphs' inputs and outputs (what one kernel moves); one scale per tensor needs the chunk's amax"
            " before its codes, so on a GPU that encode reads x twice: +4 B/element"
        )
    print(
        "\nper collective (packed layout, as the sweep): compute ops load+encode+comm+decode = total, [collective calls]"
    )
    print(f"{'codec':<20} {'collective':<15}" + "".join(f"{'n=' + str(n):>24}" for n in args.worlds))
    for name in args.codecs:
        codec = get_codec(name)
        for coll in ("all_reduce", "all_gather", "reduce_scatter"):
            cells = []
            for n in args.worlds:
                c = op_counts(codec, coll, n, n * args.m, packed=True)
                cells.append(f"{c['load']}+{c['encode']}+{c['comm']}+{c['decode']}={c['total']} [{c['collectives']}]")
            print(f"{name:<20} {coll:<15}" + "".join(f"{cell:>24}" for cell in cells))
    print("\nfp32 all_reduce for comparison: 0 compute ops, 1 collective call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
