"""``plan --replay DIR``: the job's own calls as the layout's communication, checked against the sum of the replay's
measured rows and against the ring formula written out here (nccl-tests' all_reduce bus factor 2(n-1)/n, 2(n-1)
latency steps), and its refusals (one line, exit 2)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from commbench.planning import replay_comm
from tests.cli_util import commbench_here

ALPHA_S, BETA_S = 20e-6, 1 / 5e9  # per latency step; per bus byte (5 GB/s bus bandwidth)
WORLD = 4
SHAPE = ["--layers", "2", "--hidden", "256", "--heads", "4", "--ffn", "512", "--vocab", "1024", "--seq", "128",
         "--global-batch", "64"]  # fmt: skip


def ring_all_reduce_us(size: int, n: int) -> float:
    return 1e6 * (ALPHA_S * 2 * (n - 1) + size * BETA_S * 2 * (n - 1) / n)


ROWS = [  # (collective, size_bytes, calls_per_step): a DDP step's buckets and a small all_gather
    ("all_reduce", 1 << 20, 3), ("all_reduce", 4 << 20, 2), ("all_reduce", 16 << 20, 1),
]  # fmt: skip


def write_replay(d: Path, *, world: int = WORLD, precisions: tuple[str, ...] = ("fp32", "bf16")) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    cols = ["collective", "size_bytes", "dtype", "group", "group_size", "precision", "calls_per_step", "time_us",
            "time_ci_low_us", "time_ci_high_us", "trace_precision"]  # fmt: skip
    with open(d / "replay.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for p in precisions:
            wire = 0.5 if p == "bf16" else 1.0  # bf16 carries half the bytes: half the bandwidth term
            for coll, size, calls in ROWS:
                t = 1e6 * (ALPHA_S * 2 * (world - 1) + size * wire * BETA_S * 2 * (world - 1) / world)
                w.writerow({"collective": coll, "size_bytes": size, "dtype": "float32", "group": "world",
                            "group_size": world, "precision": p, "calls_per_step": calls, "time_us": t,
                            "time_ci_low_us": 0.95 * t, "time_ci_high_us": 1.05 * t,
                            "trace_precision": p == "fp32"})  # fmt: skip
    (d / "replay.json").write_text(json.dumps({"world_size": world}))
    return d


def test_measured_layout_is_the_sum_of_calls_times_time(tmp_path: Path) -> None:
    rep = replay_comm.load_replay(write_replay(tmp_path / "r"))
    rows = replay_comm.price(rep, tp=1, pp=1, dp=WORLD, cp=1, precisions=["fp32"])
    expect = sum(c * ring_all_reduce_us(s, WORLD) for _, s, c in ROWS)
    assert sum(float(r["step_us"]) for r in rows) == pytest.approx(expect, rel=1e-9)  # type: ignore[arg-type]
    assert sum(float(r["step_ci_high_us"]) for r in rows) == pytest.approx(1.05 * expect, rel=1e-9)  # type: ignore[arg-type]
    assert {r["source"] for r in rows} == {"replay"}


def test_twice_the_dp_ranks_follows_the_ring_formula(tmp_path: Path) -> None:
    rep = replay_comm.load_replay(write_replay(tmp_path / "r"))
    rows = replay_comm.price(rep, tp=1, pp=1, dp=2 * WORLD, cp=1, precisions=["fp32"])
    for r, (_, size, calls) in zip(rows, ROWS, strict=True):
        assert r["source"] == "replay-fit" and r["group_size"] == 2 * WORLD and r["dim"] == "dp"
        assert float(r["time_us"]) == pytest.approx(ring_all_reduce_us(size, 2 * WORLD), rel=1e-6)  # type: ignore[arg-type]
        assert r["calls_per_step"] == calls


def test_cli_writes_plan_replay_and_names_sources(tmp_path: Path) -> None:
    d = write_replay(tmp_path / "r")
    out = tmp_path / "plan"
    p = commbench_here("plan", *SHAPE, "--dp", str(2 * WORLD), "--precisions", "bf16", "--replay", str(d), "--out",
                       str(out), cwd=tmp_path)  # fmt: skip
    assert p.returncode in (0, 1), p.stderr
    line = next(x for x in p.stdout.splitlines() if x.startswith("# replay communication bf16"))
    assert "6 calls replay-fit" in line and "TP 1 x PP 1 x DP 8" in line and "; preset: " in line
    with open(out / "plan_replay.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["precision"] for r in rows] == ["bf16"] * len(ROWS)
    # the bf16 rows measured half the bandwidth term: their fit scales it, the latency kept
    got = sum(int(r["calls_per_step"]) * float(r["time_us"]) for r in rows)
    n = 2 * WORLD
    expect = sum(c * 1e6 * (ALPHA_S * 2 * (n - 1) + s * 0.5 * BETA_S * 2 * (n - 1) / n) for _, s, c in ROWS)
    assert got == pytest.approx(expect, rel=1e-6)


def test_columns_read_are_the_replay_writers() -> None:
    from commbench.cli.replay_cmd import ROW_COLUMNS

    assert set(replay_comm.NEEDED) <= set(ROW_COLUMNS)


def test_one_size_takes_the_preset_latency(tmp_path: Path) -> None:
    row = replay_comm.Row("all_reduce", 1 << 20, "float32", 4, "fp32", 1, 300.0, 290.0, 310.0)
    f = replay_comm.fit([row], "all_reduce", 4)
    assert f.preset_alpha and f.alpha_s * 6 + (1 << 20) * f.beta_s_per_byte * 1.5 == pytest.approx(300e-6)


@pytest.mark.parametrize("case, needle", [
    ("missing", "no such directory"),
    ("empty", "no replay.csv in it"),
    ("world", "its world of 6 ranks cannot be laid out as tp*pp*cp = 4 x dp; valid tp*pp*cp for it: 1, 2, 3, 6"),
    ("precision", "no fp8_e4m3 rows for plan precision fp8; its precisions: bf16, fp32"),
    ("search", "--replay prices one layout"),
])  # fmt: skip
def test_bad_replay_is_one_line_exit_2(case: str, needle: str, tmp_path: Path) -> None:
    d = tmp_path / "r"
    if case == "empty":
        d.mkdir()
    elif case != "missing":
        write_replay(d, world=6 if case == "world" else WORLD)
    extra = {"world": ["--tp", "4"], "precision": ["--precisions", "fp8"], "search": ["--gpus", "8"]}.get(case, [])
    p = commbench_here("plan", *SHAPE, *extra, "--replay", str(d), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr
