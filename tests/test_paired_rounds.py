"""Paired, interleaved policy rounds (issue 35 item 1): the interval's coverage on synthetic timings, the "n too
small" rule, the rounds' order, and the rows and table built from them. Pure unit tests: no world.

Synthetic step times model a shared machine: a slow random walk of the load in log space (shared by whatever runs
at that moment) times independent per-step noise. The reference for coverage is the definition: in an A/A
comparison (both sides the same policy) a 95 % interval excludes 1 in at most 5 % of trials; a planted 10 %
difference is found in most trials at the stated number of rounds. The order-statistic ranks are the published
ones (n = 10: the 2nd and 9th; n = 6: the 1st and 6th, coverage 1 - 2/64; Hollander & Wolfe, sign-test table).
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pandas as pd
import pytest

from commbench.core import stats
from commbench.training import pairing

TRIALS = 1000


def _interleaved(rng: random.Random, rounds: int, k: int, effect: float, drift: float = 0.02, noise: float = 0.05,
                 ) -> tuple[list[float], list[float]]:  # fmt: skip
    """(policy times, reference times) of `rounds` rounds of `k` steps in the order `pairing.run_rounds` runs them
    (reference first in even rounds, the policy first in odd ones), the policy `effect` times the reference."""
    load, pol, ref = 0.0, [], []
    for r in range(rounds):
        for side in ("ref", "pol") if r % 2 == 0 else ("pol", "ref"):
            for _ in range(k):
                load += rng.gauss(0.0, drift)
                t = 100_000.0 * math.exp(load + rng.gauss(0.0, noise))
                (pol if side == "pol" else ref).append(t * effect if side == "pol" else t)
    return pol, ref


def _sequential(rng: random.Random, steps: int, effect: float, drift: float = 0.02, noise: float = 0.05,
                ) -> tuple[list[float], list[float]]:  # fmt: skip
    """The same machine with the reference's steps all run first, then the policy's (the unpaired design)."""
    load, out = 0.0, []
    for _ in range(2 * steps):
        load += rng.gauss(0.0, drift)
        out.append(100_000.0 * math.exp(load + rng.gauss(0.0, noise)))
    return [t * effect for t in out[steps:]], out[:steps]


def test_aa_flagged_in_at_most_5_percent_and_a_planted_10_percent_found() -> None:
    rng = random.Random(35)
    k, rounds = 2, 10
    aa = sum(stats.significant(stats.rounds_ratio_ci(*_interleaved(rng, rounds, k, 1.0), k)) for _ in range(TRIALS))
    assert aa / TRIALS <= 0.05, aa
    found = 0
    for _ in range(TRIALS):
        e = stats.rounds_ratio_ci(*_interleaved(rng, rounds, k, 1.10), k)
        assert e.n == rounds and e.coverage >= 0.95
        found += e.low > 1.0
    assert found / TRIALS >= 0.9, found
    # the same machine timed one policy after the other: the load's drift alone is called a difference far more
    # often than 5 % (why the rounds are paired)
    unpaired = 0
    for _ in range(TRIALS):
        pol, ref = _sequential(rng, rounds * k, 1.0)
        unpaired += stats.significant(stats.ratio_of(stats.median_ci(pol), stats.median_ci(ref)))
    assert unpaired / TRIALS > 0.2, unpaired


def test_rounds_ratio_is_the_median_of_per_round_ratios_of_medians() -> None:
    # 3 rounds of 2 steps (a 7th step, an incomplete round, is left out)
    pol = [10.0, 14.0, 9.0, 9.0, 30.0, 10.0, 99.0]
    ref = [10.0, 10.0, 10.0, 8.0, 20.0, 20.0]
    e = stats.rounds_ratio_ci(pol, ref, 2)
    ratios = sorted([12.0 / 10.0, 9.0 / 9.0, 20.0 / 20.0])
    assert e.n == 3 and e.value == pytest.approx(ratios[1])
    assert (e.low, e.high) == pytest.approx((min(ratios), max(ratios))) and e.coverage == pytest.approx(1 - 2 / 8)
    six = stats.rounds_ratio_ci([float(v) for v in range(1, 7)], [1.0] * 6)
    assert (six.low, six.high, six.coverage) == pytest.approx((1.0, 6.0, 1 - 2 / 64))
    ten = stats.rounds_ratio_ci([float(v) for v in (5, 3, 9, 1, 7, 2, 8, 4, 10, 6)], [1.0] * 10)
    assert (ten.low, ten.high) == pytest.approx((2.0, 9.0))  # the 2nd and 9th order statistics


def test_too_few_rounds_claim_no_interval_and_say_what_is_needed() -> None:
    e = stats.rounds_ratio_ci([2.0, 2.1], [1.0, 1.0])  # the min-max of 2 covers 50 %, not 95 %
    assert e.coverage == pytest.approx(0.5)
    c = stats.claimable(e)
    assert c.value == e.value and math.isnan(c.low) and math.isnan(c.high) and not stats.significant(c)
    assert stats.claimable(stats.rounds_ratio_ci([2.0] * 6, [1.0] * 6)).low == pytest.approx(2.0)
    assert stats.steps_for_95(1) == 6 and stats.steps_for_95(3) == 18
    text = stats.too_few_text(2, 3)
    assert text.startswith("n too small: 2 rounds of 3 steps") and "needs 6 (18 measured steps)" in text


class _FakeSession:
    """Records the order of steps (`pairing._Session`): which side ran which step, and that each was aligned."""

    def __init__(self, name: str, log: list[tuple[str, int, bool]]) -> None:
        self.name, self.log = name, log
        self.aligned = 0
        self._times: list[float] = []
        self.device: Any = None
        self.counter: Any = None

    def align(self) -> None:
        self.aligned += 1

    def bare_step(self, s: int) -> None:
        self.log.append((self.name + " bare", s, False))

    def instrumented_step(self, s: int, *, measure_memory: bool = False, numerics: bool = True) -> None:
        assert not measure_memory
        self.log.append((self.name, s, numerics))

    def agreed(self, phase: str, fn: Any) -> Any:
        return fn()


def test_rounds_alternate_which_side_goes_first() -> None:
    log: list[tuple[str, int, bool]] = []
    pol, ref = _FakeSession("pol", log), _FakeSession("ref", log)
    pairing.warm_partner(pol, ref, 2)
    pairing.run_rounds(pol, ref, 2, 5, 2)  # steps 2..6 in rounds [2, 3], [4, 5], [6]
    assert log == [
        ("ref bare", 2, False),
        ("ref", 2, False), ("ref", 3, False), ("pol", 2, True), ("pol", 3, True),
        ("pol", 4, True), ("pol", 5, True), ("ref", 4, False), ("ref", 5, False),
        ("ref", 6, False), ("pol", 6, True),
    ]  # fmt: skip
    assert pol.aligned == 5 and ref.aligned == 6  # every step aligned, the warm-up too
    alone: list[tuple[str, int, bool]] = []
    pairing.run_rounds(_FakeSession("pol", alone), None, 0, 3, 1)
    assert alone == [("pol", 0, True), ("pol", 1, True), ("pol", 2, True)]


def _rows(paired: pairing.Paired | None, own: list[float]) -> Any:
    from commbench.core import plugins
    from commbench.training.config import TrainingConfig
    from commbench.training.policies import get_policy
    from commbench.training.records import PolicyRun, StepRecord, build_rows

    plugins.load()

    def run(name: str, times: list[float], p: pairing.Paired | None) -> PolicyRun:
        steps = [StepRecord(i, i < 1, 2.0, 1.0, 5e6 if i < 1 else times[i - 1], False, False, 0.0, {"all_reduce:fp32": 8.0})
                 for i in range(len(times) + 1)]  # fmt: skip
        return PolicyRun(get_policy(name), steps, 10, math.nan, "none", 40, {}, 0.0, [], [], paired=p)

    sec = TrainingConfig(steps=len(own), warmup_steps=1)
    base = run("fp32", [100.0] * len(own), None)
    import torch

    return build_rows(run("bf16_hook", own, paired), base, sec, 2, "gloo", torch.device("cpu"))[0]


def test_rows_carry_the_paired_speedup_and_the_table_its_verdict() -> None:
    from commbench.views.training_tables import TOO_FEW, gain_by_parallelism, training_speed

    own = [80.0, 81.0, 79.0, 82.0, 80.0, 78.0]
    ref = [100.0, 99.0, 101.0, 100.0, 102.0, 98.0]
    row = _rows(pairing.paired("fp32", own, ref, 1), own)
    ratios = sorted(r / o for o, r in zip(own, ref, strict=True))  # reference time over the policy's, per round
    assert row.speedup_vs_reference == pytest.approx(math.sqrt(ratios[2] * ratios[3]))  # centre of an even n in logs
    assert (row.speedup_ref_ci_low, row.speedup_ref_ci_high) == pytest.approx((ratios[0], ratios[-1]))
    assert row.speedup_ref_rounds == 6 and row.speedup_ref_basis == "paired rounds"
    assert json.loads(row.speedup_ref_times_us) == ref
    # the baseline is the reference: speedup_vs_fp32 is the same paired estimate
    assert (row.speedup_vs_fp32, row.speedup_ci_low, row.speedup_significant) == (
        row.speedup_vs_reference, row.speedup_ref_ci_low, True
    )  # fmt: skip
    few = _rows(pairing.paired("fp32", own[:2], ref[:2], 1), own[:2])
    assert math.isfinite(few.speedup_vs_reference) and math.isnan(few.speedup_ref_ci_low)
    assert few.speedup_ref_basis.startswith("n too small: 2 rounds") and few.speedup_significant is False
    # unpaired (paired = false) with 2 steps each: a value, no interval
    lone = _rows(None, own[:2])
    assert math.isfinite(lone.speedup_vs_fp32) and math.isnan(lone.speedup_ci_low) and lone.speedup_ref_basis == ""
    fp32 = dict(policy="fp32", parallelism="dp", reference_policy=None, steps=6, step_time_us_p50=100.0,
                step_time_us_ci_low=99.0, step_time_us_ci_high=101.0, error=None)  # fmt: skip
    frame = pd.DataFrame([fp32] + [_asdict(r) for r in (row, few)])
    frame["policy"] = ["fp32", "bf16_hook", "fp8_hook"]
    g = gain_by_parallelism(frame).set_index("policy")
    assert g.loc["bf16_hook", "verdict"] == "faster" and g.loc["bf16_hook", "speedup"] == row.speedup_vs_reference
    assert g.loc["fp8_hook", "verdict"] == TOO_FEW and math.isnan(g.loc["fp8_hook", "speedup_ci_low"])
    assert training_speed(pd.Series(_asdict(few)))[1] == TOO_FEW
    # rows without rounds (older runs): the unpaired ratio, "n too small" below 6 steps each
    old = frame.drop(columns=["speedup_vs_reference"]).assign(steps=[6, 6, 2])
    g = gain_by_parallelism(old).set_index("policy")
    assert g.loc["fp8_hook", "verdict"] == TOO_FEW and g.loc["bf16_hook", "verdict"] != TOO_FEW


def _asdict(r: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r)
