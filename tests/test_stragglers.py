"""Stragglers from the per-rank table: a binomial test against chance, checked on hand-made tables, and a real
2-rank run with one rank finishing its calls late (the busy-core version: benchmarks/bench_stragglers.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from commbench.measure.stragglers import binomial_sf, stragglers


def _table(waited_for: list[int], n_ranks: int, hosts: list[str] | None = None) -> pd.DataFrame:
    rows = []
    hosts = hosts or ["h"] * n_ranks
    for i, slow in enumerate(waited_for):
        for r in range(n_ranks):
            rows.append({"collective": "all_reduce", "precision": "fp32", "payload": "normal", "group": "world",
                         "fp32_bytes": 1024 * (i + 1), "rank": r, "host": hosts[r], "time_us": 100.0,
                         "wait_us": 5.0 if r == slow else 50.0})  # fmt: skip
    return pd.DataFrame(rows)


def test_binomial_tail_against_closed_forms() -> None:
    assert binomial_sf(10, 10, 0.5) == pytest.approx(0.5**10)
    assert binomial_sf(0, 7, 0.3) == pytest.approx(1.0)
    assert binomial_sf(1, 4, 0.25) == pytest.approx(1 - 0.75**4)


def test_a_rank_waited_for_every_time_is_named_with_its_lead() -> None:
    found = stragglers(_table([1] * 12, 2))
    assert [(s["kind"], s["who"], s["points"], s["of"]) for s in found] == [("rank", "1", 12, 12)]
    assert found[0]["p_value"] == pytest.approx(0.5**12)
    assert found[0]["lead_us"] == pytest.approx(45.0)


def test_chance_names_nobody() -> None:
    assert stragglers(_table([0, 1] * 8, 2)) == []
    assert stragglers(_table([1] * 5, 2)) == []  # too few points to say


def test_a_node_is_named_when_its_ranks_are() -> None:
    hosts = ["a", "a", "b", "b"]
    found = stragglers(_table([2, 3] * 8, 4, hosts))
    nodes = [s for s in found if s["kind"] == "node"]
    assert [(s["who"], s["points"], s["expected_share"]) for s in nodes] == [("b", 16, 0.5)]
    assert not [s for s in found if s["kind"] == "rank"]  # each of ranks 2, 3: 8 of 16 at p0 = 1/4 (p = 0.027)
    assert math.isclose(binomial_sf(8, 16, 0.25), 0.0271, abs_tol=1e-3)


@pytest.mark.timeout(240)
def test_a_late_rank_is_named_the_straggler(tmp_path: Path) -> None:
    # Rank 1 ends each collective call 3 ms late (COMMBENCH_INJECT_SLOW: the late finish of a rank on a busy core, as
    # a sleep, so other load on the machine cannot hide it); the others wait for it at every next call and barrier.
    # The real busy core (a spinning process pinned to rank 1's core) depends on the machine being otherwise quiet:
    # benchmarks/bench_stragglers.py runs it.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["COMMBENCH_INJECT_SLOW"] = "1:3"
    proc = subprocess.run(
        [sys.executable, "-m", "commbench", "run", "--collectives", "all_reduce,all_gather,reduce_scatter",
         "--precisions", "fp32", "-b", "1K", "-e", "8K", "-f", "2", "--nproc", "2", "--no-training", "--no-report",
         "--quiet", "--no-check", "--min-time", "0.005", "--min-iters", "1", "--max-time", "0.3",
         "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=200, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = pd.read_csv(tmp_path / "run" / "ranks.csv")
    assert set(ranks["rank"]) == {0, 1} and len(ranks) == 2 * 3 * 4  # ranks x collectives x sizes
    found = stragglers(ranks)
    # 12 of 12 points at chance 1/2: p = 2.4e-4; each wait is the injected 3 ms and more
    assert [(s["kind"], s["who"]) for s in found] == [("rank", "1")], found
    assert found[0]["lead_us"] > 2000, found
    assert "# straggler: rank 1 is the one the others wait for" in proc.stdout
