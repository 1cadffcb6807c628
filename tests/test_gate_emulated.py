"""link_util and the gate on an emulated 2-node cluster (root, network namespaces, ``tc tbf``; torn down after):
each node's shaped link reads as its own tbf rate, a point's link is the slower node's, and a node whose link is
shaped below the others' fails ``check --min-busbw`` with that node named. One job, kept small (2 cores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import commbench
from commbench.cli import main
from commbench.cluster.emulate import EmulatedCluster, missing_requirements
from commbench.cluster.emulate_jobs import launch_job
from tests.cli_util import FAST

WHY = missing_requirements()
PREFIX = "cbgate"


@pytest.mark.skipif(WHY is not None, reason=f"emulated hosts unavailable: {WHY}")
@pytest.mark.timeout(300)
def test_a_slowed_node_reads_as_its_rate_and_fails_the_gate_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    # node 0 at 200 Mbit/s, node 1 degraded to 50 Mbit/s (both directions of its link)
    with EmulatedCluster(nodes=2, rate="200mbit", node_rates={1: "50mbit"}, prefix=PREFIX) as c:
        slow_host = c.nodes[1].hostname
        job = launch_job(
            c, 1, ["run", "--collectives", "all_reduce", "--precisions", "fp32", "-b", "2M", "-e", "2M",
                   "--no-check", "--out", str(out), *FAST], timeout=240,
        )  # fmt: skip
    assert job.returncode == 0, [r.stderr[-2000:] for r in job.nodes]
    meta = json.loads((out / "metadata.json").read_text())
    links = {n["host"]: n["link"] for n in meta["node_reports"]}
    # each node's own report: its eth0 (a veth, 10 Gb/s) shaped by tbf; GB/s = Mbit/s * 1e6 / 8 / 1e9
    assert links[c.nodes[0].hostname]["gbps"] == pytest.approx(200e6 / 8 / 1e9)
    assert links[slow_host]["gbps"] == pytest.approx(50e6 / 8 / 1e9)
    assert links[slow_host]["label"] == "1 × 50 Mb/s tbf (eth0)"
    row = commbench.load(out).iloc[0]
    assert row["link_gbps"] == pytest.approx(50e6 / 8 / 1e9) and row["link_host"] == slow_host
    # 2 ranks: all_reduce busbw = the bytes each rank sends per second, under the slower link's rate (a little
    # over it at most: the tbf bucket passes its first 96 KiB at memory speed)
    assert 0.5 < row["link_util"] < 1.15, row["link_util"]
    assert row["link_util"] == pytest.approx(row["busbw_gbps"] / row["link_gbps"])

    # the gate at 80 % of the 200 Mbit/s the cluster should have: fails, naming the slow node
    assert main(["check", str(out), "--min-busbw", str(0.8 * 200e6 / 8 / 1e9)]) == 1
    said = capsys.readouterr().out
    fails = [line for line in said.splitlines() if line.startswith("FAIL ")]
    assert len(fails) == 1 and f"the slowest link is {slow_host}'s: 1 × 50 Mb/s tbf (eth0)" in fails[0], said
    assert f"nodes' links differ: {slow_host} (1 × 50 Mb/s tbf (eth0)) below the fastest 0.025 GB/s" in said
    # what the slow link allows passes
    assert main(["check", str(out), "--min-busbw", str(0.3 * 50e6 / 8 / 1e9)]) == 0


@pytest.mark.skipif(WHY is not None, reason=f"emulated hosts unavailable: {WHY}")
@pytest.mark.timeout(300)
def test_a_slow_rank_names_its_node_in_the_node_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # unshaped links; rank 1 (node 1) ends each collective call 3 ms late (COMMBENCH_INJECT_SLOW: a busy core), so
    # it arrives last at every barrier: 12 points (3 collectives x 4 sizes), each node holding half the ranks, 12
    # of 12 is p = 0.5**12 = 2.4e-4 < 1e-3
    out = tmp_path / "slow"
    with EmulatedCluster(nodes=2, prefix=PREFIX) as c:
        slow_host = c.nodes[1].hostname
        job = launch_job(
            c, 1, ["run", "--collectives", "all_reduce,all_gather,reduce_scatter", "--precisions", "fp32", "-b", "1K",
                   "-e", "8K", "-f", "2", "--no-check", "--out", str(out), *FAST],
            timeout=240, env={"COMMBENCH_INJECT_SLOW": "1:3"},
        )  # fmt: skip
    assert job.returncode == 0, [r.stderr[-2000:] for r in job.nodes]
    assert main(["check", str(out), "--min-busbw", "1e-9"]) == 0
    said = capsys.readouterr().out
    assert f"straggler: node {slow_host} is the one the others wait for in 12 of 12 points" in said, said
    assert "straggler: rank 1 is the one the others wait for in 12 of 12 points" in said
    row = next(line for line in said.splitlines() if line.startswith(f"#   {slow_host}"))
    assert row.split()[5] == "12"  # waited for at every point
