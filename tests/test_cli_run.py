"""End-to-end runs through the CLI on real 2- and 3-rank gloo groups: rows, nccl-tests arithmetic, error
ordering of the precisions, resume, a killed and a hung rank, and every bad input (exit code 2, one line)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import commbench
from commbench.store.results import COLUMNS
from tests.cli_util import FAST, commbench_here
from tests.cli_util import commbench as run_cli

pytestmark = pytest.mark.timeout(240)

SIZES = ["-b", "1K", "-e", "64K", "-f", "4"]  # 1K, 4K, 16K, 64K


def _bus_factor(coll: str, n: int) -> float:  # nccl-tests doc/PERFORMANCE.md, written out independently
    return 2 * (n - 1) / n if coll == "all_reduce" else (n - 1) / n


@pytest.fixture(scope="module")
def run2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("run2")
    out = tmp / "run"
    proc = run_cli(
        "run", "--collectives", "all_reduce,all_gather,reduce_scatter,all_to_all", "--precisions", "fp32,fp16,bf16,bf16_compress",
        *SIZES, "--nproc", "2", "--out", str(out), *FAST, cwd=tmp,
    )  # fmt: skip
    return out, proc


def test_sweep_rows_and_definitions(run2: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, proc = run2
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = commbench.load(out)
    assert list(df.columns[: len(COLUMNS)]) == list(COLUMNS)
    assert len(df) == 4 * 4 * 4
    assert set(df["fp32_bytes"]) == {1024, 4096, 16384, 65536}
    assert (df["wrong"] == 0).all()
    assert (df["world_size"] == 2).all() and (df["backend"] == "gloo").all()
    for _, r in df.iterrows():
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * _bus_factor(r["collective"], 2))
        elem = {"fp32": 4, "fp16": 2, "bf16": 2, "bf16_compress": 2}[r["precision"]]
        assert r["size_bytes"] == r["fp32_bytes"] // 4 * elem
        expect_count = r["fp32_bytes"] // 4 if r["collective"] == "all_reduce" else r["fp32_bytes"] // 8
        assert r["count"] == expect_count
        assert r["time_us"] <= r["time_us_max"] + 1e-9
        assert r["total_us"] == pytest.approx(r["encode_us"] + r["comm_us"] + r["decode_us"])
    comp = df[df["precision"] == "bf16_compress"]
    assert (comp["encode_us"] > 0).all() and (comp["decode_us"] > 0).all()
    assert (df[df["precision"] == "fp32"]["encode_us"] == 0).all()
    meta = commbench.load_metadata(out)
    for key in ("torch_version", "python_version", "host", "backend", "world_size", "suite", "timing", "start_time", "end_time", "schema_version", "threads_per_rank"):
        assert meta.get(key) is not None, key
    assert meta["threads_per_rank"] == 1  # two ranks on two cores: one thread each
    assert (out / "results.csv").is_file() and (out / "results.parquet").is_file() and (out / "crossover.csv").is_file()
    # nccl-tests table layout on stdout
    header = next(ln for ln in proc.stdout.splitlines() if ln.startswith("#") and "#wrong" in ln)
    assert header.lstrip("#").split()[:10] == [
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "precision",
    ]  # fmt: skip
    assert all(len(ln) < 132 for ln in proc.stdout.splitlines())  # piped: a sane width (issue 33), not 179
    assert "crossover" in proc.stdout


def test_error_ordering_on_normal_payload(run2: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    df = commbench.load(run2[0])
    for coll, g in df.groupby("collective"):
        err = g.groupby("precision")["rel_err"].max()
        assert err["fp32"] < 1e-6, coll  # fp32 sum of two fp32 values: rounding only
        assert err["fp32"] < err["fp16"] < err["bf16"], coll  # 10 vs 7 mantissa bits
        assert err["fp16"] < 2e-3 and err["bf16"] < 2e-2


def test_gradient_payload_shows_fp16_underflow(tmp_path: Path) -> None:
    out = tmp_path / "grad"
    proc = run_cli("run", "--collectives", "all_reduce", "--precisions", "fp32,fp16,bf16", "-b", "4K", "-e", "4K",
                   "--payload", "gradient", "--nproc", "2", "--out", str(out), *FAST, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = commbench.load(out).set_index("precision")["rel_err"]
    # std 1e-7 sits at fp16's smallest subnormal (6e-8): values flush to zero or keep one or two bits
    assert err["fp16"] > 0.1
    assert err["bf16"] < 0.01  # bf16 keeps fp32's exponent range
    assert err["fp32"] < 1e-6


def test_large_world_reference_path(tmp_path: Path) -> None:
    """Beyond 16 ranks the float64 reference comes from a float64 collective; force that path on 2 ranks."""
    out = tmp_path / "ref"
    proc = run_cli("run", "--collectives", "all_reduce,reduce_scatter", "--precisions", "fp32,bf16", "-b", "4K", "-e", "4K",
                   "--nproc", "2", "--out", str(out), *FAST, cwd=tmp_path, env={"COMMBENCH_LOCAL_REFERENCE_MAX_RANKS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = commbench.load(out).set_index(["collective", "precision"])
    assert (df["wrong"] == 0).all()
    for coll in ("all_reduce", "reduce_scatter"):
        assert df.loc[(coll, "fp32"), "rel_err"] < 1e-6 < df.loc[(coll, "bf16"), "rel_err"] < 2e-2


def test_three_ranks_odd_world(tmp_path: Path) -> None:
    out = tmp_path / "n3"
    proc = run_cli("run", "--collectives", "all_gather,reduce_scatter,all_reduce,all_to_all", "--precisions", "fp32,bf16",
                   "-b", "1K", "-e", "4K", "-f", "2", "--nproc", "3", "--out", str(out), *FAST, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = commbench.load(out)
    assert len(df) == 4 * 2 * 3 and (df["wrong"] == 0).all() and (df["world_size"] == 3).all()
    ag = df[(df["collective"] == "all_gather") & (df["precision"] == "fp32") & (df["fp32_bytes"] == 1024)].iloc[0]
    # nccl-tests: per-rank count (256/3 = 85) rounded down to 16 bytes = 4 fp32 elements -> 84, size 3 * 84 * 4
    assert ag["count"] == 84 and ag["size_bytes"] == 252 * 4
    for _, r in df.iterrows():
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * _bus_factor(r["collective"], 3))
    assert (df[df["precision"] == "fp32"]["rel_err"] < 1e-6).all()


def test_killed_rank_then_resume(tmp_path: Path) -> None:
    out = tmp_path / "killed"
    args = ["run", "--collectives", "all_reduce", "--precisions", "fp32", "-b", "1K", "-e", "64K", "-f", "2", "--nproc", "2", *FAST]
    proc = run_cli(*args, "--out", str(out), cwd=tmp_path, env={"COMMBENCH_INJECT_FAULT": "kill:1:3"})
    assert proc.returncode == 1
    assert "rank 1 was killed by SIGKILL" in proc.stderr
    assert "Traceback" not in proc.stderr.split("commbench: error:")[-1]
    done = commbench.load(out)
    # every point finished before the kill is kept; the others have provisional rows of their first two passes
    assert sorted(done[~done["partial"]]["fp32_bytes"]) == [1024, 2048, 4096]
    before = (out / "rows.jsonl").read_text()
    mismatch = commbench_here(*[a if a != "2" else "3" for a in args], "--resume", str(out), cwd=tmp_path)
    assert mismatch.returncode == 2 and "cannot resume" in mismatch.stderr and "2 ranks on gloo" in mismatch.stderr
    proc = run_cli(*args, "--resume", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = commbench.load(out)
    assert sorted(df["fp32_bytes"]) == [1024 * 2**i for i in range(7)]
    assert (out / "rows.jsonl").read_text().startswith(before)  # resume appended, rewrote nothing


def test_hung_rank_is_named_within_timeout(tmp_path: Path) -> None:
    out = tmp_path / "hung"
    proc = run_cli("run", "--collectives", "all_reduce", "--precisions", "fp32", "-b", "1K", "-e", "4K", "--nproc", "2",
                   "--timeout", "5", "--out", str(out), *FAST, cwd=tmp_path, env={"COMMBENCH_INJECT_FAULT": "hang:1:1"},
                   timeout=90)  # fmt: skip
    assert proc.returncode == 1
    assert "rank 1 stopped responding" in proc.stderr
    df = commbench.load(out)
    # the point before the hang is complete; the hung size keeps the passes it finished, marked partial (issue 33)
    assert (~df["partial"]).sum() == 1 and len(df) <= 2
    assert (df[df["partial"]]["passes_done"] < df[~df["partial"]]["passes_done"].max()).all()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(out) not in ps  # no orphan rank left behind


BAD_INPUTS = [
    (["run", "--collectives", "alreduce"], "unknown collective 'alreduce'; valid choices: all_reduce"),
    (["run", "--precisions", "fp64"], "unknown precision 'fp64': 'fp64' is float64"),
    (["run", "-b", "1XB"], "malformed size '1XB'"),
    (["run", "-b", "-4K"], "-b/--minbytes"),
    (["run", "-b", "64K", "-e", "1K"], "minimum size 64K is larger than maximum size 1K"),
    (["run", "--nproc", "0"], "--nproc must be >= 1"),
    (["run", "--backend", "mpi"], "invalid choice: 'mpi'"),
    (["run", "no-such-suite"], "unknown suite 'no-such-suite'; known suites: full, quick"),
    (["run", "--resume", "nowhere"], "run directory 'nowhere' does not exist"),
    (["report", "nowhere"], "run directory 'nowhere' does not exist"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["run", "training", "--no-training"], "suite 'training' has only a [training] section"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS)
def test_bad_input_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    # in this process: refused before anything launches (test_bad_input_in_a_fresh_process: the same through -m)
    proc = commbench_here(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists()  # nothing written


def test_bad_input_in_a_fresh_process(tmp_path: Path) -> None:
    proc = run_cli("run", "--collectives", "alreduce", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown collective 'alreduce'" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_broken_suite_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("collectives = [all_reduce\n")
    proc = commbench_here("run", str(bad), cwd=tmp_path)
    assert proc.returncode == 2 and "broken suite file" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('precisions = ["fp32", "fp128"]\n')
    proc = commbench_here("run", str(unknown), cwd=tmp_path)
    assert proc.returncode == 2 and "unknown precision 'fp128'" in proc.stderr


def test_out_dir_not_overwritten_or_unwritable(tmp_path: Path) -> None:
    out = tmp_path / "full"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    proc = commbench_here("run", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 2 and "is not empty" in proc.stderr
    assert (out / "keep.txt").read_text() == "precious" and len(list(out.iterdir())) == 1
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = commbench_here("run", "--out", str(blocker / "run"), cwd=tmp_path)
    assert proc.returncode == 2 and "cannot be created" in proc.stderr
    assert blocker.read_text() == "x"


def test_list_names_everything(tmp_path: Path) -> None:
    proc = run_cli("list", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "fp32", "fp16", "bf16", "bf16_compress", "quick"):
        assert name in proc.stdout


def test_load_reads_csv_when_parquet_missing(run2: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run2[0], copy)
    (copy / "results.parquet").unlink()
    a, b = commbench.load(run2[0]), commbench.load(copy)
    pd.testing.assert_frame_equal(a[["collective", "size_bytes", "wrong"]], b[["collective", "size_bytes", "wrong"]])
    meta = json.loads((copy / "metadata.json").read_text())
    meta["schema_version"] = 99
    (copy / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(commbench.RunDirError, match="schema version 99"):
        commbench.load(copy)
    assert math.isfinite(a["time_us"].sum())


def test_joins_a_torchrun_world(tmp_path: Path) -> None:
    """Under torchrun commbench joins the existing world instead of spawning its own."""
    import sys

    from commbench.cluster.launch import free_port

    out = tmp_path / "tr"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
         "-m", "commbench", "run", "--collectives", "all_gather", "--precisions", "fp32", "-b", "1K", "-e", "1K",
         "--out", str(out), *FAST],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = commbench.load_metadata(out)
    assert meta["launcher"] == "torchrun" and meta["world_size"] == 2
    assert len(commbench.load(out)) == 1


def test_nccl_without_gpus_is_bad_input(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs: --backend nccl is valid here")
    proc = commbench_here("run", "--backend", "nccl", cwd=tmp_path)
    assert proc.returncode == 2 and "backend 'nccl' needs a GPU per rank" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "results").exists()


def test_list_describes_each_registered_collective(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`list` asks each collective for its description: a collective added to the registry (here, by this
    test alone) is listed with its own line, and the built-in ones keep nccl-tests' definitions."""
    from commbench import cli
    from commbench.measure import collectives

    class ToyBroadcast(collectives.AllGather):
        name = "toy_broadcast"
        description = "root buffer; 1"

        def bus_factor(self, n: int) -> float:
            return 1.0

    monkeypatch.setitem(collectives.COLLECTIVES, "toy_broadcast", ToyBroadcast())
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # nccl-tests doc/PERFORMANCE.md, written out independently
    for name, text in [
        ("all_reduce", "buffer; 2(n-1)/n"),
        ("all_gather", "total output; (n-1)/n"),
        ("reduce_scatter", "total input; (n-1)/n"),
        ("all_to_all", "per-rank buffer; (n-1)/n"),
        ("toy_broadcast", "root buffer; 1"),
    ]:
        assert f"  {name:<16} {text}" in lines


@pytest.mark.skipif(sys.version_info < (3, 11), reason="on 3.10 every test already loads suites through tomli")
def test_suites_load_without_tomllib(tmp_path: Path) -> None:
    """Python 3.10 has no tomllib: config falls back to tomli (same API). Simulated here by hiding tomllib and
    offering its parser under tomli's name, in a fresh interpreter so this process keeps its modules."""
    code = (
        "import sys, tomllib\n"
        "sys.modules['tomli'] = tomllib\n"
        "sys.modules['tomllib'] = None  # import tomllib now raises ModuleNotFoundError, as on 3.10\n"
        "from commbench.core.suite import load_suite\n"
        "import commbench.core.suite as c\n"
        "assert c.tomllib is sys.modules['tomli']\n"
        "print(load_suite('quick').name)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "quick"


# --------------------------------------------------------------------------- the console a person reads


def test_sizes_accept_nccl_tests_units_all_1024_based(tmp_path: Path) -> None:
    # K, KB and KiB (any case) are one unit, 1024 bytes, as nccl-tests' K: never silently 1000
    for text, value in (("8", 8), ("8B", 8), ("64K", 64 * 1024), ("64kb", 64 * 1024), ("64KiB", 64 * 1024),
                        ("1M", 2**20), ("1MB", 2**20), ("1MiB", 2**20), ("4G", 4 * 2**30), ("4GB", 4 * 2**30)):  # fmt: skip
        assert commbench.parse_size(text) == value, text
    for bad in ("1iB", "1T", "1.5M", "1 M B", "-1K"):
        with pytest.raises(ValueError, match="1024-based"):
            commbench.parse_size(bad)
    proc = commbench_here("run", "-b", "1TB", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "KiB" in proc.stderr
    assert "1024-based" in commbench_here("run", "--help", cwd=tmp_path).stdout.replace("\n", " ")


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"]])
def test_help_imports_no_torch(argv: list[str], tmp_path: Path) -> None:
    """--help must be instant: nothing that imports torch (or pandas) may run before it prints."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['commbench', *{argv!r}]\n"
        "try:\n    runpy.run_module('commbench', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print('IMPORTED', sorted(m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip().splitlines()[-1] == "IMPORTED []", proc.stdout[-500:] + proc.stderr[-2000:]


def test_run_help_shows_every_default(tmp_path: Path) -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    from commbench.cli import build_parser

    run = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "run" in a.choices).choices["run"]
    text = " ".join(commbench_here("run", "--help", cwd=tmp_path).stdout.split())
    for action in run._actions:
        if action.help in (None, "==SUPPRESS==") or action.dest == "help" or action.help.startswith("skip the"):
            continue  # --no-check is the negation of --check, whose line states the default
        assert "default" in action.help, action.option_strings
    quick = tomllib.loads((Path(__file__).resolve().parents[1] / "suites" / "quick.toml").read_text())
    assert f"quick: {quick['min_bytes']}" in text and f"quick: {quick['max_bytes']}" in text
    assert f"quick: {quick['factor']})" in text and f"quick: {quick['timing']['repeats']})" in text
    assert "--no-training" in text


def test_ctrl_c_prints_the_resume_command_and_resume_counts(tmp_path: Path) -> None:
    import os
    import signal
    import time

    out = tmp_path / "run"
    args = ["run", "--collectives", "all_reduce", "--precisions", "fp32", "-b", "1K", "-e", "64K", "-f", "2",
            "--nproc", "2", "--out", str(out), *FAST]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["COMMBENCH_INJECT_FAULT"] = "hang:1:3"  # rank 1 stops after 3 points: Ctrl-C lands mid-run
    # SIGINT back to its default in the child: a shell that starts the test suite as a background job (`cmd &`
    # without job control) hands every child SIGINT ignored, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "commbench", *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    journal = out / "rows.jsonl"
    for _ in range(1200):  # until the three points are on disk (bounded: the test's timeout ends it anyway)
        # final rows only: every pass before the last writes provisional ones ("partial": true)
        if journal.is_file() and journal.read_text().count('"partial": false') >= 3:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [
        f"commbench: interrupted; finished points are kept; continue with: python -m commbench run --resume {out} "
        "--nproc 2 --no-training --no-report --quiet"
    ], err[-3000:]
    cmd = lines[0].split("continue with: ", 1)[1].split()
    resumed = run_cli(*cmd[3:], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # 7 sizes (1K..64K, factor 2) x 1 precision: 3 were done
    assert f"# resuming {out}: 3 point(s) already measured, 4 left" in resumed.stdout


def test_console_fits_80_and_100_columns() -> None:
    from commbench.measure.console import comment, training_line
    from commbench.measure.table import LEGEND, columns_for, format_row, header_lines

    nccl_tests = {"size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"}
    row = {"size_bytes": 16777216, "count": 4194304, "dtype": "bfloat16", "redop": "sum", "time_us": 123456.7,
           "algbw_gbps": 135.9, "busbw_gbps": 135.9, "wrong": 0, "precision": "fp8_e4m3_native", "time_ci_low_us": 1.0,
           "time_ci_high_us": 2.0, "gain_vs_fp32": 1.41, "gain_significant": True, "encode_us": 1.0, "decode_us": 1.0,
           "effective_gbps": 1.0, "rel_err": 1e-3, "fp32_bytes": 16777216}  # fmt: skip
    for width in (80, 100, 132):
        cols = columns_for(width)
        for line in (*header_lines(cols), format_row(row, cols), *comment(LEGEND, width)):
            assert len(line) < width, (width, line)
    # nccl-tests' nine columns and the precision at 100 columns (issue 33: algbw was dropped there); more at 132
    assert {c.header for c in columns_for(100)} == nccl_tests | {"precision"}
    assert {c.header for c in columns_for(132)} == nccl_tests | {"precision", "±ci", "vs fp32", "wire"}
    assert {c.header for c in columns_for(80)} >= {"size", "type", "time", "algbw", "busbw", "#wrong", "precision"}
    # a training line: step time in ms with its interval, speed-up with significance, MiB and KiB
    line = training_line({
        "policy": "amp_bf16", "step_time_us_p50": 37920.0, "step_time_us_ci_low": 30000.0,
        "step_time_us_ci_high": 45100.0, "speedup_vs_fp32": 0.8, "speedup_significant": True,
        "peak_mem_bytes": 13.6 * 2**20, "comm_bytes_per_step": 463 * 1024, "final_loss_drift": -9.1e-5,
        "notes": "CPU autocast bfloat16: emulated here",
    })  # fmt: skip
    first, *rest = line.splitlines()
    assert len(first) <= 100
    assert "37.9 ms [30.0-45.1] 0.80x*" in first and "mem 13.6 MiB" in first and "comm 463 KiB/step" in first
    assert rest and "slower here; notes: CPU autocast bfloat16: emulated here" in " ".join(rest)
    # not significantly slower: no machine note (claims only when significant)
    calm = training_line({"policy": "amp_bf16", "step_time_us_p50": 1e4, "speedup_vs_fp32": 0.9,
                          "speedup_significant": False, "notes": "CPU autocast"})  # fmt: skip
    assert len(calm.splitlines()) == 1 and "0.90x~" in calm


def test_passes_split_every_points_rounds_and_print_each_row_once(tmp_path: Path) -> None:
    # 3 passes over 2 sizes x 2 precisions: every pass takes at least one round of each group (repeats 3 / 3 passes),
    # and the rows are written and printed once, after the last pass.
    out = tmp_path / "passes"
    args = ["run", "--collectives", "all_reduce", "--precisions", "fp32,bf16", "-b", "1K", "-e", "4K", "-f", "4",
            "--nproc", "2", "--passes", "3", "--max-time", "0.3", "--out", str(out)]  # fmt: skip
    proc = run_cli(*args, *[a for a in FAST if a != "--quiet"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = commbench.load(out)
    assert len(df) == 4 and (df["samples"] >= 3).all()
    rows = [ln for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(rows) == 4, proc.stdout
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["suite"]["timing"]["passes"] == 3


def test_isolated_timing_mode_times_one_op_per_sample(tmp_path: Path) -> None:
    out = tmp_path / "iso"
    args = ["run", "--collectives", "all_reduce,all_gather", "--precisions", "fp32,bf16", "-b", "4K", "-e", "16K",
            "-f", "4", "--nproc", "2", "--timing-mode", "isolated", "--gap", "0.002", "--max-time", "0.5",
            "--out", str(out), *FAST]  # fmt: skip
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = commbench.load(out)
    assert len(df) == 8 and (df["timing_mode"] == "isolated").all() and (df["iters"] == 1).all()
    assert (df["time_us"] > 0).all() and (df["time_ci_low_us"] <= df["time_us"]).all()
    assert (df["wrong"] == 0).all()
    bad = commbench_here(*args[:-len(FAST) - 2], "--timing-mode", "burst", "--out", str(tmp_path / "bad"), cwd=tmp_path)
    assert bad.returncode == 2 and "invalid choice: 'burst'" in bad.stderr and "Traceback" not in bad.stderr
