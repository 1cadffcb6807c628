"""How fast `commbench plan` answers (issue 32, item 6): one layout, 9600 layers, a search over >= 10^4 layouts.

    python benchmarks/bench_plan_speed.py [--repeat 3]

Each case is timed in-process after a warm-up call (the first call imports torch's distributed modules through the
training strategies: the CLI's start-up, measured apart by benchmarks/bench_cli_startup.py), best of ``--repeat``,
and printed next to its target as a ratio (< 1: within it). Targets: one layout well under 1 s (0.1 s here),
``--layers 9600`` (the flat strategies x precisions plan and a fixed layout) 2 s, a search over 10^4 layouts 10 s.
Not a test: the machine is shared and noisy; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's commbench

from commbench.planning.layout_plan import plan_layout  # noqa: E402
from commbench.planning.plan import plan  # noqa: E402
from commbench.planning.search import search  # noqa: E402


def best_of(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """(seconds of the fastest of ``repeat`` calls, the last result)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    plan_layout(model_preset="llama3-8b", tp=1, dp=8)  # warm-up: imports
    cases: list[tuple[str, float, Callable[[], Any]]] = [
        ("one layout (llama3-70b, TP 8 x PP 4 x DP 32)", 0.1,
         lambda: plan_layout(model_preset="llama3-70b", tp=8, pp=4, dp=32, nodes=128, sequence_parallel=True)),
        ("fixed layout, --layers 9600 (TP 8 x PP 64 x DP 2)", 2.0,
         lambda: plan_layout(model_preset="llama3-8b", layers=9600, tp=8, pp=64, dp=2, nodes=128)),
        ("flat plan, --layers 9600 (7 strategies x 3 precisions)", 2.0,
         lambda: plan(model_preset="llama3-8b", layers=9600, gpu="h100", nodes=8)),
        ("search, gpt3-175b on 768, 1536, 3072 GPUs (every TP, PP; vpp 1-2; mb 1-4; 7 strategies; 2 precisions)", 10.0,
         lambda: search(model_preset="gpt3-175b", gpu="a100", gpus=[768, 1536, 3072], micro_batch=[1, 2, 4])),
    ]  # fmt: skip
    print("| case | layouts | seconds | target | ratio |\n|---|---|---|---|---|")
    for name, target, fn in cases:
        t, df = best_of(fn, args.repeat)
        print(f"| {name} | {len(df)} | {t:.3f} | {target:g} | {t / target:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
