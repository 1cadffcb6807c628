"""nccl-tests' flags and names on `run` (issue 33 items 1 and 5), the one-line "did you mean" for an unknown name,
and `fit`'s refusal to extrapolate from a fit that cannot be trusted (item 7).

References: nccl-tests ``src/common.cu`` (its getopt table, ``test_typenames``, the ``-a`` modes 0=rank 0, 1=avg,
2=min, 3=max, ``-c`` a check count, ``-z`` blocking, ``-N`` run cycles), commbench's importer's own type table
(``store.nccl_common.NCCL_TYPES``), and the alpha-beta formula for the fit. In-process: nothing is spawned.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from commbench import cli
from commbench.cli.common import CLIError
from commbench.cli.nccl_flags import check_nccl_tests_flags
from commbench.core.names import canonical, closest, unknown
from commbench.core.suite import SuiteConfig, resolve_suite_path, suite_from_dict
from commbench.measure.precision import get_precision, precision_names


def _run_args(*argv: str) -> object:
    return cli.build_parser(suite_defaults=False).parse_args(["run", *argv])


# ------------------------------------------------------------------------------------------------ names
def test_nccl_tests_and_torch_type_names_mean_commbench_precisions() -> None:
    from commbench.store.nccl_common import NCCL_TYPES

    # nccl-tests' test_typenames of the float types, as the importer maps them: one name for one thing
    for nccl in ("float", "half", "bfloat16", "f8e4m3", "f8e5m2"):
        assert canonical("precision", nccl) == NCCL_TYPES[nccl][0], nccl
    torch_names = {"float32": "fp32", "torch.float32": "fp32", "torch.float": "fp32", "float16": "fp16",
                   "torch.half": "fp16", "torch.bfloat16": "bf16", "float8_e4m3fn": "fp8_e4m3",
                   "torch.float8_e5m2": "fp8_e5m2"}  # fmt: skip
    for name, want in torch_names.items():
        assert canonical("precision", name) == want, name
    assert canonical("precision", "f8e4m3:block128") == "fp8_e4m3:block128"  # an option is kept
    assert canonical("collective", "alltoall") == "all_to_all" and canonical("collective", "all_reduce_perf") == "all_reduce"
    # the registry answers to every spelling with the same object
    assert get_precision("bfloat16") is get_precision("bf16") and get_precision("float").name == "fp32"


def test_unknown_names_say_why_or_name_the_closest() -> None:
    valid = precision_names()
    assert closest("bf61", valid, "precision")[0] == "bf16"
    assert closest("flaot", valid, "precision")[0] == "fp32"  # nccl-tests' name, misspelt: what it means
    assert set(closest("fp8", valid, "precision")) >= {"fp8_e4m3", "fp8_e5m2"}
    line = unknown("precision", "double", valid)
    assert line.startswith("unknown precision 'double': 'double' is float64") and "did you mean" not in line
    assert "integer type" in unknown("precision", "int8", valid) and "\n" not in line
    assert closest("zzzz", valid, "precision") == []
    with pytest.raises(ValueError, match=r"^unknown collective 'alreduce'; valid choices: .*; did you mean 'all_reduce'"):
        SuiteConfig(collectives=["alreduce"])


def test_suite_names_become_commbench_names_once() -> None:
    s = suite_from_dict({"collectives": ["alltoall", "all_reduce"], "precisions": ["float", "bfloat16", "torch.float16"]})
    assert s.collectives == ["all_to_all", "all_reduce"] and s.precisions == ["fp32", "bf16", "fp16"]
    assert suite_from_dict({"precisions": "all"}).precisions == precision_names()  # nccl-tests' -d all
    with pytest.raises(ValueError, match="twice"):
        suite_from_dict({"precisions": ["fp32", "float"]})  # the same precision under two names
    with pytest.raises(ValueError, match="did you mean 'gradient'"):
        suite_from_dict({"payload": "gradeint"})


# ------------------------------------------------------------------------------------------------ suites before paths
def test_a_suite_name_wins_over_a_same_named_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quick" / "logs").mkdir(parents=True)  # what `--out quick` leaves behind
    found = resolve_suite_path("quick").resolve()
    assert found.name == "quick.toml" and found.is_file() and tmp_path not in found.parents  # the built-in one
    # the default command resolves the same way (no suite argument: the default suite)
    suite = cli.resolve_suite(_run_args("--no-training"))
    assert suite.name == "quick" and suite.training is None
    with pytest.raises(ValueError, match=r"suite './quick' is a directory, not a suite file"):
        resolve_suite_path("./quick")  # written as a path: read as one
    with pytest.raises(ValueError, match=r"suite file 'nope.toml' does not exist"):
        resolve_suite_path("nope.toml")
    (tmp_path / "mine").write_text('collectives = ["all_reduce"]\nprecisions = ["float"]\n')
    assert resolve_suite_path("mine") == Path("mine")  # no suite of that name: a file by that name is read
    local = tmp_path / "quick.toml"
    local.write_text('precisions = ["half"]\n')
    assert resolve_suite_path("./quick.toml") == Path("./quick.toml")
    with pytest.raises(ValueError, match=r"unknown suite 'quik'; .*did you mean 'quick'\?$"):
        resolve_suite_path("quik")


# ------------------------------------------------------------------------------------------------ flags
def test_nccl_tests_flags_set_commbench_settings() -> None:
    args = _run_args("-n", "50", "-w", "3", "-N", "2", "-d", "float,bfloat16", "-c", "0", "-T", "30", "-b", "1K",
                     "-e", "4K", "-f", "2", "-a", "1", "-z", "0", "-g", "1", "--no-training")  # fmt: skip
    check_nccl_tests_flags(args)  # -a 1, -z 0, -g 1 are what commbench does: accepted
    suite = cli.resolve_suite(args)
    t = suite.timing
    assert (t.min_iters, t.warmup, t.passes) == (50, 3, 2)
    assert suite.precisions == ["fp32", "bf16"] and suite.check is False
    assert (suite.min_bytes, suite.max_bytes, suite.factor) == (1024, 4096, 2)
    assert args.timeout == 30.0
    assert cli.resolve_suite(_run_args("-c", "5", "--no-training")).check is True
    big = cli.resolve_suite(_run_args("-n", "5000", "--no-training")).timing  # above the default ceiling of k
    assert big.min_iters == 5000 and big.max_iters >= 5000
    notes = cli.nccl_tests_notes(_run_args("-c", "5", "-N", "3"), ["run", "-c", "5", "-N", "3"])
    assert any("-c N" in n for n in notes) and any("-N 3: 3 passes" in n for n in notes)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["-a", "3"], "-a 3 (nccl-tests reports rank 0's (0), the average (1), min (2) or max (3) time) has no meaning here"),
        (["-a", "0"], "time_us_max"),
        (["-z", "1"], "-z 1 (the host waits for every collective"),
        (["-g", "8"], "one process per GPU: --nproc N"),
        (["-m", "4"], "torch.distributed issues each collective on its own"),
        (["-d", "double"], "'double' is float64"),
        (["-d", "int8"], "integer type"),
        (["-d", "bf61"], "did you mean 'bf16'?"),
        (["-c", "-1"], "must be >= 0"),
        (["--backend", "glo"], "did you mean 'gloo'?"),
        (["quik"], "did you mean 'quick'?"),
    ],
)
def test_bad_nccl_tests_input_is_one_line_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", *argv, "--nproc", "2", "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err


def test_run_help_shows_both_spellings() -> None:
    run = cli.build_parser(suite_defaults=False)._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    text = " ".join(run.format_help().split())
    for both in ("-n MIN_ITERS, --min-iters", "-w WARMUP, --warmup", "-N PASSES, --passes", "-d PRECISIONS",
                 "--datatype", "-c N, --check-count", "-a 0|1|2|3, --average", "-z 0|1, --blocking",
                 "-T S, --timeout", "-b MINBYTES, --minbytes", "-e MAXBYTES, --maxbytes"):  # fmt: skip
        assert both in text, both
    with pytest.raises(CLIError):
        check_nccl_tests_flags(_run_args("-C", "1"))


def test_docs_table_maps_every_nccl_tests_flag() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "running.md").read_text()
    table = doc[doc.index("## nccl-tests flags") :]
    first = " ".join(line.split("|")[1] for line in table.splitlines() if line.startswith("| `"))
    # every flag of nccl-tests' usage text a user types (src/common.cu), with commbench's spelling or the reason
    for flag in ("-b", "-e", "-f", "-i", "-n", "-w", "-m", "-N", "-c", "-d", "-o", "-r", "-a", "-z", "-G", "-t", "-g",
                 "-C", "-T", "-p", "-R", "-J"):  # fmt: skip
        assert f"`{flag}`" in first or f"`{flag} " in first, flag
    assert "`--cuda-graph`" in table


# ------------------------------------------------------------------------------------------------ fit trust
def _points(times_us: list[float], sizes: list[int], n: int = 2) -> pd.DataFrame:
    return pd.DataFrame([
        {"collective": "all_reduce", "precision": "fp32", "impl": "native", "backend": "gloo", "world_size": n,
         "nodes": 1, "size_bytes": s, "fp32_bytes": s, "time_us": t, "encode_us": 0.0, "decode_us": 0.0,
         "time_ci_low_us": t * 0.95, "time_ci_high_us": t * 1.05}
        for s, t in zip(sizes, times_us, strict=True)
    ])  # fmt: skip


def test_fit_refuses_to_extrapolate_from_latency_bound_points(tmp_path: Path) -> None:
    from commbench.planning.costmodel_io import read_model
    from commbench.planning.fitting import REACH, fit, main_fit, untrusted
    from commbench.store.results import RunWriter

    # the run: 2 ranks, 1K..64K, every time ~2.4 ms whatever the size (loopback under load)
    sizes = [1024 * 2**k for k in range(7)]
    rng = np.random.default_rng(3)
    flat = [2400.0 * math.exp(0.05 * rng.standard_normal()) for _ in sizes]
    best = max(s * 1.0 / (t * 1e-6) for s, t in zip(sizes, flat, strict=True)) * 1e-9  # ring busbw factor 2(n-1)/n = 1
    model = fit(_points(flat, sizes))
    f = model.get("all_reduce", "fp32")
    why = untrusted(model)[("all_reduce", "fp32", "world")]
    assert f.r2_log < 0.5 and f"R^2 of log time {f.r2_log:.2f} < 0.5" in why
    assert f"best measured busbw {best:.3g} GB/s" in why and "no bandwidth term" in why  # beta = 0: busbw infinite
    # points whose time grows, but only a little over the range: the fitted busbw is far above the best measured
    slow = [2000.0 + s / 1e3 for s in sizes]  # 2 ms + bytes at 1 GB/s: 64K reads 0.03 GB/s
    bf = fit(_points(slow, sizes)).get("all_reduce", "fp32")
    best_slow = max(s / (t * 1e-6) for s, t in zip(sizes, slow, strict=True)) * 1e-9
    assert bf.busbw_gbps == pytest.approx(1.0, rel=0.05) and bf.busbw_gbps > REACH * best_slow
    assert f"{bf.busbw_gbps / best_slow:.3g}x the best measured {best_slow:.3g} GB/s" in untrusted(
        fit(_points(slow, sizes)))[("all_reduce", "fp32", "world")]  # fmt: skip
    # alpha-beta points that reach their bandwidth: 40 us + bytes at 5 GB/s, 64K..64M (busbw factor 1 at n = 2)
    good = [40.0 + s / 5e3 for s in (2**k for k in range(16, 27, 2))]
    assert untrusted(fit(_points(good, [2**k for k in range(16, 27, 2)]))) == {}

    run = tmp_path / "run"
    w = RunWriter(run)
    w.write_metadata({"schema_version": 1})
    w.add_rows("results", _points(flat, sizes).to_dict("records"))
    text = main_fit([run], tmp_path / "m.json")
    assert "# warning: 1 fit(s) cannot be trusted outside their points" in text
    assert "# skipped all_reduce/fp32/world: not kept" in text and "raise -e above 64K" in text
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["fits"] == [] and "all_reduce/fp32/world" in saved["skipped"]
    with pytest.raises(ValueError, match="cannot be trusted outside its points"):
        read_model(tmp_path / "m.json").predict("all_reduce", "fp32", world_size=2, nbytes=2**30)
