"""The timing core with a fake clock (pytest-benchmark's technique): calibration, sample arithmetic, and the
agreement between ranks that keeps collective call counts identical."""

from __future__ import annotations

import itertools

import pytest

from commbench.timing import calibrate, measure


class FakeClock:
    """Each call of the measured function advances time by ``op_s``."""

    def __init__(self, op_s: float) -> None:
        self.t = 0.0
        self.op_s = op_s
        self.calls = 0

    def __call__(self) -> float:
        return self.t

    def op(self) -> None:
        self.calls += 1
        self.t += self.op_s


def test_calibrate_reaches_min_time() -> None:
    c = FakeClock(1e-4)
    k = calibrate(c.op, min_time_s=0.01, max_iters=10**6, clock=c)
    assert k * 1e-4 >= 0.01
    assert k <= 2 * 120  # grows from the measured time, not by blind doubling to far past the target


def test_calibrate_respects_max_iters() -> None:
    c = FakeClock(1e-9)
    assert calibrate(c.op, min_time_s=1.0, max_iters=64, clock=c) == 64


def test_measure_divides_by_k_and_counts_calls() -> None:
    c = FakeClock(2e-3)
    m = measure(c.op, warmup=3, min_time_s=0.01, repeats=4, max_iters=1000, clock=c)
    assert all(s == pytest.approx(2e-3) for s in m.samples)
    assert len(m.samples) == 4
    assert m.iters * 2e-3 >= 0.01


def test_agree_uses_slowest_rank() -> None:
    # This rank is fast (1 us/op) but the slowest rank reports 1 ms for any k: calibration must stop at k=1
    # exactly as the slow rank does, so both ranks call the collective the same number of times.
    c = FakeClock(1e-6)
    k = calibrate(c.op, min_time_s=1e-3, max_iters=1000, clock=c, agree=lambda t: max(t, 1e-3))
    assert k == 1


def test_fixed_iters_skip_calibration() -> None:
    c = FakeClock(1e-3)
    m = measure(c.op, warmup=1, min_time_s=10.0, repeats=2, max_iters=10, clock=c, iters=3)
    assert m.iters == 3 and c.calls == 1 + 2 * 3


def test_sync_called_once_per_sample() -> None:
    c = FakeClock(1e-3)
    syncs = itertools.count()
    measure(c.op, warmup=1, min_time_s=1e-3, repeats=5, max_iters=10, clock=c, sync=lambda: next(syncs), iters=2)
    assert next(syncs) == 1 + 5  # one after warm-up, one per sample
