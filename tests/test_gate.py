"""`commbench check` (the gate) and the per-node view, on run directories written here with chosen numbers: a
point fails only when its interval lies entirely on the wrong side of the bar (the expected intervals are worked
out in the tests from the formulas: busbw / link rate, the log-space ratio of two medians)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from commbench.cli import main
from commbench.cluster.metadata import build_metadata
from commbench.core.records import CollectivePoint, RankPoint
from commbench.core.stats import Z95
from commbench.store.results import RunWriter
from commbench.views.gate import Bars, check_run, node_view, parse_slowdown

LINK = "inter-node: 1 × 200 Mb/s tbf (eth0) on b; slowest of 2 nodes (fastest 0.05 GB/s)"


def point(size: int, time_us: float, ci: float, *, busbw: float | None = None, **over: Any) -> CollectivePoint:
    """An all_reduce fp32 point on 2 ranks: busbw = size / time (bus factor 1 at n = 2), interval from time's."""
    lo, hi = time_us * (1 - ci), time_us * (1 + ci)
    bw = size / time_us / 1e3 if busbw is None else busbw
    base: dict[str, Any] = dict(
        collective="all_reduce", precision="fp32", impl="native", backend="gloo", device="cpu", world_size=2,
        nodes=2, payload="normal", dtype="float", size_bytes=size, count=size // 4, fp32_bytes=size,
        wire_bytes=size, time_us=time_us, time_us_max=time_us, time_ci_low_us=lo, time_ci_high_us=hi,
        p50_us=time_us, p95_us=time_us, cv=0.01, rank_spread=0.0, iters=1, samples=20, algbw_gbps=bw,
        busbw_gbps=bw, busbw_ci_low_gbps=bw * time_us / hi, busbw_ci_high_gbps=bw * time_us / lo, encode_us=0.0,
        comm_us=time_us, decode_us=0.0, total_us=time_us, effective_gbps=bw, wrong=0, tolerance=0.0, rel_err=0.0,
        max_abs_err=0.0, timestamp="2026-12-02T00:00:00+00:00", link_gbps=0.025, link_util=bw / 0.025, link=LINK,
        link_host="b",
    )  # fmt: skip
    base.update(over)
    return CollectivePoint(**base)


def write_run(path: Path, points: list[CollectivePoint], ranks: list[RankPoint] = (), reports: Any = ()) -> Path:  # type: ignore[assignment]
    w = RunWriter(path)
    w.write_metadata(build_metadata(
        start_time="t0", end_time=None, host="a", hosts=["a", "b"], device_name="cpu", backend="gloo", world_size=2,
        nodes=2, nproc_per_node=1, threads_per_rank=1, launcher="torchrun", torch_version=None, nccl_version=None,
        suite={}, timing={}, argv=[], extra={"node_reports": list(reports)},
    ))  # fmt: skip
    w.add(points)
    if ranks:
        w.add(ranks)
    return path


# 1 MiB at 1 ms = 1.048576 GB/s (small), 4 MiB at 200 ms = 0.02097 GB/s, its interval ±2 % of time
MIB = 1 << 20


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run", [point(MIB, 1000.0, 0.02), point(4 * MIB, 200_000.0, 0.02)])


def test_min_busbw_judges_the_largest_size_by_its_interval(run: Path) -> None:
    bw = 4 * MIB / 200_000.0 / 1e3  # 0.020972 GB/s; interval bw/1.02 .. bw/0.98 = 0.020561 .. 0.021400
    assert check_run(run, Bars(min_busbw=0.0213)).failures == []  # inside the interval: not significant
    res = check_run(run, Bars(min_busbw=0.0215))
    assert res.judged == {"busbw": 1} and len(res.failures) == 1  # 1 MiB is not judged (not the largest)
    f = res.failures[0]
    assert f.startswith("all_reduce fp32 [world] 4 MiB: busbw 0.02097 GB/s [0.02056-0.0214] is below 0.0215 GB/s")
    assert f.endswith("the slowest link is b's: 1 × 200 Mb/s tbf (eth0) (slowest of 2 nodes (fastest 0.05 GB/s))")
    assert bw / 1.02 < 0.0213 < bw / 0.98 < 0.0215
    # --from-size: every point from that size
    assert check_run(run, Bars(min_busbw=0.0215, from_size=MIB)).judged == {"busbw": 2}


def test_min_link_util_divides_by_the_link(run: Path) -> None:
    util = 4 * MIB / 200_000.0 / 1e3 / 0.025  # 0.8389, interval 0.8224 .. 0.8560
    assert check_run(run, Bars(min_link_util=0.85)).failures == []
    res = check_run(run, Bars(min_link_util=0.86))
    assert len(res.failures) == 1 and f"link_util {util:.2f} [0.82-0.86] is below 0.86" in res.failures[0]


def test_a_point_without_an_interval_is_judged_on_its_value(tmp_path: Path) -> None:
    p = point(4 * MIB, 200_000.0, 0.02, busbw_ci_low_gbps=math.nan, busbw_ci_high_gbps=math.nan)
    res = check_run(write_run(tmp_path / "r", [p]), Bars(min_busbw=0.0213))
    assert len(res.failures) == 1 and "(no interval)" in res.failures[0]


def test_max_slowdown_uses_both_runs_intervals(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", [point(4 * MIB, 100_000.0, 0.01)])
    slow = write_run(tmp_path / "slow", [point(4 * MIB, 130_000.0, 0.01)])
    # log-space: se of each = ln(1.01/0.99) / (2 z); one ratio judged (m = 1): interval 1.3 * exp(+-z * hypot)
    se = math.log(1.01 / 0.99) / (2 * Z95)
    lo = 1.3 * math.exp(-Z95 * math.hypot(se, se))
    assert 1.25 < lo < 1.3
    res = check_run(slow, Bars(max_slowdown=0.25), base)
    assert len(res.failures) == 1
    assert f"time 1.300x the baseline's [{lo:.3f}-" in res.failures[0] and "(--max-slowdown 25%)" in res.failures[0]
    assert check_run(slow, Bars(max_slowdown=0.29), base).failures == []  # 1.29 inside the interval
    assert check_run(base, Bars(max_slowdown=0.0), base).failures == []  # a run against itself
    assert parse_slowdown("10%") == pytest.approx(0.1) and parse_slowdown("0.25") == 0.25


def test_cli_exit_codes(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(run), "--min-busbw", "0.0215"]) == 1
    out = capsys.readouterr().out
    assert "FAIL all_reduce fp32 [world] 4 MiB: busbw" in out and "1 point(s) significantly below the bar" in out
    assert "# inter-node all_reduce fp32 reaches 0.84 [0.82-0.86] of 1 × 200 Mb/s tbf (eth0) on b" in out
    assert main(["check", str(run), "--min-busbw", "0.02"]) == 0
    assert "every bar holds" in capsys.readouterr().out
    for bad, said in (
        ([], "check needs at least one bar"),
        (["--max-slowdown", "10%"], "--max-slowdown needs --baseline"),
        (["--max-slowdown", "ten", "--baseline", str(run)], "--max-slowdown must look like 10% or 0.1"),
        (["--min-link-util", "80"], "--min-link-util is a fraction"),
        (["--min-busbw", "-1"], "must be > 0"),
    ):
        assert main(["check", str(run), *bad]) == 2, bad
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, (bad, err)
    assert main(["check", str(run.parent / "missing"), "--min-busbw", "1"]) == 2


def test_node_view_names_the_slow_node_its_spikes_and_the_links(tmp_path: Path) -> None:
    # 2 nodes x 2 ranks, 8 points; rank 3 (node b) arrives last at every barrier (waits least) and at two points
    # its own time is 3x the others'
    ranks = []
    for k in range(8):
        for r in range(4):
            t = 100.0 * (3 if r == 3 and k < 2 else 1)
            ranks.append(RankPoint(collective="all_reduce", precision="fp32", payload="normal", fp32_bytes=1024 << k,
                                   rank=r, host="ab"[r // 2], time_us=t, wait_us=5.0 if r == 3 else 50.0 + r))  # fmt: skip
    reports = [
        {"host": "a", "ranks": [0, 1], "link": {"gbps": 0.025, "label": "1 × 200 Mb/s tbf (eth0)"}},
        {"host": "b", "ranks": [2, 3], "link": {"gbps": 0.00625, "label": "1 × 50 Mb/s tbf (eth0)"}},
    ]
    run = write_run(tmp_path / "nodes", [point(MIB, 1000.0, 0.02)], ranks, reports)
    table, notes = node_view(run)
    assert table[0].split()[:2] == ["node", "ranks"]
    a, b = (line.split() for line in table[1:])
    assert a[:2] == ["a", "0,1"] and b[:2] == ["b", "2,3"]
    # node b's time/median: per point its ranks' medians over the point's median: 1 (6 points) -> median 1.0
    assert float(b[2]) == pytest.approx(1.0) and int(b[5]) == 2  # two spikes (3x > 1.5x)
    assert int(b[4]) == 8  # waited for at all 8 points
    text = "\n".join(notes)
    assert "straggler: rank 3 is the one the others wait for in 8 of 8 points" in text
    assert "straggler: node" not in text  # b: 8 of 8 at chance 1/2, p = 0.0039, above the 1e-3 alarm level
    assert "spikes: rank 3 on b at 2 point(s), over 1.5x the other ranks' median" in text and "(3.0x)" in text
    assert "nodes' links differ: b (1 × 50 Mb/s tbf (eth0)) below the fastest 0.025 GB/s" in text


def test_an_nccl_tests_import_is_judged_on_its_values_per_placement(tmp_path: Path) -> None:
    from commbench.store.nccl_import import import_nccl_tests

    log = Path(__file__).parent / "data" / "nccl_all_reduce_float.txt"
    # its last row: 16777216 B, busbw 56.62 GB/s out of place, 54.98 in place
    run = import_nccl_tests(log, tmp_path / "imp")
    res = check_run(run, Bars(min_busbw=55.0))
    assert res.failures == ["all_reduce fp32 [world] in-place 16 MiB: busbw 54.98 GB/s (no interval) is below 55 GB/s"]
    assert res.judged == {"busbw": 2}
    with pytest.raises(ValueError, match="no point of .* has a link rate"):
        check_run(run, Bars(min_link_util=0.8))
