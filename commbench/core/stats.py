"""Uncertainty: confidence intervals of a point's time, of paired ratios, and when a difference is significant.

Pure functions over floats (no torch, no pandas), so views and the sweep share them.

Method (documented in the README, "Uncertainty"):

* A **sample** is the per-op time of k back-to-back ops started together after a barrier. The ranks' values of one
  sample are not independent (they time the same collective calls), so they are first combined into one value per
  sample (the mean over ranks, nccl-tests' ``-a`` convention); successive samples are treated as independent.
* The **centre** is the median of those per-sample values and its 95 % interval is the distribution-free
  order-statistic interval of the median (binomial; e.g. Hollander & Wolfe, *Nonparametric Statistical Methods*,
  §3.6): no normality assumption, no random resampling, so the same samples always give the same interval.
  With fewer than 6 samples no 95 % interval exists; the widest one (min, max) is returned with its lower coverage.
* A **paired ratio** (precision vs fp32 at the same size, sampled in alternating rounds) is the median of the
  per-round ratios with the same interval: slow drift of a shared machine lands on both sides of each pair.
* An **unpaired ratio** (run B vs run A) combines the two intervals in log space (delta method: independent,
  roughly log-normal errors).
* **Many ratios at once** (``compare`` of two runs: one ratio per point, often a hundred): at 95 % each, about
  5 % of the ratios of two identical runs would exclude 1 by chance alone. ``compare`` therefore selects its
  significant ratios with the Benjamini-Hochberg procedure (false discovery rate 5 %) and reports every ratio
  with the matching false-coverage-rate interval (Benjamini & Yekutieli 2005, JASA 100:71): level
  1 - R q / m for R selected of m. Those intervals exclude 1 exactly for the selected ratios, so "significant"
  still means "its interval excludes 1".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

Z95 = 1.959963984540054
"""Two-sided 95 % standard-normal quantile."""

_NORMAL = NormalDist()

MIN_SAMPLES_95 = 6
"""Fewest samples whose order-statistic interval of the median reaches 95 % coverage (1 - 2 * 0.5**6 = 0.969)."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """A centre with its confidence interval."""

    value: float
    low: float
    high: float
    n: int
    """Number of samples (or pairs) behind it."""
    coverage: float = 0.95
    """Actual coverage of [low, high] (order-statistic intervals are conservative: at least the target)."""

    @property
    def rel_half_width(self) -> float:
        """Half the interval's width relative to the centre (0.02 = ±2 %)."""
        if not (self.value > 0 and math.isfinite(self.low) and math.isfinite(self.high)):
            return math.inf
        return (self.high - self.low) / 2.0 / self.value

    @property
    def log_se(self) -> float:
        """Standard error of log(value) implied by the interval (normal in log space); NaN without a positive
        lower end."""
        if not (self.low > 0 and math.isfinite(self.high)):
            return math.nan
        return (math.log(self.high) - math.log(self.low)) / (2 * Z95)

    def excludes(self, x: float) -> bool:
        """True when the interval lies entirely on one side of ``x``."""
        return self.low > x or self.high < x


@functools.lru_cache(maxsize=1024)
def median_rank_bounds(n: int, confidence: float = 0.95) -> tuple[int, int, float]:
    """1-based ranks (l, u) of the order statistics bounding the median's interval, and its coverage.

    The largest l with P(B <= l - 1) <= alpha/2 for B ~ Binomial(n, 1/2); u = n + 1 - l; coverage
    1 - 2 P(B <= l - 1). For n = 10: (2, 9, 0.979); n = 20: (6, 15, 0.959) (standard tables).
    One pass over the binomial coefficients, cached per n: the sampling loop asks after every round (summing
    each CDF afresh made that quadratic in n: 8 ms a round at 400 rounds, CPU work between samples).
    """
    if n < 1:
        raise ValueError("median_rank_bounds needs at least one sample")
    alpha = 1.0 - confidence
    total = 2**n
    lo = 1
    coef = n  # C(n, lo)
    below = 1 + n  # sum of C(n, i) for i <= lo: 2^n P(B <= lo)
    while lo + 1 <= (n + 1) // 2 and below / total <= alpha / 2:
        lo += 1
        coef = coef * (n - lo + 1) // lo
        below += coef
    return lo, n + 1 - lo, 1.0 - 2.0 * ((below - coef) / total)


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    if n == 0:
        return math.nan
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def median_ci(values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """Median of ``values`` with its distribution-free order-statistic confidence interval."""
    s = sorted(v for v in values if not math.isnan(v))
    if not s:
        return Estimate(math.nan, math.nan, math.nan, 0, 0.0)
    lo, hi, cov = median_rank_bounds(len(s), confidence)
    return Estimate(median(s), s[lo - 1], s[hi - 1], len(s), cov)


def per_sample_across_ranks(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """One value per sample: the mean over ranks of that sample (ranks time the same calls together)."""
    if not per_rank:
        return []
    n = min(len(r) for r in per_rank)
    return [sum(r[i] for r in per_rank) / len(per_rank) for i in range(n)]


def paired_ratio_ci(num: Sequence[float], den: Sequence[float], confidence: float = 0.95) -> Estimate:
    """Median of the per-pair ratios ``num[i] / den[i]`` with its interval (pairs measured in the same round)."""
    ratios = [a / b for a, b in zip(num, den, strict=False) if b > 0 and math.isfinite(a) and math.isfinite(b)]
    return median_ci(ratios, confidence)


def ratio_of(a: Estimate, b: Estimate) -> Estimate:
    """``a / b`` for independent estimates, interval combined in log space (delta method)."""
    if not (a.value > 0 and b.value > 0 and a.low > 0 and b.low > 0):
        return Estimate(math.nan, math.nan, math.nan, min(a.n, b.n), 0.0)
    r = math.log(a.value) - math.log(b.value)
    se = math.hypot(a.log_se, b.log_se)
    return Estimate(math.exp(r), math.exp(r - Z95 * se), math.exp(r + Z95 * se), min(a.n, b.n))


def invert(e: Estimate) -> Estimate:
    """``1 / e`` (a time ratio as a speed ratio): the interval's ends swap."""
    if not (e.low > 0):
        return Estimate(math.nan, math.nan, math.nan, e.n, e.coverage)
    return Estimate(1.0 / e.value, 1.0 / e.high, 1.0 / e.low, e.n, e.coverage)


def significant(ratio: Estimate, min_effect: float = 0.0) -> bool:
    """A ratio is significant when its interval excludes 1 and, with ``min_effect`` > 0, also excludes
    [1 / (1 + min_effect), 1 + min_effect] (a practical threshold for run-to-run noise)."""
    j = judge(ratio, min_effect)
    return j.basis == "interval" and j.direction != 0


def geometric_mean_ci(ratios: Sequence[Estimate]) -> Estimate:
    """Geometric mean of ratios with a log-space interval (each ratio's error treated as independent)."""
    ok = [r for r in ratios if r.value > 0 and r.low > 0 and math.isfinite(r.high)]
    if not ok:
        return Estimate(math.nan, math.nan, math.nan, 0, 0.0)
    logs = [math.log(r.value) for r in ok]
    ses = [r.log_se for r in ok]
    m = sum(logs) / len(ok)
    se = math.sqrt(sum(s * s for s in ses)) / len(ok)
    return Estimate(math.exp(m), math.exp(m - Z95 * se), math.exp(m + Z95 * se), len(ok))


@dataclass(frozen=True, slots=True)
class Adjusted:
    """Many log-ratios judged together: which are significant and the interval level that agrees with it."""

    selected: tuple[bool, ...]
    """Benjamini-Hochberg selection at false discovery rate ``q``, in input order (False where no test)."""
    p_values: tuple[float, ...]
    """Two-sided p-value of each log-ratio against 0 (NaN where its standard error is unknown)."""
    z: float
    """Half-width multiplier of the false-coverage-rate intervals: the normal quantile of 1 - R q / (2 m)."""
    m: int
    """Number of ratios tested."""


def adjust_many(log_ratios: Sequence[float], ses: Sequence[float], q: float = 0.05) -> Adjusted:
    """Benjamini-Hochberg selection of many log-ratios (normal errors ``ses``) with FCR-adjusted intervals.

    With R of m selected, every interval ``log_ratio +- z * se`` uses z = Phi^-1(1 - R q / (2 m)) (with R = 0, the
    Bonferroni level q / m), which excludes 0 exactly for the selected ratios: a selected p-value is <= R q / m,
    an unselected one is > (its rank) q / m >= (R + 1) q / m.
    """
    ps = [
        2.0 * _NORMAL.cdf(-abs(lr) / se) if math.isfinite(lr) and math.isfinite(se) and se > 0 else math.nan
        for lr, se in zip(log_ratios, ses, strict=True)
    ]
    tested = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    m = len(tested)
    r = 0
    for rank, (p, _) in enumerate(tested, start=1):
        if p <= rank * q / m:
            r = rank
    chosen = {i for _, i in tested[:r]}
    z = _NORMAL.inv_cdf(1.0 - max(r, 1) * q / (2.0 * m)) if m else Z95
    return Adjusted(tuple(i in chosen for i in range(len(ps))), tuple(ps), z, m)


DEFAULT_THRESHOLD = 0.05
"""``compare --threshold``'s default: the relative difference from which two point estimates (runs without
samples: nccl-tests text logs) are called different. nccl-tests reports one averaged measurement per point; run
to run it moves by a few percent on a quiet cluster, so 5 % leaves noise out and a real regression in."""


@dataclass(frozen=True, slots=True)
class Judgement:
    """What a ratio (run B over baseline A, a time) says against a threshold."""

    direction: int
    """+1: B is slower (the ratio lies above ``1 + threshold``), -1: faster (below ``1 / (1 + threshold)``), 0:
    neither (no difference beyond the threshold, or nothing to judge)."""
    basis: str
    """``interval`` (the ratio's confidence interval lies beyond the threshold), ``threshold`` (a point estimate
    without an interval: its value does), or ``none`` (no finite ratio)."""


def judge(ratio: Estimate, threshold: float = 0.0) -> Judgement:
    """The one decision ``compare`` and ``check`` share about a time ratio: with an interval (both runs had
    samples), B differs when the whole interval lies beyond ``[1 / (1 + threshold), 1 + threshold]``; without one
    (point estimates), when the value does. ``check --max-slowdown X`` fails exactly the points this calls slower
    at ``threshold = X``; ``compare`` calls them slower at its own threshold (``--min-effect`` with intervals,
    ``--threshold`` without)."""
    hi_bar, lo_bar = 1.0 + threshold, 1.0 / (1.0 + threshold)
    if math.isfinite(ratio.low) and math.isfinite(ratio.high) and ratio.low > 0:
        d = 1 if ratio.low > hi_bar else (-1 if ratio.high < lo_bar else 0)
        return Judgement(d, "interval")
    if math.isfinite(ratio.value) and ratio.value > 0:
        d = 1 if ratio.value > hi_bar else (-1 if ratio.value < lo_bar else 0)
        return Judgement(d, "threshold")
    return Judgement(0, "none")


# --- paired rounds of training steps (a policy against its reference, interleaved) ----------------------------


def steps_for_95(round_steps: int = 1) -> int:
    """Measured steps a paired comparison needs before it may claim 95 %: `MIN_SAMPLES_95` rounds of
    `round_steps` steps each."""
    return MIN_SAMPLES_95 * max(1, round_steps)


def rounds_ratio_ci(
    num: Sequence[float], den: Sequence[float], round_steps: int = 1, confidence: float = 0.95
) -> Estimate:
    """Paired rounds: ``num`` and ``den`` are the step times of two policies run in alternating rounds of
    ``round_steps`` steps (step ``i`` in round ``i // round_steps``, the same rounds on both sides). Each round gives
    one ratio, the median of its ``num`` steps over the median of its ``den`` steps; the estimate is the median of
    those per-round ratios with its order-statistic interval (as `paired_ratio_ci`, taken in log space so that an
    even count's centre, the geometric mean of the middle two, inverts exactly): drift of a shared machine that is
    slower than a round lands on both sides of each ratio. ``n`` is the number of complete rounds."""
    k = max(1, round_steps)
    rounds = min(len(num), len(den)) // k
    a = [median([v for v in num[r * k : (r + 1) * k] if math.isfinite(v)]) for r in range(rounds)]
    b = [median([v for v in den[r * k : (r + 1) * k] if math.isfinite(v)]) for r in range(rounds)]
    logs = [math.log(x / y) for x, y in zip(a, b, strict=True) if x > 0 and y > 0 and math.isfinite(x / y)]
    e = median_ci(logs, confidence)  # in log space: an even n's centre inverts exactly (a time ratio as a speed-up)
    return Estimate(math.exp(e.value), math.exp(e.low), math.exp(e.high), e.n, e.coverage) if e.n else e


def claimable(e: Estimate, confidence: float = 0.95) -> Estimate:
    """``e`` as it may be stated at ``confidence``: unchanged when its interval reaches that coverage, else its value
    alone (the interval's ends NaN, so nothing calls it significant): below `MIN_SAMPLES_95` samples the widest
    order-statistic interval, (min, max), covers less (2 samples: 50 %)."""
    if e.coverage >= confidence or not math.isfinite(e.value):
        return e
    return Estimate(e.value, math.nan, math.nan, e.n, e.coverage)


def too_few_text(n: int, round_steps: int = 1, what: str = "rounds") -> str:
    """The note where a ratio has too few samples for a 95 % interval: how many it has and how many it needs."""
    k = max(1, round_steps)
    return (
        f"n too small: {n} {what} of {k} step{'s' if k > 1 else ''}; a 95 % interval needs {MIN_SAMPLES_95} "
        f"({steps_for_95(k)} measured steps)"
    )
