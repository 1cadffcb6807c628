"""CUDA-graph mode (nccl-tests' ``-G N``) modelled on the CPU: a fake graph records the ops a capture sees and runs
them on replay; a fake clock advances only when an op runs. The expectations are nccl-tests' BenchTime
(src/common.cu): the iterations are captured once, the graph is launched N times, and the time per op is the
elapsed time / (iterations x N)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from commbench.measure.timing import graph_note, graph_timer, run_sample, sample_timer


class FakeGraph:
    """A capture records the ops (nothing runs); a replay runs them all, in order."""

    def __init__(self, ops: list[Callable[[], None]]) -> None:
        self.ops = ops
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for op in self.ops:
            op()


class World:
    """Ops that each take ``op_s`` of a fake clock; a capture that only records."""

    def __init__(self, op_s: float = 0.25) -> None:
        self.now = 0.0
        self.op_s = op_s
        self.ran = 0
        self.captured: list[FakeGraph] = []
        self.syncs = 0

    def clock(self) -> float:
        return self.now

    def op(self) -> None:
        self.ran += 1
        self.now += self.op_s

    def capture(self, fn: Callable[[], None], k: int) -> FakeGraph:
        g = FakeGraph([fn] * k)
        self.captured.append(g)
        return g

    def sync(self) -> None:
        self.syncs += 1


def test_a_sample_launches_the_captured_graph_n_times_and_reports_k_ops() -> None:
    w = World()
    timer = graph_timer(w.capture, 10, sync=w.sync, clock=w.clock)
    k = 20
    seconds = run_sample(w.op, k, sync=w.sync, clock=w.clock, timer=timer)
    assert len(w.captured) == 1 and len(w.captured[0].ops) == k  # the k ops were captured, not run
    assert w.captured[0].replays == 10
    assert w.ran == k * 10  # replays x N ops ran
    assert seconds == pytest.approx(k * w.op_s)  # elapsed / launches: the time of k ops
    assert seconds / k == pytest.approx(w.op_s)  # per op: elapsed / (k x N), as nccl-tests' deltaSec
    assert w.syncs == 1  # one synchronisation after the launches


def test_the_graph_is_captured_once_per_k_and_again_when_k_changes() -> None:
    w = World()
    timer = graph_timer(w.capture, 3, sync=w.sync, clock=w.clock)
    for _ in range(4):
        timer(w.op, 5)
    assert len(w.captured) == 1 and w.captured[0].replays == 12
    timer(w.op, 8)  # calibration grew k: a new graph of 8 ops
    assert [len(g.ops) for g in w.captured] == [5, 8]
    other = World().op
    timer(other, 8)  # another phase (encode, decode) has its own graph
    assert len(w.captured) == 3


def test_graph_mode_runs_inside_an_events_timer() -> None:
    w = World()
    launches: list[int] = []

    def events(fn: Callable[[], None], k: int) -> float:  # stands for CUDA events around the k launches
        launches.append(k)
        t0 = w.now
        for _ in range(k):
            fn()
        return w.now - t0

    timer = graph_timer(w.capture, 4, sync=w.sync, clock=w.clock, timer=events)
    assert timer(w.op, 6) == pytest.approx(6 * w.op_s)
    assert launches == [4] and w.syncs == 0  # the events time the 4 launches; the host clock is not used


def _dist(backend: str, device: str) -> object:
    class D:
        pass

    d = D()
    d.backend, d.device, d.sync = backend, torch.device(device), lambda: None  # type: ignore[attr-defined]
    return d


def test_off_nccl_the_ops_run_eagerly_with_one_line() -> None:
    d = _dist("gloo", "cpu")
    note = graph_note(d, 10)  # type: ignore[arg-type]
    assert note is not None and "\n" not in note and "-G 10" in note and "gloo" in note and "eagerly" in note
    assert sample_timer(d, "host", 10) is None  # type: ignore[arg-type]  # eager: the host clock, no graph
    assert graph_note(d, 0) is None  # type: ignore[arg-type]
    assert graph_note(_dist("nccl", "cuda"), 10) is None  # type: ignore[arg-type]  # captured there


def test_on_nccl_and_cuda_the_sample_timer_is_the_graph_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    import commbench.measure.timing as timing

    w = World()
    monkeypatch.setattr(timing, "cuda_graph_capture", w.capture)  # no GPU here: the capture is the fake's
    d = _dist("nccl", "cuda")
    d.sync = w.sync  # type: ignore[attr-defined]
    timer = sample_timer(d, "host", 2)  # type: ignore[arg-type]
    assert timer is not None
    monkeypatch.setattr(timing.time, "perf_counter", w.clock)
    timer(w.op, 3)
    assert w.ran == 6 and w.captured[0].replays == 2


def test_graph_mode_and_isolated_timing_exclude_each_other() -> None:
    from commbench.core.suite import TimingConfig

    assert TimingConfig(cuda_graph=5).cuda_graph == 5
    with pytest.raises(ValueError, match="-G 5 .*'isolated'"):
        TimingConfig(cuda_graph=5, mode="isolated")
    with pytest.raises(ValueError, match="cuda_graph"):
        TimingConfig(cuda_graph=-1)
