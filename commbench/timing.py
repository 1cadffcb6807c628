"""The timing core: warm up, calibrate k back-to-back ops per sample, take R samples, and the statistics.

No I/O and no torch.distributed here: the caller injects ``barrier`` (start samples together), ``agree``
(max of a float across ranks, so every rank makes the same calibration decision and calls the collective
the same number of times), ``sync`` (device synchronisation; a no-op on CPU) and ``clock``. Tests drive it
with a fake clock.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Clock = Callable[[], float]


def _noop() -> None:
    return None


def _identity(x: float) -> float:
    return x


@dataclass(frozen=True, slots=True)
class Measurement:
    """Per-op times of one rank: ``samples`` in seconds, each the mean of ``iters`` back-to-back ops."""

    samples: tuple[float, ...]
    iters: int


def run_sample(fn: Callable[[], None], k: int, *, sync: Callable[[], None], clock: Clock) -> float:
    """Seconds for ``k`` back-to-back calls of ``fn`` followed by one device synchronisation."""
    t0 = clock()
    for _ in range(k):
        fn()
    sync()
    return clock() - t0


def calibrate(
    fn: Callable[[], None],
    *,
    min_time_s: float,
    max_iters: int,
    sync: Callable[[], None] = _noop,
    clock: Clock = time.perf_counter,
    agree: Callable[[float], float] = _identity,
    barrier: Callable[[], None] = _noop,
) -> int:
    """Smallest k (from a geometric search) whose sample lasts >= ``min_time_s`` on the slowest rank.

    Like pyperf: start at one op, and grow k from the measured time (at least doubling) until one sample
    passes the minimum. ``agree`` makes the decision on the slowest rank's time so every rank runs the
    same number of collectives.
    """
    k = 1
    while True:
        barrier()
        elapsed = agree(run_sample(fn, k, sync=sync, clock=clock))
        if elapsed >= min_time_s or k >= max_iters:
            return k
        if elapsed <= 0:
            nxt = k * 10
        else:
            # Aim 20 % past the target so the next try usually passes.
            nxt = math.ceil(k * 1.2 * min_time_s / elapsed)
        k = min(max_iters, max(2 * k, nxt))


def measure(
    fn: Callable[[], None],
    *,
    warmup: int,
    min_time_s: float,
    repeats: int,
    max_iters: int,
    sync: Callable[[], None] = _noop,
    clock: Clock = time.perf_counter,
    agree: Callable[[float], float] = _identity,
    barrier: Callable[[], None] = _noop,
    iters: int | None = None,
) -> Measurement:
    """Warm up, calibrate (unless ``iters`` is given) and take ``repeats`` samples of per-op seconds."""
    for _ in range(warmup):
        fn()
    sync()
    k = iters if iters is not None else calibrate(
        fn, min_time_s=min_time_s, max_iters=max_iters, sync=sync, clock=clock, agree=agree, barrier=barrier
    )
    samples = []
    for _ in range(repeats):
        barrier()
        samples.append(run_sample(fn, k, sync=sync, clock=clock) / k)
    return Measurement(samples=tuple(samples), iters=k)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default 'linear' method), ``q`` in [0, 100]."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Stats:
    """Statistics over every rank's samples (seconds in, microseconds out).

    ``time_us`` is nccl-tests' convention: the mean over ranks of each rank's median; ``time_us_max`` the
    slowest rank's median; p50/p95/cv pool every sample of every rank; ``rank_spread`` is slowest over
    fastest rank median minus one.
    """

    time_us: float
    time_us_max: float
    p50_us: float
    p95_us: float
    cv: float
    rank_spread: float

    @classmethod
    def from_ranks(cls, per_rank: Sequence[Sequence[float]]) -> Stats:
        medians = [statistics.median(s) for s in per_rank]
        pooled = [v for s in per_rank for v in s]
        mean = statistics.fmean(pooled)
        cv = statistics.pstdev(pooled) / mean if mean > 0 and len(pooled) > 1 else 0.0
        spread = max(medians) / min(medians) - 1.0 if min(medians) > 0 else 0.0
        return cls(
            time_us=statistics.fmean(medians) * 1e6,
            time_us_max=max(medians) * 1e6,
            p50_us=percentile(pooled, 50) * 1e6,
            p95_us=percentile(pooled, 95) * 1e6,
            cv=cv,
            rank_spread=spread,
        )


def bandwidth_gbps(nbytes: float, time_us: float) -> float:
    """nccl-tests' GB/s: bytes / seconds / 1e9."""
    return nbytes / (time_us * 1e-6) / 1e9 if time_us > 0 else math.nan
