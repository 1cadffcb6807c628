"""Rows as each pass ends (issue 33 item 4): the per-pass journal, provisional rows, a stopped run's report, and a
--resume that measures only the passes that are missing (counted from the trace hook, not timed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import commbench
from commbench.core.records import CollectivePoint
from commbench.measure.check import Check
from commbench.measure.passes import GroupState, group_key, pass_entry, pass_line, restore
from commbench.measure.timing import Rounds
from commbench.store.results import RunWriter, latest_per_key, read_journal
from tests.cli_util import FAST
from tests.cli_util import commbench as run_cli

# 3 passes, 6 rounds at least (2 per pass): each pass journals rounds of its own
GRID = ["--collectives", "all_reduce", "--precisions", "fp32,bf16", "-b", "1K", "-e", "2K", "-f", "2"]
TIMING = ["--min-time", "0.002", "--min-iters", "1", "--repeats", "6", "--warmup", "1", "--passes", "3", "--max-time", "0.6"]
QUIET = ["--no-report", "--no-training"]


def _rounds(vals: list[list[list[list[float]]]], waits: list[list[float]], elapsed: float) -> Rounds:
    n = len(waits[0])
    return Rounds(
        iters=tuple(tuple(20 for _ in c) for c in vals),
        samples=tuple(tuple(tuple(tuple(r) for r in ph) for ph in c) for c in vals),
        waits=tuple(tuple(w) for w in waits), rounds=n, converged=False, elapsed_s=elapsed,
    )  # fmt: skip


def _check() -> Check:
    return Check(wrong=0, tolerance=0.0, rel_err=1e-3, comm_rel_err=math.nan, max_abs_err=2e-3)


def test_journal_entries_replay_to_the_concatenated_rounds() -> None:
    # two passes of a 2-contender, 2-rank group: contender 0 one phase, contender 1 three (encode, comm, decode)
    p1 = [[[[1.0, 2.0], [1.5, 2.5]]], [[[0.1, 0.2], [0.1, 0.2]], [[3.0, 4.0], [3.5, 4.5]], [[0.3, 0.4], [0.3, 0.4]]]]
    more = [[[[5.0], [5.5]]], [[[0.5], [0.5]], [[6.0], [6.5]], [[0.6], [0.6]]]]
    both = [[[a + b for a, b in zip(pa, pb, strict=True)] for pa, pb in zip(ca, cb, strict=True)] for ca, cb in zip(p1, more, strict=True)]
    r1 = _rounds(p1, [[0.01, 0.02], [0.0, 0.0]], 0.5)
    r2 = _rounds(both, [[0.01, 0.02, 0.03], [0.0, 0.0, 0.0]], 0.8)
    key = group_key("all_reduce", "world", 1024, "normal")
    s1 = GroupState([_check(), _check()], r1, [1024, 520], [False, True], [0, 2], passes=1)
    s2 = GroupState([_check(), _check()], r2, [1024, 520], [False, True], [0, 2], passes=2)
    names = ["fp32", "bf16", "fp8_e4m3"]  # bf16 (position 1) was skipped: live holds positions 0 and 2
    rows = [pass_entry(key, ["fp32", "fp8_e4m3"], s1, None, 0, 3), pass_entry(key, ["fp32", "fp8_e4m3"], s2, r1, 1, 3)]
    assert rows[1]["rounds"] == 1 and rows[1]["samples"][0] == [[[5.0], [5.5]]]  # only the pass's own rounds
    # through a real journal (NaN in a check survives), as a resumed run reads it
    got = restore(json.loads(json.dumps([json.loads(json.dumps(r)) for r in rows])), {key: names})[key]
    assert got.rounds.samples == r2.samples and got.rounds.waits == r2.waits and got.rounds.rounds == 3
    assert got.rounds.elapsed_s == pytest.approx(0.8) and got.live == [0, 2] and got.passes == 2
    assert math.isnan(got.checks[0].comm_rel_err) and got.checks[1].rel_err == 1e-3
    # a gap (pass 1 missing) keeps pass 0 only; other precisions than the group's: measured again
    assert restore([rows[0], {**rows[1], "pass": 2}], {key: names})[key].passes == 1
    assert restore(rows, {key: ["fp32", "bf16"]}) == {}


def test_a_point_s_final_row_replaces_its_provisional_ones(tmp_path: Path) -> None:
    rows = [
        {"collective": "all_reduce", "precision": p, "payload": "normal", "fp32_bytes": s, "group": "world",
         "time_us": t, "partial": part}
        for p, s, t, part in [("fp32", 1024, 1.0, True), ("fp32", 2048, 2.0, True), ("fp32", 1024, 3.0, False)]
    ]  # fmt: skip
    assert [(r["fp32_bytes"], r["time_us"]) for r in latest_per_key(rows, CollectivePoint)] == [(2048, 2.0), (1024, 3.0)]
    w = RunWriter(tmp_path / "run")
    w.write_metadata({"schema_version": 2})
    w.add_rows("results", rows[:2])
    w.add_rows("results", rows[2:])
    assert len(read_journal(tmp_path / "run" / "rows.jsonl")) == 3  # the journal keeps every row written
    assert sorted(commbench.load(tmp_path / "run")["time_us"]) == [2.0, 3.0]
    again = RunWriter(tmp_path / "run", resume=True)
    assert again.done_keys() == {("all_reduce", "fp32", "normal", 1024, "world")}  # a provisional row is not done


def test_pass_line_names_every_point_s_estimate() -> None:
    line = pass_line("all_reduce 4K [world]", 0, 3, [
        {"precision": "fp32", "time_us": 40.0, "time_ci_low_us": 38.0, "time_ci_high_us": 42.0, "gain_vs_fp32": 1.0},
        {"precision": "bf16", "time_us": 30.0, "time_ci_low_us": 27.0, "time_ci_high_us": 33.0, "gain_vs_fp32": 1.37},
    ])  # fmt: skip
    assert line == "pass 1/3 all_reduce 4K [world]: fp32 40 us ±5%, bf16 30 us ±10% (1.37x)"


def _trace(path: Path) -> list[str]:
    """Rank 0's lines of the trace hook, without the rank."""
    return [line.split(" ", 1)[1] for line in path.read_text().splitlines() if line.startswith("0 ")]


@pytest.mark.timeout(300)
def test_interrupted_after_pass_1_keeps_it_reports_partial_and_resumes_passes_2_and_3(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = tmp_path / "trace1"
    proc = run_cli(
        "run", *GRID, *TIMING, *QUIET, "--nproc", "2", "--out", str(out), cwd=tmp_path,
        env={"COMMBENCH_INJECT_SIGNAL": "INT:1", "COMMBENCH_INJECT_TRACE": str(first)},
    )  # fmt: skip
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "interrupted" in proc.stderr and f"--resume {out}" in proc.stderr
    sizes = [1024, 2048]
    assert _trace(first) == [line for s in sizes for line in (f"check all_reduce {s} world", f"measure all_reduce {s} world pass 0")]
    # the journal holds pass 1's samples: per size both precisions, 2 ranks, at least its 2 of the 6 repeats
    entries = read_journal(out / "passes.jsonl")
    assert [(e["fp32_bytes"], e["pass"]) for e in entries] == [(1024, 0), (2048, 0)]
    for e in entries:
        assert e["precisions"] == ["fp32", "bf16"] and e["rounds"] >= 2
        assert all(len(rank) == e["rounds"] for c in e["samples"] for ph in c for rank in ph) and len(e["samples"][0][0]) == 2
    # provisional rows from them: the report renders, marked partial at the top and in the metadata
    df = commbench.load(out)
    assert sorted(df["fp32_bytes"]) == [1024, 1024, 2048, 2048] and df["partial"].all() and (df["passes_done"] == 1).all()
    meta = commbench.load_metadata(out)
    assert meta["partial"]["provisional_points"] == 4 and meta["partial"]["final_points"] == 0
    assert "SIGINT" in meta["partial"]["reason"] and meta["end_time"] is None
    from commbench.views.report import write_report

    md = write_report(out)["md"].read_text()
    assert "Partial run" in md and "4 provisional" in md and md.index("Partial run") < md.index("## Metadata")
    # --resume: passes 2 and 3 of each size only, no check again; every point final, from 3 passes
    second = tmp_path / "trace2"
    proc = run_cli("run", "--resume", str(out), "--no-report", cwd=tmp_path, env={"COMMBENCH_INJECT_TRACE": str(second)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(_trace(second)) == sorted(f"measure all_reduce {s} world pass {p}" for s in sizes for p in (1, 2))
    assert "pass 2/3 all_reduce 1K" in proc.stdout  # the running estimate after pass 2
    df = commbench.load(out)
    assert len(df) == 4 and not df["partial"].any() and (df["passes_done"] == 3).all()
    journal = read_journal(out / "passes.jsonl")
    # every pass's rounds are in the final row: the samples column counts the three passes' rounds together
    for s in sizes:
        rounds = sum(e["rounds"] for e in journal if e["fp32_bytes"] == s)
        assert set(df[df["fp32_bytes"] == s]["samples"]) == {rounds} and rounds >= 6
    meta = commbench.load_metadata(out)
    assert "partial" not in meta and meta["end_time"] is not None


class _NoMeasure:
    """A sweep whose every pass is already journaled: measuring would be a bug."""

    class suite:  # noqa: N801 - stands in for the suite's attributes the visit reads
        class timing:  # noqa: N801
            passes = 3

    def sample_group(self, *args: object) -> None:
        raise AssertionError("a pass in the journal was measured again")

    def finish_group(self, group: object, state: GroupState, indices: set[int], *, partial: bool) -> tuple[list[object], list[object]]:
        self.finished = (state.passes, partial)
        return [], []


def test_a_size_whose_passes_are_all_journaled_is_finished_without_measuring() -> None:
    from commbench.cli.sweep_run import _visit

    r = _rounds([[[[1.0], [1.0]]]], [[0.0], [0.0]], 0.1)
    state = GroupState([_check()], r, [1024], [False], [0], passes=3)
    sweep = _NoMeasure()
    for p in range(3):  # a resumed run visits every pass: the first two are skipped, the last only finishes
        got = _visit(sweep, None, None, (), None, {0}, state, p, quiet=True)  # type: ignore[arg-type]
        assert got is (None if p == 2 else state)
    assert sweep.finished == (3, False)


@pytest.mark.timeout(300)
def test_one_pass_prints_each_size_s_rows_as_it_finishes(tmp_path: Path) -> None:
    # --passes 1, rank 1 killed as the second size (run-order points 2, 3) starts: the first size's rows are on
    # stdout already and in the run directory, as nccl-tests prints a row per size
    out = tmp_path / "run"
    proc = run_cli(
        "run", *GRID, *FAST, "--passes", "1", "--max-time", "0.3", "--nproc", "2", "--out", str(out), cwd=tmp_path,
        env={"COMMBENCH_INJECT_FAULT": "kill:1:2"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert len(rows) == 2 and {r[1] for r in rows} == {"256"}  # count: 1K of fp32 = 256 elements, both precisions
    df = commbench.load(out)
    assert sorted(df["fp32_bytes"]) == [1024, 1024] and not df["partial"].any() and (df["passes_done"] == 1).all()


@pytest.mark.timeout(300)
def test_sigterm_after_pass_1_is_recorded_as_partial(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(
        "run", *GRID, *TIMING, *QUIET, "--nproc", "2", "--out", str(out), cwd=tmp_path,
        env={"COMMBENCH_INJECT_SIGNAL": "TERM:1"},
    )  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [e["pass"] for e in read_journal(out / "passes.jsonl")] == [0, 0]
    df = commbench.load(out)
    assert len(df) == 4 and df["partial"].all()
    assert "SIGTERM" in commbench.load_metadata(out)["partial"]["reason"]


def test_a_stop_mid_call_hands_over_the_exchanged_rounds() -> None:
    from commbench.measure.timing import PARTIAL_ROUNDS, measure_rounds

    calls = [0]

    def op() -> None:  # one call per sample (k = 1); the 6th call (calibration + 5 rounds) is interrupted
        calls[0] += 1
        if calls[0] == 6:
            raise KeyboardInterrupt("SIGINT")

    def timer(fn: object, k: int) -> float:  # a sample's seconds: 1 ms per call so far (never converging)
        fn()  # type: ignore[operator]
        return 0.001 * calls[0]

    kw = dict(warmup=0, min_time_s=0.0, min_iters=1, max_iters=1, max_rounds=100, target_rel_ci=-1.0, budget_s=1e9,
              exchange_s=0.0, timer=timer)  # fmt: skip
    with pytest.raises(KeyboardInterrupt) as info:
        measure_rounds([[op]], min_rounds=1, **kw)  # type: ignore[arg-type]
    cut = getattr(info.value, PARTIAL_ROUNDS)
    # every round was exchanged as it ended (exchange_s 0): the 4 before the interrupted 5th, one rank
    assert cut.rounds == 4 and cut.samples == ((((0.002, 0.003, 0.004, 0.005),),),) and not cut.converged
    # continuing a prior pass: its rounds and the new exchanged ones
    calls[0] = 1  # no calibration with a prior: the 5th new round's call is the 6th
    with pytest.raises(KeyboardInterrupt) as info:
        measure_rounds([[op]], min_rounds=1, prior=cut, **kw)  # type: ignore[arg-type]
    assert getattr(info.value, PARTIAL_ROUNDS).rounds == 4 + 4
    # stopped before any exchange of new rounds: nothing to hand over
    calls[0] = 5
    with pytest.raises(KeyboardInterrupt) as info:
        measure_rounds([[op]], min_rounds=1, prior=cut, **kw)  # type: ignore[arg-type]
    assert not hasattr(info.value, PARTIAL_ROUNDS)


def test_a_pass_cut_short_is_journaled_incomplete_and_resumed_where_it_stopped(tmp_path: Path) -> None:
    from commbench.cli.sweep_run import _visit
    from commbench.measure.passes import PARTIAL_STATE

    full = _rounds([[[[1.0, 1.1], [1.0, 1.1]]]], [[0.0, 0.0], [0.0, 0.0]], 0.2)
    cut = _rounds([[[[1.0, 1.1, 1.2], [1.0, 1.1, 1.2]]]], [[0.0] * 3, [0.0] * 3], 0.3)
    done = GroupState([_check()], full, [1024], [False], [0], passes=1)

    class Stopped(_NoMeasure):
        def sample_group(self, *args: object) -> None:
            e = KeyboardInterrupt("SIGINT")
            setattr(e, PARTIAL_STATE, GroupState([_check()], cut, [1024], [False], [0], passes=1))
            raise e

    class Group:
        points = [(0, type("P", (), {"precision": type("Q", (), {"name": "fp32"})()})())]

    w = RunWriter(tmp_path / "run")
    w.write_metadata({"schema_version": 2})
    key = group_key("all_reduce", "world", 1024, "normal")
    w.append_journal("passes", [pass_entry(key, ["fp32"], done, None, 0, 3)])
    sweep = Stopped()
    with pytest.raises(KeyboardInterrupt):
        _visit(sweep, w, None, key, Group(), {0}, done, 1, quiet=True)  # type: ignore[arg-type]
    rows = read_journal(tmp_path / "run" / "passes.jsonl")
    assert [(r["pass"], r["complete"], r["rounds"]) for r in rows] == [(0, True, 2), (1, False, 1)]
    assert sweep.finished == (1, True)  # the provisional rows from every round so far
    got = restore(rows, {key: ["fp32"]})[key]
    assert got.passes == 1 and got.rounds.rounds == 3  # pass 2 is measured again, continuing its exchanged round
    # the rest of pass 2, journaled when it completes, follows the cut entry
    rest = _rounds([[[[1.0, 1.1, 1.2, 1.3], [1.0, 1.1, 1.2, 1.3]]]], [[0.0] * 4, [0.0] * 4], 0.4)
    after = GroupState([_check()], rest, [1024], [False], [0], passes=2)
    rows.append(pass_entry(key, ["fp32"], after, got.rounds, 1, 3))
    again = restore(rows, {key: ["fp32"]})[key]
    assert again.passes == 2 and again.rounds.samples == rest.samples and again.rounds.elapsed_s == pytest.approx(0.4)


def test_the_first_stopping_signal_wins_for_its_grace_period(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal

    from commbench.cli import orchestrate

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        orchestrate._term_as_interrupt()
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # the launcher's answer, within the grace period: ignored
        monkeypatch.setattr(orchestrate, "STOP_GRACE_S", 0.0)  # a second Ctrl-C once it is over: raises again
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
