"""The reader of torch's execution trace (``torch.profiler.ExecutionTraceObserver``, the Chakra host trace): one
node per operator with its parent (``ctrl_deps``), its inputs' shapes, types (``GenericList[Tensor(float)]``) and
values, in execution order (node ids).

A call is read from the c10d and functional operators (:mod:`commbench.store.trace_calls`); a step is the
``ProfilerStep#N`` node above it. The execution trace records no process group (a group argument is written
``"<Object>"``) and no world size: its calls keep ``group`` None and the replay says so.
"""

from __future__ import annotations

from typing import Any

from commbench.store.trace_calls import OpEvent, Trace, TraceError, add_calls, is_c10d_op, is_comm
from commbench.store.trace_kineto import STEP


def read_execution_trace(path: str, data: dict[str, Any]) -> Trace:
    """The :class:`~commbench.store.trace_calls.Trace` of one execution-trace JSON document."""
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        raise TraceError(f"{path}: 'nodes' is not a list: not an execution trace")
    trace = Trace(
        path=path, format="execution_trace", rank=0, world_size=None, backend="", groups={}, steps=[], calls=[]
    )
    by_id: dict[int, dict[str, Any]] = {
        n["id"]: n for n in nodes if isinstance(n, dict) and isinstance(n.get("id"), int)
    }

    def step_of(node: dict[str, Any]) -> int | None:
        seen = 0
        while node is not None and seen < len(by_id):
            m = STEP.match(str(node.get("name", "")))
            if m:
                return int(m.group(1))
            parent = node.get("ctrl_deps")
            node = by_id.get(parent) if isinstance(parent, int) and parent != node.get("id") else None  # type: ignore[assignment]
            seen += 1
        return None

    events: list[OpEvent] = []
    steps_of: dict[int, int | None] = {}
    comm_ids: set[int] = set()
    for nid in sorted(by_id):
        node = by_id[nid]
        name = str(node.get("name", ""))
        m = STEP.match(name)
        if m:
            trace.steps.append(int(m.group(1)))
            continue
        if not is_comm(name):
            continue
        parent = node.get("ctrl_deps")
        if isinstance(parent, int) and parent in comm_ids:  # inside another communication operator: the same call
            trace.skipped[f"{name} (inside another communication record: the same call)"] += 1
            comm_ids.add(nid)
            continue
        comm_ids.add(nid)
        if name.startswith(("gloo:", "nccl:")):
            trace.skipped[f"{name} (the backend's work item of a call)"] += 1
            continue
        if not is_c10d_op(name):
            trace.unread[f"{name}: not read from an execution trace"] += 1
            continue
        ins = node.get("inputs") or {}
        ev = OpEvent(
            name=name, ts=float(nid), dur=0.0, thread=0, dims=list(ins.get("shapes") or []),
            types=list(ins.get("types") or []), values=list(ins.get("values") or []),
        )  # fmt: skip
        events.append(ev)
        steps_of[id(ev)] = step_of(node)
    trace.steps = sorted(set(trace.steps))
    add_calls(trace, events, lambda ev: steps_of[id(ev)] if trace.steps else -1)
    return trace
