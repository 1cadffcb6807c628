"""The reader of torch.profiler's Chrome/Kineto JSON (``prof.export_chrome_trace``, ``tensorboard_trace_handler``):
the ``distributedInfo`` block (backend, rank, world size, ``pg_config``: each process group's name, description and
ranks), the ``ProfilerStep#N`` spans, the communication calls (:mod:`commbench.store.trace_calls`) and the GPU
kernels.

A call is read from ``record_param_comms`` where the trace has it (NCCL); its enclosing c10d operator is then the
same call and is skipped. Without it (gloo; an older torch's record without fields), from the c10d operator; Kineto
writes a list argument's type as ``TensorList`` (and older torch its shapes as ``[]``), so a list-taking operator's
dtype (and shape) comes from the work item it queued (``gloo:<collective>`` on gloo's worker threads,
``nccl:<collective>`` inside the operator, each with the tensor's shape and type): :func:`pair_work`. An operator nested in another communication
operator on the same thread (a functional collective calling c10d) is the outer call.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from typing import Any

from commbench.store.trace_calls import Group, OpEvent, Trace, TraceError, add_calls, dtype_of, is_comm

STEP = re.compile(r"ProfilerStep#(\d+)$")

_WORK: dict[str, tuple[str, ...]] = {
    "all_reduce": ("gloo:all_reduce", "nccl:all_reduce"),
    # gloo runs reduce_scatter_tensor as an all_reduce of the whole input (ProcessGroupGloo::_reduce_scatter_base)
    "reduce_scatter": ("gloo:reduce_scatter", "gloo:all_reduce", "nccl:_reduce_scatter_base", "nccl:reduce_scatter"),
    "all_gather": ("gloo:all_gather", "nccl:_all_gather_base", "nccl:all_gather"),
    "all_to_all": ("gloo:all_to_all", "nccl:all_to_all"),
    "broadcast": ("gloo:broadcast", "nccl:broadcast"),
    "reduce": ("gloo:reduce", "nccl:reduce"),
    "send": ("gloo:send", "nccl:send"),
    "recv": ("gloo:recv", "nccl:recv"),
    "gather": ("gloo:gather", "nccl:gather"),
    "scatter": ("gloo:scatter", "nccl:scatter"),
}
"""The backend's work items a c10d operator queues, by its collective: gloo's on its worker threads, ProcessGroupNCCL's
``nccl:<collective>`` record inside the operator. Each carries the input tensor's shape and type (``record_shapes``)."""

_C10D_COLLECTIVE = {
    "c10d::allreduce_": "all_reduce", "c10d::allreduce_coalesced_": "all_reduce", "c10d::broadcast_": "broadcast",
    "c10d::reduce_": "reduce", "c10d::send": "send", "c10d::recv_": "recv", "c10d::recv_any_source_": "recv",
    "c10d::_allgather_base_": "all_gather", "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::alltoall_base_": "all_to_all",
}  # fmt: skip


_COMM_KERNEL = re.compile(r"^nccl.*Kernel")
_MEMORY_KERNEL = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def kernel_kind(name: str) -> str:
    """HolisticTraceAnalysis' kernel types (``hta/utils/utils.py`` of holistictraceanalysis 0.5.0, ``get_kernel_type``
    and its patterns, copied as they are): ``communication`` for NCCL's kernels (``ncclKernel_*``,
    ``ncclDevKernel_*``), ``memory`` for Memcpy/Memset/dma, ``computation`` for the rest but a ``Sync`` kernel, which is
    ``other``."""
    if _COMM_KERNEL.match(name):
        return "communication"
    if _MEMORY_KERNEL.match(name):
        return "memory"
    return "other" if _NOT_COMPUTE.match(name) else "computation"


def _groups(info: dict[str, Any]) -> dict[str, Group]:
    """``distributedInfo["pg_config"]``: a list of ``{pg_name, pg_desc, ranks}`` (torch >= 2.2) or a dict by name."""
    cfg = info.get("pg_config") or []
    entries = list(cfg.values()) if isinstance(cfg, dict) else list(cfg) if isinstance(cfg, list) else []
    out: dict[str, Group] = {}
    for e in entries:
        if not isinstance(e, dict):
            continue
        ranks = e.get("ranks")
        if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks):
            name = str(e.get("pg_name", len(out)))
            out[name] = Group(name, tuple(ranks), str(e.get("pg_desc", "")))
    return out


def _op(e: dict[str, Any]) -> OpEvent:
    a = e.get("args") or {}
    return OpEvent(
        name=str(e.get("name", "")), ts=float(e.get("ts", 0.0)), dur=float(e.get("dur", 0.0) or 0.0),
        thread=(e.get("pid"), e.get("tid")), dims=list(a.get("Input Dims") or []), types=list(a.get("Input type") or []),
        values=list(a.get("Concrete Inputs") or []), args=a,
    )  # fmt: skip


def _first_shape(dims: Any) -> Any:
    """The first tensor shape of a dims entry (a shape, or a list of them)."""
    while isinstance(dims, list) and dims and isinstance(dims[0], list):
        dims = dims[0]
    return dims


def pair_work(ops: list[OpEvent], work: list[OpEvent]) -> None:
    """Give each c10d operator what its backend's work item records of it: the earliest unclaimed one of its kind
    starting after it, with its tensor's shape, or, for an operator whose list argument's shapes were not recorded
    (older torch writes ``[]``), the one inside its span. The work's dtype fills a ``TensorList``'s missing one
    (``dtype_hint``), its shape a missing shape (``dims_hint``); an operator left without one keeps both None."""
    by_name: dict[str, list[OpEvent]] = defaultdict(list)
    for w in sorted(work, key=lambda w: w.ts):
        by_name[w.name].append(w)
    starts = {name: [w.ts for w in ws] for name, ws in by_name.items()}
    claimed: set[int] = set()
    for op in sorted(ops, key=lambda o: o.ts):
        coll = _C10D_COLLECTIVE.get(op.name)
        if coll is None or not op.dims:
            continue
        shape = _first_shape(op.dims[1] if coll in ("all_gather", "reduce_scatter", "all_to_all") else op.dims[0])
        unknown = shape == [] and op.dims[0] == []  # an empty list: nothing recorded of the tensors
        best: OpEvent | None = None
        for name in _WORK[coll]:
            ws = by_name.get(name, [])
            for i in range(bisect.bisect_left(starts.get(name, []), op.ts), len(ws)):  # work starts after its call
                w = ws[i]
                if unknown and w.ts > op.ts + op.dur:
                    break
                if id(w) in claimed or (not unknown and _first_shape(w.dims[:1]) != shape):
                    continue
                if best is None or w.ts < best.ts:
                    best = w
                break
        if best is not None:
            claimed.add(id(best))
            op.dtype_hint = dtype_of(best.types[0]) if best.types else None
            op.dims_hint = best.dims[:1] if unknown and best.dims else None


def _outermost(events: list[OpEvent]) -> tuple[list[OpEvent], list[OpEvent], list[OpEvent]]:
    """(calls, nested, holders): per thread, a communication operator inside another one is part of it, and so is a
    ``record_param_comms`` inside another; a c10d operator holding a ``record_param_comms`` is read from that record
    instead (it is returned as a holder)."""
    keep: list[OpEvent] = []
    nested: list[OpEvent] = []
    replaced: set[int] = set()
    kept: set[int] = set()  # the operators kept as calls
    by_thread: dict[Any, list[OpEvent]] = defaultdict(list)
    for e in events:
        by_thread[e.thread].append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e.ts, -e.dur))
        open_: list[OpEvent] = []
        for e in evs:
            while open_ and e.ts >= open_[-1].ts + open_[-1].dur:
                open_.pop()
            if e.name != "record_param_comms" and open_ and e.name == open_[0].name and id(open_[0]) in kept:
                # the same operator inside itself: a tensor subclass's dispatch (torchao's Float8TrainingTensor reaches
                # a functional all-gather with its nominal dtype, then again with its uint8 codes), read from the inner
                kept.discard(id(open_[0]))
                nested.append(open_[0])
                keep[keep.index(open_[0])] = e
                kept.add(id(e))
            elif e.name != "record_param_comms":
                (nested if open_ else keep).append(e)
                if not open_:
                    kept.add(id(e))
            elif any(o.name == "record_param_comms" for o in open_):
                nested.append(e)
            else:
                # the record is the call: the c10d operator around it is not a second one
                holder = next((o for o in open_ if id(o) in kept), None)  # the one kept; the others are nested already
                if holder is not None:
                    replaced.add(id(holder))
                keep.append(e)
            open_.append(e)
    return [e for e in keep if id(e) not in replaced], nested, [e for e in keep if id(e) in replaced]


def read_kineto(path: str, data: dict[str, Any]) -> Trace:
    """The :class:`~commbench.store.trace_calls.Trace` of one Kineto JSON document."""
    events = data.get("traceEvents")
    if not isinstance(events, list):
        raise TraceError(f"{path}: 'traceEvents' is not a list: not a torch.profiler trace")
    raw_info = data.get("distributedInfo")
    info: dict[str, Any] = raw_info if isinstance(raw_info, dict) else {}
    rank = int(info.get("rank", 0)) if isinstance(info.get("rank", 0), int) else 0
    world = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    trace = Trace(
        path=path, format="kineto", rank=rank, world_size=world, backend=str(info.get("backend", "")),
        groups=_groups(info), steps=[], calls=[], host=str(data.get("host_name", "")),
    )  # fmt: skip
    comm: list[OpEvent] = []
    work: list[OpEvent] = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name, cat = str(e.get("name", "")), str(e.get("cat", ""))
        if cat == "kernel":
            trace.kernels.append(
                (float(e.get("ts", 0)), float(e.get("dur", 0)), str(e.get("tid", "")), kernel_kind(name))
            )
            continue
        m = STEP.match(name)
        if m and cat == "gpu_user_annotation":
            trace.gpu_step_spans[int(m.group(1))] = (
                float(e.get("ts", 0)),
                float(e.get("ts", 0)) + float(e.get("dur", 0)),
            )
            continue
        if m:
            trace.step_spans[int(m.group(1))] = (float(e.get("ts", 0)), float(e.get("ts", 0)) + float(e.get("dur", 0)))
            continue
        if not is_comm(name) or cat.startswith("gpu"):
            continue
        if name.startswith(("gloo:", "nccl:")):
            work.append(_op(e))
        else:
            comm.append(_op(e))
    trace.steps = sorted(trace.step_spans)
    old = [e for e in comm if e.name == "record_param_comms" and "Collective name" not in e.args]
    if old:  # torch < 2.1 recorded no fields in it: its c10d operator is the call
        trace.skipped[
            "record_param_comms (an older torch's, without its fields: the call is read from its operator)"
        ] += len(old)
        comm = [e for e in comm if not (e.name == "record_param_comms" and "Collective name" not in e.args)]
    calls, nested, holders = _outermost(comm)
    pair_work([c for c in calls if c.name.startswith("c10d::")], work)
    for w in work:
        trace.skipped[f"{w.name} (the backend's work item of a call)"] += 1
    for e in nested:
        trace.skipped[f"{e.name} (inside another communication record: the same call)"] += 1
    for e in holders:
        trace.skipped[f"{e.name} (read from the record_param_comms inside it)"] += 1
    add_calls(trace, sorted(calls, key=lambda e: e.ts), lambda ev: _step_of(trace, ev.ts) if trace.step_spans else -1)
    return trace


def _step_of(trace: Trace, ts: float) -> int | None:
    for s, (lo, hi) in trace.step_spans.items():
        if lo <= ts <= hi:
            return s
    return None
