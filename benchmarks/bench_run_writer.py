"""Rank 0's cost of writing a run's points as they finish: the journal append plus the CSV and parquet rewrite after
every point (``TABLE_EVERY_S = 0``, the writer before 2026-12-04) against the rewrite at most every
:data:`commbench.store.results.TABLE_EVERY_S` and once at the end (today's), side by side in one run.

    PYTHONPATH=$PWD python benchmarks/bench_run_writer.py [--points 20,200,1000] [--repeats 3]

Each point is one results row written through :class:`commbench.store.results.RunWriter` into a fresh directory,
as a sweep writes its final rows, then ``flush()``; the figure is the median over ``--repeats`` of the whole write,
per point. Every rank waits for rank 0 between points, so this is time the whole run pays. No target asserted
(the machine's disk and load move it); the ratio says what the throttle saves as a run grows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import commbench.store.results as results  # noqa: E402
from commbench.cluster.metadata import build_metadata  # noqa: E402
from commbench.core.records import CollectivePoint  # noqa: E402


def _point(i: int) -> CollectivePoint:
    size = 1024 * (i + 1)
    return CollectivePoint(
        collective="all_reduce", precision="fp32", impl="native", backend="gloo", device="cpu", world_size=2,
        nodes=1, payload="normal", dtype="float", size_bytes=size, count=size // 4, fp32_bytes=size, wire_bytes=size,
        time_us=10.0, time_us_max=11.0, p50_us=10.0, p95_us=12.0, cv=0.05, rank_spread=0.1, iters=8, samples=5,
        algbw_gbps=0.1, busbw_gbps=0.1, encode_us=0.0, comm_us=10.0, decode_us=0.0, total_us=10.0,
        effective_gbps=0.1, wrong=0, tolerance=0.0, rel_err=0.0, max_abs_err=0.0,
        timestamp="2026-01-01T00:00:00+00:00",
    )  # fmt: skip


def write_run(points: int, every_s: float) -> float:
    """Seconds to write ``points`` rows one at a time and flush, with tables rewritten at most every ``every_s``."""
    saved = results.TABLE_EVERY_S
    results.TABLE_EVERY_S = every_s
    try:
        with tempfile.TemporaryDirectory() as tmp:
            w = results.RunWriter(Path(tmp) / "run")
            w.write_metadata(build_metadata(
                start_time="t0", end_time=None, host="h", hosts=["h"], device_name="cpu", backend="gloo",
                world_size=2, nodes=1, nproc_per_node=2, threads_per_rank=1, launcher="local", torch_version=None,
                nccl_version=None, suite={}, timing={}, argv=[],
            ))  # fmt: skip
            rows = [_point(i) for i in range(points)]
            t0 = time.perf_counter()
            for r in rows:
                w.add([r])
            w.flush()
            elapsed = time.perf_counter() - t0
            assert len(results.load(Path(tmp) / "run")) == points
            return elapsed
    finally:
        results.TABLE_EVERY_S = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", default="20,200,1000")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    print(f"| points | every point: ms/point | every {results.TABLE_EVERY_S:g} s + flush: ms/point | ratio |")
    print("|---|---|---|---|")
    for n in (int(x) for x in a.points.split(",")):
        old = statistics.median(write_run(n, 0.0) for _ in range(a.repeats)) / n * 1e3
        new = statistics.median(write_run(n, results.TABLE_EVERY_S) for _ in range(a.repeats)) / n * 1e3
        print(f"| {n} | {old:.2f} | {new:.2f} | {old / new:.1f}x |")


if __name__ == "__main__":
    main()
