"""The timing core with a fake clock (pytest-benchmark's technique): calibration, sample arithmetic, and the
agreement between ranks that keeps collective call counts identical."""

from __future__ import annotations

import itertools

import pytest

from commbench.measure.timing import calibrate, run_sample


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


def test_rounds_divide_by_k_and_k_reaches_min_time() -> None:
    c = FakeClock(2e-3)
    r = _rounds(c, [[c.op]], min_rounds=4, max_rounds=4)
    assert all(v == pytest.approx(2e-3) for v in r.samples[0][0][0])
    assert r.rounds == 4
    assert r.iters[0][0] * 2e-3 >= 0.01


def test_min_iters_raises_k_past_the_calibrated_one() -> None:
    # 1 ms per op and a 10 ms minimum calibrate k = 10; nccl-tests' 20 back-to-back ops win
    c = FakeClock(1e-3)
    r = _rounds(c, [[c.op]], min_iters=20, min_rounds=2, max_rounds=2)
    assert r.iters == ((20,),)


def test_agree_uses_slowest_rank() -> None:
    # This rank is fast (1 us/op) but the slowest rank reports 1 ms for any k: calibration must stop at k=1
    # exactly as the slow rank does, so both ranks call the collective the same number of times.
    c = FakeClock(1e-6)
    k = calibrate(c.op, min_time_s=1e-3, max_iters=1000, clock=c, agree=lambda t: max(t, 1e-3))
    assert k == 1


def test_sync_called_once_per_sample() -> None:
    c = FakeClock(1e-3)
    syncs = itertools.count()
    t = run_sample(c.op, 5, sync=lambda: next(syncs), clock=c)
    assert next(syncs) == 1 and c.calls == 5 and t == pytest.approx(5e-3)


# --- interleaved rounds (measure_rounds) ----------------------------------------------------------------------


def _rounds(clock: FakeClock, contenders, **kw):  # type: ignore[no-untyped-def]
    from commbench.measure.timing import measure_rounds

    args = dict(
        warmup=1, min_time_s=0.01, min_iters=1, max_iters=1000, min_rounds=6, max_rounds=50,
        target_rel_ci=0.02, budget_s=1e9, clock=clock,
    )  # fmt: skip
    args.update(kw)
    return measure_rounds(contenders, **args)


def _recording_ops(clock: FakeClock, order: list[str], scale: list[float]):  # type: ignore[no-untyped-def]
    """op(name, dt): a contender phase that logs its name in ``order`` and advances ``clock`` by dt * scale[0]."""

    def op(name: str, dt: float):  # type: ignore[no-untyped-def]
        def f() -> None:
            order.append(name)
            clock.t += dt * scale[0]

        return f

    return op


def test_rounds_stop_at_min_rounds_when_noise_free_and_time_each_phase() -> None:
    c = FakeClock(0.0)

    def op(dt: float):  # type: ignore[no-untyped-def]
        def f() -> None:
            c.t += dt

        return f

    r = _rounds(c, [[op(1e-3)], [op(2e-4), op(5e-4), op(1e-4)]])
    assert r.rounds == 6 and r.converged
    assert r.per_sample_total(0) == pytest.approx([1e-3] * 6)
    assert r.per_sample_total(1) == pytest.approx([8e-4] * 6)
    assert r.per_sample(1, 1) == pytest.approx([5e-4] * 6)
    assert r.iters[0][0] * 1e-3 >= 0.01 and r.iters[1][2] * 1e-4 >= 0.01


def test_rounds_rotate_the_order_and_pair_drift() -> None:
    # A machine that slows down round after round: both contenders see the same drift within a round.
    c = FakeClock(0.0)
    order: list[str] = []
    calls = {"a": 0, "b": 0}

    def op(name: str, dt: float):  # type: ignore[no-untyped-def]
        def f() -> None:
            order.append(name)
            rnd = max(0, calls[name] - 1) // 10  # calibration's one call, then 10 per round
            calls[name] += 1
            c.t += dt * 1.5**rnd  # drift between rounds

        return f

    r = _rounds(c, [[op("a", 1e-3)], [op("b", 2e-3)]], warmup=0, min_iters=10, min_time_s=1e-6, max_rounds=8,
                target_rel_ci=1e-9)  # fmt: skip
    timed = order[-8 * 20 :]
    firsts = [timed[i * 20] for i in range(8)]
    assert firsts == ["a", "b"] * 4
    from commbench.core.stats import paired_ratio_ci

    e = paired_ratio_ci(r.per_sample_total(1), r.per_sample_total(0))
    assert e.value == pytest.approx(2.0) and e.low == pytest.approx(2.0) and e.high == pytest.approx(2.0)
    assert not r.converged and r.rounds == 8  # drift keeps each side's own interval wide


def test_rounds_stop_on_budget_as_the_slowest_rank_sees_it() -> None:
    c = FakeClock(1e-3)
    # the other rank reports 100 s elapsed: every rank must stop after the same (first allowed) round
    r = _rounds(c, [[c.op]], gather=lambda v: [v, v[:-1] + [100.0]], budget_s=5.0, target_rel_ci=0.0)
    assert r.rounds == 6 and not r.converged and r.elapsed_s == 100.0
    assert len(r.samples[0][0]) == 2 and len(r.samples[0][0][1]) == 6


def test_rounds_respect_min_iters() -> None:
    c = FakeClock(1.0)
    r = _rounds(c, [[c.op]], min_iters=20, min_time_s=1e-3, min_rounds=2, max_rounds=2)
    assert r.iters == ((20,),)


def test_a_later_pass_continues_the_rounds_with_the_same_k() -> None:
    # Pass 1 calibrates and takes 3 rounds; pass 2 keeps k, adds its own rounds (at least min_new_rounds) and
    # returns both passes' samples, in order, with the elapsed time of both; the contender order keeps rotating.
    c = FakeClock(0.0)
    order: list[str] = []
    speed = [1.0]
    op = _recording_ops(c, order, speed)

    contenders = [[op("a", 1e-3)], [op("b", 2e-3)]]
    first = _rounds(c, contenders, warmup=0, min_iters=5, min_time_s=1e-6, min_rounds=3, max_rounds=3,
                    target_rel_ci=1.0)  # fmt: skip
    assert first.rounds == 3 and first.iters == ((5,), (5,))
    speed[0] = 2.0  # the machine is twice as slow in the second pass
    del order[:]
    second = _rounds(c, contenders, warmup=0, min_iters=50, min_time_s=1.0, min_rounds=6, max_rounds=50,
                     target_rel_ci=1.0, prior=first, min_new_rounds=2)  # fmt: skip
    # min_rounds counts both passes: 3 + 3 rounds, and no calibration (k stays 5 although min_iters is now 50)
    assert second.rounds == 6 and second.iters == first.iters and len(order) == 3 * 2 * 5
    assert second.per_sample_total(0) == pytest.approx([1e-3] * 3 + [2e-3] * 3)
    assert second.per_sample_total(1) == pytest.approx([2e-3] * 3 + [4e-3] * 3)
    assert second.elapsed_s == pytest.approx(first.elapsed_s + 3 * 5 * 6e-3)
    # round 3 (the 4th) starts with contender b: the rotation goes on from the prior's round count
    assert order[0] == "b" and order[5] == "a"


def test_a_later_pass_takes_at_least_its_own_rounds() -> None:
    c = FakeClock(1e-3)
    first = _rounds(c, [[c.op]], min_rounds=6, max_rounds=6, target_rel_ci=1.0)
    assert first.rounds == 6 and first.converged
    second = _rounds(c, [[c.op]], min_rounds=6, max_rounds=60, target_rel_ci=1.0, prior=first, min_new_rounds=2)
    assert second.rounds == 8 and second.converged
    with pytest.raises(ValueError, match="phases"):
        _rounds(c, [[c.op, c.op]], prior=first)


def test_isolated_mode_times_one_op_after_the_gap_and_takes_the_fastest_rank() -> None:
    # gap() runs after every barrier, before a sample of exactly one op (no calibration); a round's value over ranks
    # is the minimum: the rank that arrived first also timed its wait for the last one.
    c = FakeClock(0.0)
    events: list[str] = []

    def op() -> None:
        events.append("op")
        c.t += 1e-3

    def gap() -> None:
        events.append("gap")
        c.t += 0.02

    def gather(v: list[float]) -> list[list[float]]:
        # a block of rounds, (op, wait) each, then the elapsed time; the other rank waited: its op took 3x as long
        return [v, [3 * x if i % 2 == 0 else x for i, x in enumerate(v[:-1])] + [v[-1]]]

    r = _rounds(c, [[op]], warmup=0, min_iters=20, min_time_s=1.0, gather=gather, gap=gap, min_rounds=4, max_rounds=4)
    assert r.iters == ((1,),) and r.rounds == 4 and r.across_ranks == "min"
    assert events == ["gap", "op"] * 4
    assert r.per_sample_total(0) == pytest.approx([1e-3] * 4)  # min over ranks, not the mean (2e-3)
    assert r.per_sample(0, 0) == pytest.approx([1e-3] * 4)
    with pytest.raises(ValueError, match="combine ranks"):
        _rounds(c, [[op]], prior=r)  # a stream pass cannot continue isolated rounds


def test_ranks_exchange_values_once_per_block_of_rounds_not_after_every_round() -> None:
    # Work between two samples slows the next one, so the exchange and the stopping test come once per ~exchange_s
    # of rounds: the first as soon as a stop is allowed (min_rounds), then one block (10 rounds of 1 ms) apart,
    # the last block cut at max_rounds. Every round's values arrive, in order.
    def run(exchange_s: float) -> tuple[list[int], object]:
        c = FakeClock(1e-3)
        sizes: list[int] = []

        def gather(v: list[float]) -> list[list[float]]:
            sizes.append((len(v) - 1) // 2)  # rounds in this block: (op, wait) each, then the elapsed time
            return [v]

        r = _rounds(
            c,
            [[c.op]],
            min_iters=1,
            min_time_s=1e-3,
            gather=gather,
            min_rounds=6,
            max_rounds=50,
            ci=lambda xs: 1.0,
            exchange_s=exchange_s,
        )  # fmt: skip  (never precise: runs to max_rounds)
        return sizes, r

    sizes, r = run(0.01)
    assert sizes == [6, 10, 10, 10, 10, 4]
    assert r.rounds == 50 and r.per_sample_total(0) == pytest.approx([1e-3] * 50) and len(r.waits[0]) == 50
    sizes, r = run(0.0)  # a round longer than the block: an exchange after every round
    assert sizes == [6] + [1] * 44 and r.rounds == 50


def test_a_precise_point_stops_at_the_first_allowed_test_whatever_the_block() -> None:
    c = FakeClock(1e-3)
    r = _rounds(c, [[c.op]], min_iters=1, min_time_s=1e-3, min_rounds=6, max_rounds=50, target_rel_ci=0.5,
                exchange_s=10.0)  # fmt: skip
    assert r.rounds == 6 and r.converged


# --- device timer: CUDA events (a fake event class on CPU) -----------------------------------------------------


class FakeDevice:
    """A device stream: each op queues ``op_s`` of device work; the host clock moves only by ``host_s`` per op
    (the launch), so the host clock alone, without a synchronize, would see launches and not the work."""

    def __init__(self, op_s: float, host_s: float) -> None:
        self.host = FakeClock(host_s)
        self.device_t = 0.0  # when the stream's last queued work finishes
        self.op_s = op_s

    def op(self) -> None:
        self.host.op()
        self.device_t = max(self.device_t, self.host.t) + self.op_s


class FakeEvent:
    """``torch.cuda.Event(enable_timing=True)``'s interface: ``record`` stamps the stream's position, elapsed in ms."""

    def __init__(self, dev: FakeDevice, log: list[str]) -> None:
        self.dev, self.log, self.at = dev, log, None

    def record(self) -> None:
        self.log.append("record")
        self.at = max(self.dev.device_t, self.dev.host.t)

    def synchronize(self) -> None:
        self.log.append("synchronize")
        self.dev.host.t = max(self.dev.host.t, self.at)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1e3


def test_event_timer_times_the_device_work_of_k_ops() -> None:
    from commbench.measure.timing import event_timer

    dev, log = FakeDevice(op_s=1e-3, host_s=1e-5), []
    timer = event_timer(lambda: FakeEvent(dev, log))
    t = timer(dev.op, 20)
    # the device's 20 ms plus the first launch (the device was idle at the first event); the other 19 launches
    # hide behind the work queued before them. A host clock without a synchronize would read 20 launches, 0.2 ms.
    assert t == pytest.approx(20 * 1e-3 + 1e-5) and dev.host.calls == 20
    assert log == ["record", "record", "synchronize"]  # one host wait per sample, after the second event
    syncs = itertools.count()
    # run_sample with a timer uses neither the host clock nor sync
    t2 = run_sample(dev.op, 5, sync=lambda: next(syncs), clock=lambda: 1 / 0, timer=timer)
    assert t2 == pytest.approx(5e-3 + 1e-5) and next(syncs) == 0


def test_rounds_with_the_event_timer_report_device_time_per_op() -> None:
    from commbench.measure.timing import event_timer, measure_rounds

    dev, log = FakeDevice(op_s=2e-4, host_s=1e-6), []
    r = measure_rounds(
        [[dev.op]], warmup=1, min_time_s=0.01, min_iters=1, max_iters=1000, min_rounds=6, max_rounds=6,
        target_rel_ci=0.5, budget_s=1e9, clock=dev.host, timer=event_timer(lambda: FakeEvent(dev, log)),
    )  # fmt: skip
    # calibration on the events: at least 0.01 s / 2e-4 s per op = 50 ops (on the host's launches alone, 1 us
    # each, k would run to max_iters)
    assert 50 <= r.iters[0][0] < 100
    assert r.per_sample(0, 0) == pytest.approx([2e-4] * 6, rel=1e-3)
