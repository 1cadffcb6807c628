"""One ``commbench run`` of the collectives of issue 33 as a user types it, nccl-tests' flags included
(``-r 1 -o max -G 3``), on 2 gloo ranks: every row's busbw / algbw is nccl-tests' factor (doc/PERFORMANCE.md),
its redop and root columns are what was asked, every check passes, the codec that cannot reduce by max is skipped
with one line, and CUDA-graph mode, which gloo cannot capture, says so in one line and times the ops eagerly."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.cli_util import commbench

COLLS = ["broadcast", "reduce", "gather", "scatter", "sendrecv", "pp_sendrecv", "all_reduce"]
FACTOR = {"broadcast": 1.0, "reduce": 1.0, "sendrecv": 1.0, "pp_sendrecv": 1.0, "gather": 0.5, "scatter": 0.5,
          "all_reduce": 1.0}  # fmt: skip
"""nccl-tests' bus factors at n = 2: 1 for broadcast, reduce, sendrecv; (n-1)/n for gather, scatter; 2(n-1)/n."""


@pytest.mark.timeout(300)
def test_rooted_and_p2p_collectives_run_with_nccl_tests_flags(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = commbench(
        "run", "--collectives", ",".join(COLLS), "--precisions", "fp32,fp8_e4m3", "--nproc", "2",
        "-b", "1K", "-e", "4K", "-f", "4", "-r", "1", "-o", "max", "-G", "3",
        "--warmup", "1", "--min-iters", "2", "--repeats", "3", "--passes", "1", "--max-time", "0.2",
        "--target-ci", "0.9", "--no-training", "--no-report", "--quiet", "--out", str(out),
        cwd=tmp_path, timeout=280, env={"COLUMNS": "250"},  # comment lines unwrapped: one line is one line
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    graph_lines = [line for line in p.stdout.splitlines() if "-G 3" in line]
    assert len(graph_lines) == 1 and "gloo" in graph_lines[0] and "eagerly" in graph_lines[0], p.stdout[-3000:]
    skips = [line for line in p.stdout.splitlines() if line.startswith("# skipped") and "fp8_e4m3" in line]
    # the codec reductions, one line each (said once for every size): the chunked algorithm sums, -o max cannot run
    assert sorted(line.split()[2] for line in skips) == ["all_reduce", "reduce"], skips
    assert all("fp32 sum" in line and "--op max" in line for line in skips)
    df = pd.read_csv(out / "results.csv")
    got = set(zip(df["collective"], df["precision"], strict=True))
    want = {(c, p) for c in COLLS for p in ("fp32", "fp8_e4m3")} - {("reduce", "fp8_e4m3"), ("all_reduce", "fp8_e4m3")}
    assert want <= got, want - got
    assert (df["wrong"] == 0).all()
    assert (df["timing_mode"] == "stream").all()  # no graph was captured on gloo
    for _, r in df.iterrows():
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * FACTOR[r["collective"]], rel=1e-9)
        reduces = r["collective"] in ("reduce", "all_reduce")
        assert r["redop"] == ("max" if reduces else "none")
        rooted = r["collective"] in ("broadcast", "reduce", "gather", "scatter")
        assert r["root"] == (1 if rooted else -1)
    # nccl-tests' count column: the buffer for broadcast/reduce/sendrecv, one rank's share for gather/scatter
    one = df[(df["fp32_bytes"] == 4096) & (df["precision"] == "fp32")].set_index("collective")["count"]
    assert one["broadcast"] == one["reduce"] == one["sendrecv"] == 1024 and one["gather"] == one["scatter"] == 512


@pytest.mark.timeout(120)
def test_a_root_outside_the_world_or_an_op_gloo_lacks_is_one_line_before_anything_runs(tmp_path: Path) -> None:
    for flags, words in ((["-r", "2"], ["broadcast", "root 2", "0..1"]), (["-o", "avg"], ["reduce", "'avg'", "gloo"])):
        out = tmp_path / "never"
        p = commbench("run", "--collectives", "broadcast,reduce", "--nproc", "2", *flags, "--out", str(out), cwd=tmp_path)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and all(w in lines[0] for w in words), lines
        assert not out.exists()
