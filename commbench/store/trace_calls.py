"""The communication calls of a PyTorch profiler trace, as data: one :class:`TraceCall` per call, the steps that
hold them, and how an operator's recorded arguments become a call.

Two kinds of record carry a call (both readers, :mod:`commbench.store.trace_kineto` and
:mod:`commbench.store.trace_et`, hand this module the same :class:`OpEvent`):

- ``record_param_comms``: what ProcessGroupNCCL (``RECORD_PARAM_COMMS_DATA``) records around each collective, with
  the fields of torch's ``torch/csrc/profiler/util.h`` (``kCommsName = "Collective name"``, ``"In msg nelems"``,
  ``"Out msg nelems"``, ``"dtype"``, ``"Group size"``, ``"Process Group Name"``, ``"Process Group Ranks"``, ``"Rank"``,
  ``"Src Rank"``/``"Dst Rank"`` for point-to-point): the message element counts of this rank, per call.
- the c10d dispatcher operators (``c10d::allreduce_``, ``c10d::_allgather_base_``, ``c10d::send``, ...) and the
  functional collectives (``_c10d_functional::all_reduce``, ...), recorded on the CPU with their input shapes and
  types when the profiler runs with ``record_shapes=True``: what a gloo run has (ProcessGroupGloo records no
  ``record_param_comms``; its ``gloo:<collective>`` events are the backend's work items on its own threads, and it
  runs ``reduce_scatter_tensor`` as a ``gloo:all_reduce``, so they do not say which collective the user called).

Sizes are nccl-tests' (doc/PERFORMANCE.md), as ``run`` reports them: all_reduce the buffer, all_gather the total
output, reduce_scatter the total input, all_to_all the per-rank buffer, broadcast the buffer, a send the tensor
sent. Pure Python: no torch.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TOTAL_IS_OUTPUT = frozenset({"all_gather", "recv"})
"""Collectives whose nccl-tests size is the output (the rest: the input)."""

P2P = frozenset({"send", "recv"})

NOT_CALLS = frozenset({"barrier", "wait", "coalesced", "init", "split", "wait_tensor"})
"""Communication records that move no payload (a barrier moves one byte of its own; ``coalesced`` marks the end of a
group of calls already recorded one by one): counted in :attr:`Trace.skipped`, never replayed."""

_RPC_NAMES: dict[str, str] = {
    "allreduce": "all_reduce",
    "allreducecoalesced": "all_reduce",
    "allgather": "all_gather",
    "allgatherbase": "all_gather",
    "allgatherintotensor": "all_gather",
    "allgatherintotensorcoalesced": "all_gather",
    "allgathercoalesced": "all_gather",
    "reducescatter": "reduce_scatter",
    "reducescatterbase": "reduce_scatter",
    "reducescattertensor": "reduce_scatter",
    "reducescattertensorcoalesced": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallbase": "all_to_all",
    "alltoallv": "all_to_all",
    "alltoallsingle": "all_to_all",
    "broadcast": "broadcast",
    "broadcastoop": "broadcast",
    "reduce": "reduce",
    "reduceoop": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "send": "send",
    "recv": "recv",
    "recvanysource": "recv",
    "barrier": "barrier",
    "coalesced": "coalesced",
    "wait": "wait",
    "init": "init",
}
"""``record_param_comms``' "Collective name" (ProcessGroupNCCL's names: ``allreduce``, ``_allgather_base``,
``allgather_into_tensor_coalesced``, ``_reduce_scatter_base``, ``all_to_all``, ``send``, ...), lower-cased with every
non-letter removed -> the collective."""

# c10d operator -> (collective, how its sizes are read): "list" = the first argument's tensors are the call's
# (in place: input = output); "out_in" = argument 0 is the output, argument 1 the input; "outs_ins" = lists of
# outputs and inputs; "gather_list" = argument 0 the outputs (a list of lists), argument 1 the inputs.
_C10D_OPS: dict[str, tuple[str, str]] = {
    "c10d::allreduce_": ("all_reduce", "list"),
    "c10d::allreduce_coalesced_": ("all_reduce", "list"),
    "c10d::broadcast_": ("broadcast", "list"),
    "c10d::reduce_": ("reduce", "list"),
    "c10d::send": ("send", "list"),
    "c10d::recv_": ("recv", "list"),
    "c10d::recv_any_source_": ("recv", "list"),
    "c10d::_allgather_base_": ("all_gather", "out_in"),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", "out_in"),
    "c10d::alltoall_base_": ("all_to_all", "out_in"),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", "outs_ins"),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", "outs_ins"),
    "c10d::alltoall_": ("all_to_all", "outs_ins"),
    "c10d::allgather_": ("all_gather", "outs_ins"),
    "c10d::allgather_coalesced_": ("all_gather", "outs_ins"),
    "c10d::reduce_scatter_": ("reduce_scatter", "outs_ins"),
    "c10d::gather_": ("gather", "outs_ins"),
    "c10d::scatter_": ("scatter", "outs_ins"),
    "c10d::barrier": ("barrier", "list"),
}

# functional collectives (torch/csrc/distributed/c10d/Functional.cpp): (collective, index of the group name
# argument, index of the group size argument or -1, output elements per input element: "gather" x size,
# "scatter" / size, "same")
_FUNCTIONAL_OPS: dict[str, tuple[str, int, int, str]] = {
    "_c10d_functional::all_reduce": ("all_reduce", 2, -1, "same"),
    "_c10d_functional::all_reduce_": ("all_reduce", 2, -1, "same"),
    "_c10d_functional::all_reduce_coalesced": ("all_reduce", 2, -1, "same"),
    "_c10d_functional::all_reduce_coalesced_": ("all_reduce", 2, -1, "same"),
    "_c10d_functional::all_gather_into_tensor": ("all_gather", 2, 1, "gather"),
    "_c10d_functional::all_gather_into_tensor_out": ("all_gather", 2, 1, "gather"),
    "_c10d_functional::all_gather_into_tensor_coalesced": ("all_gather", 2, 1, "gather"),
    "_c10d_functional::reduce_scatter_tensor": ("reduce_scatter", 3, 2, "scatter"),
    "_c10d_functional::reduce_scatter_tensor_coalesced": ("reduce_scatter", 3, 2, "scatter"),
    "_c10d_functional::all_to_all_single": ("all_to_all", 3, -1, "same"),
    "_c10d_functional::broadcast": ("broadcast", 2, -1, "same"),
    "_c10d_functional::broadcast_": ("broadcast", 2, -1, "same"),
}

NON_CALL_OPS = frozenset({
    "_c10d_functional::wait_tensor", "_c10d_functional::_wrap_tensor_autograd", "c10d::wait", "c10d::monitored_barrier_",
    "_c10d_functional_autograd::wait_tensor",
})  # fmt: skip
"""Communication operators that are no call: waiting for one (a functional collective's ``wait_tensor``), autograd's
wrapper of its result."""

COMM_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::", "nccl:", "gloo:", "record_param_comms")
"""Names of events that are communication: every one is a call, a backend work item, or counted as unread."""

_DTYPES: dict[str, str] = {
    "float": "float32", "float32": "float32", "Float": "float32",
    "double": "float64", "float64": "float64", "Double": "float64",
    "c10::Half": "float16", "Half": "float16", "float16": "float16", "half": "float16",
    "c10::BFloat16": "bfloat16", "BFloat16": "bfloat16", "bfloat16": "bfloat16",
    "c10::Float8_e4m3fn": "float8_e4m3fn", "Float8_e4m3fn": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2", "Float8_e5m2": "float8_e5m2", "float8_e5m2": "float8_e5m2",
    "unsigned char": "uint8", "Byte": "uint8", "uint8": "uint8",
    "signed char": "int8", "Char": "int8", "int8": "int8",
    "int": "int32", "Int": "int32", "int32": "int32",
    "long int": "int64", "long": "int64", "Long": "int64", "int64": "int64",
    "bool": "bool", "Bool": "bool",
}  # fmt: skip
"""Type names as traces write them (c10's ScalarType names in ``record_param_comms``' dtype, C++ type names in
Kineto's "Input type", ``Tensor(c10::BFloat16)`` in the execution trace) -> torch's dtype name."""

DTYPE_SIZES: dict[str, int] = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "uint8": 1, "int8": 1, "int32": 4, "int64": 8, "bool": 1,
}  # fmt: skip


class TraceError(ValueError):
    """A trace that cannot be read: truncated, of an unknown format, without communication. One line."""


def dtype_of(name: Any) -> str | None:
    """torch's name of a trace's type name (``Tensor(float)`` and ``GenericList[Tensor(float)]`` too), None if
    it is not a tensor type."""
    if not isinstance(name, str):
        return None
    m = re.fullmatch(r"(?:GenericList\[)?Tensor\((.+?)\)\]?", name)
    return _DTYPES.get(m.group(1) if m else name)


@dataclass(frozen=True, slots=True)
class TraceCall:
    """One communication call of one rank."""

    collective: str
    """all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, gather, scatter, send, recv."""
    in_numel: int
    out_numel: int
    dtype: str
    """torch's dtype name (``float32``, ``bfloat16``)."""
    group: tuple[int, ...] | None
    """Global ranks of its process group; None when the trace does not say (see :attr:`Trace.unread`)."""
    group_name: str
    rank: int
    step: int
    order: int
    """Position of the call in its step (0 first)."""
    ts_us: float
    dur_us: float
    peer: int | None = None
    """Point-to-point: the global rank sent to (send) or received from (recv), when the trace says."""
    source: str = ""
    """The trace event it came from."""

    @property
    def numel(self) -> int:
        """Elements of nccl-tests' size: the output for all_gather and a receive, the input otherwise."""
        return self.out_numel if self.collective in TOTAL_IS_OUTPUT else self.in_numel

    @property
    def size_bytes(self) -> int:
        return self.numel * DTYPE_SIZES.get(self.dtype, 0)

    @property
    def group_size(self) -> int:
        return len(self.group) if self.group is not None else 0


@dataclass(slots=True)
class OpEvent:
    """One operator record, as both readers see it: name, its arguments' shapes, types and values, and time."""

    name: str
    ts: float
    dur: float
    thread: Any
    dims: list[Any] = field(default_factory=list)
    types: list[Any] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    args: dict[str, Any] = field(default_factory=dict)
    """Kineto's args (``record_param_comms`` fields)."""
    dtype_hint: str | None = None
    """A list argument's dtype when the record leaves it out (Kineto writes ``TensorList``): from the backend's work
    item (:func:`commbench.store.trace_kineto.pair_work`)."""
    dims_hint: list[Any] | None = None
    """The first argument's shapes when the record holds none (older torch writes a list argument as ``[]``): from
    the backend's work item."""


@dataclass(slots=True)
class Group:
    name: str
    ranks: tuple[int, ...]
    desc: str = ""


@dataclass(slots=True)
class Trace:
    """What one rank's trace (or several ranks' traces merged) holds about communication."""

    path: str
    format: str
    """``kineto`` or ``execution_trace``."""
    rank: int
    world_size: int | None
    backend: str
    groups: dict[str, Group]
    steps: list[int]
    """Step numbers (``ProfilerStep#N``) in order."""
    calls: list[TraceCall]
    unread: Counter[str] = field(default_factory=Counter)
    """Communication events not turned into calls, by "name: why"."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Records that are communication but no payload call (barriers, waits, the backend's work items), by name."""
    kernels: list[tuple[float, float, str, str]] = field(default_factory=list)
    """GPU kernels (start us, duration us, stream, kind: communication, memory, computation), for the exposure."""
    step_spans: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Each step's (start, end) in us on the host (``ProfilerStep#N``)."""
    gpu_step_spans: dict[int, tuple[float, float]] = field(default_factory=dict)
    """The same steps on the GPU timeline (Kineto's ``gpu_user_annotation`` of ``ProfilerStep#N``)."""
    host: str = ""
    """The host the rank ran on (Kineto's ``host_name``)."""


def _numel(shape: Any) -> int:
    if not isinstance(shape, list) or not all(isinstance(x, int) for x in shape):
        raise TraceError("unreadable shape")
    n = 1
    for x in shape:
        n *= x
    return n


def _flat_numel(dims: Any) -> tuple[int, int]:
    """(elements, tensors) of a dims entry: a tensor's shape, or a (nested) list of them."""
    if isinstance(dims, list) and all(isinstance(x, int) for x in dims):
        return _numel(dims), 1
    if isinstance(dims, list):
        total = count = 0
        for d in dims:
            e, c = _flat_numel(d)
            total, count = total + e, count + c
        return total, count
    raise TraceError("unreadable shape")


def _ranks_of(value: Any) -> tuple[int, ...] | None:
    """ "Process Group Ranks" as Kineto writes it (a string ``"[0, 1]"``) or a list."""
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return None
    if isinstance(value, (list, tuple)) and all(isinstance(x, int) for x in value):
        return tuple(value)
    return None


def param_comms_call(ev: OpEvent, groups: dict[str, Group], world: int | None) -> tuple[str, int, int, str, str]:
    """(collective, in elements, out elements, dtype, group name) of a ``record_param_comms`` record; TraceError
    naming what is missing."""
    a = ev.args
    raw = a.get("Collective name")
    if not isinstance(raw, str):
        raise TraceError("no 'Collective name'")
    coll = _RPC_NAMES.get(re.sub(r"[^a-z]", "", raw.lower()))
    if coll is None:
        raise TraceError(f"unknown collective {raw!r}")
    if coll in NOT_CALLS:
        return coll, 0, 0, "", ""
    nin, nout = a.get("In msg nelems"), a.get("Out msg nelems")
    if not isinstance(nin, int) or not isinstance(nout, int):
        raise TraceError("no message element counts")
    dtype = dtype_of(a.get("dtype"))
    if dtype is None:
        raise TraceError(f"unknown dtype {a.get('dtype')!r}")
    name = str(a.get("Process Group Name", ""))
    ranks = _ranks_of(a.get("Process Group Ranks"))
    if ranks is not None and name and name not in groups:
        groups[name] = Group(name, ranks, str(a.get("Process Group Description", "")))
    return coll, nin, nout, dtype, name


def c10d_call(ev: OpEvent) -> tuple[str, int, int, str, str | None, int | None]:
    """(collective, in elements, out elements, dtype, group name or None, group size or None) of a c10d or
    functional operator; TraceError naming what is missing (no shapes: the profiler ran without
    ``record_shapes=True``)."""
    if not ev.dims:
        raise TraceError("no input shapes (profile with record_shapes=True)")
    if ev.name in _C10D_OPS:
        coll, how = _C10D_OPS[ev.name]
        if coll in NOT_CALLS:
            return coll, 0, 0, "", None, None
        if how == "list":
            listed = ev.dims[0] if ev.dims[0] != [] else ev.dims_hint
            if not listed:
                raise TraceError("input shapes not recorded")
            n, _ = _flat_numel(listed)
            nin = nout = n
            dtype = dtype_of(ev.types[0]) if ev.types else None
        else:
            nout, _ = _flat_numel(ev.dims[0])
            nin, _ = _flat_numel(ev.dims[1])
            dtype = dtype_of(ev.types[1]) if len(ev.types) > 1 else None
            if dtype is None and ev.types:
                dtype = dtype_of(ev.types[0])
        dtype = dtype or ev.dtype_hint
        if dtype is None:
            raise TraceError("dtype not recorded")
        size = (
            nout // nin if coll == "all_gather" and nin else nin // nout if coll == "reduce_scatter" and nout else None
        )
        return coll, nin, nout, dtype, None, size
    coll, gi, si, scale = _FUNCTIONAL_OPS[ev.name]
    nin, _ = _flat_numel(ev.dims[0])
    dtype = dtype_of(ev.types[0]) if ev.types else None
    if dtype is None:
        raise TraceError("dtype not recorded")
    group_name = ev.values[gi] if len(ev.values) > gi and isinstance(ev.values[gi], str) and ev.values[gi] else None
    size = _int(ev.values[si]) if si >= 0 and len(ev.values) > si else None
    if scale != "same" and size is None:
        raise TraceError("group size not recorded")
    nout = nin * size if scale == "gather" and size else nin // size if scale == "scatter" and size else nin
    return coll, nin, nout, dtype, group_name, size


def _int(v: Any) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def is_c10d_op(name: str) -> bool:
    return name in _C10D_OPS or name in _FUNCTIONAL_OPS


def is_comm(name: str) -> bool:
    return name.startswith(COMM_PREFIXES)


def resolve_group(
    groups: dict[str, Group], name: str | None, size: int | None, rank: int, world: int | None
) -> tuple[tuple[int, ...] | None, str]:
    """(ranks, name) of a call's process group: by name where recorded, else the only group that can be meant
    (every known group has the same ranks, or only one of them has the call's size and holds this rank); (None,
    why) when the trace cannot tell."""
    if name is not None and name in groups:
        return groups[name].ranks, name
    if name is not None and not groups and world is not None:
        return tuple(range(world)), name
    sets = {g.ranks for g in groups.values() if rank in g.ranks} if groups else set()
    if not sets and world is not None:
        sets = {tuple(range(world))}
    if len(sets) == 1:
        ranks = next(iter(sets))
        if size is None or size == len(ranks):
            return ranks, next((g.name for g in groups.values() if g.ranks == ranks), "world")
    fits = {s for s in sets if size is not None and len(s) == size}
    if len(fits) == 1:
        ranks = next(iter(fits))
        return ranks, next(g.name for g in groups.values() if g.ranks == ranks)
    if size is not None and not fits:
        return None, f"process group not recorded: a {size}-rank group, and the trace lists none holding rank {rank}"
    return None, f"process group not recorded ({len(sets)} groups hold rank {rank})"


def add_calls(trace: Trace, events: list[OpEvent], step_of: Callable[[OpEvent], int | None]) -> None:
    """Turn the outermost communication records into ``trace``'s calls, in record order, numbered per step
    (``step_of``: the step of a record, None outside every step, -1 when the trace has no steps). A Kineto
    call whose process group cannot be told is unread; an execution trace records no group at all, so its calls
    keep ``group`` None (the replay puts them on the whole world and says so)."""
    order: Counter[int] = Counter()
    for ev in events:
        if ev.name in NON_CALL_OPS:
            trace.skipped[f"{ev.name} (no payload: part of a call)"] += 1
            continue
        try:
            if ev.name == "record_param_comms":
                coll, nin, nout, dtype, name = param_comms_call(ev, trace.groups, trace.world_size)
                gname: str | None = name or None
                size = ev.args.get("Group size") if isinstance(ev.args.get("Group size"), int) else None
            elif is_c10d_op(ev.name):
                coll, nin, nout, dtype, gname, size = c10d_call(ev)
            else:
                raise TraceError("unknown communication operator")
        except TraceError as e:
            trace.unread[f"{ev.name}: {e}"] += 1
            continue
        if coll in NOT_CALLS:
            trace.skipped[f"{ev.name} ({coll}: no payload)"] += 1
            continue
        step = step_of(ev)
        if step is None:
            trace.skipped[f"{ev.name} (outside every ProfilerStep span)"] += 1
            continue
        ranks, gname2 = resolve_group(trace.groups, gname, size, trace.rank, trace.world_size)
        if ranks is None and trace.format == "kineto":
            trace.unread[f"{ev.name}: {gname2}"] += 1
            continue
        peer = _peer(ev, coll, ranks)
        trace.calls.append(
            TraceCall(
                collective=coll, in_numel=nin, out_numel=nout, dtype=dtype, group=ranks,
                group_name=gname2 if ranks is not None else "(not recorded)",
                rank=trace.rank, step=step, order=order[step], ts_us=ev.ts, dur_us=ev.dur, peer=peer, source=ev.name,
            )
        )  # fmt: skip
        order[step] += 1


def _peer(ev: OpEvent, coll: str, ranks: tuple[int, ...] | None) -> int | None:
    """A point-to-point call's peer (global rank): "Dst Rank"/"Src Rank" of ``record_param_comms``, or the c10d
    operator's ``dst``/``src`` argument (a group rank)."""
    if coll not in P2P:
        return None
    for key in ("Dst Rank", "Src Rank"):
        v = ev.args.get(key)
        if isinstance(v, int):
            return v
    if len(ev.values) > 2:
        v = ev.values[2]
        r = int(v) if isinstance(v, int) or (isinstance(v, str) and v.isdigit()) else None
        if r is not None and ranks is not None and 0 <= r < len(ranks):
            return ranks[r]
        return r
    return None
