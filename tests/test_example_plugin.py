"""The example plugin (examples/plugin: a codec, a training policy, a figure), installed as its own distribution
into a temporary target (offline, no build isolation: nothing enters the environment) and used the way a user
does, through its entry point only: `commbench list` names all three, `run --precisions fp32,example_int8` with
a `[training]` section listing the example policy writes their rows on a 2-rank gloo world, and `report` draws
the example figure. No file of commbench names the plugin."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import commbench
from tests.cli_util import commbench as run_cli

pytestmark = pytest.mark.timeout(300)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plugin"
CODEC, POLICY, FIGURE = "example_int8", "example_int8_hook", "example_wire_ratio"
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]

SUITE = f"""name = "example-plugin"
collectives = {json.dumps(COLLECTIVES)}
precisions = ["fp32"]
min_bytes = "1K"
max_bytes = "4K"
factor = 4

[timing]
warmup = 1
min_time_s = 0.002
min_iters = 1
repeats = 3
budget_s = 0.3

[training]
model = "mlp"
policies = ["fp32", "{POLICY}"]
d_model = 16
n_layers = 1
vocab = 4
steps = 2
warmup_steps = 1
comm_timed_steps = 1
paired = false
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PYTHONPATH for the subprocesses: the installed example, then the commbench these tests import."""
    tmp = tmp_path_factory.mktemp("example-plugin")
    src, target = tmp / "src", tmp / "site"
    # built from a copy: the build leaves build/ and *.egg-info next to the sources
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "--quiet",
           "--disable-pip-version-check", "--target", str(target), str(src)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "commbench_example").is_dir()
    root = Path(commbench.__file__).resolve().parents[1]
    return {"PYTHONPATH": os.pathsep.join([str(target), str(root)]), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def run(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("example-run")
    suite = tmp / "example.toml"
    suite.write_text(SUITE)
    out = tmp / "run"
    proc = run_cli("run", str(suite), "--precisions", f"fp32,{CODEC}", "--nproc", "2", "--out", str(out),
                   "--quiet", "--no-report", cwd=tmp, timeout=240, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out


def test_list_names_the_codec_the_policy_and_the_figure(env: dict[str, str], tmp_path: Path) -> None:
    proc = run_cli("list", cwd=tmp_path, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in (CODEC, POLICY, FIGURE):
        assert name in proc.stdout, (name, proc.stdout)


def test_without_the_plugin_nothing_of_it_is_known(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(Path(commbench.__file__).resolve().parents[1])}
    proc = run_cli("list", cwd=tmp_path, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert CODEC not in proc.stdout and POLICY not in proc.stdout


def test_plugin_flag_loads_it_without_installing(tmp_path: Path) -> None:
    root = Path(commbench.__file__).resolve().parents[1]
    env = {"PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(root)])}  # the sources: no entry point
    proc = run_cli("--plugin", "commbench_example", "list", cwd=tmp_path, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert CODEC in proc.stdout and POLICY in proc.stdout


def test_example_codec_is_a_precision(run: Path) -> None:
    df = commbench.load(run)
    rows = df[df["precision"] == CODEC]
    assert sorted(set(rows["collective"])) == sorted(COLLECTIVES)
    assert len(rows) == len(COLLECTIVES) * 2  # 1K and 4K
    assert (rows["impl"] == f"{CODEC}_bytes").all()
    assert (rows["wrong"] == 0).all()  # within the codec's own error bound
    assert rows["rel_err"].map(math.isfinite).all() and (rows["rel_err"] > 0).all()  # int8 loses something
    fp32 = df[df["precision"] == "fp32"].set_index(["collective", "fp32_bytes"])
    for _, r in rows.iterrows():
        # one byte per element plus float32 scales: about a quarter of fp32's wire bytes
        assert r["wire_bytes"] < 0.5 * fp32.loc[(r["collective"], r["fp32_bytes"]), "wire_bytes"]


def test_example_policy_trains(run: Path) -> None:
    rows = {r["policy"]: r for r in commbench.load_training(run).to_dict("records")}
    assert set(rows) == {"fp32", POLICY}
    row = rows[POLICY]
    assert not isinstance(row["error"], str) or row["error"] == "", row["error"]
    assert row["family"] == "ddp" and row["comm_dtype"] == CODEC
    assert math.isfinite(row["final_loss"]) and math.isfinite(row["underflow_frac"])
    measured, expected = json.loads(row["comm_by_op"]), json.loads(row["comm_expected_by_op"])
    assert set(measured) == set(expected) and all(measured[k] == pytest.approx(expected[k]) for k in expected)
    assert row["comm_saved_vs_fp32"] > 0.5  # int8 codes instead of fp32 gradients


def test_report_draws_the_example_figure(run: Path, env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = run_cli("report", str(run), "--out", str(out), cwd=tmp_path, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = next(out.rglob("report.md")).read_text()
    assert f"{FIGURE}.png" in md
    assert "Bytes on the wire per fp32 byte" in md  # its caption
    assert next(out.rglob(f"{FIGURE}.png")).stat().st_size > 0
