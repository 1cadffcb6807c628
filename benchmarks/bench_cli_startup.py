"""Wall time of the commands a user types first: ``python -m commbench list``, ``--help`` and ``run --help``
(issue 13: instant, torch imported only where it is used), next to a bare interpreter and ``import torch``.

    PYTHONPATH=$PWD python benchmarks/bench_cli_startup.py [--runs 5]

Prints the median of ``--runs`` fresh subprocesses per command and its ratio to ``import torch``; no targets
asserted (a shared machine's load moves them), the ratio says whether a command still pays for torch.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "commbench --help": [sys.executable, "-m", "commbench", "--help"],
    "commbench run --help": [sys.executable, "-m", "commbench", "run", "--help"],
    "commbench list": [sys.executable, "-m", "commbench", "list"],
}


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="subprocesses per command (default 5)")
    args = ap.parse_args()
    medians: dict[str, float] = {}
    for label, cmd in COMMANDS.items():
        wall(cmd)  # warm the page cache: the first start reads every .pyc from disk
        medians[label] = statistics.median(wall(cmd) for _ in range(args.runs))
    torch_s = medians["python -c 'import torch'"]
    print(f"{'command':<28} {'median s':>9} {'x import torch':>15}   (median of {args.runs})")
    for label, s in medians.items():
        print(f"{label:<28} {s:>9.3f} {s / torch_s:>15.2f}")


if __name__ == "__main__":
    main()
