"""A busy core makes its rank the straggler: the real effect, which needs an otherwise quiet machine.

    python benchmarks/bench_stragglers.py [--rounds 3]

Two local ranks pinned to cores 0 and 1 (``COMMBENCH_PIN_RANKS=1``), one thread each; a spinning process shares
core 1 with rank 1. Each round runs the same grid with and without the hog, side by side, and prints what the
straggler view (``commbench.measure.stragglers``) names and the share of points at which rank 1 arrived last.
The test suite checks the detection with an injected lag instead (``tests/test_stragglers.py``), which no other
load can hide; this is the version with a real busy core, whose effect other work on the machine dilutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from commbench.measure.stragglers import stragglers

GRID = ["--collectives", "all_reduce,all_gather,reduce_scatter", "--precisions", "fp32,bf16_compress",
        "-b", "128K", "-e", "16M", "-f", "2", "--nproc", "2", "--no-training", "--no-report", "--quiet",
        "--min-time", "0.005", "--min-iters", "1", "--max-time", "0.5"]  # fmt: skip


def one_run(out: Path, hog: bool) -> tuple[str, float]:
    """(who the view names, the share of points where rank 1 waited least, i.e. arrived last)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["COMMBENCH_PIN_RANKS"] = "1"
    spin = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while True: pass"]) if hog else None
    try:
        subprocess.run([sys.executable, "-m", "commbench", "run", *GRID, "--out", str(out)], check=True,
                       capture_output=True, env=env, timeout=600)  # fmt: skip
    finally:
        if spin is not None:
            spin.kill()
            spin.wait()
    ranks = pd.read_csv(out / "ranks.csv")
    waits = ranks.pivot_table(index=["collective", "precision", "fp32_bytes"], columns="rank", values="wait_us")
    last = float((waits[1] < waits[0]).mean())
    named = ", ".join(f"{s['kind']} {s['who']}" for s in stragglers(ranks)) or "nobody"
    return named, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        raise SystemExit("needs taskset and 2 cores")
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for hog in (False, True):
                named, last = one_run(Path(tmp) / f"r{r}-{int(hog)}", hog)
                print(f"round {r} {'busy core 1' if hog else 'quiet      '}: straggler named: {named}; "
                      f"rank 1 last at {last:.0%} of points")  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
