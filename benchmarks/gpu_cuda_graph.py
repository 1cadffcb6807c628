"""CUDA-graph mode (``-G N``, nccl-tests' ``--cudagraph``) on a GPU: rows exist, are correct and timed plausibly.

    python benchmarks/gpu_cuda_graph.py [OUT_DIR]

On CUDA it runs ``python -m commbench run -G 10`` on a 1-rank NCCL world (all_reduce, broadcast, reduce, sendrecv
in fp32 and bf16, 4K and 1M, checked) and the same grid eagerly, then asserts that every point has a row with
``timing_mode`` graph (eager: stream), ``#wrong`` 0 and a finite time between 0.1 us and 100 ms, and prints the
graph / eager time per point side by side (a ratio, not an assertion: a graph saves the host's launch cost, most
visible at small sizes). Without CUDA it prints one line and exits 2: a check that tests nothing must not pass.
What only this proves: that ProcessGroupNCCL's collectives and sends are captured by ``torch.cuda.graph`` and
replayed as nccl-tests' BenchTime does (tests/test_graph_mode.py models the semantics on the CPU).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "sendrecv")
PRECISIONS = ("fp32", "bf16")
LAUNCHES = 10
TIMING = ("--warmup", "2", "--min-iters", "5", "--repeats", "3", "--passes", "1", "--max-time", "0.5",
          "--target-ci", "0.5")  # fmt: skip


def run(out: Path, extra: list[str]) -> int:
    """``commbench run`` of the grid into ``out`` (its console streamed); the exit status."""
    argv = [
        sys.executable, "-m", "commbench", "run", "--nproc", "1", "--backend", "nccl", "--groups", "world",
        "--collectives", ",".join(COLLECTIVES), "--precisions", ",".join(PRECISIONS), "-b", "4K", "-e", "1M",
        "-f", "256", *TIMING, "--check", "--no-training", "--no-report", "--quiet", *extra, "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    print("$", " ".join(argv), flush=True)
    return subprocess.run(argv, cwd=REPO, env=env, timeout=300).returncode


def check_rows(df: object, mode: str) -> list[str]:
    """What is wrong with the rows of one run (empty: nothing)."""
    import pandas as pd

    assert isinstance(df, pd.DataFrame)
    problems = []
    for coll in COLLECTIVES:
        for prec in PRECISIONS:
            rows = df[(df["collective"] == coll) & (df["precision"] == prec)]
            if not len(rows):
                problems.append(f"{coll} {prec}: no row")
                continue
            for _, r in rows.iterrows():
                where = f"{coll} {prec} {int(r['fp32_bytes'])} B"
                if r["timing_mode"] != mode:
                    problems.append(f"{where}: timing_mode {r['timing_mode']!r}, expected {mode!r}")
                if int(r["wrong"]) != 0:
                    problems.append(f"{where}: {int(r['wrong'])} wrong")
                t = float(r["time_us"])
                if not (math.isfinite(t) and 0.1 <= t <= 1e5):
                    problems.append(f"{where}: time {t} us is not plausible")
    return problems


def main(argv: list[str] | None = None) -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_cuda_graph: no CUDA device: CUDA-graph mode needs one (nothing was tested)", file=sys.stderr)
        return 2
    from commbench.store.results import load

    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else Path(tempfile.mkdtemp(prefix="commbench-graph-"))
    graph_dir, eager_dir = out / "graph", out / "eager"
    rc_graph = run(graph_dir, ["-G", str(LAUNCHES)])
    rc_eager = run(eager_dir, [])
    problems = [f"-G run exited {rc_graph}"] if rc_graph else []
    problems += [f"eager run exited {rc_eager}"] if rc_eager else []
    graph = load(graph_dir) if rc_graph == 0 else None
    eager = load(eager_dir) if rc_eager == 0 else None
    if graph is not None:
        problems += check_rows(graph, "graph")
    if eager is not None:
        problems += check_rows(eager, "stream")
    if graph is not None and eager is not None:
        key = ["collective", "precision", "fp32_bytes"]
        both = graph.merge(eager, on=key, suffixes=("_graph", "_eager"))
        print(f"{'collective':<12} {'precision':<9} {'size':>9} {'graph us':>10} {'eager us':>10} {'graph/eager':>12}")
        for _, r in both.iterrows():
            ratio = r["time_us_graph"] / r["time_us_eager"]
            print(
                f"{r['collective']:<12} {r['precision']:<9} {int(r['fp32_bytes']):>9} {r['time_us_graph']:>10.1f} "
                f"{r['time_us_eager']:>10.1f} {ratio:>12.2f}"
            )
    for p in problems:
        print(f"gpu_cuda_graph: FAIL {p}", file=sys.stderr)
    print(f"gpu_cuda_graph: {'FAIL' if problems else 'ok'} ({out})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
