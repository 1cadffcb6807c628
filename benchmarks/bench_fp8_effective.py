"""Does fp8 pay on this machine? fp8 (uint8 bytes path) against fp32 and bf16_compress for all_gather,
reduce_scatter and all_reduce in one spawned gloo world, with the time split into encode / comm / decode.

    python benchmarks/bench_fp8_effective.py                 # 2 ranks, 64 MiB (fp32 size), ~1-2 min
    python benchmarks/bench_fp8_effective.py --size 16M --nproc 3 --rounds 3

``effective_gbps`` = fp32 bytes of the point (nccl-tests size definition) / (encode + comm + decode), GB = 1e9;
the ratio column is effective_gbps / fp32's at the same point. Target: fp8 all_gather ratio >= 2 at 64 MiB on
2 gloo ranks (the byte limit is 4x). Each phase is timed like the sweep does: barrier, k back-to-back calls,
per-call time; median over rounds on each rank, then the mean over ranks. One intra-op thread per rank.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

PRECISIONS = ["fp32", "bf16_compress", "fp8_e4m3", "fp8_e4m3:block128", "fp8_e5m2", "fp8_e4m3:none"]
COLLECTIVES = ["all_gather", "reduce_scatter", "all_reduce"]


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def timed(fn: Callable[[], None], rounds: int, min_time_s: float) -> float:
    """Median per-call seconds over ``rounds`` samples of k back-to-back calls (k calibrated once)."""
    fn()  # warm-up
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    # Every rank must run the same k (collectives): agree on the largest single-call time.
    t = torch.tensor([one], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    k = max(1, int(min_time_s / float(t)))
    samples = []
    for _ in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        samples.append((time.perf_counter() - t0) / k)
    return statistics.median(samples)


def mean_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t) / dist.get_world_size()


def worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from commbench.measure import fp8
    from commbench.measure.collectives import get_collective
    from commbench.measure.precision import get_precision

    elements = parse_size(args.size) // 4
    rows = []
    for cname in args.collectives:
        coll = get_collective(cname)
        layout = coll.layout(coll.round_total(elements, world), world)
        x = torch.randn(layout.input_numel, generator=torch.Generator().manual_seed(rank))
        fp32_eff = None
        for pname in args.precisions:
            prec = get_precision(pname)
            if not prec.supports(coll, "gloo"):
                continue
            op = prec.make_op(coll, layout, None, torch.device("cpu"))
            op.load(x)
            op.encode()
            enc = mean_over_ranks(timed(op.encode, args.rounds, args.min_time)) if op.has_codec else 0.0
            comm = mean_over_ranks(timed(op.comm, args.rounds, args.min_time))
            dec = mean_over_ranks(timed(op.decode, args.rounds, args.min_time)) if op.has_codec else 0.0
            total = enc + comm + dec
            eff = layout.total * 4 / total / 1e9
            if pname == "fp32":
                fp32_eff = eff
            rows.append(
                (cname, pname, op.wire_bytes, enc, comm, dec, total, eff, eff / fp32_eff if fp32_eff else float("nan"))
            )
            del op
    if rank == 0:
        print(
            f"# {world} ranks, gloo, 1 thread/rank, fp32 size {args.size}, torch {torch.__version__}, "
            f"codec {fp8.kernel_status()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        print(
            f"{'collective':<15}{'precision':<19}{'wire MiB':>9}{'enc ms':>9}{'comm ms':>9}{'dec ms':>9}"
            f"{'total ms':>10}{'eff GB/s':>10}{'vs fp32':>9}"
        )
        for c, p, w, e, m, d, t, g, r in rows:
            print(
                f"{c:<15}{p:<19}{w / 2**20:9.2f}{e * 1e3:9.2f}{m * 1e3:9.2f}{d * 1e3:9.2f}{t * 1e3:10.2f}{g:10.3f}{r:9.2f}"
            )
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="64M", help="fp32 bytes in nccl-tests' size definition (default 64M)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per sample (k calls back to back)")
    ap.add_argument("--collectives", nargs="+", default=COLLECTIVES)
    ap.add_argument("--precisions", nargs="+", default=PRECISIONS, help="fp32 first: ratios are against it")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.nproc, port, args), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
