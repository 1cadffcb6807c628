"""Time a point spends making payloads outside the collective, per rank: the CPU stream generator of before
(every peer's payload regenerated on one CPU generator, once per input dtype, while the GPUs wait) against the
counter-based generator of ``commbench.measure.payloads`` made on the rank's device, side by side.

The point: ``--world`` ranks (default 8), ``--gib`` GiB of fp32 per rank (default 1), an all_reduce checked with
``--dtypes`` distinct input dtypes among its precisions (default 3: fp32, bf16, fp16). Per rank the error passes
make, per input dtype, every rank's payload for the float64 references and its own once more to load the ops,
and the timing its own once: ``dtypes * (world + 1) + 1`` payloads of ``N`` elements (the sweep's structure,
``commbench.measure.check.check_group``; the generator changed, not that count).

Measured here, on the CPU (``--threads``, default 1, what a rank gets): elements per second of both generators,
and the bytes per element the new one reads and writes (a dispatch mode over its torch ops, the ops a GPU runs).
Estimated from them: the old time at its CPU rate (the old code drew on the CPU whatever the device), the new
time at its CPU rate (a CPU-only run), and the new time on a GPU from its bytes at half the HBM bandwidth of an
H200 (``--gbps``, default 4800 GB/s: NVIDIA H200 datasheet, 4.8 TB/s), plus the float64 accumulation of the
references (read a block, add into two expectations: 40 B per peer element) alike for both.

    python benchmarks/bench_payloads.py [--world 8] [--gib 1] [--dtypes 3] [--threads 1]

Target: the new generator on the device <= 10 s per rank for the default point.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from commbench.measure.opcount import ByteCounter
from commbench.measure.payloads import payload_piece

ACCUMULATE_BYTES = 40
"""Per peer element of a reference: read the float64 block (8), add it into the exact and the "as given"
expectations (read 8 + write 8 each)."""


def rate(fn: Callable[[int], object], n: int, reps: int = 3) -> float:
    """Elements per second of ``fn(n)`` (best of ``reps`` after a warm-up call)."""
    fn(n)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return n / best


def old_payload(kind: str) -> Callable[[int], object]:
    """The generator before: torch's CPU stream, float64 normals (and, for outliers, a uniform per element)."""
    g = torch.Generator().manual_seed(1)

    def make(n: int) -> object:
        x = torch.randn(n, generator=g, dtype=torch.float64)
        if kind == "outliers":
            mask = torch.rand(n, generator=g, dtype=torch.float64) < 1e-3
            x = torch.where(mask, x * 1e4, x)
        return x

    return make


def new_payload(kind: str) -> Callable[[int], object]:
    return lambda n: payload_piece(kind, 12345, 0, n)


def new_bytes_per_element(kind: str, n: int) -> float:
    with ByteCounter() as c:
        payload_piece(kind, 12345, 0, n)
    return (c.read + c.written) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--gib", type=float, default=1.0, help="GiB of fp32 input per rank")
    ap.add_argument("--dtypes", type=int, default=3, help="distinct input dtypes among the precisions")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gbps", type=float, default=4800.0, help="device memory bandwidth, GB/s (H200: 4800)")
    ap.add_argument("--block", type=int, default=1 << 20, help="elements per measured call (a payload block)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    numel = int(args.gib * (1 << 30)) // 4
    payloads = args.dtypes * (args.world + 1) + 1
    made = payloads * numel
    peer = args.dtypes * args.world * numel  # elements accumulated into references
    acc_s = peer * ACCUMULATE_BYTES / (0.5 * args.gbps * 1e9)
    print(
        f"point: {args.world} ranks x {args.gib:g} GiB fp32 ({numel} elements), {args.dtypes} input dtypes: "
        f"{payloads} payloads made per rank ({made / 1e9:.2f} G elements); CPU threads {args.threads}"
    )
    print(
        f"{'payload':<10} {'old CPU M/s':>12} {'new CPU M/s':>12} {'new B/elem':>11}   per rank outside the collective"
    )
    for kind in ("normal", "gradient", "outliers"):
        old = rate(old_payload(kind), args.block)
        new = rate(new_payload(kind), args.block)
        b = new_bytes_per_element(kind, 1 << 16)
        old_s = made / old
        new_cpu_s = made / new
        new_dev_s = made * b / (0.5 * args.gbps * 1e9) + acc_s
        ok = "ok" if new_dev_s <= 10 else "ABOVE 10 s"
        print(
            f"{kind:<10} {old / 1e6:12.1f} {new / 1e6:12.1f} {b:11.0f}   old {old_s:7.1f} s (CPU, GPU waits) | "
            f"new {new_cpu_s:7.1f} s at the CPU rate (CPU-only run) | new {new_dev_s:5.2f} s on the device "
            f"({ok}, target <= 10 s)"
        )
    print(
        f"the device figure: the new generator's bytes at half of {args.gbps:g} GB/s, plus the references' float64 "
        f"accumulation ({ACCUMULATE_BYTES} B per peer element: {acc_s:.2f} s), the same for both generators"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
