"""`commbench list` and every `--help` run without importing torch (issue 13): each command runs in a fresh
interpreter through a wrapper that, after the command, asserts ``torch`` is not in ``sys.modules``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_util import commbench

ROOT = Path(__file__).resolve().parents[1]

# Runs `python -m commbench ARGS` in this interpreter (main exits through SystemExit), then reports whether
# torch was imported: exit 3 and its name on stderr if so, else the command's own exit code.
WRAPPER = """
import runpy, sys
sys.argv = ["commbench", *sys.argv[1:]]
try:
    runpy.run_module("commbench", run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as e:
    code = e.code
if "torch" in sys.modules:
    print("torch was imported", file=sys.stderr)
    sys.exit(3)
sys.exit(code)
"""


def _run_without_torch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WRAPPER, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "args, expect",
    [
        (("--help",), "usage: commbench"),
        (("run", "--help"), "usage: commbench run"),
        (("report", "--help"), "usage: commbench report"),
        (("compare", "--help"), "usage: commbench compare"),
        (("plan", "--help"), "usage: commbench plan"),
    ],
)
def test_help_imports_no_torch(args: tuple[str, ...], expect: str) -> None:
    r = _run_without_torch(*args)
    assert r.returncode == 0, r.stderr
    assert expect in r.stdout


def test_list_imports_no_torch() -> None:
    r = _run_without_torch("list")
    assert r.returncode == 0, r.stderr
    assert "training policies:" in r.stdout  # the policy table was built, not skipped


def test_list_prints_nccl_tests_definitions(tmp_path: Path) -> None:
    """What `list` says of each collective is nccl-tests' size definition and bus factor (PERFORMANCE.md)."""
    r = commbench("list", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in r.stdout.splitlines() if line.startswith("  ")}
    assert rows["all_reduce"] == "buffer; 2(n-1)/n"
    assert rows["all_gather"] == "total output; (n-1)/n"
    assert rows["reduce_scatter"] == "total input; (n-1)/n"
    assert rows["all_to_all"] == "per-rank buffer; (n-1)/n"
    # wire types in nccl-tests' names: bf16 travels as "bfloat16", the fp8 codecs as bytes, native fp8 as f8e4m3
    assert rows["bf16_compress"].split()[:3] == ["cast", "wire", "bfloat16"]
    assert rows["fp8_e4m3"].split()[:3] == ["fp8_bytes", "wire", "uint8"]
    assert rows["fp8_e4m3_native"].split()[:3] == ["fp8_native", "wire", "f8e4m3"]
