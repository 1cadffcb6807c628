"""Cost of the training instrumentation: the same step loop with and without it, side by side in one 2-rank run.

    python benchmarks/bench_training_overhead.py                 # target: ratio <= 1.02 for every policy
    python benchmarks/bench_training_overhead.py --policies fp32 fsdp2_bf16 --reps 60

For each policy one wrapped model runs, after warm-up, four kinds of step:
  bare          `PolicySession.bare_step`: forward, backward + gradient communication, optimizer step, zero_grad
  instrumented  `PolicySession.instrumented_step` with the CommCounter installed: per-step clock (and device
                sync), comm-byte counting, gradient statistics (norm, underflow, non-finite) -- what
                `run_training` does on every timed step
  timing+comm   the same without the gradient statistics (the issue's "timing, memory, comm counting")
  bare_again    a second bare series: the A/A noise floor
Steps of the four kinds alternate one at a time (barrier before each; the order rotates); each is timed on
rank 0 around the whole call; the ratio is median(instrumented step) / median(bare step) over `--reps` steps.
The memory measurement is not in any timed step (it runs on the last warm-up step only), so it adds
nothing to step time; its one-step cost is printed for information.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

SECTION: dict[str, Any] = {
    # the suites/training.toml model
    "model": "gpt", "batch_size": 8, "seq_len": 64, "d_model": 128, "n_layers": 4, "n_heads": 4, "vocab": 512,
    "steps": 1, "warmup_steps": 1,
}  # fmt: skip


def worker(rank: int, world: int, port: int, args: argparse.Namespace, q: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from commbench.training.config import TrainingConfig
    from commbench.training.models import make_batch
    from commbench.training.policies import get_policy
    from commbench.training.runner import PolicySession

    sec = TrainingConfig.from_dict({**SECTION, "policies": args.policies})
    dev = torch.device("cpu")
    out: dict[str, Any] = {}
    for name in sec.policies:
        sess = PolicySession(get_policy(name), sec, dev)
        step = 0
        for _ in range(args.warmup):
            sess.bare_step(step)
            step += 1
        t0 = time.perf_counter()
        with sess.counter:
            sess.instrumented_step(step, measure_memory=True)
        mem_step_s = time.perf_counter() - t0
        step += 1
        kinds: dict[str, Any] = {
            "bare": sess.bare_step,
            "bare_again": sess.bare_step,
            "timing+comm": functools.partial(sess.instrumented_step, numerics=False),
            "instrumented": sess.instrumented_step,
        }
        times: dict[str, list[float]] = {k: [] for k in kinds}
        order = list(kinds)
        for r in range(args.reps):
            for kind in order[r % 4 :] + order[: r % 4]:  # rotate so no kind always follows another
                dist.barrier()
                t0 = time.perf_counter()
                if kind.startswith("bare"):
                    kinds[kind](step)
                else:
                    with sess.counter:
                        kinds[kind](step)
                times[kind].append(time.perf_counter() - t0)
                step += 1
        # the gradient statistics alone, on the gradients of one more step
        x, y = make_batch(sec, rank, step, dev)
        loss = sess.train_step(x, y)
        stats = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            sess._grad_stats(loss, 1.0)
            stats.append(time.perf_counter() - t0)
        sess.w.optimizer.zero_grad(set_to_none=True)
        sess.finish()
        out[name] = {k: statistics.median(v) for k, v in times.items()} | {
            "mem_step_s": mem_step_s,
            "stats_s": statistics.median(stats),
        }
    if rank == 0:
        q.put(out)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policies", nargs="+", default=["fp32", "bf16_hook", "fsdp2_bf16", "zero3_fp32"])
    p.add_argument("--reps", type=int, default=30, help="timed steps of each kind per policy")
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, 2, port, args, q)) for r in range(2)]
    for pr in procs:
        pr.start()
    res = q.get(timeout=1800)
    for pr in procs:
        pr.join()
    print(f"# torch {torch.__version__}, 2 ranks gloo/CPU, 1 thread each, gpt d=128 L=4 seq=64 batch=8 per rank")
    print(f"# {args.reps} steps of each kind per policy, interleaved one step at a time; median wall per step")
    print(f"{'policy':<22} {'bare ms':>8} {'A/A':>6} {'t+comm':>7} {'instr':>7} {'stats ms':>9} {'mem step ms':>12}")
    worst_tc = worst = 0.0
    for name, r in res.items():
        aa, tc, full = (r[k] / r["bare"] for k in ("bare_again", "timing+comm", "instrumented"))
        worst_tc, worst = max(worst_tc, tc), max(worst, full)
        print(
            f"{name:<22} {r['bare'] * 1e3:8.2f} {aa:6.3f} {tc:7.3f} {full:7.3f} {r['stats_s'] * 1e3:9.3f}"
            f" {r['mem_step_s'] * 1e3:12.1f}"
        )
    print("# ratios to bare; A/A = a second bare series (the noise floor of this machine)")
    print(f"# worst timing+comm/bare {worst_tc:.3f}, worst instrumented/bare {worst:.3f} (target <= 1.02)")
    print("# stats ms = the gradient statistics alone (norm, underflow, non-finite), timed directly; they run")
    print("#   outside the step clock, so they never enter a reported step time")


if __name__ == "__main__":
    main()
