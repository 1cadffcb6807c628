"""How often a finished 2-rank gloo world dies at exit, with and without commbench's exit path.

    python benchmarks/stress_teardown.py                # 30 worlds per exit path, interleaved
    python benchmarks/stress_teardown.py --runs 10

Each world: 2 ranks (torchrun's environment variables, 127.0.0.1, a free port) join through
``commbench.cluster.launch.init_world``, train a small DDP model a few steps with commbench's ``bf16_hook`` (an
async all_reduce whose future has a Python callback), run that pattern bare 20 times, keep the model, the
futures and the group referenced from module level -- as anything that outlives the run would -- and leave
by one of two paths:

  plain      ``destroy_process_group()`` then ``sys.exit``: interpreter finalization may run while gloo's
             worker threads still hold Python objects (what commbench did before)
  commbench  ``shutdown_world()`` (garbage collection, then ``destroy_process_group()``), then
             ``exit_process`` (flush the standard streams, ``os._exit``): what ``python -m commbench`` does

A world fails when any rank exits non-zero (SIGABRT: "terminate called without an active exception").
The two exit paths alternate world by world, so machine load affects both alike.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing


_KEEP: list[object] = []


def worker(mode: str) -> None:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from commbench.cluster.launch import detect_world, exit_process, init_world, shutdown_world
    from commbench.training.hooks import cast_hook

    info = detect_world()
    assert info is not None, "run through run_world(): the torchrun environment variables are missing"
    init_world(info, "gloo", 60.0)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)))
    model.register_comm_hook(None, cast_hook(torch.bfloat16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        model(torch.randn(8, 64)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    # The hooks' pattern on its own: async all_reduces whose futures carry Python callbacks, kept alive.
    futures = []
    for _ in range(20):
        wire = torch.randn(4096).to(torch.bfloat16)
        fut = torch.distributed.all_reduce(wire, async_op=True).get_future().then(lambda f: f.value()[0].float())
        futures.append(fut)
        fut.wait()
    # Module-level, like anything that outlives the function (a cache, a cycle collected only at exit): locals
    # would be released as SystemExit unwinds, before finalization, and hide the race.
    _KEEP.extend([model, opt, futures, torch.distributed.group.WORLD])
    torch.distributed.barrier()
    if mode == "commbench":
        shutdown_world()
        exit_process(0)
    torch.distributed.destroy_process_group()  # what _KEEP holds still references the group
    sys.exit(0)


def run_world(mode: str, nproc: int = 2, timeout_s: float = 120.0) -> list[tuple[int, str]]:
    """Run one world of ``nproc`` ranks exiting by ``mode``; (exit code, stderr tail) per rank."""
    from commbench.cluster.launch import free_port, local_rank_env

    port = free_port()
    procs = []
    for r in range(nproc):
        env = {**os.environ, **local_rank_env(r, nproc, port, threads=1)}
        cmd = [sys.executable, __file__, "--worker", mode]
        procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    out = []
    for p in procs:
        _, err = p.communicate(timeout=timeout_s)
        out.append((p.returncode, err.decode(errors="replace")[-300:]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30, help="worlds per exit path (default 30)")
    ap.add_argument("--worker", choices=["plain", "commbench"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    modes = ["plain", "commbench"]
    failed = {m: 0 for m in modes}
    for i in range(args.runs):
        for m in modes if i % 2 == 0 else modes[::-1]:
            ranks = run_world(m)
            if any(code != 0 for code, _ in ranks):
                failed[m] += 1
                codes = ", ".join(str(c) for c, _ in ranks)
                print(f"world {i:3d} {m:10s} failed: exit codes {codes}", flush=True)
    print(f"\n{'exit path':14s} {'failed worlds':>14s}")
    for m in modes:
        print(f"{m:14s} {failed[m]:>8d} / {args.runs}")


if __name__ == "__main__":
    main()
