"""The timing core: warm up, calibrate k back-to-back ops per sample, sample in rounds, and the statistics.

No I/O and no torch.distributed here: the caller injects ``barrier`` (start samples together), ``agree``
(max of a float across ranks, so every rank makes the same calibration decision and calls the collective
the same number of times), ``sync`` (device synchronisation; a no-op on CPU), ``clock`` and, optionally,
``timer`` (a sample timer that replaces clock + sync for the k ops). Tests drive it with a fake clock and
fake events.

The protocol, one sample of k back-to-back ops (``stream`` mode; ``isolated`` is k = 1 after a gap of compute):

- CPU (gloo): barrier, host clock, k ops, host clock; per-op time = elapsed / k. A gloo collective returns when
  its result is in the output tensor, so there is nothing to synchronise.
- GPU, ``device_timer = "host"`` (the default, nccl-tests' ``BenchTime``: a host timer around ``-n`` ops, then a
  wait for the stream): barrier (``device_ids`` = this rank's GPU, so it is a collective on the NCCL stream), host
  clock, k ops, ``torch.cuda.synchronize()``, host clock. A blocking NCCL call returns once its kernel is queued
  and the current stream made to wait on it, so only the synchronize puts the k kernels inside the interval; the
  interval also holds the host's launch time of the first op and the synchronize's return, a few microseconds,
  amortised over k (k >= 20).
- GPU, ``device_timer = "events"``: barrier, a CUDA event recorded on the current stream, k ops, a second event,
  wait for it on the host; per-op time = the events' elapsed time / k. Each blocking NCCL call makes the current
  stream wait on NCCL's stream, so the second event completes after the last kernel; the interval is the device's
  (launch latency of the first op and host overhead drop out while the host keeps ahead of the GPU; a host that
  falls behind shows as gaps inside the interval, as it would in a training step). Events resolve to about 0.5 us.

Both GPU timers report seconds per op, in the same records, and a run records which one it used (``timing`` in
its metadata); ``docs/timing.md`` has the same text for readers of the docs.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from commbench.core.suite import DEVICE_TIMERS

if TYPE_CHECKING:
    from commbench.cluster.launch import Dist

Clock = Callable[[], float]
SampleTimer = Callable[[Callable[[], None], int], float]
"""``timer(fn, k)``: seconds for ``k`` back-to-back calls of ``fn``, measured end to end (device completion
included); replaces the host clock and ``sync`` around a sample."""


def _noop() -> None:
    return None


def _identity(x: float) -> float:
    return x


def run_sample(
    fn: Callable[[], None], k: int, *, sync: Callable[[], None], clock: Clock, timer: SampleTimer | None = None
) -> float:
    """Seconds for ``k`` back-to-back calls of ``fn`` followed by one device synchronisation (or ``timer``'s)."""
    if timer is not None:
        return timer(fn, k)
    t0 = clock()
    for _ in range(k):
        fn()
    sync()
    return clock() - t0


def event_timer(event: Callable[[], Any]) -> SampleTimer:
    """A sample timer from device events: ``event()`` makes an event with ``record()``, ``synchronize()`` and
    ``elapsed_time(other)`` in milliseconds (``torch.cuda.Event(enable_timing=True)``: :func:`sample_timer` passes it).
    Both events are recorded on the current stream, around the k ops; the host waits for the second one only."""

    def sample(fn: Callable[[], None], k: int) -> float:
        start, end = event(), event()
        start.record()
        for _ in range(k):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3

    return sample


def sample_timer(d: Dist, kind: str, cuda_graph: int = 0) -> SampleTimer | None:
    """The sample timer of ``timing.device_timer`` ``kind`` on the world ``d``: None for ``host`` (the host clock
    around k ops and one synchronize, nccl-tests' BenchTime), CUDA events on the current stream for ``events``
    (:func:`event_timer`); ValueError, one line, for an unknown kind or ``events`` off CUDA. With ``cuda_graph``
    launches (nccl-tests' ``-G``) on NCCL and CUDA, that timer times the launches of a CUDA graph of the k ops
    (:func:`graph_timer`); elsewhere the ops run eagerly (:func:`graph_note` says so)."""
    if kind not in DEVICE_TIMERS:
        raise ValueError(f"unknown device timer {kind!r}; valid choices: {', '.join(DEVICE_TIMERS)}")
    inner: SampleTimer | None = None
    if kind == "events":
        if d.device.type != "cuda":
            raise ValueError(
                f"--device-timer events needs CUDA devices: this run is on {d.device.type} "
                f"(backend {d.backend}); use --device-timer host"
            )
        import torch

        inner = event_timer(lambda: torch.cuda.Event(enable_timing=True))
    if cuda_graph and graph_note(d, cuda_graph) is None:
        return graph_timer(cuda_graph_capture, cuda_graph, sync=d.sync, timer=inner)
    return inner


class Graph(Protocol):
    """A captured sequence of ops (``torch.cuda.CUDAGraph``): ``replay()`` launches them all again."""

    def replay(self) -> None: ...


Capture = Callable[[Callable[[], None], int], Graph]
"""``capture(fn, k)``: a graph holding ``k`` back-to-back calls of ``fn`` (recorded, not run)."""


def cuda_graph_capture(fn: Callable[[], None], k: int) -> Graph:
    """``k`` calls of ``fn`` captured in a CUDA graph on the current device (``torch.cuda.graph``: a side stream
    with the thread-local capture mode nccl-tests also uses; the caller has run ``fn`` eagerly first, so NCCL's
    communicators and connections exist before the capture)."""
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(k):
            fn()
    return graph


def graph_timer(
    capture: Capture, launches: int, *, sync: Callable[[], None], clock: Clock = time.perf_counter,
    timer: SampleTimer | None = None,
) -> SampleTimer:  # fmt: skip
    """nccl-tests' ``-G launches`` (src/common.cu ``BenchTime``): the k ops of a sample are captured once as one
    graph, then the sample times ``launches`` launches of it back to back, ending in one device synchronisation
    (or ``timer``'s), and reports the time of k ops: elapsed / launches (nccl-tests divides by iters x launches;
    the caller divides by k). A graph is kept per phase for its latest k (calibration grows k, then it stays)."""
    graphs: dict[Callable[[], None], tuple[int, Graph]] = {}  # by phase (a bound method is equal to itself again)

    def sample(fn: Callable[[], None], k: int) -> float:
        kept = graphs.get(fn)
        if kept is None or kept[0] != k:
            graphs[fn] = kept = (k, capture(fn, k))
        return run_sample(kept[1].replay, launches, sync=sync, clock=clock, timer=timer) / launches

    return sample


def graph_note(d: Dist, launches: int) -> str | None:
    """Why ``-G launches`` runs eagerly on the world ``d`` (one line), None where CUDA graphs are captured: NCCL's
    collectives on CUDA devices can be captured; gloo's run on the host and cannot."""
    if not launches or (d.device.type == "cuda" and d.backend == "nccl"):
        return None
    return (
        f"-G {launches}: CUDA-graph mode needs NCCL on CUDA devices; this run is {d.backend} on {d.device.type}, "
        "so its ops run eagerly (no graph)"
    )


def calibrate(
    fn: Callable[[], None],
    *,
    min_time_s: float,
    max_iters: int,
    sync: Callable[[], None] = _noop,
    clock: Clock = time.perf_counter,
    agree: Callable[[float], float] = _identity,
    barrier: Callable[[], None] = _noop,
    timer: SampleTimer | None = None,
) -> int:
    """Smallest k (from a geometric search) whose sample lasts >= ``min_time_s`` on the slowest rank.

    Like pyperf: start at one op, and grow k from the measured time (at least doubling) until one sample
    passes the minimum. ``agree`` makes the decision on the slowest rank's time so every rank runs the
    same number of collectives.
    """
    k = 1
    while True:
        barrier()
        elapsed = agree(run_sample(fn, k, sync=sync, clock=clock, timer=timer))
        if elapsed >= min_time_s or k >= max_iters:
            return k
        if elapsed <= 0:
            nxt = k * 10
        else:
            # Aim 20 % past the target so the next try usually passes.
            nxt = math.ceil(k * 1.2 * min_time_s / elapsed)
        k = min(max_iters, max(2 * k, nxt))


@dataclass(frozen=True, slots=True)
class Rounds:
    """Interleaved samples of several contenders (e.g. the precisions of one size), each with its phases.

    ``samples[c][p][r]`` holds rank ``r``'s per-op seconds of phase ``p`` of contender ``c``, one value per
    round (every rank receives every rank's values, so every rank takes the same stopping decision).
    """

    iters: tuple[tuple[int, ...], ...]
    """k (back-to-back ops per sample) of each contender's phases."""
    samples: tuple[tuple[tuple[tuple[float, ...], ...], ...], ...]
    waits: tuple[tuple[float, ...], ...]
    """Seconds each rank spent waiting in the round's barriers, ``waits[rank][round]``: the rank the others
    wait for (a straggler: a busy core, a slow link) waits least."""
    rounds: int
    converged: bool
    """True when every contender's total time reached the target interval half-width."""
    elapsed_s: float
    """Seconds spent sampling (slowest rank), calibration excluded."""
    across_ranks: str = "mean"
    """How one round's values of the ranks make one value: ``mean`` (a stream of k ops: every rank timed the same
    calls; nccl-tests' convention) or ``min`` (one isolated op: a rank that arrived early also timed its wait for
    the last one, which waited least)."""

    def _combine(self, values: Sequence[float]) -> float:
        return min(values) if self.across_ranks == "min" else sum(values) / len(values)

    def per_sample_total(self, c: int) -> list[float]:
        """Contender ``c``'s total per-op seconds (its phases summed) per round, each combined over ranks."""
        return [sum(self._combine([r[i] for r in phase]) for phase in self.samples[c]) for i in range(self.rounds)]

    def per_sample(self, c: int, p: int) -> list[float]:
        """Phase ``p`` of contender ``c`` per round, combined over ranks (``across_ranks``)."""
        phase = self.samples[c][p]
        return [self._combine([r[i] for r in phase]) for i in range(self.rounds)]


EXCHANGE_S = 0.1
"""Seconds of rounds between two exchanges of the sampled values (and stopping tests) across ranks: work just
before a sample slows it by a few percent, so the bookkeeping runs once per block of rounds instead of after every
round (the figures: benchmarks/results/2026-12-01_2core-vm_gloo.md, "Timing protocol: why k = 20 and why
exchanges are blocked")."""


def measure_rounds(
    contenders: Sequence[Sequence[Callable[[], None]]],
    *,
    warmup: int,
    min_time_s: float,
    min_iters: int,
    max_iters: int,
    min_rounds: int,
    max_rounds: int,
    target_rel_ci: float,
    budget_s: float,
    gather: Callable[[list[float]], list[list[float]]] = lambda v: [v],
    sync: Callable[[], None] = _noop,
    clock: Clock = time.perf_counter,
    agree: Callable[[float], float] = _identity,
    barrier: Callable[[], None] = _noop,
    ci: Callable[[Sequence[float]], float] | None = None,
    prior: Rounds | None = None,
    min_new_rounds: int = 1,
    gap: Callable[[], None] | None = None,
    exchange_s: float = EXCHANGE_S,
    timer: SampleTimer | None = None,
) -> Rounds:
    """Sample contenders in alternating rounds until each one's total time is precise enough.

    Each contender is a list of phases (encode, comm, decode; a native precision has only comm). After warm-up
    and calibration of each phase (k from ``min_time_s``, at least ``min_iters``), every round takes one sample
    of every phase of every contender, rotating the contender order so none always goes first. Rounds go on
    until, after ``min_rounds``, the relative half-width of every contender's total-time interval (``ci``,
    default the median's order-statistic interval) is at most ``target_rel_ci``, or ``budget_s`` or
    ``max_rounds`` is spent. Values are exchanged with ``gather`` after each round and the elapsed time
    with ``agree``, so every rank stops after the same round.

    With ``prior`` (an earlier pass over the same contenders), sampling continues it: its k are kept (no
    calibration), its rounds count towards ``min_rounds``, ``max_rounds`` and the interval, this call takes at
    least ``min_new_rounds`` rounds and ``budget_s`` is this call's own; the result holds every round of both.

    With ``timer`` (``device_timer = "events"``), each sample's k ops are timed by it instead of ``clock`` and
    ``sync`` (:func:`event_timer`); the barrier waits and the budget stay on ``clock``.

    With ``gap`` (isolated mode), a sample is one op after the barrier and ``gap()`` (compute), with no
    calibration (k = 1), and a round's value over ranks is their minimum (``Rounds.across_ranks``).

    The bookkeeping between samples (exchanging values, the interval, the stopping test) runs once per block of
    rounds lasting about ``exchange_s`` (every round when a round lasts longer), not after every round: work
    between two samples slows the next one (:data:`EXCHANGE_S`). A block never runs past ``max_rounds``, and the
    first test comes as soon as ``min_rounds`` and ``min_new_rounds`` allow, so a point that is precise then
    stops there.
    """
    width_of = ci or _median_rel_half_width
    _warm_up(contenders, warmup, sync)
    if prior is not None:
        iters = _prior_iters(prior, contenders)
    elif gap is not None:
        iters = tuple(tuple(1 for _ in phases) for phases in contenders)
    else:
        cal = _Calibration(min_time_s, min_iters, max_iters, sync, clock, agree, barrier, timer)
        iters = tuple(tuple(cal.k(fn) for fn in phases) for phases in contenders)
    log = _Log.continuing(prior, "min" if gap is not None else "mean", [len(p) for p in contenders])
    t0 = clock()
    first = log.rounds
    elapsed = 0.0
    # the round after which the ranks exchange what they sampled and test whether to stop: the first as soon as
    # a stop is allowed, later ones one block (about exchange_s of rounds) apart
    test_at = min(max(min_rounds, first + min_new_rounds, first + 1), max(max_rounds, first + 1))
    block: list[float] = []
    try:
        while True:
            block.extend(_round(contenders, iters, log.rounds, barrier=barrier, clock=clock, gap=gap, sync=sync, timer=timer))
            log.rounds += 1
            if log.rounds < test_at:
                continue
            per_rank = gather(block + [clock() - t0])
            block = []
            elapsed = max(r[-1] for r in per_rank)
            log.add(per_rank)
            if log.rounds >= min_rounds and log.rounds - first >= min_new_rounds:
                result = log.result(iters, False, elapsed)
                log.converged = all(width_of(result.per_sample_total(c)) <= target_rel_ci for c in range(len(contenders)))
                if log.converged or elapsed >= budget_s or log.rounds >= max_rounds:
                    break
            test_at = _next_test(log.rounds, first, elapsed, exchange_s, max_rounds)
    except BaseException as e:
        # a stop mid-call (Ctrl-C, SIGTERM, a failed peer): the rounds every rank exchanged so far leave with it
        if log.acc is not None and log.exchanged > first:
            setattr(e, PARTIAL_ROUNDS, log.cut(iters, elapsed))
        raise
    return log.result(iters, log.converged, elapsed)


PARTIAL_ROUNDS = "commbench_partial_rounds"
"""Attribute of an exception that stopped :func:`measure_rounds` after at least one exchange of new rounds: the
:class:`Rounds` so far (the prior pass's and the exchanged new ones; the rounds of the block in flight are lost,
being on one rank only), so the sweep can journal them (:mod:`commbench.cli.sweep_run`)."""


def _median_rel_half_width(xs: Sequence[float]) -> float:
    """The default interval: the relative half-width of the median's order-statistic interval."""
    from commbench.core.stats import median_ci

    return median_ci(xs).rel_half_width


def _warm_up(contenders: Sequence[Sequence[Callable[[], None]]], warmup: int, sync: Callable[[], None]) -> None:
    """``warmup`` untimed calls of every phase (first-call costs: allocations, connections), then one sync."""
    for phases in contenders:
        for fn in phases:
            for _ in range(warmup):
                fn()
    sync()


def _prior_iters(prior: Rounds, contenders: Sequence[Sequence[Callable[[], None]]]) -> tuple[tuple[int, ...], ...]:
    """The k of an earlier pass, which must have sampled contenders of the same phases."""
    shape = [len(p) for p in contenders]
    if [len(p) for p in prior.iters] != shape:
        raise ValueError(f"prior rounds have phases {[len(p) for p in prior.iters]}, contenders {shape}")
    return prior.iters


@dataclass(frozen=True, slots=True)
class _Calibration:
    """How one phase's k is found: :func:`calibrate`, then clamped to ``[min_iters, max_iters]``."""

    min_time_s: float
    min_iters: int
    max_iters: int
    sync: Callable[[], None]
    clock: Clock
    agree: Callable[[float], float]
    barrier: Callable[[], None]
    timer: SampleTimer | None

    def k(self, fn: Callable[[], None]) -> int:
        found = calibrate(
            fn, min_time_s=self.min_time_s, max_iters=self.max_iters, sync=self.sync, clock=self.clock,
            agree=self.agree, barrier=self.barrier, timer=self.timer,
        )  # fmt: skip
        return min(self.max_iters, max(self.min_iters, found))


def _round(
    contenders: Sequence[Sequence[Callable[[], None]]],
    iters: tuple[tuple[int, ...], ...],
    index: int,
    *,
    barrier: Callable[[], None],
    clock: Clock,
    gap: Callable[[], None] | None,
    sync: Callable[[], None],
    timer: SampleTimer | None,
) -> list[float]:
    """Round ``index``: one sample of every phase of every contender, starting from contender ``index`` (mod
    their number). Returns this rank's per-op seconds of every phase in contender order, then its barrier wait."""
    values = [[0.0] * len(phases) for phases in contenders]
    wait = 0.0
    for j in range(len(contenders)):
        c = (j + index) % len(contenders)
        for p, fn in enumerate(contenders[c]):
            # Time spent waiting in the barrier: the rank the others wait for (a straggler) waits least.
            tb = clock()
            barrier()
            wait += clock() - tb
            if gap is not None:
                gap()
            values[c][p] = run_sample(fn, iters[c][p], sync=sync, clock=clock, timer=timer) / iters[c][p]
    return [*(v for row in values for v in row), wait]


def _next_test(rounds: int, first: int, elapsed: float, exchange_s: float, max_rounds: int) -> int:
    """The round of the next exchange: about ``exchange_s`` of rounds at this call's pace so far (the same on every
    rank: it comes from the exchanged elapsed time), never past ``max_rounds``."""
    per_round = elapsed / max(1, rounds - first)
    size = max(1, round(exchange_s / per_round)) if per_round > 0 else 1
    return min(rounds + size, max(max_rounds, rounds + 1))


@dataclass(slots=True)
class _Log:
    """Every rank's samples so far (``acc[c][p][rank][round]``, ``waits[rank][round]``), a prior pass's first."""

    shape: list[int]
    across: str
    before: float
    """Seconds a prior pass sampled."""
    rounds: int
    acc: list[list[list[list[float]]]] | None = None
    """None until the first exchange says how many ranks there are (without a prior pass)."""
    waits: list[list[float]] = field(default_factory=list)
    converged: bool = False

    @classmethod
    def continuing(cls, prior: Rounds | None, across: str, shape: list[int]) -> _Log:
        if prior is None:
            return cls(shape, across, 0.0, 0)
        log = cls(
            shape, across, prior.elapsed_s, prior.rounds,
            [[[list(r) for r in phase] for phase in c] for c in prior.samples], [list(w) for w in prior.waits],
        )  # fmt: skip
        if prior.across_ranks != across:
            raise ValueError(f"prior rounds combine ranks by {prior.across_ranks}, this pass by {across}")
        return log

    def add(self, per_rank: list[list[float]]) -> None:
        """Append one exchange: each rank's block of rounds (every phase's value, then the wait, per round) and,
        last, its elapsed time."""
        if self.acc is not None and len(self.acc[0][0]) != len(per_rank):
            raise ValueError(f"prior rounds hold {len(self.acc[0][0])} ranks, this pass {len(per_rank)}")
        if self.acc is None:
            self.acc = [[[[] for _ in per_rank] for _ in range(n)] for n in self.shape]
            self.waits = [[] for _ in per_rank]
        width = sum(self.shape) + 1
        for r, vals in enumerate(per_rank):
            for b in range(0, len(vals) - 1, width):
                i = b
                for c, n in enumerate(self.shape):
                    for p in range(n):
                        self.acc[c][p][r].append(vals[i])
                        i += 1
                self.waits[r].append(vals[i])

    @property
    def exchanged(self) -> int:
        """Rounds every rank holds (the prior pass's and those exchanged since)."""
        return len(self.waits[0]) if self.waits else 0

    def cut(self, iters: tuple[tuple[int, ...], ...], elapsed: float) -> Rounds:
        """The exchanged rounds, as a call stopped in the middle leaves them (not converged)."""
        assert self.acc is not None
        return _rounds(iters, self.acc, self.waits, self.exchanged, False, self.before + elapsed, self.across)

    def result(self, iters: tuple[tuple[int, ...], ...], converged: bool, elapsed: float) -> Rounds:
        assert self.acc is not None  # the loop exchanges before it can stop
        return _rounds(iters, self.acc, self.waits, self.rounds, converged, self.before + elapsed, self.across)


def _rounds(
    iters: tuple[tuple[int, ...], ...],
    acc: list[list[list[list[float]]]],
    waits: list[list[float]],
    rounds: int,
    converged: bool,
    elapsed: float,
    across_ranks: str = "mean",
) -> Rounds:
    samples = tuple(tuple(tuple(tuple(r) for r in phase) for phase in c) for c in acc)
    return Rounds(
        iters=iters, samples=samples, waits=tuple(tuple(w) for w in waits), rounds=rounds, converged=converged,
        elapsed_s=elapsed, across_ranks=across_ranks,
    )  # fmt: skip


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
    fastest rank median minus one. The sweep takes p50/p95/cv/rank_spread from here; its time and interval
    come from the per-sample means of :mod:`commbench.core.stats`.
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
