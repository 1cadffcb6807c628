"""Replaying one training step's communication (read from a profiler trace) on this world, under each precision.

Two measurements, both through the sweep's machinery (no timing loop of its own):

- **per call size**: each distinct (collective, size, group) of the step is a sweep group (:class:`Sweep`'s
  ``sample_group`` / ``finish_group``) whose contenders are the call's own precision (the trace's dtype) and the
  other precisions asked for: the same checks, errors against float64, interleaved rounds and records as ``run``.
  The speed-up of each precision is the paired ratio against the trace's own precision in the same rounds.
- **the step**: per precision one contender that runs every call of the step in the trace's order (encode, comm,
  decode of each), timed by :func:`commbench.measure.timing.measure_rounds` in alternating rounds, so the step's
  communication time and its speed-up against the trace's dtype are paired as well (``core/stats.py``).

A point-to-point send or receive is replayed as a pipeline-stage transfer (:data:`REPLAY_AS`). What cannot run here
is named, never dropped: a collective with no registered implementation, a dtype with no precision (int64
buffers). A trace's process group becomes a group kind
(:class:`TraceGroups`) whose partition is the trace's groups of that layout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from commbench.cluster.launch import Dist
from commbench.core import stats
from commbench.core.records import CollectivePoint
from commbench.core.suite import SuiteConfig
from commbench.measure.check import load_inputs, payload_source
from commbench.measure.collectives import COLLECTIVES, get_collective
from commbench.measure.groups import GROUP_KINDS, GroupKind, register_group_kind
from commbench.measure.precision import Unsupported, get_precision
from commbench.measure.sweep import Group, GroupView, Point, Sweep
from commbench.measure.timing import measure_rounds, sample_timer

TRACE = "trace"
"""The precision name meaning "each call at the dtype the trace recorded"."""

DTYPE_PRECISIONS: dict[str, str] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
"""A trace's dtype -> the native precision that replays it."""

REPLAY_AS: dict[str, str] = {"send": "pp_sendrecv", "recv": "pp_sendrecv"}
"""A trace's point-to-point call -> the collective that replays it: each send or receive of the replayed rank is one
stage-boundary transfer of its size (``pp_sendrecv``: rank r of the group to r+1; a backward pass's receive runs the
other way, over the same link with the same bytes)."""


class TraceGroups(GroupKind):
    """A trace's process groups of one layout (e.g. every tensor-parallel group) as a group kind: all of them run
    at once, as the job ran them."""

    name = "trace"
    description = "process groups of a replayed trace"

    def __init__(self, name: str, parts: Sequence[Sequence[int]]) -> None:
        self.name = name  # type: ignore[misc]
        self.parts = [list(p) for p in parts]

    def partition(self, hosts: Sequence[str]) -> list[list[int]]:
        return [list(p) for p in self.parts]


def group_kind(parts: Sequence[Sequence[int]], hosts: Sequence[str]) -> str:
    """The group kind of a trace layout on this world (``hosts``: every rank's host): a registered kind with that
    partition here (``world``; ``intra`` for groups that are this world's nodes: a tensor-parallel group inside a
    node), else a :class:`TraceGroups` registered under ``trace:<size>x<count>:<first group>`` (every rank
    registers the same)."""
    want = sorted(sorted(p) for p in parts)
    for name, kind in GROUP_KINDS.items():
        if not isinstance(kind, TraceGroups) and sorted(sorted(p) for p in kind.partition(hosts)) == want:
            return name
    name = f"trace:{len(parts[0])}x{len(parts)}:{'-'.join(map(str, parts[0]))}"
    if name not in GROUP_KINDS.names():
        register_group_kind(TraceGroups(name, parts))
    return name


def is_trace_kind(name: str) -> bool:
    """Whether ``name`` is a trace's own layout (known to this process only: a run directory's readers, such as
    ``commbench fit``, know the registered kinds)."""
    return isinstance(GROUP_KINDS.get(name, None), TraceGroups)


@dataclass(frozen=True, slots=True)
class ReplayCall:
    """One call of the step, as the replay runs it."""

    collective: str
    numel: int
    """Elements of nccl-tests' size (the user's tensor: commbench sizes count them as fp32 elements)."""
    dtype: str
    """torch's name of the dtype the trace recorded."""
    group: str
    """Group kind name (:func:`group_kind`)."""
    order: int


@dataclass(slots=True)
class StepResult:
    """The step replayed under one precision."""

    precision: str
    time: stats.Estimate
    """Seconds per step (the calls that ran)."""
    speedup: stats.Estimate
    """Paired ratio: the trace's own precision's step time over this one's (> 1: faster)."""
    wire_bytes: int
    """nccl-tests size summed over the step's calls at this precision."""
    rel_err_max: float
    rel_err_mean: float
    """Mean relative error over the step's elements (each row weighted by its calls times elements)."""


@dataclass(slots=True)
class Replay:
    records: list[CollectivePoint] = field(default_factory=list)
    """The sweep's records of every (call size, precision), as ``run`` writes them."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """One per (call size, precision): the CollectivePoint's fields plus ``calls_per_step``, ``trace_dtype``,
    ``speedup`` and its interval against the trace's precision."""
    steps: list[StepResult] = field(default_factory=list)
    same_as_trace: list[str] = field(default_factory=list)
    """Precisions that are every replayed call's own: their step is the trace's, not measured twice."""
    not_replayed: dict[str, int] = field(default_factory=dict)
    """"what: why" -> calls per step that did not run."""


def own_precision(dtype: str) -> str | None:
    return DTYPE_PRECISIONS.get(dtype)


def replayable(call: ReplayCall, sweep: Sweep) -> str | None:
    """Why ``call`` cannot run here (None when it can). Creates the call's process groups (a collective: every
    rank asks about the same calls in the same order)."""
    if call.collective not in COLLECTIVES.names():
        return f"{call.collective}: no registered collective (registered: {', '.join(COLLECTIVES.names())})"
    if own_precision(call.dtype) is None:
        return f"{call.collective} {call.dtype}: no precision replays this dtype ({', '.join(DTYPE_PRECISIONS)})"
    n = sweep.subgroup(call.group).size
    if sweep.layout(get_collective(call.collective), call.numel * 4, n) is None:
        return f"{call.collective} of {call.numel} elements: fewer than nccl-tests' layout of it needs on {n} ranks"
    return None


def resolve(names: Sequence[str], dtype: str) -> list[str]:
    """The precisions a call runs under, its own first, each once."""
    own = own_precision(dtype)
    out = [own] if own else []
    for n in names:
        p = own if n == TRACE else n
        if p and p not in out:
            out.append(p)
    return out


def replay(d: Dist, suite: SuiteConfig, calls: Sequence[ReplayCall], precisions: Sequence[str]) -> Replay:
    """Run the step's ``calls`` under ``precisions`` (``trace`` = each call's own dtype) on every rank; the same
    result on every rank."""
    for p in precisions:
        if p != TRACE:
            get_precision(p)  # an unknown name: ValueError naming the valid ones, before any collective
    out = Replay()
    sweep = Sweep(suite, d)
    run: list[ReplayCall] = []
    for c in calls:
        as_name = REPLAY_AS.get(c.collective)
        if as_name is not None and as_name in COLLECTIVES.names():
            c = replace(c, collective=as_name)
        why = replayable(c, sweep)
        if why is None:
            run.append(c)
        else:
            out.not_replayed[why] = out.not_replayed.get(why, 0) + 1
    distinct: dict[tuple[str, int, str, str], int] = {}
    for c in run:
        key = (c.collective, c.numel, c.dtype, c.group)
        distinct[key] = distinct.get(key, 0) + 1
    names = [TRACE, *[p for p in precisions if p != TRACE]]
    for (coll, numel, dtype, kind), count in distinct.items():
        recs, rows = _measure_size(sweep, coll, numel, dtype, kind, count, names)
        out.records.extend(recs)
        out.rows.extend(rows)
    out.same_as_trace = [p for p in precisions if p != TRACE and run and all(own_precision(c.dtype) == p for c in run)]
    names = [p for p in names if p not in out.same_as_trace]
    if run:
        out.steps = _measure_step(sweep, run, names)
        step_errors(out)
    return out


def _measure_size(
    sweep: Sweep, coll_name: str, numel: int, dtype: str, kind: str, count: int, names: Sequence[str]
) -> tuple[list[CollectivePoint], list[dict[str, Any]]]:
    """One call size under each precision: a sweep group, every pass, with paired speed-ups."""
    coll = get_collective(coll_name)
    precs = [get_precision(p) for p in resolve(names, dtype)]
    precs = [p for p in precs if p.supports(coll, sweep.d.backend)]
    group = Group(coll, numel * 4, kind)
    group.points = [(i, Point(coll, p, numel * 4)) for i, p in enumerate(precs)]
    state = None
    for p in range(sweep.suite.timing.passes):
        state = sweep.sample_group(group, state, p)
    if state is None:
        return [], []
    totals = [state.rounds.per_sample_total(c) for c in range(len(state.live))]
    live_names = [group.points[c][1].precision.name for c in state.live]
    base = 0 if live_names and live_names[0] == precs[0].name else None
    records, _ = sweep.finish_group(group, state)
    rows = []
    for c, (_, rec) in enumerate(records):
        gain = stats.paired_ratio_ci(totals[base], totals[c]) if base is not None else _nan_estimate()
        rows.append(_row(rec, count, dtype, gain, is_own=c == base))
    return [rec for _, rec in records], rows


def _row(rec: CollectivePoint, count: int, dtype: str, gain: stats.Estimate, *, is_own: bool) -> dict[str, Any]:
    from dataclasses import asdict

    row = asdict(rec)
    row.update(
        calls_per_step=count, trace_dtype=dtype, trace_precision=is_own,
        speedup=1.0 if is_own else gain.value, speedup_ci_low=1.0 if is_own else gain.low,
        speedup_ci_high=1.0 if is_own else gain.high,
        speedup_significant=False if is_own else stats.significant(gain),
        step_time_us=rec.total_us * count,
    )  # fmt: skip
    return row


def _nan_estimate() -> stats.Estimate:
    return stats.Estimate(math.nan, math.nan, math.nan, 0)


def _measure_step(sweep: Sweep, calls: Sequence[ReplayCall], names: Sequence[str]) -> list[StepResult]:
    """Every precision's whole step (the calls in the trace's order), timed in alternating rounds."""
    d, suite = sweep.d, sweep.suite
    labels = [TRACE, *[n for n in names if n != TRACE]]
    steps: list[Callable[[], None]] = []
    wire: list[int] = []
    kept: list[str] = []
    for label in labels:
        ops: dict[tuple[str, int, str, str], Any] = {}
        fns: list[Callable[[], None]] = []
        total = 0
        try:
            for c in calls:
                key = (c.collective, c.numel, c.dtype, c.group)
                prec = get_precision(own_precision(c.dtype) if label == TRACE else label)  # type: ignore[arg-type]
                coll = get_collective(c.collective)
                if key not in ops:
                    sg = sweep.subgroup(c.group)
                    layout = sweep.layout(coll, c.numel * 4, sg.size)
                    if layout is None or not prec.supports(coll, d.backend):
                        raise Unsupported(f"{prec.name} cannot run {coll.name} of {c.numel} elements here")
                    op = prec.make_op(coll, layout, sg.pg, d.device)
                    load_inputs([(prec, op)], payload_source(suite, layout, c.numel * 4, d.device), GroupView(d, sg).rank,
                                layout.input_numel, d.device)  # fmt: skip
                    ops[key] = op
                op = ops[key]
                total += op.wire_bytes
                fns.extend([op.encode, op.comm, op.decode] if op.has_codec else [op.comm])
        except Unsupported:
            continue  # agreed on every rank: this precision's step is left out (its rows say why)
        steps.append(_chain(fns))
        wire.append(total)
        kept.append(label)
    if not steps:
        return []
    t = suite.timing
    rounds = measure_rounds(
        [[fn] for fn in steps], warmup=t.warmup, min_time_s=t.min_time_s, min_iters=1, max_iters=t.max_iters,
        min_rounds=t.repeats, max_rounds=max(t.max_samples, t.repeats), target_rel_ci=t.target_ci, budget_s=t.budget_s,
        gather=d.gather_floats, sync=d.sync, agree=d.agree_max, barrier=d.barrier, timer=sample_timer(d, t.device_timer),
    )  # fmt: skip
    totals = [rounds.per_sample_total(i) for i in range(len(steps))]
    out = []
    for i, label in enumerate(kept):
        gain = stats.paired_ratio_ci(totals[0], totals[i]) if kept[0] == TRACE else _nan_estimate()
        out.append(StepResult(label, stats.median_ci(totals[i]), gain, wire[i], math.nan, math.nan))
    return out


def _chain(fns: Sequence[Callable[[], None]]) -> Callable[[], None]:
    def step() -> None:
        for fn in fns:
            fn()

    return step


def step_errors(result: Replay) -> None:
    """Fill each step's error from its rows: the largest relative error and the element-weighted mean."""
    for s in result.steps:
        rows = [
            r for r in result.rows if (r["trace_precision"] if s.precision == TRACE else r["precision"] == s.precision)
        ]
        errs = [
            (float(r["rel_err"]), r["calls_per_step"] * r["fp32_bytes"])
            for r in rows
            if not math.isnan(float(r["rel_err"]))
        ]
        if errs:
            s.rel_err_max = max(e for e, _ in errs)
            s.rel_err_mean = sum(e * w for e, w in errs) / sum(w for _, w in errs)
