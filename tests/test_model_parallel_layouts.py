"""Model-parallel layouts refused or reported as the issue asks, without a world: a run whose every requested
tensor/pipeline-parallel policy was skipped exits non-zero (`orchestrate.model_parallel_skipped`); the bubble
fraction's theory is Narayanan et al. 2021's (p - 1) / (v m + p - 1)."""

from __future__ import annotations

import pytest

from commbench.cli.orchestrate import model_parallel_skipped
from commbench.training.p2p_timing import bubble_theory


def _row(policy: str, parallelism: str, error: str = "") -> dict[str, object]:
    return {"policy": policy, "parallelism": parallelism, "error": error}


def test_a_run_whose_every_model_parallel_policy_was_skipped_is_a_failure() -> None:
    dp_ok = _row("fp32", "dp")
    skipped = [_row("tp_fp32", "tp", "tp_fp32 skipped: tp_degree=3 does not divide world_size=2"),
               _row("pp_gpipe_fp32", "pp+dp", "rank 1 failed")]  # fmt: skip
    line = model_parallel_skipped([dp_ok, *skipped])
    assert "tp_fp32, pp_gpipe_fp32" in line and "\n" not in line
    assert model_parallel_skipped([dp_ok, skipped[0], _row("pp_1f1b_fp32", "pp")]) == ""  # one ran
    assert model_parallel_skipped([dp_ok, _row("fp8_hook", "dp", "failed")]) == ""  # none requested
    assert model_parallel_skipped([]) == ""


def test_bubble_theory_is_narayanan_et_al() -> None:
    # GPipe / 1F1B: (p - 1) / (m + p - 1); worked by hand: p=4, m=8 -> 3/11; p=2, m=1 -> 1/2
    assert bubble_theory(4, 8) == pytest.approx(3 / 11, rel=1e-15)
    assert bubble_theory(2, 1) == pytest.approx(0.5, rel=1e-15)
    # interleaved with v=2 stages per rank: the bubble shrinks by v in the micro-batch term: 3 / (16 + 3)
    assert bubble_theory(4, 8, 2) == pytest.approx(3 / 19, rel=1e-15)
    assert bubble_theory(1, 8) == 0.0
