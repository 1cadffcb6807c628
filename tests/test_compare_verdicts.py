"""compare and check on nccl-tests imports (issue 33 item 6): point estimates get a threshold verdict labelled as
such, per-iteration data gives an interval, and compare and check agree on the same pair (one decision,
``stats.judge``). The logs are written by tests/nccl_writers.py (nccl-tests' own writers, ported)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from commbench.cli import main
from commbench.core import stats
from commbench.store.nccl_import import import_nccl_tests
from commbench.views import compare
from commbench.views.gate import Bars, check_run
from tests import nccl_writers as w

SIZES = [1 << k for k in range(16, 24, 2)]  # 64K .. 4M: 4 sizes, each out-of-place and in-place
BASE = {s: 20.0 + s / 2.0e4 for s in SIZES}  # us: a latency and a 20 GB/s slope


def _log(tmp: Path, name: str, scale: float, jitter: float = 0.0) -> Path:
    ms = [w.Measure(s, {"out-of-place": BASE[s] * scale * (1 + jitter), "in-place": BASE[s] * scale * (1 - jitter)}) for s in SIZES]
    (tmp / f"{name}.txt").write_text(w.nccl_text("all_reduce", ms, w.Layout(procs=1, ngpus=8)))
    return import_nccl_tests(tmp / f"{name}.txt", tmp / name)


def _json(tmp: Path, name: str, scale: float) -> Path:
    # -I 1: 40 iterations per placement, +-3 % around the point's time (a fixed pattern, so the test is exact)
    ms = []
    for s in SIZES:
        its = {p: [BASE[s] * scale * (1 + 0.03 * math.sin(1.7 * i + k)) for i in range(40)]
               for k, p in enumerate(("out-of-place", "in-place"))}  # fmt: skip
        ms.append(w.Measure(s, {p: sum(v) / len(v) for p, v in its.items()}, iter_times=its))
    (tmp / f"{name}.json").write_text(w.nccl_json("all_reduce", ms, w.Layout(procs=1, ngpus=8), mpi=False, per_iter=True, iters=40))
    return import_nccl_tests(tmp / f"{name}.json", tmp / name)


def _failing_points(result: list[str]) -> set[tuple[str, str]]:
    """(placement, size) of each failure line of check: 'all_reduce fp32 [world] out-of-place 64 KiB: ...'."""
    out = set()
    for line in result:
        head = line.split(":")[0].split()
        out.add((head[3], " ".join(head[4:])))
    return out


def test_a_5x_slowdown_of_two_text_logs_compare_says_slower_on_threshold_and_check_fails_the_same(tmp_path: Path) -> None:
    a, b = _log(tmp_path, "a", 1.0), _log(tmp_path, "b", 5.0)
    out = compare.compare_runs([a, b], ["A", "B"], tmp_path / "cmp")
    rf = pd.read_csv(out["csv"])
    assert len(rf) == 2 * len(SIZES)
    assert set(rf["basis"]) == {"threshold"} and rf["significant"].isna().all()  # no significance claimed
    assert set(rf["verdict"]) == {"B slower (threshold 5%, point estimates)"}
    # the ratio is the logs' own: 5x at every point (nccl-tests prints times to 2 decimals)
    assert rf["time_ratio"].tolist() == pytest.approx([5.0] * len(rf), rel=1e-3)
    gate = check_run(b, Bars(max_slowdown=0.10), baseline=a)
    assert gate.exit_code == 1 and gate.judged["slowdown"] == len(rf)
    slower = {(r.placement, r.size_bytes) for r in rf.itertuples() if "slower" in r.verdict}
    assert len(_failing_points(gate.failures)) == len(slower) == 2 * len(SIZES)
    assert all("point estimates, no interval" in f for f in gate.failures)
    md = out["md"].read_text()
    assert "threshold 5%, point estimates" in md
    lines = compare.console_lines(out["csv"])
    assert "8 of 8 point estimates differ by more than the threshold (±5%, --threshold)" in lines[-1]


def test_an_a_a_pair_of_text_logs_is_no_difference_in_both(tmp_path: Path) -> None:
    a, b = _log(tmp_path, "a", 1.0), _log(tmp_path, "b", 1.0, jitter=0.01)  # +-1 %: within the 5 % threshold
    rf = compare.ratio_frame(compare.aligned([compare.load_run(a), compare.load_run(b)], ["A", "B"]), ["A", "B"])
    assert set(rf["verdict"]) == {"within threshold (±5%, point estimates)"}
    gate = check_run(b, Bars(max_slowdown=0.05), baseline=a)
    assert gate.exit_code == 0 and not gate.failures


def test_compare_and_check_agree_at_every_threshold(tmp_path: Path) -> None:
    # B 8 % slower: compare --threshold X calls it slower exactly when check --max-slowdown X fails it
    a, b = _log(tmp_path, "a", 1.0), _log(tmp_path, "b", 1.08)
    al = compare.aligned([compare.load_run(a), compare.load_run(b)], ["baseline", "run"])
    for x in (0.02, 0.05, 0.079, 0.081, 0.10):
        rf = compare.ratio_frame(al, ["baseline", "run"], threshold=x)
        slower = int(rf["verdict"].str.contains("slower").sum())
        failed = len(check_run(b, Bars(max_slowdown=x), baseline=a).failures)
        assert slower == failed == (len(rf) if x < 0.08 else 0), x


def test_per_iteration_json_gives_an_interval_and_a_significance_verdict(tmp_path: Path) -> None:
    a, b = _json(tmp_path, "a", 1.0), _json(tmp_path, "b", 5.0)
    al = compare.aligned([compare.load_run(a), compare.load_run(b)], ["A", "B"])
    # the interval of A's point: the order-statistic interval of its 40 iterations' median, scaled to its time
    row = al[(al["size_bytes"] == SIZES[0]) & (al["placement"] == "out-of-place")].iloc[0]
    its = [BASE[SIZES[0]] * (1 + 0.03 * math.sin(1.7 * i)) for i in range(40)]
    ci = stats.median_ci(its)
    t = row["time_us|A"]
    assert row["time_ci_low_us|A"] == pytest.approx(t * ci.low / ci.value, rel=1e-3)
    assert row["time_ci_high_us|A"] == pytest.approx(t * ci.high / ci.value, rel=1e-3)
    rf = compare.ratio_frame(al, ["A", "B"])
    assert set(rf["basis"]) == {"interval"} and rf["significant"].all() and set(rf["verdict"]) == {"B slower"}
    same = compare.ratio_frame(compare.aligned([compare.load_run(a), compare.load_run(a)], ["A", "B"]), ["A", "B"])
    assert set(same["verdict"]) == {"no significant difference"}


def test_threshold_flag_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _log(tmp_path, "a", 1.0), _log(tmp_path, "b", 1.08)
    assert main(["compare", str(a), str(b), "--threshold", "10%", "--out", str(tmp_path / "c1")]) == 0
    assert "0 of 8 point estimates differ by more than the threshold (±10%" in capsys.readouterr().out
    assert main(["compare", str(a), str(b), "--threshold", "lots", "--out", str(tmp_path / "c2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--threshold must look like 10% or 0.1" in err[0]


def _cycles(tmp: Path, name: str, scale: float, n: int) -> Path:
    # -N n: the table's rows repeat once per cycle, each cycle's times +-2 % (a fixed pattern)
    ms = [w.Measure(s, {p: BASE[s] * scale * (1 + 0.02 * math.sin(2.3 * c + k)) for k, p in enumerate(("out-of-place", "in-place"))})
          for c in range(n) for s in SIZES]  # fmt: skip
    (tmp / f"{name}.txt").write_text(w.nccl_text("all_reduce", ms, w.Layout(procs=1, ngpus=8)))
    return import_nccl_tests(tmp / f"{name}.txt", tmp / name)


def test_six_cycles_give_an_interval_fewer_a_threshold_verdict(tmp_path: Path) -> None:
    a, b = _cycles(tmp_path, "a", 1.0, 6), _cycles(tmp_path, "b", 1.3, 6)
    assert sorted(set(pd.read_csv(a / "results.csv")["cycle"])) == list(range(6))
    al = compare.aligned([compare.load_run(a), compare.load_run(b)], ["A", "B"])
    # the interval of the median of 6 cycles: their min and max (order statistics 1 and 6, coverage 96.9 %)
    row = al[(al["size_bytes"] == SIZES[1]) & (al["placement"] == "in-place")].iloc[0]
    times = pd.read_csv(a / "results.csv")
    times = times[(times["size_bytes"] == SIZES[1]) & (times["placement"] == "in-place")]["time_us"]
    assert row["time_us|A"] == pytest.approx(times.median())
    assert (row["time_ci_low_us|A"], row["time_ci_high_us|A"]) == pytest.approx((times.min(), times.max()))
    rf = compare.ratio_frame(al, ["A", "B"])
    assert set(rf["basis"]) == {"interval"} and set(rf["verdict"]) == {"B slower"}
    # 3 cycles cannot make a 95 % interval: point estimates (their median), a threshold verdict
    a3, b3 = _cycles(tmp_path, "a3", 1.0, 3), _cycles(tmp_path, "b3", 1.3, 3)
    rf3 = compare.ratio_frame(compare.aligned([compare.load_run(a3), compare.load_run(b3)], ["A", "B"]), ["A", "B"])
    assert set(rf3["basis"]) == {"threshold"} and set(rf3["verdict"]) == {"B slower (threshold 5%, point estimates)"}
