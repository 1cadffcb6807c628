"""The sweep: drives the collective x precision x size grid on every rank and yields one record per point
(a :class:`~commbench.core.records.CollectivePoint`).

Points are run by **groups**: every precision of one (collective, size). Each point first gets its correctness
and error passes (:mod:`commbench.measure.check`); then the group's precisions are timed together in alternating rounds
(:func:`commbench.measure.timing.measure_rounds`) until each point's 95 % interval is narrow enough or the group's budget
is spent, so every ratio against fp32 is computed from pairs measured in the same round (:mod:`commbench.core.stats`).
The rounds of a group are spread over ``timing.passes`` visits of the whole grid (:meth:`Sweep.sample_group` once
per pass, :meth:`Sweep.finish_group` after the last), so a slow spell of the machine lands on part of many points.
Where a codec precision reaches its result through another algorithm than fp32 (reductions over all_to_all), fp32
through that algorithm (``fp32_chunked``) joins the group, and a codec's gain splits into algorithm and precision.
The group's references are made once for all its precisions, and one payload loads every contender
(:func:`commbench.measure.check.check_group`); a precision that turns out unable to run here (``Unsupported`` from its
``make_op``, agreed across ranks) is skipped with a note rather than ending the run.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import signal
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from commbench.cluster.launch import Dist
from commbench.cluster.metadata import group_link, rank_link_facts
from commbench.core import stats
from commbench.core.records import CollectivePoint, RankPoint
from commbench.core.suite import SuiteConfig
from commbench.measure import console
from commbench.measure.check import Check, check_group, load_inputs, payload_source
from commbench.measure.collectives import Collective, Layout, get_collective
from commbench.measure.groups import SubGroup, build, get_group_kind, unusable
from commbench.measure.passes import PARTIAL_STATE, GroupState
from commbench.measure.precision import Precision, Unsupported, get_precision
from commbench.measure.raw_codec import NAME as ALGORITHM_BASELINE
from commbench.measure.timing import (
    PARTIAL_ROUNDS,
    Rounds,
    Stats,
    bandwidth_gbps,
    graph_note,
    measure_rounds,
    sample_timer,
)

BASELINE = "fp32"
"""Every gain is against this precision at the same size (when the suite runs it)."""


@dataclass(frozen=True, slots=True)
class Point:
    collective: Collective
    precision: Precision
    fp32_bytes: int


@dataclass(slots=True)
class Group:
    """Every point of one (collective, size): timed together, in alternating rounds."""

    collective: Collective
    fp32_bytes: int
    kind: str = "world"
    """Communicator group kind (commbench.measure.groups) the points run in."""
    points: list[tuple[int, Point]] = field(default_factory=list)
    """(run-order index, point) in precision order."""


def contenders(names: Sequence[str], coll: Collective, backend: str) -> list[Precision]:
    """The precisions a group of ``coll`` runs on ``backend``: the suite's ``names`` the backend supports, in
    order, and ``fp32_chunked`` where the algorithm/precision split applies (the memory estimate counts them
    all: :func:`commbench.measure.footprint.point_memory`)."""
    precs = [get_precision(p) for p in names]
    precs = [p for p in precs if p.supports(coll, backend)]
    have = {p.name for p in precs}
    # The algorithm/precision split needs fp32 through the codecs' algorithm, where that algorithm differs
    # from the backend's own: a reduction done as exchange + local sum instead of by the backend.
    if BASELINE in have and ALGORITHM_BASELINE not in have and coll.reduces and any(p.chunked for p in precs):
        extra = get_precision(ALGORITHM_BASELINE)
        if extra.supports(coll, backend):
            precs.append(extra)
    return precs


def compute_gap(device: Any, seconds: float, sync: Callable[[], None]) -> Callable[[], None]:
    """Isolated mode's gap: small matmuls on ``device`` for ``seconds``, as a training step computes between
    collectives (the cores and the backend's threads go from compute to the collective, not from the last op)."""
    a = torch.randn(64, 64, device=device)

    def gap() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            torch.mm(a, a)
            sync()

    return gap


def _fault_hook(rank: int, index: int) -> None:
    """Test hook: ``COMMBENCH_INJECT_FAULT=kill:RANK:POINT`` or ``hang:RANK:POINT`` (used by the test suite
    to check that a dead or hung rank ends the run and is named)."""
    spec = os.environ.get("COMMBENCH_INJECT_FAULT")
    if not spec:
        return
    kind, r, p = spec.split(":")
    if int(r) == rank and int(p) == index:
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "hang":
            time.sleep(3600)


def _trace(rank: int, what: str) -> None:
    """Test hook: with ``COMMBENCH_INJECT_TRACE=PATH`` every rank appends one line per check and per measured pass
    of a group to PATH (``RANK check|measure COLLECTIVE FP32_BYTES GROUP [pass P]``): the tests count what a resumed
    run measures again, not how long it took."""
    path = os.environ.get("COMMBENCH_INJECT_TRACE")
    if path:
        with open(path, "a") as f:
            f.write("".join(f"{rank} {line}\n" for line in what.splitlines()))


def signal_hook(rank: int, passes_done: int) -> None:
    """Test hook: ``COMMBENCH_INJECT_SIGNAL=INT:PASS`` or ``TERM:PASS``: once the run's ``PASS``-th pass of the grid
    is over (and journaled), every rank sends itself the signal and rank 0 its launcher too (a Ctrl-C reaches every
    process of the terminal's group; a batch system's SIGTERM reaches the ranks)."""
    spec = os.environ.get("COMMBENCH_INJECT_SIGNAL")
    if not spec or int(spec.split(":")[1]) != passes_done:
        return
    sig = signal.Signals[f"SIG{spec.split(':')[0]}"]
    parent = os.environ.get("COMMBENCH_PARENT_PID")
    try:
        os.kill(os.getpid(), sig)  # its handler raises as this call returns: the rank stops before its launcher does
    finally:
        if rank == 0 and parent and sig == signal.SIGINT:
            os.kill(int(parent), sig)


def _slow_hook(rank: int, comm: Callable[[], None]) -> Callable[[], None]:
    """Test hook: ``COMMBENCH_INJECT_SLOW=RANK:MS`` makes ``RANK`` sleep MS milliseconds after each of its collective
    calls, as a rank on a busy core ends its work late: the others wait for it in the next call and at the next
    barrier (used by the tests of the straggler and per-node views)."""
    spec = os.environ.get("COMMBENCH_INJECT_SLOW")
    if not spec or int(spec.split(":")[0]) != rank:
        return comm
    delay = float(spec.split(":")[1]) / 1e3

    def slow() -> None:
        comm()
        time.sleep(delay)

    return slow


class GroupView:
    """What a point's checks see of its communicator group: rank and size inside the group, its process group;
    synchronisation, barriers and the exchange of results still span the world (every group at once)."""

    def __init__(self, d: Dist, sg: SubGroup) -> None:
        self.rank = sg.rank
        self.world_size = sg.size
        self.pg = sg.pg
        self.device = d.device
        self.sync = d.sync
        self.gather_floats = d.gather_floats


class Sweep:
    """Runs groups of points on one rank; every rank runs the same points in the same order."""

    def __init__(self, suite: SuiteConfig, d: Dist) -> None:
        self.suite = suite
        self.d = d
        self._subgroups: dict[str, SubGroup] = {}
        self._link_facts: list[Any] | None = None
        self._links: dict[str, dict[str, Any]] = {}
        note = graph_note(d, suite.timing.cuda_graph)
        if note is not None and d.rank == 0:  # -G off NCCL/CUDA: said once, the ops run eagerly
            for line in console.comment(note):
                print(line, flush=True)
        self.timing_mode = "graph" if suite.timing.cuda_graph and note is None else suite.timing.mode
        """The rows' ``timing_mode``: ``graph`` when each sample launches a CUDA graph of its ops (``-G``)."""
        self.unavailable: list[dict[str, str]] = []
        """Points skipped at run time, once per (precision, collective, group): ``precision``, ``collective``,
        ``group`` and ``reason`` (the :class:`~commbench.measure.precision.Unsupported` message), for the metadata."""

    def subgroup(self, kind: str) -> SubGroup:
        """This rank's communicator group of ``kind``, created on first use (by every rank, in the same order)."""
        if kind not in self._subgroups:
            self._subgroups[kind] = build(get_group_kind(kind), self.d.hosts, self.d.backend)
            self._links[kind] = self._group_link(kind, self._subgroups[kind])
        return self._subgroups[kind]

    def _group_link(self, kind: str, sg: SubGroup) -> dict[str, Any]:
        """The link ``kind``'s groups are measured against (``link_util``): every rank's link facts, gathered once
        (a collective: every rank builds its subgroups in the same order), then the group's rule
        (:func:`commbench.cluster.metadata.group_link`)."""
        if self._link_facts is None:
            gpu = self.d.device.index if self.d.device.type == "cuda" else None
            self._link_facts = self.d.gather_object(rank_link_facts(self.d.backend, gpu))
        hosts = list(self.d.hosts)
        return group_link(self._link_facts, hosts, get_group_kind(kind).partition(hosts), sg.ranks)

    def group_kinds(self) -> list[str]:
        return [g for g in self.suite.groups if unusable(get_group_kind(g), self.d.hosts) is None]

    def skipped_groups(self) -> list[tuple[str, str]]:
        """(group kind, why) for the suite's groups this world cannot form."""
        out = []
        for g in self.suite.groups:
            why = unusable(get_group_kind(g), self.d.hosts)
            if why is not None:
                out.append((g, why))
        return out

    def _precisions(self, coll: Collective) -> list[Precision]:
        return contenders(self.suite.precisions, coll, self.d.backend)

    def groups(self) -> list[Group]:
        """Groups in run order: collective, then size; inside a group, the suite's precision order."""
        out: list[Group] = []
        index = 0
        for kind in self.group_kinds():
            for c in self.suite.collectives:
                coll = get_collective(c).configured(root=self.suite.root, op=self.suite.op)
                precs = self._precisions(coll)
                if not precs:
                    continue
                for s in self.suite.sizes():
                    g = Group(coll, s, kind)
                    for prec in precs:
                        g.points.append((index, Point(coll, prec, s)))
                        index += 1
                    out.append(g)
        return out

    def points(self) -> list[Point]:
        return [pt for g in self.groups() for _, pt in g.points]

    def skipped(self) -> list[tuple[str, str]]:
        """(collective, precision) pairs the backend cannot run."""
        out = []
        for c in self.suite.collectives:
            for p in self.suite.precisions:
                if not get_precision(p).supports(get_collective(c), self.d.backend):
                    out.append((c, p))
        return out

    def layout(self, coll: Collective, fp32_bytes: int, n: int | None = None) -> Layout | None:
        n = n or self.d.world_size
        total = coll.round_total(fp32_bytes // 4, n)
        if total < n:
            return None
        return coll.layout(total, n)

    def run_group(self, group: Group, todo: set[int] | None = None) -> list[tuple[int, CollectivePoint]]:
        """Check and time every point of ``group`` (see :meth:`run_group_ranks`); the point records only."""
        return self.run_group_ranks(group, todo)[0]

    def run_group_ranks(
        self, group: Group, todo: set[int] | None = None
    ) -> tuple[list[tuple[int, CollectivePoint]], list[RankPoint]]:
        """Check and time every point of ``group`` in every pass back to back; records of the points in ``todo``
        (all when None). A whole run spreads the passes over the grid instead (``orchestrate._run_sweep``)."""
        state = None
        for p in range(self.suite.timing.passes):
            state = self.sample_group(group, state, p)
        return self.finish_group(group, state, todo)

    def sample_group(self, group: Group, state: GroupState | None, pass_index: int) -> GroupState | None:
        """One pass over ``group``: its correctness and error passes first (pass 0), then rounds of samples that
        continue ``state``'s. None when the group cannot run (its layout does not divide, or every precision of it
        was skipped). A precision whose ``make_op`` raises :class:`~commbench.measure.precision.Unsupported` (the same on
        every rank) is skipped with its message as the note (:attr:`unavailable`) instead of ending the run."""
        d, suite, coll = self.d, self.suite, group.collective
        sg = self.subgroup(group.kind)
        view = GroupView(d, sg)
        layout = self.layout(coll, group.fp32_bytes, sg.size)
        if layout is None:
            return None
        why = coll.unsupported(d.backend, sg.size)  # the suite's root or op in a group too small, or a backend without it
        if why is not None:  # every precision of the collective alike: recorded for each, said once
            if any([self._skip(pt, group.kind, why, say=False) for _, pt in group.points]) and d.rank == 0:
                entry = {"collective": coll.name, "precision": "every precision", "group": group.kind, "reason": why}
                console.print_unavailable(entry)
            return None
        live, ops = [], []
        for c, (index, pt) in enumerate(group.points):
            if state is not None and c not in state.live:
                continue
            if pass_index == suite.timing.passes - 1:
                _fault_hook(d.rank, index)  # in the pass that finishes the point: the points before it are kept
            try:
                op = pt.precision.make_op(coll, layout, sg.pg, d.device)
            except Unsupported as e:  # agreed on every rank of the group: they all skip it together
                self._skip(pt, group.kind, str(e))
                continue
            live.append(c)
            ops.append(op)
        if not ops:
            return None
        pairs = [(group.points[c][1].precision, op) for c, op in zip(live, ops, strict=True)]
        checks = check_group(view, suite, coll, layout, pairs, group.fp32_bytes) if state is None else state.checks  # type: ignore[arg-type]
        where = f"{coll.name} {group.fp32_bytes} {group.kind}"
        _trace(d.rank, f"{'check ' + where + chr(10) if state is None else ''}measure {where} pass {pass_index}")
        # Timing on the payload, regenerated from its seed in blocks rather than kept through the checks or the
        # run: one tensor per input dtype loads every contender (in-place collectives keep summing into the buffer:
        # like nccl-tests in-place).
        source = payload_source(suite, layout, group.fp32_bytes, d.device)
        load_inputs(pairs, source, view.rank, layout.input_numel, d.device)
        phases = []
        for _, op in pairs:
            op.encode()
            comm = _slow_hook(d.rank, op.comm)
            phases.append([op.encode, comm, op.decode] if op.has_codec else [comm])
        t = suite.timing
        total_rounds = max(t.max_samples, t.repeats)
        wire_bytes, has_codec = [op.wire_bytes for op in ops], [op.has_codec for op in ops]
        passes_before = 0 if state is None else state.passes
        try:
            rounds = measure_rounds(
                phases,
                warmup=t.warmup,
                min_time_s=t.min_time_s,
                min_iters=t.min_iters,
                max_iters=t.max_iters,
                # by the end of pass p: at least its share of the repeats, at most its share of the rounds; every pass
                # takes its share of the repeats (even after the interval is reached) and at most its share of the budget
                min_rounds=math.ceil(t.repeats * (pass_index + 1) / t.passes),
                max_rounds=math.ceil(total_rounds * (pass_index + 1) / t.passes),
                min_new_rounds=math.ceil(t.repeats / t.passes),
                target_rel_ci=t.target_ci,
                budget_s=t.budget_s / t.passes,
                gather=d.gather_floats,
                sync=d.sync,
                agree=d.agree_max,
                barrier=d.barrier,
                prior=None if state is None else state.rounds,
                gap=compute_gap(d.device, t.gap_s, d.sync) if t.mode == "isolated" else None,
                timer=sample_timer(d, t.device_timer, t.cuda_graph),
            )
        except BaseException as e:  # stopped mid-pass: what every rank exchanged goes with it, as a state
            cut = getattr(e, PARTIAL_ROUNDS, None)
            if cut is not None:
                setattr(e, PARTIAL_STATE, GroupState(checks, cut, wire_bytes, has_codec, live, passes_before))
            raise
        return GroupState(checks, rounds, wire_bytes, has_codec, live, passes_before + 1)

    def _skip(self, pt: Point, kind: str, reason: str, say: bool = True) -> bool:
        """Record (and on rank 0 print, unless not ``say``) a point its precision refused at run time, once per
        (precision, collective, group): every size of it is skipped alike. True when it was not recorded yet."""
        entry = {"precision": pt.precision.name, "collective": pt.collective.name, "group": kind, "reason": reason}
        if entry in self.unavailable:
            return False
        self.unavailable.append(entry)
        if say and self.d.rank == 0:
            console.print_unavailable(entry)
        return True

    def finish_group(
        self, group: Group, state: GroupState | None, todo: set[int] | None = None, *, partial: bool = False
    ) -> tuple[list[tuple[int, CollectivePoint]], list[RankPoint]]:
        """The records of ``group``'s points in ``todo`` (all when None) from every pass's rounds so far; with
        ``partial``, marked provisional (written after a pass that is not the last: an interrupted run keeps them).

        Points already finished (``--resume``) are timed again when a point still to do needs them as its
        pair partner, but not recorded twice.
        """
        if state is None:
            return [], []
        sg = self.subgroup(group.kind)
        layout = self.layout(group.collective, group.fp32_bytes, sg.size)
        assert layout is not None  # sample_group returned a state, so the layout divides
        checks, rounds = state.checks, state.rounds
        points = [group.points[c] for c in state.live]
        names = [pt.precision.name for _, pt in points]
        totals = [rounds.per_sample_total(c) for c in range(len(points))]
        base = names.index(BASELINE) if BASELINE in names else None
        algo = names.index(ALGORITHM_BASELINE) if ALGORITHM_BASELINE in names else None
        out = []
        for c, ((index, pt), chk) in enumerate(zip(points, checks, strict=True)):
            if todo is not None and index not in todo:
                continue
            gain = algo_gain = prec_gain = None
            if base is not None:
                gain = stats.paired_ratio_ci(totals[base], totals[c])
                if algo is not None and pt.precision.chunked and c != algo:
                    algo_gain = stats.paired_ratio_ci(totals[base], totals[algo])
                    prec_gain = stats.paired_ratio_ci(totals[algo], totals[c])
            rec = self._record(
                pt, layout, state.wire_bytes[c], state.has_codec[c], chk, rounds, c, gain, algo_gain, prec_gain, sg
            )
            out.append((index, replace(rec, passes_done=state.passes, partial=partial)))
        keep = [i for i, _ in points if todo is None or i in todo]
        return out, self._rank_records(group, points, rounds, keep)

    def _rank_records(
        self, group: Group, points: list[tuple[int, Point]], r: Rounds, keep: list[int]
    ) -> list[RankPoint]:
        """Per rank and point: the rank's median comm time and its median barrier wait of the group's rounds."""
        out = []
        wait_us = [statistics.median(w) * 1e6 for w in r.waits]
        for c, (index, pt) in enumerate(points):
            if index not in keep:
                continue
            comm_phase = len(r.samples[c]) // 2  # encode/comm/decode or comm alone
            for rank, samples in enumerate(r.samples[c][comm_phase]):
                out.append(
                    RankPoint(
                        collective=pt.collective.name, precision=pt.precision.name, group=group.kind,
                        payload=self.suite.payload, fp32_bytes=pt.fp32_bytes, rank=rank, host=self.d.hosts[rank],
                        time_us=statistics.median(samples) * 1e6, wait_us=wait_us[rank],
                    )
                )  # fmt: skip
        return out

    def _record(
        self,
        pt: Point,
        layout: Layout,
        wire_bytes: int,
        has_codec: bool,
        chk: Check,
        r: Rounds,
        c: int,
        gain: stats.Estimate | None,
        algo_gain: stats.Estimate | None,
        prec_gain: stats.Estimate | None,
        sg: SubGroup,
    ) -> CollectivePoint:
        d, suite, coll, prec = self.d, self.suite, pt.collective, pt.precision
        comm_phase = 1 if has_codec else 0
        comm = stats.median_ci(r.per_sample(c, comm_phase))
        enc_s = statistics.median(r.per_sample(c, 0)) if has_codec else 0.0
        dec_s = statistics.median(r.per_sample(c, 2)) if has_codec else 0.0
        # total = the phases' medians summed (so encode + comm + decode = total in every row); its interval is
        # the per-round totals' interval, scaled to that centre
        per_round = stats.median_ci(r.per_sample_total(c))
        total_s = enc_s + comm.value + dec_s
        scale = total_s / per_round.value if per_round.value > 0 else float("nan")
        total = stats.Estimate(total_s, per_round.low * scale, per_round.high * scale, per_round.n, per_round.coverage)
        per_rank = r.samples[c][comm_phase]
        pooled = Stats.from_ranks(per_rank)  # p50/p95/cv over every sample of every rank, rank spread
        slowest = statistics.median(max(vals) for vals in zip(*per_rank, strict=True))
        bus = coll.bus_factor(sg.size)
        fp32_bytes = layout.total * 4

        def us(x: float) -> float:
            return x * 1e6

        def bw(nbytes: int, seconds: float) -> float:
            return bandwidth_gbps(nbytes, us(seconds))

        algbw = bw(wire_bytes, comm.value)
        g = gain if gain is not None else stats.Estimate(float("nan"), float("nan"), float("nan"), 0)
        ag = algo_gain if algo_gain is not None else stats.Estimate(float("nan"), float("nan"), float("nan"), 0)
        pg = prec_gain if prec_gain is not None else stats.Estimate(float("nan"), float("nan"), float("nan"), 0)
        is_base = prec.name == BASELINE
        link = self._links.get(sg.kind.name) or {}
        return CollectivePoint(
            collective=coll.name,
            precision=prec.name,
            impl=prec.impl,
            backend=d.backend,
            device=d.device_name(),
            world_size=d.world_size,
            nodes=d.nodes,
            group=sg.kind.name,
            group_size=sg.size,
            n_groups=sg.n_groups,
            payload=suite.payload,
            dtype=prec.nccl_type,
            size_bytes=wire_bytes,
            count=layout.count,
            redop=coll.redop,
            root=coll.root if coll.rooted else -1,
            fp32_bytes=pt.fp32_bytes,
            wire_bytes=wire_bytes,
            time_us=us(comm.value),
            time_ci_low_us=us(comm.low),
            time_ci_high_us=us(comm.high),
            time_us_max=us(max(slowest, comm.value)),
            p50_us=pooled.p50_us,
            p95_us=pooled.p95_us,
            cv=pooled.cv,
            rank_spread=pooled.rank_spread,
            iters=r.iters[c][comm_phase],
            timing_mode=self.timing_mode,
            samples=r.rounds,
            ci_coverage=comm.coverage,
            noisy=total.rel_half_width > suite.timing.target_ci,
            algbw_gbps=algbw,
            busbw_gbps=algbw * bus,
            busbw_ci_low_gbps=bw(wire_bytes, comm.high) * bus,
            busbw_ci_high_gbps=bw(wire_bytes, comm.low) * bus,
            link_gbps=math.nan if link.get("gbps") is None else float(link["gbps"]),
            link_util=math.nan if link.get("gbps") is None else algbw * bus / float(link["gbps"]),
            link=str(link.get("label", "")),
            link_host=str(link.get("host", "")),
            encode_us=us(enc_s),
            comm_us=us(comm.value),
            decode_us=us(dec_s),
            total_us=us(total.value),
            total_ci_low_us=us(total.low),
            total_ci_high_us=us(total.high),
            effective_gbps=bw(fp32_bytes, total.value),
            effective_ci_low_gbps=bw(fp32_bytes, total.high),
            effective_ci_high_gbps=bw(fp32_bytes, total.low),
            gain_vs_fp32=1.0 if is_base else g.value,
            gain_ci_low=1.0 if is_base else g.low,
            gain_ci_high=1.0 if is_base else g.high,
            gain_significant=False if is_base else (stats.significant(g) if gain is not None else None),
            algo_gain=ag.value,
            algo_gain_ci_low=ag.low,
            algo_gain_ci_high=ag.high,
            precision_gain=pg.value,
            precision_gain_ci_low=pg.low,
            precision_gain_ci_high=pg.high,
            wrong=chk.wrong,
            tolerance=chk.tolerance,
            rel_err=chk.rel_err,
            comm_rel_err=chk.comm_rel_err,
            max_abs_err=chk.max_abs_err,
            timestamp=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )


def iter_groups(sweep: Sweep, done: set[tuple[Any, ...]]) -> Iterator[tuple[Group, set[int]]]:
    """Groups with points still to run and the indices of those points (``done`` holds POINT_KEY tuples of
    finished rows, for --resume)."""
    for g in sweep.groups():
        todo = {
            i
            for i, pt in g.points
            if (pt.collective.name, pt.precision.name, sweep.suite.payload, pt.fp32_bytes, g.kind) not in done
        }
        if todo:
            yield g, todo


def count_points(groups: Sequence[tuple[Group, set[int]]]) -> int:
    return sum(len(todo) for _, todo in groups)


def agree_done(d: Dist, done: set[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """Rank 0's set of finished points, on every rank (only rank 0 reads the run directory)."""
    obj: list[Any] = [sorted(done) if d.rank == 0 else None]
    dist.broadcast_object_list(obj, src=0)
    return {tuple(k) for k in obj[0]}
