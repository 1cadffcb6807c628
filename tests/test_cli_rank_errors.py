"""Bad input under a launcher: every rank meets it, only the job's rank 0 prints the one line (exit 2 on all)."""

from __future__ import annotations

import pytest

from commbench.cli import main

LAUNCHER_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in LAUNCHER_VARS:
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize("var", LAUNCHER_VARS)
@pytest.mark.parametrize("argv", [["run", "--collectives", "bogus"], ["run", "--nosuch-flag"]])
def test_bad_input_prints_once_per_job(
    var: str, argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(var, "3")
    assert main(argv) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(var, "0")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("commbench: error: ")


def test_without_launcher_the_line_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--collectives", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "unknown collective 'bogus'" in err and "all_reduce" in err
