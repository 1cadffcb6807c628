"""commbench.stats against independent references: binomial tables for the median's interval, simulated coverage."""

from __future__ import annotations

import math
import random

import pytest

from commbench import stats


@pytest.mark.parametrize(
    ("n", "lo", "hi", "coverage"),
    [
        # Order statistics of the 95 % interval of the median (Conover, Practical Nonparametric Statistics,
        # Table A3; coverage = 1 - 2 P(Binomial(n, 1/2) <= lo - 1)).
        (6, 1, 6, 1 - 2 / 64),
        (10, 2, 9, 1 - 2 * 11 / 1024),
        (20, 6, 15, 0.9586),
        (50, 18, 33, 0.9672),
    ],
)
def test_median_rank_bounds_match_binomial_tables(n: int, lo: int, hi: int, coverage: float) -> None:
    got_lo, got_hi, got_cov = stats.median_rank_bounds(n)
    assert (got_lo, got_hi) == (lo, hi)
    assert got_cov == pytest.approx(coverage, abs=1e-4)
    assert got_cov >= 0.95


def test_too_few_samples_give_the_widest_interval_with_its_lower_coverage() -> None:
    e = stats.median_ci([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (e.value, e.low, e.high) == (3.0, 1.0, 5.0)
    assert e.coverage == pytest.approx(1 - 2 / 32)
    assert e.coverage < 0.95


def test_median_interval_covers_the_true_median_at_least_95_percent() -> None:
    rng = random.Random(1234)
    trials, hits = 2000, 0
    for _ in range(trials):
        xs = [rng.lognormvariate(0.0, 0.3) for _ in range(12)]  # true median exp(0) = 1
        e = stats.median_ci(xs)
        hits += e.low <= 1.0 <= e.high
    # exact coverage for n = 12 is 0.961; 2000 trials give a binomial sd of ~0.004
    assert hits / trials > 0.945


def test_per_sample_mean_across_ranks_truncates_to_the_shortest_rank() -> None:
    assert stats.per_sample_across_ranks([[1.0, 2.0, 3.0], [3.0, 4.0]]) == [2.0, 3.0]


def test_paired_ratio_removes_shared_drift() -> None:
    # Both sides drift by the same factor round to round: each pair's ratio is exactly 0.5.
    drift = [1.0, 1.5, 0.7, 2.0, 1.1, 0.9, 1.3]
    a = [0.5 * d for d in drift]
    e = stats.paired_ratio_ci(a, drift)
    assert (e.value, e.low, e.high) == (0.5, 0.5, 0.5)
    assert stats.significant(e)
    unpaired = stats.ratio_of(stats.median_ci(a), stats.median_ci(drift))
    assert unpaired.low < 0.5 < unpaired.high
    assert unpaired.high - unpaired.low > 0.1


def test_ratio_of_independent_estimates_in_log_space() -> None:
    a = stats.Estimate(2.0, 2.0 / math.exp(stats.Z95 * 0.1), 2.0 * math.exp(stats.Z95 * 0.1), 10)
    b = stats.Estimate(1.0, 1.0 / math.exp(stats.Z95 * 0.1), math.exp(stats.Z95 * 0.1), 10)
    r = stats.ratio_of(a, b)
    se = math.hypot(0.1, 0.1)
    assert r.value == pytest.approx(2.0)
    assert r.low == pytest.approx(2.0 * math.exp(-stats.Z95 * se))
    assert r.high == pytest.approx(2.0 * math.exp(stats.Z95 * se))


def test_significance_needs_the_interval_to_exclude_one_and_the_threshold() -> None:
    assert not stats.significant(stats.Estimate(1.1, 0.99, 1.2, 10))
    assert stats.significant(stats.Estimate(1.1, 1.01, 1.2, 10))
    assert not stats.significant(stats.Estimate(1.1, 1.01, 1.2, 10), min_effect=0.05)
    assert stats.significant(stats.Estimate(0.8, 0.7, 0.9, 10), min_effect=0.05)
    assert not stats.significant(stats.Estimate(math.nan, math.nan, math.nan, 0))


def test_invert_swaps_the_interval() -> None:
    e = stats.invert(stats.Estimate(2.0, 1.0, 4.0, 8))
    assert (e.value, e.low, e.high) == (0.5, 0.25, 1.0)


def test_rel_half_width() -> None:
    assert stats.Estimate(10.0, 9.0, 11.0, 8).rel_half_width == pytest.approx(0.1)
    assert stats.Estimate(10.0, math.nan, 11.0, 8).rel_half_width == math.inf
