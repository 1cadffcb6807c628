"""Runs that are safe to leave alone: file modes follow the umask, resume continues a run with its own world
and refuses changed settings, a torn journal line is cut (never glued to the next row), tables are rewritten
on resume, an unfinished run's report says so, and bad input (memory, --nproc, metadata.json) is one line."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import commbench
from commbench.store.results import RunDirError, RunWriter, load_metadata, read_journal
from tests.cli_util import FAST, commbench_here
from tests.cli_util import commbench as run_cli
from tests.views_util import fabricate_rows, fabricate_run

pytestmark = pytest.mark.timeout(300)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_files_honour_umask(tmp_path: Path, mask: int) -> None:
    from commbench.views.report import write_report

    old = os.umask(mask)
    try:
        # no rows: the report writes its html and md without figures (their modes are matplotlib's, not ours)
        run = fabricate_run(tmp_path / "run", results=False, training=False)
        w = RunWriter(tmp_path / "new")
        w.write_metadata({"schema_version": 2})
        w.add_rows("results", fabricate_rows().head(2).to_dict("records"))
        w.write_crossover([])
        paths = write_report(run)
    finally:
        os.umask(old)
    want = 0o666 & ~mask  # what open() gives a new file
    for name in ("metadata.json", "rows.jsonl", "results.csv", "results.parquet", "crossover.csv"):
        assert _mode(tmp_path / "new" / name) == want, name
    assert _mode(paths["html"]) == want


def test_unfinished_run_report_says_so_at_the_top(tmp_path: Path) -> None:
    from commbench.views.report import write_report

    # the banner is the metadata's (no end time), so runs without rows, hence without figures, show it
    done = write_report(fabricate_run(tmp_path / "done", results=False, training=False))
    unfinished = write_report(
        fabricate_run(tmp_path / "open", results=False, training=False, meta_extra={"end_time": None})
    )
    assert "Unfinished run" not in done["html"].read_text()
    for kind, first_section in (("html", 'id="metadata"'), ("md", "## Metadata")):
        text = unfinished[kind].read_text()
        assert "Unfinished run" in text
        assert text.index("Unfinished run") < text.index(first_section)  # above every section


def test_torn_journal_line_dropped_with_warning_not_glued(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = fabricate_rows().head(3).to_dict("records")
    w = RunWriter(tmp_path / "run")
    w.write_metadata({"schema_version": 2})
    w.add_rows("results", rows[:2])
    journal = tmp_path / "run" / "rows.jsonl"
    with open(journal, "a") as f:
        f.write(json.dumps(rows[2])[:40])  # a crash mid-write: no newline
    (tmp_path / "run" / "results.csv").unlink()
    (tmp_path / "run" / "results.parquet").unlink()
    capsys.readouterr()
    w2 = RunWriter(tmp_path / "run", resume=True)
    assert "torn last line" in capsys.readouterr().err
    assert len(commbench.load(tmp_path / "run")) == 2  # tables rewritten from the journal on resume
    w2.add_rows("results", rows[2:])
    lines = journal.read_text().splitlines()
    assert len(lines) == 3 and all(isinstance(json.loads(line), dict) for line in lines)
    assert [r["fp32_bytes"] for r in read_journal(journal)] == [r["fp32_bytes"] for r in rows]


def test_complete_last_row_without_newline_is_kept(tmp_path: Path) -> None:
    rows = fabricate_rows().head(2).to_dict("records")
    w = RunWriter(tmp_path / "run")
    w.write_metadata({"schema_version": 2})
    w.add_rows("results", rows[:1])
    with open(tmp_path / "run" / "rows.jsonl", "a") as f:
        f.write(json.dumps(rows[1]))  # the crash fell between the row and its newline
    RunWriter(tmp_path / "run", resume=True).add_rows("results", rows[:1])
    assert len(read_journal(tmp_path / "run" / "rows.jsonl")) == 3


@pytest.mark.parametrize("content", ["[1, 2]", '"text"', "42"])
def test_metadata_not_an_object_is_one_line(tmp_path: Path, content: str) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metadata.json").write_text(content)
    with pytest.raises(RunDirError, match="JSON object"):
        load_metadata(tmp_path / "run")
    for args in (["report", "run"], ["run", "--resume", "run"]):
        proc = commbench_here(*args, cwd=tmp_path)
        assert proc.returncode == 2 and "JSON object" in proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_huge_size_refused_before_spawning(tmp_path: Path) -> None:
    proc = run_cli("run", "-e", "1024G", "--nproc", "2", "--out", "r", *FAST, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "cannot fit" in proc.stderr and "or less" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_memory_estimate_sums_precisions() -> None:
    from commbench.core.suite import SuiteConfig
    from commbench.measure.footprint import memory_problem, point_memory

    one = SuiteConfig(collectives=["all_gather"], precisions=["fp32"], min_bytes=1 << 20, max_bytes=1 << 20)
    two = SuiteConfig(collectives=["all_gather"], precisions=["fp32", "bf16"], min_bytes=1 << 20, max_bytes=1 << 20)
    (_, dev1, _), = point_memory(one, 2, "gloo")
    (_, dev2, _), = point_memory(two, 2, "gloo")
    # all_gather of 1 MiB on 2 ranks: input 128K elements, output 256K: fp32 4 B each, bf16 2 B each
    assert dev1 == (128 + 256) * 1024 * 4
    assert dev2 == dev1 + (128 + 256) * 1024 * 2
    assert memory_problem(two, 2, "gloo", 2, False, 1 << 40, None) is None
    msg = memory_problem(two, 2, "gloo", 2, False, 1 << 20, None)
    assert msg is not None and "-e 1M cannot fit" in msg and "no size of this suite fits" in msg


def test_nproc_beyond_bound_refused_before_spawning(tmp_path: Path) -> None:
    proc = run_cli("run", "--nproc", "100000", "--out", "r", *FAST, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and "--nproc 100000" in proc.stderr and "at most" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_dead_rank_one_line_per_rank_then_resume_alone(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["run", "--collectives", "all_reduce", "--precisions", "fp32", "-b", "1K", "-e", "16K", "-f", "2", *FAST]
    proc = run_cli(*args, "--nproc", "3", "--out", str(out), cwd=tmp_path, env={"COMMBENCH_INJECT_FAULT": "kill:1:2"})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for r in range(3):
        assert f"rank {r}: " in proc.stderr
    assert (out / "logs" / "rank2.log").is_file()
    # the sizes that finished their last pass are final; the others keep their first two passes, provisional
    df = commbench.load(out)
    assert sorted(df[~df["partial"]]["fp32_bytes"]) == [1024, 2048]
    assert sorted(df[df["partial"]]["fp32_bytes"]) == [4096, 8192, 16384] and set(df[df["partial"]]["passes_done"]) == {2}
    assert commbench.load_metadata(out)["partial"]["final_points"] == 2
    # different settings would mix rows measured otherwise: refused, naming the difference
    for extra, word in ((["--precisions", "fp32,bf16"], "precisions"), (["--min-time", "0.5"], "timing"), (["-e", "64K"], "max_bytes")):
        bad = commbench_here("run", "--resume", str(out), *extra, cwd=tmp_path)
        assert bad.returncode == 2 and "cannot resume" in bad.stderr and word in bad.stderr, bad.stderr
    # --resume alone: the run's own world size (3, not the default 2) and settings
    proc = run_cli("run", "--resume", str(out), "--no-report", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = commbench.load(out)
    assert sorted(df["fp32_bytes"]) == [1024, 2048, 4096, 8192, 16384]
    assert (df["world_size"] == 3).all()
    meta = load_metadata(out)
    assert meta["end_time"] is not None
    assert meta["fp8_codec"].startswith(("kernel (", "torch ("))
