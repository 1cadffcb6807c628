"""commbench.core.stats against independent references: binomial tables for the median's interval, simulated coverage."""

from __future__ import annotations

import math
import random

import pytest

from commbench.core import stats


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


@pytest.mark.parametrize("confidence", [0.95, 0.99, 0.9])
def test_median_rank_bounds_match_the_binomial_definition_for_every_n(confidence: float) -> None:
    # The definition written out term by term: l is the largest rank with P(B <= l) <= alpha/2 still below the
    # median, B ~ Binomial(n, 1/2); exact integer arithmetic.
    for n in range(1, 400):

        def cdf(k: int, n: int = n) -> float:
            return sum(math.comb(n, i) for i in range(k + 1)) / 2**n

        lo = 1
        while lo + 1 <= (n + 1) // 2 and cdf(lo) <= (1 - confidence) / 2:
            lo += 1
        got = stats.median_rank_bounds(n, confidence)
        assert got[:2] == (lo, n + 1 - lo), n
        assert got[2] == pytest.approx(1 - 2 * cdf(lo - 1), abs=1e-12), n


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


def test_adjust_many_reproduces_benjamini_hochberg_1995_example() -> None:
    from statistics import NormalDist

    from commbench.core.stats import adjust_many

    # Benjamini & Hochberg (1995), section 4: 15 p-values, q = 0.05 rejects the four smallest.
    ps = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262, 0.5719, 0.6528,
          0.7590, 1.0]  # fmt: skip
    z = [NormalDist().inv_cdf(1 - p / 2) if p < 1 else 0.0 for p in ps]
    adj = adjust_many(z, [1.0] * len(ps))
    assert adj.selected == tuple([True] * 4 + [False] * 11)
    assert adj.p_values == pytest.approx(ps, abs=1e-12)
    assert adj.m == 15
    # FCR level 1 - R q / m with R = 4: z of 1 - 4 * 0.05 / 30
    assert adj.z == pytest.approx(NormalDist().inv_cdf(1 - 4 * 0.05 / 30))


def test_adjusted_intervals_exclude_zero_exactly_for_the_selected() -> None:
    import random

    from commbench.core.stats import adjust_many

    rng = random.Random(7)
    for _ in range(200):
        m = rng.randint(1, 40)
        lr = [rng.gauss(0, 1) * rng.choice([0.0, 0.05, 0.3]) + rng.gauss(0, 0.05) for _ in range(m)]
        se = [rng.uniform(0.01, 0.1) for _ in range(m)]
        adj = adjust_many(lr, se)
        for x, s, chosen in zip(lr, se, adj.selected, strict=True):
            assert (abs(x) > adj.z * s) == chosen


def test_identical_runs_give_about_no_significant_ratio_after_adjustment() -> None:
    import random

    from commbench.core.stats import Z95, adjust_many

    # 100 ratios of two identical runs (true log-ratio 0, exact standard errors): marginal 95 % intervals exclude 0
    # for about 5 of them; the adjusted ones for none in at least 95 % of repetitions (FWER = FDR under the null).
    rng = random.Random(11)
    marginal = flagged_runs = 0
    for _ in range(400):
        se = [rng.uniform(0.02, 0.2) for _ in range(100)]
        lr = [rng.gauss(0, s) for s in se]
        marginal += sum(abs(x) > Z95 * s for x, s in zip(lr, se, strict=True))
        flagged_runs += any(adjust_many(lr, se).selected)
    assert 0.04 < marginal / 40000 < 0.06
    assert flagged_runs / 400 < 0.08
