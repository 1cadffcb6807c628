"""A collective issued after compute against the same collective in a stream, in one 2-rank gloo world.

    python benchmarks/bench_isolated_calls.py [--rounds 40] [--placement both|bound|unbound]

Why `timing.mode = "isolated"` exists: a training step issues one collective per bucket after milliseconds of
compute, not nccl-tests' back-to-back loop. Variants alternate round by round (so a drifting machine hits all
alike): a 20-op stream after a barrier (per-op time), and one op after a barrier followed by 0, 2 or 20 ms of
matmuls or 20 ms of sleep. Per sample the faster rank's duration (the other also timed its wait), then the median
and the 10th/90th percentiles over rounds, for fp32 all_reduce of 1 MiB and 2.56 MiB (DDP's first bucket and
the gpt training model's second), and of 64 KiB. `>2ms` is the share of samples over 2 ms.

Each world runs twice (`--placement both`, the default): each rank bound to its own block of cores as `python -m
commbench` binds its local ranks (`launch.core_blocks`), and unbound. On this project's 2-core VM a block is one
core, so a rank's main thread shares it with gloo's threads, and the first op after 20 ms of compute or sleep
often pays ~3-4 ms (about one tick of that VM kernel's 250 Hz clock; the mechanism is not traced) before it moves,
more often bound than unbound (64 KiB: 78 % against 40 % of samples, 2026-12-01): likely why an isolated-mode sweep
of bound ranks prices calls that follow each other closely (FSDP's per-layer all_gathers) high.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = {"64K": 16384, "1M": 262144, "2.56M": 671088}


def worker(rank: int, port: int, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    a = torch.randn(64, 64)
    tensors = {k: torch.randn(n) for k, n in SIZES.items()}
    for t in tensors.values():
        for _ in range(5):
            dist.all_reduce(t)

    def compute(ms: float) -> None:
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            torch.mm(a, a)

    def isolated(t, ms: float, sleep: bool = False):  # type: ignore[no-untyped-def]
        def fn() -> float:
            dist.barrier()
            time.sleep(ms / 1e3) if sleep else compute(ms)
            t0 = time.perf_counter()
            dist.all_reduce(t)
            return time.perf_counter() - t0

        return fn

    def stream(t):  # type: ignore[no-untyped-def]
        def fn() -> float:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(20):
                dist.all_reduce(t)
            return (time.perf_counter() - t0) / 20

        return fn

    fns = {}
    for k, t in tensors.items():
        fns[f"{k} stream (20 ops)"] = stream(t)
        for ms in (0, 2, 20):
            fns[f"{k} after {ms} ms compute"] = isolated(t, ms)
        fns[f"{k} after 20 ms sleep"] = isolated(t, 20, sleep=True)
    names = list(fns)
    res: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for j in range(len(names)):
            k = names[(j + r) % len(names)]
            res[k].append(fns[k]())
    out: list = [None, None]
    dist.all_gather_object(out, res)
    from commbench.cluster.launch import rank_cores

    out_cores: list = [None, None]
    dist.all_gather_object(out_cores, rank_cores())
    if rank == 0:
        base: dict[str, float] = {}
        bound = len(set(out_cores)) > 1  # unbound, every rank may run on every core
        print(f"## ranks {'bound to cores ' + ' | '.join(map(str, out_cores)) if bound else 'unbound'}")
        print(f"{'variant':<28}{'median_ms':>10}{'p10_ms':>8}{'p90_ms':>8}{'/stream':>9}{'>2ms':>7}")
        for k in names:
            m = [min(x, y) for x, y in zip(out[0][k], out[1][k], strict=True)]
            q = statistics.quantiles(m, n=10)
            med = statistics.median(m)
            size = k.split()[0]
            base.setdefault(size, med)
            slow = sum(x > 2e-3 for x in m) / len(m)
            print(f"{k:<28}{med * 1e3:>10.2f}{q[0] * 1e3:>8.2f}{q[-1] * 1e3:>8.2f}{med / base[size]:>9.2f}{slow:>7.2f}")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--placement", choices=["both", "bound", "unbound"], default="both",
                    help="bound: each rank on its own block of cores, as the CLI binds its local ranks")  # fmt: skip
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank is not None:
        worker(a.rank, a.port, a.rounds)
        return
    from commbench.cluster.launch import allowed_cores, bind, core_blocks, free_port

    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  load average {os.getloadavg()}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    rc = 0
    for placement in ["bound", "unbound"] if a.placement == "both" else [a.placement]:
        blocks = core_blocks(allowed_cores(), 2) if placement == "bound" else None
        if placement == "bound" and blocks is None:
            print("## bound: fewer cores than ranks, skipped")
            continue
        port = free_port()
        procs = []
        for r in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--rank", str(r), "--port", str(port), "--rounds", str(a.rounds)], env=env,
            ))  # fmt: skip
            if blocks:  # as the CLI binds a local rank: right after exec, before the worker starts a thread
                bind(procs[-1].pid, blocks[r])
        rc = max(rc, *(p.wait() for p in procs))
    sys.exit(rc)


if __name__ == "__main__":
    main()
