"""benchmarks/gpu_check.sh and gpu_check.py on a CPU machine: the script fails (one line) without CUDA, its
step timeouts fit the budget, the driver records every step whatever it does, and the checks the steps make
catch what they are meant to catch (run here on CPU data: a synthetic results frame, the codec with the C kernel
on and off, the codec hook on a 1-rank gloo world)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest
import torch

from tests.distutil import run_in_world

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
BUDGET_S = 545  # the GPU machine runs the script as one command of at most 560 s


def load_gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", mod)
    spec.loader.exec_module(mod)
    return mod


gc = load_gpu_check()


# ------------------------------------------------------------------------------------------ the driver


def script_timeouts(text: str) -> tuple[dict[str, int], int, dict[str, int]]:
    """(step -> timeout from the STEPS array incl. preflight and summary, kill grace, step -> header timeout)."""
    grace = int(re.search(r"^GRACE=(\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    steps = {"preflight": int(re.search(r"^PREFLIGHT_TIMEOUT=(\d+)$", text, re.M).group(1))}  # type: ignore[union-attr]
    block = re.search(r"^STEPS=\((.*?)^\)", text, re.M | re.S).group(1)  # type: ignore[union-attr]
    for name, limit in re.findall(r'"(\w+) (\d+)"', block):
        steps[name] = int(limit)
    steps["summary"] = int(re.search(r"^SUMMARY_TIMEOUT=(\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    header = {m[0]: int(m[1]) for m in re.findall(r"^#\s{3}(\w+)\s+(\d+)\s{2}", text, re.M)}
    return steps, grace, header


def test_without_cuda_the_script_fails_with_one_line(tmp_path: Path) -> None:
    assert not torch.cuda.is_available()
    out = tmp_path / "out"
    p = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode != 0
    assert len(lines) == 1, lines
    assert "no CUDA device" in lines[0] and "nothing was tested" in lines[0]
    assert not out.exists()  # nothing run, nothing written


def test_step_timeouts_fit_the_budget_and_match_the_header() -> None:
    text = SCRIPT.read_text()
    steps, grace, header = script_timeouts(text)
    assert list(steps)[1:-1] == list(gc.STEPS)  # the driver runs every step gpu_check.py defines, in order
    assert header == steps  # the header lists the steps with the timeouts the driver uses
    worst = sum(steps.values()) + grace * len(steps)
    assert worst < BUDGET_S, f"step timeouts and kill graces add up to {worst} s"
    assert all(t > gc.CLI_GRACE_S for name, t in steps.items() if name in ("sweep", "sweep_256m", "native", "training"))


FAKE_PY = """#!/usr/bin/env bash
# stands in for python: preflight passes, each step writes a record, 'hook' dies, 'native' records a failure
case "$2" in
  preflight) exit 0 ;;
  step)
    name=$3; out=$5
    [ "$name" = hook ] && { echo "hook died"; exit 3; }
    mkdir -p "$out/steps"
    if [ "$name" = native ]; then
      echo '{"name": "native", "figures": {}, "failures": ["fp8_e4m3_native: no rows"]}' >"$out/steps/$name.json"
      exit 1
    fi
    echo '{"name": "'$name'", "figures": {"answer": 42}, "failures": [], "wall_s": 100}' >"$out/steps/$name.json"
    exit 0 ;;
  summary) exec "$REAL_PY" "$@" ;;
esac
exit 99
"""


def test_driver_runs_every_step_after_a_failure_and_summarises(tmp_path: Path) -> None:
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_PY)
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(fake), "REAL_PY": sys.executable}
    p = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 1, p.stdout + p.stderr
    data = json.loads((out / "summary.json").read_text())
    by_name = {s["name"]: s for s in data["steps"]}
    assert list(by_name) == list(gc.STEPS)
    assert data["ok"] is False
    assert by_name["hook"]["ok"] is False and "exited with status 3" in by_name["hook"]["failures"][0]
    assert by_name["native"]["ok"] is False and by_name["native"]["failures"] == ["fp8_e4m3_native: no rows"]
    passed = [n for n, s in by_name.items() if s["ok"]]
    assert passed == [n for n in gc.STEPS if n not in ("hook", "native")]
    assert by_name["device"]["figures"] == {"answer": 42} and by_name["device"]["wall_s"] < 30  # the driver's clock
    limits = script_timeouts(SCRIPT.read_text())[0]
    assert [s["limit_s"] for s in data["steps"]] == [limits[n] for n in gc.STEPS]
    text = (out / "summary.txt").read_text()
    assert text in p.stdout  # printed at the end
    n = len(gc.STEPS)
    assert f"{n - 2} of {n} steps passed" in text and text.rstrip().endswith("gpu_check: FAILED")
    # what comes back from a GPU machine: at most 8 files, the bulk in a temporary folder; the logs in a tarball
    assert sorted(f.name for f in out.iterdir()) == ["logs.tar.gz", "summary.json", "summary.txt"]
    import tarfile

    with tarfile.open(out / "logs.tar.gz") as tar:
        log = tar.extractfile("logs/hook.log")
        assert log is not None and log.read() == b"hook died\n"
        assert {"steps.tsv", "steps/native.json"} <= set(tar.getnames())


def test_collect_names_a_timeout_and_a_missing_record(tmp_path: Path) -> None:
    (tmp_path / "steps.tsv").write_text("device\t20\t0\t3.2\nsweep\t80\t124\t80.4\nhook\t45\t139\t9\n")
    gc.write_record(tmp_path, gc.StepReport("device", figures={"gpu": "X"}, wall_s=2.5))
    reports = gc.collect(tmp_path)
    assert [r.name for r in reports] == ["device", "sweep", "hook"]
    assert [r.ok for r in reports] == [True, False, False]
    assert reports[0].wall_s == 3.2 and reports[1].wall_s == 80.4  # the driver's clock
    assert reports[1].failures == ["timed out after its 80 s limit (see logs/sweep.log)"]
    assert "exited with status 139" in reports[2].failures[0]
    text = gc.write_summary(tmp_path, reports)
    assert json.loads((tmp_path / "summary.json").read_text())["ok"] is False
    assert "1 of 3 steps passed" in text and "gpu: X" in text


def test_record_is_json_without_nan(tmp_path: Path) -> None:
    rep = gc.StepReport("x", figures={"a": math.nan, "b": math.inf, "c": torch.tensor(2.5)})
    data = json.loads(gc.write_record(tmp_path, rep).read_text())
    assert data["figures"] == {"a": None, "b": "inf", "c": 2.5}


def test_every_cli_run_a_step_starts_is_valid(tmp_path: Path) -> None:
    """Every `commbench run` a step starts parses and resolves to the suite it means (flags, precisions, sizes,
    the training TOML), so a renamed flag fails here, not on the GPU machine."""
    from commbench.cli import build_parser, resolve_suite
    from commbench.core.units import parse_size, size_grid
    from commbench.training.policies import list_policies

    run = tmp_path / "run"
    for sizes, extra in ((gc.SWEEP_SIZES, ()), (gc.BIG_SWEEP_SIZES, ("--device-timer", "events"))):
        args = build_parser().parse_args(gc.sweep_args(run, *sizes, extra))
        suite = resolve_suite(args)
        assert (args.nproc, args.backend, args.no_report, args.out) == (1, "nccl", True, run)
        assert list(suite.collectives) == list(gc.COLLECTIVES) and list(suite.precisions) == list(gc.PRECISIONS)
        assert suite.check is True and suite.training is None and list(suite.groups) == ["world"]
        assert suite.timing.repeats == 3 and suite.timing.passes == 1
        grid = size_grid(suite.min_bytes, suite.max_bytes, suite.factor)
        assert grid == size_grid(parse_size(sizes[0]), parse_size(sizes[1]), int(sizes[2]))
    assert grid == [gc.BIG_BYTES] and suite.timing.device_timer == "events"

    args = build_parser().parse_args(gc.native_args(run))
    suite = resolve_suite(args)
    assert set(suite.collectives) == {"all_reduce", "reduce_scatter"} and list(suite.precisions) == list(
        gc.NATIVE_PRECISIONS
    )
    assert args.nccl_debug and args.no_report

    toml = tmp_path / "train.toml"
    toml.write_text(gc.TRAINING_TOML)
    args = build_parser().parse_args(gc.training_args(toml, run))
    suite = resolve_suite(args)
    assert suite.training is not None and suite.training.policies == list_policies() and args.no_report
    assert suite.training.measure_memory


def test_run_cli_tees_the_console_and_returns_the_status(tmp_path: Path, capsys: Any) -> None:
    log = tmp_path / "c.log"
    run = gc.run_cli(["run", "--precisions", "bogus", "--out", str(tmp_path / "r")], log, 60)
    assert run.rc == 2
    assert "unknown precision 'bogus'" in run.console
    text = log.read_text()
    assert text.startswith("$ ") and "unknown precision 'bogus'" in text
    assert "unknown precision 'bogus'" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_run_cli_stops_a_run_past_its_deadline_with_every_rank(tmp_path: Path) -> None:
    args = ["run", "--nproc", "2", "--backend", "gloo", "--collectives", "all_reduce", "--precisions", "fp32",
            "-b", "4K", "-e", "64M", "-f", "2", "--no-training", "--no-report", "--quiet",
            "--out", str(tmp_path / "r")]  # fmt: skip
    t0 = time.monotonic()
    run = gc.run_cli(args, tmp_path / "c.log", 6)
    assert run.rc == 124
    assert time.monotonic() - t0 < 6 + 8 + 5
    with pytest.raises(ProcessLookupError):  # launcher and ranks: the whole group is gone
        os.killpg(run.pgid, 0)
    assert "stopped `commbench run` after 6 s" in (tmp_path / "c.log").read_text()


def test_group_skips_name_why_a_run_has_no_rows() -> None:
    rep = gc.StepReport("sweep")
    console = "# skipped group world: its groups would have 1 rank (needs >= 2)\n# results: x\n"
    gc.group_skips(rep, pd.DataFrame(), console)
    assert rep.failures == ["console: skipped group world: its groups would have 1 rank (needs >= 2)"]
    rep = gc.StepReport("sweep")
    gc.group_skips(rep, sweep_frame([("all_reduce", "fp32", 4096, 0.0)]), console)
    assert rep.ok


def test_device_step_records_the_versions_a_gpu_reports(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    """The device step against a faked CUDA runtime (what torch reports for one H200): its figures and its line."""
    from types import SimpleNamespace

    props = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=141 * 2**30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    rep = gc.run_step("device", tmp_path, 20)
    assert rep.ok, rep.failures
    f = json.loads((tmp_path / "steps" / "device.json").read_text())["figures"]
    assert (f["gpu"], f["capability"], f["nccl"], f["cuda"], f["devices"]) == (
        "NVIDIA H200",
        "9.0",
        "2.27.3",
        "12.8",
        1,
    )
    assert f["memory_gib"] == 141 and f["torch"] == torch.__version__
    assert "NVIDIA H200 (sm_90, 141 GiB, 1 device(s)); torch" in capsys.readouterr().out

    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    rep = gc.run_step("device", tmp_path, 20)
    assert rep.failures == ["torch.distributed has no NCCL backend"]


def test_a_step_that_raises_fails_naming_the_exception(tmp_path: Path, monkeypatch: Any) -> None:
    def boom(ctx: Any, rep: Any) -> None:
        raise KeyError("total_us")

    monkeypatch.setitem(gc.STEPS, "sweep", boom)
    rep = gc.run_step("sweep", tmp_path, 80)
    assert len(rep.failures) == 1 and rep.failures[0].startswith("raised KeyError at test_gpu_check_script.py:")
    assert json.loads((tmp_path / "steps" / "sweep.json").read_text())["ok"] is False
    rep = gc.run_step("hook", tmp_path, 45)  # no CUDA here: the step says so
    assert rep.failures == [f"no CUDA device visible to torch {torch.__version__} (built with CUDA None)"]


def test_the_codec_compiles_once_before_the_fused_runs(tmp_path: Path, monkeypatch: Any) -> None:
    # the first sweep runs the eager codec (no compile inside its limit); codec_exact compiles the fused graphs
    # (inductor's on-disk cache), and only then do the steps that run the fused codec in a CLI come
    import gpu_steps.steps as steps
    from gpu_steps.runs import CliRun

    from commbench.measure import fused

    seen: list[dict[str, str] | None] = []

    def fake_cli(args: Any, log: Path, timeout_s: float, env: Any = None) -> CliRun:
        seen.append(env)
        return CliRun(1, "", 0)

    monkeypatch.setattr(steps, "cuda_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(steps, "run_cli", fake_cli)
    gc.run_step("sweep", tmp_path, 80)
    gc.run_step("sweep_256m", tmp_path, 80)
    assert seen == [{fused.ENV: "0"}, None]
    order = list(gc.STEPS)
    assert order.index("codec_exact") < min(order.index(n) for n in ("sweep_256m", "hook", "counts", "training"))


# --------------------------------------------------------------------------------------------- checkers


def sweep_frame(rows: list[tuple[str, str, int, float]], backend: str = "nccl") -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"collective": c, "precision": p, "impl": "native", "backend": backend, "fp32_bytes": b, "wrong": w,
             "tolerance": 0.0}
            for c, p, b, w in rows
        ]
    )  # fmt: skip


def test_check_sweep_names_each_wrong_and_missing_point() -> None:
    pairs = [("all_reduce", "fp32"), ("all_gather", "fp8_e4m3")]
    sizes = [4096, 2**20]
    good = [(c, p, s, 0.0) for c, p in pairs for s in sizes]
    rep = gc.StepReport("sweep")
    gc.check_sweep(rep, sweep_frame(good), pairs, sizes, "nccl")
    assert rep.ok and rep.figures["points_checked"] == 4 and rep.figures["wrong_total"] == 0

    bad = good[:2] + [("all_gather", "fp8_e4m3", 4096, 3.0), ("all_gather", "fp8_e4m3", 2**20, math.nan)]
    rep = gc.StepReport("sweep")
    gc.check_sweep(rep, sweep_frame(bad), pairs + [("all_to_all", "bf16")], sizes, "nccl")
    assert not rep.ok
    assert "all_gather x fp8_e4m3 at 4K: #wrong = 3 (tolerance 0)" in rep.failures
    assert "all_gather x fp8_e4m3 at 1M: #wrong not measured" in rep.failures
    assert "all_to_all x bf16 at 4K: no result row" in rep.failures
    assert "all_to_all x bf16 at 1M: no result row" in rep.failures
    assert len(rep.failures) == 4 and rep.figures["wrong_total"] == 3

    rep = gc.StepReport("sweep")
    gc.check_sweep(rep, sweep_frame(good, backend="gloo"), pairs, sizes, "nccl")
    assert rep.failures == ["backend gloo in the results, expected nccl only"]

    rep = gc.StepReport("sweep")
    gc.check_sweep(rep, sweep_frame([]), pairs, sizes, "nccl")
    assert rep.failures == ["the run wrote no result rows"]


def test_expected_pairs_leave_native_fp8_to_its_step() -> None:
    pairs = gc.expected_pairs(gc.COLLECTIVES, gc.PRECISIONS, "nccl")
    assert not [p for _, p in pairs if "native" in p]
    # every non-native precision runs every collective (the codecs through the chunked algorithm)
    assert len(pairs) == 4 * (len(gc.PRECISIONS) - 2)


def native_frame(precisions: list[str]) -> pd.DataFrame:
    return pd.DataFrame([{"precision": p, "impl": "fp8_native", "wrong": 0} for p in precisions])


def test_check_native_accepts_rows_or_a_skip_note_and_nothing_else() -> None:
    precs = ["fp8_e4m3_native", "fp8_e5m2_native:block128"]
    rep = gc.StepReport("native")
    gc.check_native(rep, native_frame(precs), {}, "", precs)
    assert rep.ok and rep.figures["fp8_e4m3_native"] == "ran: 1 rows"

    # the precision named in the suite is not a note; nothing else says it was skipped
    suite_only: dict[str, Any] = {"suite": {"precisions": precs}, "skipped": []}
    rep = gc.StepReport("native")
    gc.check_native(rep, native_frame([]), suite_only, "# results: x\n", precs)
    assert len(rep.failures) == 2 and "fp8_e4m3_native: no fp8_native rows" in rep.failures[0]

    notes: list[tuple[dict[str, Any], str]] = [
        ({"skipped_precisions": [{"precision": "fp8_e4m3_native", "note": "probe failed"}]}, ""),
        ({"skipped": {"fp8_e4m3_native": "torch refused float8 all_reduce"}}, ""),
        ({"notes": ["fp8_e4m3_native skipped: NCCL 2.21 < 2.24"]}, ""),
        ({"unavailable": [{"collective": "all_reduce", "precision": "fp8_e4m3_native", "reason": "refused"}]}, ""),
        ({"skipped": [{"collective": "all_reduce", "precision": "fp8_e4m3_native", "reason": "refused"}]}, ""),
        ({}, "# skipped fp8_e4m3_native: the probe failed on rank 0\n"),
    ]
    for meta, console in notes:
        rep = gc.StepReport("native")
        gc.check_native(rep, native_frame(["fp8_e5m2_native:block128"]), meta, console, precs)
        assert rep.ok, (meta, console, rep.failures)
        assert rep.figures["fp8_e4m3_native"].startswith("skipped: ")
    # the metadata entry commbench writes (orchestrate: meta["skipped"]) is shown whole, its reason included
    entry = {"collective": "all_reduce", "precision": "fp8_e4m3_native", "group": "world", "reason": "torch refused"}
    assert gc.skip_notes("fp8_e4m3_native", {"skipped": [entry]}, "") == [
        "metadata skipped[0]: collective=all_reduce, precision=fp8_e4m3_native, group=world, reason=torch refused"
    ]


def training_frame(**over: Any) -> pd.DataFrame:
    row = {"policy": "fp32", "error": "", "peak_mem_kind": "cuda_allocator", "peak_mem_bytes": 1e6,
           "final_loss": 6.3, "final_loss_drift": 0.0, "max_grad_norm_drift": 0.0}  # fmt: skip
    other = {**row, "policy": "fp8_hook", "final_loss_drift": -2e-5, "max_grad_norm_drift": 5e-4, **over}
    return pd.DataFrame([row, other])


def test_check_training() -> None:
    rep = gc.StepReport("training")
    gc.check_training(rep, training_frame(), ["fp32", "fp8_hook"], "cuda_allocator")
    assert rep.ok and rep.figures["max_grad_norm_drift"] == 5e-4

    cases = {
        "peak_mem_kind": ("cpu_heap", "fp8_hook: peak_mem_kind = cpu_heap, expected cuda_allocator"),
        "peak_mem_bytes": (math.nan, "fp8_hook: peak_mem_bytes = nan"),
        "max_grad_norm_drift": (math.inf, "fp8_hook: max_grad_norm_drift = inf (not finite)"),
        "final_loss_drift": (math.nan, "fp8_hook: final_loss_drift = nan (not finite)"),
        "error": ("OutOfMemoryError: CUDA out of memory", "fp8_hook: raised OutOfMemoryError: CUDA out of memory"),
    }
    for col, (value, message) in cases.items():
        rep = gc.StepReport("training")
        gc.check_training(rep, training_frame(**{col: value}), ["fp32", "fp8_hook"], "cuda_allocator")
        assert rep.failures == [message], col

    rep = gc.StepReport("training")
    gc.check_training(rep, training_frame(), ["fp32", "fp8_hook", "zero3_bf16"], "cuda_allocator")
    assert rep.failures == ["zero3_bf16: no training row"]


def test_training_layout_skips_of_a_one_rank_world() -> None:
    # One GPU is a 1-rank NCCL world: every pipeline policy and the 2-D TP x DP ones cannot form their layout and
    # must say so in one line; the 1-D TP ones run (TP over one rank), as do all data-parallel ones.
    skips = gc.layout_skips(gc.TRAINING_TOML, world_size=1)
    from commbench.training.policies import list_policies

    names = list_policies()
    model_parallel = {p for p in names if p.startswith(("pp_", "cp_", "tp_pp_dp_"))}  # CP needs 2 ranks, 3-D 8
    assert model_parallel | {"tp_dp_fp32", "tp_dp_bf16"} == set(skips)
    assert all(reason for reason in skips.values())
    frame = training_frame()
    rows = [{"policy": p, "error": f"{p} skipped: {why}"} for p, why in skips.items()]
    df = pd.concat([frame, pd.DataFrame(rows)], ignore_index=True)
    rep = gc.StepReport("training")
    gc.check_training(rep, df, ["fp32", "fp8_hook", *skips], "cuda_allocator", skips)
    assert rep.ok, rep.failures
    assert rep.figures["policies_skipped_by_layout"] == len(skips)
    # a skipped policy whose row says something else (it ran and failed) is a failure
    p = next(iter(skips))
    bad = df.assign(error=df["error"].where(df["policy"] != p, "RuntimeError: boom"))
    rep = gc.StepReport("training")
    gc.check_training(rep, bad, ["fp32", "fp8_hook", *skips], "cuda_allocator", skips)
    assert len(rep.failures) == 1 and rep.failures[0].startswith(f"{p}: expected the layout skip")


def test_copy_fraction_uses_read_plus_write_bytes() -> None:
    n = 1000
    # copy: 8n bytes in 1 s; encode 5n bytes in 2 s, decode 5n bytes in 3 s: 10n bytes in 5 s
    f = gc.copy_fraction(2.0, 3.0, 1.0, n)
    assert f["copy_gbps"] == pytest.approx(8 * n / 1e9)
    assert f["encode_gbps"] == pytest.approx(5 * n / 2 / 1e9)
    assert f["decode_gbps"] == pytest.approx(5 * n / 3 / 1e9)
    assert f["fraction"] == pytest.approx((10 / 5) / 8)
    assert "bandwidth_fraction" not in f
    # the code path moves 9 B to encode (a tensor scale's second read) and 5 to decode: 14n bytes in 5 s
    g = gc.copy_fraction(2.0, 3.0, 1.0, n, moved=(9.0, 5.0))
    assert g["fraction"] == f["fraction"] and g["moved_b_per_element"] == 14.0
    assert g["bandwidth_fraction"] == pytest.approx((14 / 5) / 8)


# ------------------------------------------------------------------------------------------------ codec


@pytest.fixture
def kernel_restored() -> Any:
    from commbench.measure import fp8

    yield fp8
    fp8.use_kernel(True)


def test_codec_kernel_vs_torch_bit_exact(kernel_restored: Any) -> None:
    """The bit-exact comparison the GPU step makes (CPU vs CUDA), run here on the two CPU paths."""
    fp8 = kernel_restored
    fp8.use_kernel(True)
    if fp8.kernel_status() != "c":
        pytest.skip(f"the C kernel is not available here: {fp8.kernel_status()}")

    def with_kernel(on: bool) -> Any:
        def run(thunk: Any) -> Any:
            fp8.use_kernel(on)
            return thunk()

        return run

    cpu = torch.device("cpu")
    rep = gc.StepReport("codec_exact")
    gc.codec_exact_cases(rep, with_kernel(True), with_kernel(False), cpu, cpu, ("kernel", "torch"))
    assert rep.ok, rep.failures[:5]
    assert rep.figures["cases"] == len(gc.CODEC_CASES) * (len(gc.codec_inputs()) + 1)


def test_special_values_reach_every_branch() -> None:
    x = gc.special_values(2**12 + 77, seed=0)
    assert torch.isnan(x).any() and torch.isposinf(x).any() and torch.isneginf(x).any()
    assert ((x != 0) & (x.abs() < 1.17e-38)).any()  # float32 subnormals
    assert (x == 0).any() and (torch.signbit(x) & (x == 0)).any()  # -0.0
    assert (x[128:256] == 0).all() and torch.isnan(x[256:384]).all()


def test_compare_codec_finds_each_kind_of_difference() -> None:
    cpu = torch.device("cpu")
    x = gc.special_values(2**12 + 77, seed=1)
    a = gc.codec_roundtrip(x, "e4m3", "block", 128, cpu)
    assert gc.compare_codec(a, a) == []

    codes = a.codes.clone()
    codes[5] ^= 1
    scales = a.scales.clone()
    scales[2] *= 2
    dec = a.decoded.clone()
    finite = torch.nonzero(torch.isfinite(dec) & (dec != 0))[:, 0]
    dec[finite[0]] = -dec[finite[0]]
    dec[finite[1]] = math.nan
    found = gc.compare_codec(a, gc.CodecResult(codes, scales, dec))
    assert [f.split(":")[0] for f in found] == ["codes", "scales", "decoded", "decoded"]
    assert found[0].startswith("codes: 1 of 4173 differ (first at 5")
    assert "NaN at 1 positions" in found[2] and found[3].startswith("decoded: 1 of 4173 differ")

    # a NaN input encoded as another NaN code (its sign) is reported apart, not failed
    nan_at = int(torch.nonzero(torch.isnan(a.decoded))[0, 0])
    flipped = a.codes.clone()
    flipped[nan_at] ^= 0x80
    other = gc.CodecResult(flipped, a.scales, a.decoded)
    assert gc.compare_codec(a, other) == [] and gc.nan_code_differences(a, other) == 1
    # ... but a NaN code where the other result has a number is a difference
    nan_code = gc.CodecResult(flipped.clone(), a.scales, a.decoded.clone())
    nan_code.codes[5] = a.codes[nan_at]
    nan_code.decoded[5] = math.nan
    found = gc.compare_codec(a, nan_code)
    assert found[0].startswith("codes: 1 of 4173 differ (first at 5") and "NaN at 1 positions" in found[1]

    # +0.0 against -0.0 is a bit difference too
    zero = gc.CodecResult(a.codes, a.scales, torch.zeros(3))
    negzero = gc.CodecResult(a.codes, a.scales, -torch.zeros(3))
    assert gc.compare_codec(zero, negzero) == ["decoded: 3 of 3 differ (first at 0: 0.0 vs -0.0)"]


# ------------------------------------------------------------------------------------------------- hook


def _hook_world(rank: int, world: int, numel: int) -> dict[str, Any]:
    mod = load_gpu_check()
    cpu = torch.device("cpu")
    found: dict[str, Any] = {name: mod.hook_vs_sync(name, numel, cpu) for name in ("fp8_e4m3", "fp8_e5m2:block128", "fp8_e4m3:none")}
    rep = mod.StepReport("hook")
    found["control"] = [mod.hook_control(rep, "fp8_e4m3", numel, cpu), rep.figures]
    return found


@pytest.mark.timeout(120)
def test_hook_matches_the_synchronous_chunked_all_reduce_on_gloo() -> None:
    (found,) = run_in_world(_hook_world, nproc=1, timeout=100, numel=100_003)
    # the control on gloo: a work is complete on the host before its stage runs, so removing the waits changes
    # nothing and the control says the check has no power here (on NCCL it must differ: docs/gpu.md)
    bad, figures = found.pop("control")
    assert bad == 0 and figures["hook check power"].startswith("none here"), figures
    for name, by_bucket in found.items():
        calls = ["step0.call0(bucket 0)", "step0.call1(bucket 1)", "step1.call0(bucket 0)", "step1.call1(bucket 0)"]
        assert list(by_bucket) == calls, name
        assert set(by_bucket.values()) == {0}, (name, by_bucket)


def _stale_hook_world(rank: int, world: int, numel: int) -> dict[str, int]:
    """A hook that hands back its input unreduced, as a racing decode would: the comparison must see it."""
    import commbench.training.hooks as hooks

    def codec_hook(name: str) -> Any:
        def hook(group: Any, bucket: Any) -> Any:
            fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        return hook

    hooks.codec_hook = codec_hook  # type: ignore[assignment]
    return load_gpu_check().hook_vs_sync("fp8_e4m3", numel, torch.device("cpu"))  # type: ignore[no-any-return]


@pytest.mark.timeout(120)
def test_hook_comparison_sees_a_result_that_is_not_the_reduction() -> None:
    (found,) = run_in_world(_stale_hook_world, nproc=1, timeout=100, numel=10_007)
    assert len(found) == 4 and all(v > 10_007 // 2 for v in found.values()), found


def test_duck_bucket_and_gradient_like() -> None:
    g = torch.Generator().manual_seed(0)
    x = gc.gradient_like(3 * 4096 + 5, g, torch.device("cpu"))
    amax = [float(x[i * 4096 : (i + 1) * 4096].abs().max()) for i in range(3)]
    assert len({math.floor(math.log2(a)) for a in amax}) > 1  # chunks of another magnitude
    b = gc.DuckBucket(x, 3)
    assert b.buffer() is x and b.index() == 3


def test_memory_agreement_and_the_probe_steps_need_cuda(tmp_path: Path) -> None:
    mib = 2**20
    assert gc.agree(100 * mib, 104 * mib) and gc.agree(10 * mib, 11.5 * mib)  # 5 % or 2 MiB of rounding
    assert not gc.agree(100 * mib, 132 * mib)  # a 32 MiB workspace in one of them: caught
    assert not gc.agree(float("nan"), 1.0)
    for name in ("counts", "memory", "launch", "cuda_graph"):
        rep = gc.run_step(name, tmp_path, 30)
        assert not rep.ok and any("no CUDA device" in f or "CUDA" in f for f in rep.failures), (name, rep.failures)


def test_the_steps_find_the_repository() -> None:
    """The steps load benchmarks/*.py and start the CLI from the repository root: a REPO one level short (the
    benchmarks folder) made the counts and cuda_graph steps fail on the first H200 run."""
    assert gc.REPO == REPO
    assert (gc.REPO / "benchmarks" / "gpu_cuda_graph.py").is_file()
    assert (gc.REPO / "benchmarks" / "bench_codec_launches.py").is_file()
