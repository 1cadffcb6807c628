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


def test_schedules_place_their_stages_as_the_papers_draw_them() -> None:
    from commbench.training.pp_schedules import SCHEDULES

    # looped (Narayanan et al. 2021, fig. 4): stage s on rank s mod p; ZBV (Qi et al.): a V, rank 0 holds 0 and 2p-1
    assert [SCHEDULES["interleaved_1f1b"].rank_of(s, 4) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [SCHEDULES["zbv"].rank_of(s, 4) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [SCHEDULES["gpipe"].rank_of(s, 4) for s in range(4)] == [0, 1, 2, 3]
    assert SCHEDULES["zbv"].per_rank(5) == 2 and SCHEDULES["1f1b"].per_rank(5) == 1
    assert SCHEDULES["interleaved_1f1b"].per_rank(3) == 3


def test_balanced_and_given_stage_layers() -> None:
    from commbench.training.pp_schedules import balanced, split_error

    assert balanced(8, 4) == (2, 2, 2, 2)
    assert balanced(6, 4) == (1, 2, 2, 1)  # the extras to the middle: the ends hold the embeddings and the head
    assert balanced(5, 2) == (3, 2) and sum(balanced(13, 5)) == 13
    assert split_error(4, 4, ()) is None and split_error(4, 4, (1, 1, 1, 1)) is None
    assert "at least 8 layers" in (split_error(4, 8, ()) or "")
    assert "3 entries" in (split_error(4, 2, (1, 1, 2)) or "")
    assert "sums to 3" in (split_error(4, 2, (1, 2)) or "")


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ({"pp_degree": 2, "microbatches": 1, "policies": ["pp_1f1b_fp32"]}, "1F1B needs at least as many micro-batches"),
        ({"pp_degree": 2, "n_layers": 4, "policies": ["pp_interleaved_fp32"], "virtual_stages": 3}, "at least 6 layers"),
        ({"pp_degree": 2, "n_layers": 4, "stage_layers": [1, 3, 1], "policies": ["pp_gpipe_fp32"]}, "3 entries"),
        ({"pp_degree": 4, "n_layers": 8, "microbatches": 9, "batch_size": 9, "policies": ["pp_interleaved_fp32"]},
         "2 rounds, which must divide microbatches=9"),  # torch's rule: max(1, m // p) rounds of m / rounds each
    ],
)  # fmt: skip
def test_impossible_pipelines_fail_when_the_suite_loads(table: dict[str, object], needle: str) -> None:
    from commbench.training.config import TrainingConfig

    with pytest.raises(ValueError, match="training.policies") as err:
        TrainingConfig.from_dict(table)
    assert needle in str(err.value) and "\n" not in str(err.value)
