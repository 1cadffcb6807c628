"""The seed's gain table on an emulated two-node cluster (issue 35 item 5): bf16 against fp32 communication under DP,
TP and PP, with step-time entries from paired rounds, where the bytes saved cross the slow link and where they do
not.

Two emulated hosts (`commbench.cluster.emulate`: network namespaces on a bridge, every host's link shaped with
``tc tbf`` to ``--rate`` both ways), 2 ranks each, one small GPT. Two runs of the suite below, each through
``python -m commbench.emulate --nodes 2 --nproc-per-node 2 --rate RATE -- run SUITE``:

* **crossing** (``tp_degree = 0``, ``pp_degree = 4``): DP's gradient all-reduce, TP's activation all-reduces over
  all 4 ranks and the pipeline's stage 1 -> 2 sends all cross the shaped link, so bf16's halved bytes should show as
  a significant step-time gain where communication dominates the step;
* **intra** (``pp_degree = 2``, ``tp_degree = 2``): each pipeline's, each TP group's ranks share a host (ranks are
  numbered node by node), so the bytes bf16 saves (sends, TP all-reduces) stay on the unshaped loopback while what
  crosses (the data-parallel gradient reduction of fp32 gradients) is the same for both: "not significant" is the
  expected verdict, or a slower one where CPU autocast's emulated bf16 compute costs more (TP x DP's bf16 params).

* **pp** (``pp_degree = 4``; not in the default ``--runs``): the crossing layout's pipeline alone, bf16 and fp8 on
  the wire, cheap enough per step for the many rounds a gain near 1.1x needs (``--runs pp --steps 40``).

The PP entries use bf16 on the wire only (``pp_gpipe_bf16comm``: fp32 compute, stage outputs and their gradients
cast to bf16 for the sends), the counterpart of ``tp_bf16comm``: ``pp_gpipe_bf16`` computes under CPU autocast bf16,
which this CPU emulates, so its step time measures emulated bf16 math, not communication.

Each compared policy alternates rounds of ``--round-steps`` steps with its reference in the same processes
(`training/pairing.py`); the speed-up is the median of per-round ratios with its order-statistic 95 % interval.
Prints, per run, the gain-by-parallelism lines the console prints (speed-up [95 % CI], verdict, bytes per step per
rank) and the inter-node bytes of each policy (counted). Needs root, ``ip``, ``tc`` (exit 2 with the reason
otherwise); the namespaces are always torn down by the emulator (checked and printed at the end).

    sudo python benchmarks/bench_gain_emulated.py --rate 100mbit --steps 12 --round-steps 2 --out-root /tmp/gain
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from commbench.cluster.emulate import list_namespaces, missing_requirements  # noqa: E402

SUITE = """
name = "gain_emulated_{name}"
collectives = ["all_reduce"]
precisions = ["fp32"]
min_bytes = "4K"
max_bytes = "4K"

[training]
model = "gpt"
policies = {policies}
steps = {steps}
warmup_steps = 2
round_steps = {round_steps}
batch_size = 4
seq_len = 64
d_model = {d_model}
n_layers = 4
n_heads = 4
vocab = 256
tp_degree = {tp}
pp_degree = {pp}
microbatches = 4
comm_timed_steps = 0
measure_memory = false
"""

RUNS: dict[str, tuple[list[str], int, int]] = {
    "crossing": (["fp32", "bf16_hook", "tp_fp32", "tp_bf16comm", "pp_gpipe_fp32", "pp_gpipe_bf16comm"], 0, 4),
    "intra": (["fp32", "tp_dp_fp32", "tp_dp_bf16", "pp_gpipe_fp32", "pp_gpipe_bf16comm"], 2, 2),
    "pp": (["pp_gpipe_fp32", "pp_gpipe_bf16comm", "pp_1f1b_fp32", "pp_1f1b_fp8comm"], 0, 4),
}
"""name: (policies, tp_degree, pp_degree)."""


def _run(name: str, out: Path, args: argparse.Namespace) -> float:
    policies, tp, pp = RUNS[name]
    out.mkdir(parents=True, exist_ok=True)
    suite = out / "suite.toml"
    suite.write_text(SUITE.format(name=name, policies=policies, steps=args.steps, round_steps=args.round_steps,
                                  d_model=args.d_model, tp=tp, pp=pp).replace("'", '"'))  # fmt: skip
    argv = [sys.executable, "-m", "commbench.emulate", "--nodes", "2", "--nproc-per-node", "2", "--rate", args.rate,
            "--timeout", str(args.timeout), "--", "run", str(suite), "--out", str(out / "run"), "--min-time", "0.002",
            "--min-iters", "1", "--repeats", "3", "--warmup", "1", "--no-report"]  # fmt: skip
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.timeout + 60)
    (out / "stdout.txt").write_text(r.stdout + "\n--- stderr ---\n" + r.stderr)
    if r.returncode != 0:
        print(f"# {name}: exit {r.returncode}; see {out / 'stdout.txt'}\n{r.stderr[-2000:]}", file=sys.stderr)
    return time.perf_counter() - t0


def _show(name: str, run: Path) -> None:
    import pandas as pd

    from commbench.views.training_tables import gain_by_parallelism_lines

    csv = run / "training.csv"
    if not csv.is_file():
        print(f"## {name}: no training.csv")
        return
    t = pd.read_csv(csv)
    steps = pd.read_csv(run / "training_steps.csv") if (run / "training_steps.csv").is_file() else None
    _, tp, pp = RUNS[name]
    print(f"## {name} (tp_degree={tp or 'world'}, pp_degree={pp})")
    for line in gain_by_parallelism_lines(t, steps):
        print(line)
    cols = ["policy", "step_time_us_p50", "comm_bytes_inter_per_step", "comm_bytes_intra_per_step",
            "speedup_ref_rounds", "speedup_ref_basis", "error"]  # fmt: skip
    have = [c for c in cols if c in t.columns]
    print(t[have].to_string(index=False))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-root", type=Path, required=True, help="run directories (reused when present)")
    ap.add_argument("--rate", default="100mbit", help="tc rate of every host's link (default 100mbit)")
    ap.add_argument("--steps", type=int, default=12, help="measured steps per policy (default 12)")
    ap.add_argument("--round-steps", type=int, default=2, help="steps per paired round (default 2)")
    ap.add_argument("--d-model", type=int, default=128, help="GPT width (default 128)")
    ap.add_argument("--runs", default="crossing,intra", help=f"which runs, of {','.join(RUNS)}")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run (default 900)")
    args = ap.parse_args()
    names = [n for n in args.runs.split(",") if n]
    bad = [n for n in names if n not in RUNS]
    if bad:
        print(f"bench_gain_emulated: unknown run {bad[0]!r}; valid: {', '.join(RUNS)}", file=sys.stderr)
        return 2
    dirs = {n: args.out_root / f"{n}-{args.rate}" for n in names}
    if any(not (d / "run" / "training.csv").is_file() for d in dirs.values()):
        why = missing_requirements()
        if why:
            print(f"bench_gain_emulated: cannot emulate hosts here: {why}", file=sys.stderr)
            return 2
    walls = {n: (0.0 if (d / "run" / "training.csv").is_file() else _run(n, d, args)) for n, d in dirs.items()}
    left = [ns for ns in list_namespaces() if ns.startswith("cbemu-")] if not missing_requirements() else []
    import torch

    print(f"# host {platform.node()}  {os.cpu_count()} cpus  torch {torch.__version__}  gloo  2 emulated hosts x 2 "
          f"ranks, link tbf {args.rate} both ways; steps={args.steps} round_steps={args.round_steps} "
          f"d_model={args.d_model}")  # fmt: skip
    print("# wall s per run: " + ", ".join(f"{n}: {w:.0f}" for n, w in walls.items()))
    for n, d in dirs.items():
        _show(n, d / "run")
    print(f"# runs: {args.out_root}; emulated namespaces left: {left or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
