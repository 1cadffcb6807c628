"""Byte accounting for training steps: intercepts the c10d collectives and sums bytes per op and dtype.

`CommCounter` replaces the collective functions in the `torch.distributed` namespace while it is
active. DDP comm hooks, FSDP1 (`_flat_param`, `_runtime_utils`), FSDP2 (`_fsdp_collectives`) and
`ZeroRedundancyOptimizer` all call them as `dist.<op>(...)`, so each call is seen once, with its real
tensors. DTensor (tensor parallelism's redistributions, FSDP2's found-inf reduction under a scaler) calls the
functional collectives instead (`torch.distributed._functional_collectives.<op>`): those are replaced too. Calls made *inside* `distributed_c10d` (e.g. `all_gather_into_tensor` forwarding to
`all_gather_single`) resolve the module's own globals and are not seen twice; a re-entrancy depth
guards the rest.

Sizes follow nccl-tests (all_reduce: buffer; all_gather: total output; reduce_scatter: total input;
all_to_all: per-rank buffer; broadcast: buffer) and are turned into per-rank "bus bytes" with the
nccl-tests bus factors (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n;
broadcast 1): the bytes a rank sends with the ring algorithm. That is the figure the issue's
formulas give (DDP: 2(n-1)/n * Psi * bytes/element).

Each call is also classified by link: "intra" when every rank of its process group is on one node,
"inter" when the group spans nodes (`CommCounter(node_of_rank=...)`; without a node map, one node).
That is where its bytes travel as the formulas count them: a collective over a group that spans nodes
is bound by its inter-node edges.

Point-to-point sends (pipeline parallelism: `torch.distributed.pipelining` posts `dist.P2POp(dist.isend, ...)` in
`batch_isend_irecv`, or calls `isend` / `send` directly) are counted by the sender as op "send": the tensor's bytes,
bus factor 1 (nccl-tests' sendrecv), by dtype, and "inter" when the receiver sits on another node. `isend` is
replaced in `distributed_c10d`'s own namespace as well as in `torch.distributed`, since `send` and
`batch_isend_irecv` call it there and `P2POp` checks that its op is that very function. Receives count nothing
(the sender has counted those bytes). In timed mode the sends are recorded (peer, shape, dtype: `timed_sends`), not
timed in place (see `_wrap_send`); `training.p2p_timing` times the same transfers right after the step.

Gloo implements `reduce_scatter_tensor` as an all_reduce of the whole input followed by a local
copy, so on gloo the real wire bytes of a reduce_scatter are 2(n-1)/n * input, not (n-1)/n * input.
`wire_bytes()` reports that backend-specific figure next to the nominal one.

Timed mode (`with counter.timed(sync=...):`) also measures how long each counted collective takes: `sync` waits
for the device before the clock starts (so compute still queued on the stream is not counted as communication),
the call is made synchronous (its returned Work is waited on, then `sync` waits for the device again) and the
clock stops; its wall time is appended to `durations`, in call order, and its group's ranks to `duration_groups`. `sync` is the caller's device
synchronisation (`launch.Dist.sync`); this module never asks which device it runs on. Every rank then holds one duration per call of the same sequence; a rank that
arrived early spent part of its duration waiting for a peer, so the collective's own time is the smallest
duration over the ranks of its group (the last to arrive waited least). `comm_time_per_step` turns every rank's
(duration, group) pairs (`timed_calls`) into one communication time per step: each rank's sum of its calls' times,
averaged over the ranks (the bytes are per rank averaged over the world too). Synchronous calls forgo overlap: the figure is the no-overlap sum of the
step's collectives, what a cost model prices. DDP's gradient all_reduce is seen here because every DDP policy
registers a Python comm hook (`GradComm.register`; plain fp32 uses torch's `allreduce_hook`), which issues
`dist.all_reduce`; DDP's C++ reducer without a hook would bypass the counter. A codec hook's encode/decode
between its collectives is not part of the durations (wire time only).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from commbench.measure.collectives import COLLECTIVES
from commbench.measure.precision import nccl_type_name

if TYPE_CHECKING:  # torch is imported where tensors are met: the byte formulas (`bus_factor`) need none
    import torch


def dtype_name(dtype: torch.dtype | str) -> str:
    """nccl-tests type name of a torch dtype or of its name (falls back to torch's own name)."""
    return nccl_type_name(dtype)


_EXTRA_BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "broadcast": lambda n: 1.0,  # DDP's buffer re-broadcast, ZeRO-1's parameters; not a benchmarked collective
    "send": lambda n: 1.0,  # a point-to-point send (pipeline stages): the bytes sent, as nccl-tests' sendrecv
}

BACKEND_OPS: dict[tuple[str, str], tuple[str, str]] = {
    ("gloo", "reduce_scatter"): (
        "all_reduce",
        "gloo implements reduce_scatter as an all_reduce of the whole input: wire bytes exceed nominal",
    ),
}
"""(backend, op) -> (the op the backend really runs, a note for the rows), where they differ."""


def bus_factor(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor: bytes a rank sends per byte of nccl-tests `size`."""
    if n <= 1:
        return 0.0
    coll = COLLECTIVES.get(op, None)
    if coll is not None:
        return coll.bus_factor(n)
    extra = _EXTRA_BUS_FACTORS.get(op)
    if extra is not None:
        return extra(n)
    raise ValueError(
        f"unknown collective {op!r}; valid: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send"
    )


def wire_bytes(bus_by_op: dict[str, float], backend: str, n: int) -> tuple[float, list[str]]:
    """(bytes a rank really sends on `backend`, notes) for bus bytes by "op:dtype" (see `BACKEND_OPS`)."""
    total = 0.0
    notes: list[str] = []
    for key, v in bus_by_op.items():
        op = key.split(":", 1)[0]
        real = BACKEND_OPS.get((backend, op))
        if real is None:
            total += v
            continue
        total += v * bus_factor(real[0], n) / bus_factor(op, n)
        if real[1] not in notes:
            notes.append(real[1])
    return total, notes


def _payload(t: torch.Tensor) -> torch.Tensor:
    """What of `t` a collective moves: a DTensor's local shard; of a tensor that carries float8 codes beside their
    scale (torchao's Float8TrainingTensor, whose all-gather moves the codes `_data` alone), the codes, as the bytes
    they cross as (uint8: `float8.gather_float8_as_bytes`)."""
    if hasattr(t, "_local_tensor"):
        t = t._local_tensor
    codes = getattr(t, "_data", None)
    if codes is not None and hasattr(t, "_scale") and codes.is_floating_point() and codes.element_size() == 1:
        import torch

        return codes.view(torch.uint8)  # type: ignore[no-any-return]
    return t


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of a payload (:func:`_payload`)."""
    return int(t.numel() * t.element_size())


def _group_size(group: Any) -> int:
    import torch.distributed as dist

    return int(dist.get_world_size(group))


_NOTHING = object()
"""`CommCounter._record`'s answer for a call that moves nothing (a group of one rank)."""


def _ranks_of(group: Any) -> tuple[int, ...]:
    """The global ranks of `group` (None: the default group); 0..size-1 where no process group exists."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return tuple(range(_group_size(group)))
    return tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))


def _tensors(x: Any) -> list[torch.Tensor]:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        out: list[torch.Tensor] = []
        for item in x:
            out.extend(_tensors(item))
        return out
    return []


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, *names: str) -> Any:
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return args[index] if len(args) > index else None


# A size function reads a call's arguments and returns ([(nccl-tests size in bytes, dtype), ...], group);
# list-taking ops may mix dtypes (DDP broadcasts float and int64 buffers together).
_Sizes = tuple[list[tuple[int, "torch.dtype"]], Any]
_SizeFn = Callable[[tuple[Any, ...], dict[str, Any]], _Sizes]


def _by_dtype(ts: list[torch.Tensor]) -> list[tuple[int, torch.dtype]]:
    acc: dict[torch.dtype, int] = {}
    for t in map(_payload, ts):
        acc[t.dtype] = acc.get(t.dtype, 0) + _nbytes(t)
    return [(v, k) for k, v in acc.items()]


def _single(index: int, names: tuple[str, ...], group_index: int) -> _SizeFn:
    """Size = the one tensor at `index` (the output for all_gather, the input for reduce_scatter)."""

    def size(a: tuple[Any, ...], k: dict[str, Any]) -> _Sizes:
        return _by_dtype(_tensors(_arg(a, k, index, *names))[:1]), _arg(a, k, group_index, "group")

    return size


def _listed(index: int, names: tuple[str, ...], group_index: int) -> _SizeFn:
    """Size = all tensors of the list at `index`, summed per dtype."""

    def size(a: tuple[Any, ...], k: dict[str, Any]) -> _Sizes:
        return _by_dtype(_tensors(_arg(a, k, index, *names))), _arg(a, k, group_index, "group")

    return size


def _broadcast_coalesced(a: tuple[Any, ...], k: dict[str, Any]) -> _Sizes:
    # dist._broadcast_coalesced(process_group, tensors, buffer_size, src): DDP's parameter/buffer sync
    return _by_dtype(_tensors(a[1] if len(a) > 1 else [])), (a[0] if a else None)


# (op, how a call's size is read, the torch.distributed functions that issue it): one row per way of reading a
# size, so the single-tensor variants of a collective (`*_single`, `*_tensor`, the legacy `_*_base`) share it.
_OPS: tuple[tuple[str, _SizeFn, tuple[str, ...]], ...] = (
    ("all_reduce", _single(0, ("tensor",), 2), ("all_reduce",)),
    ("all_reduce", _listed(0, ("tensors",), 2), ("all_reduce_coalesced",)),
    # all_gather: nccl-tests size is the total output
    (
        "all_gather",
        _single(0, ("output_tensor",), 2),
        ("all_gather_single", "all_gather_into_tensor", "_all_gather_base"),
    ),
    ("all_gather", _listed(0, ("tensor_list",), 2), ("all_gather",)),
    # reduce_scatter: nccl-tests size is the total input
    (
        "reduce_scatter",
        _single(1, ("input",), 3),
        ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base"),
    ),
    ("reduce_scatter", _listed(1, ("input_list",), 3), ("reduce_scatter",)),
    # all_to_all: the per-rank buffer
    ("all_to_all", _single(1, ("input",), 4), ("all_to_all_single",)),
    ("all_to_all", _listed(1, ("input_tensor_list",), 2), ("all_to_all",)),
    ("broadcast", _single(0, ("tensor",), 2), ("broadcast",)),
    ("broadcast", _broadcast_coalesced, ("_broadcast_coalesced",)),
)
_PATCHES: dict[str, tuple[str, _SizeFn]] = {name: (op, size) for op, size, names in _OPS for name in names}
"""torch.distributed function name -> (the collective it issues, its size reader)."""


def _funcol_group(group: Any) -> Any:
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.distributed_c10d import _resolve_process_group

    resolved = funcol._resolve_group(group)  # a group name in this torch
    return _resolve_process_group(resolved) if isinstance(resolved, str) else resolved


def _funcol(group_index: int, gathers: bool = False) -> _SizeFn:
    """Size reader of a functional collective `f(self, ..., group)` (DTensor's redistributions: tensor
    parallelism's all-reduces): the input, or for an all-gather the total output (input times the group size)."""

    def size(a: tuple[Any, ...], k: dict[str, Any]) -> _Sizes:
        group = _funcol_group(_arg(a, k, group_index, "group"))
        sizes = _by_dtype(_tensors(_arg(a, k, 0, "self"))[:1])
        if gathers:
            n = _group_size(group)
            sizes = [(b * n, dt) for b, dt in sizes]
        return sizes, group

    return size


_FUNCOL_PATCHES: dict[str, tuple[str, _SizeFn]] = {
    "all_reduce": ("all_reduce", _funcol(2)),
    "all_gather_tensor": ("all_gather", _funcol(2, gathers=True)),
    "all_gather_single": ("all_gather", _funcol(2, gathers=True)),
    "reduce_scatter_tensor": ("reduce_scatter", _funcol(3)),
    "reduce_scatter_single": ("reduce_scatter", _funcol(3)),
    "all_to_all_single": ("all_to_all", _funcol(3)),
}
"""`torch.distributed._functional_collectives` function -> (collective, size reader): DTensor (`torch.distributed.tensor`,
tensor parallelism) calls these as `funcol.<op>(...)`, which go to the c10d ops without `dist.<op>`."""


class CommCounter:
    """Counts the collectives issued while active (`with counter:`), per "op:dtype".

    `paused()` stops counting for instrumentation traffic of our own (e.g. all-reducing the loss).
    Only one counter may be installed at a time; nesting raises.
    """

    _installed: CommCounter | None = None

    def __init__(self, node_of_rank: Sequence[int] | None = None) -> None:
        self.calls: dict[str, int] = defaultdict(int)
        self.size_bytes: dict[str, int] = defaultdict(int)  # nccl-tests size, summed
        self.bus_bytes: dict[str, float] = defaultdict(float)  # per-rank ring bytes (size x bus factor)
        self.link_bytes: dict[str, dict[str, float]] = {"intra": defaultdict(float), "inter": defaultdict(float)}
        """Bus bytes by link ("intra" / "inter"), then by "op:dtype"."""
        self.node_of_rank = tuple(node_of_rank) if node_of_rank is not None else None
        self.durations: list[float] = []
        """Timed mode: seconds of each counted call (groups of two or more ranks), in call order."""
        self.duration_groups: list[tuple[int, ...]] = []
        """Timed mode: the global ranks of each timed call's group (parallel to `durations`)."""
        self.timed_sends: list[tuple[int, tuple[int, ...], torch.dtype, str]] = []
        """Timed mode: each counted point-to-point send as (global peer, shape, dtype, `send_label()`), in call order."""
        self.send_label: Callable[[], str] = lambda: ""
        """What a timed send is labelled with (a pipeline: the phase of the compute that produced it)."""
        self.send_dtype: Callable[[], str | None] = lambda: None
        """The type name a send is counted under, None: its tensor's (a pipeline whose boundaries carry codec bytes
        in a float32 view, which autograd needs, counts them as the "uint8" they are)."""
        self._originals: dict[str, Any] = {}
        self._funcol_originals: dict[str, Any] = {}
        self._p2p_original: Any = None
        self._local = threading.local()
        self._enabled = True
        self._timing: tuple[Callable[[], None], Callable[[], float]] | None = None  # (sync, clock) when timed
        self._lock = threading.Lock()

    # -- install / uninstall -------------------------------------------------------------------
    def __enter__(self) -> CommCounter:
        if CommCounter._installed is not None:
            raise RuntimeError("a CommCounter is already installed")
        import torch.distributed as dist

        for name, (op, size_fn) in _PATCHES.items():
            orig = getattr(dist, name, None)
            if orig is None:
                continue
            self._originals[name] = orig
            setattr(dist, name, self._wrap(orig, op, size_fn))
        from torch.distributed import _functional_collectives as funcol

        for name, (op, size_fn) in _FUNCOL_PATCHES.items():
            orig = getattr(funcol, name, None)
            if orig is None:
                continue
            self._funcol_originals[name] = orig
            setattr(funcol, name, self._wrap(orig, op, size_fn))
        # Point-to-point: `isend` in c10d's own namespace too, where `send`, `batch_isend_irecv` and
        # `send_object_list` find it, and where `P2POp` checks its op is `isend` (the same object as `dist.isend`).
        from torch.distributed import distributed_c10d as c10d

        self._p2p_original = c10d.isend
        counted_isend = self._wrap_send(c10d.isend)
        c10d.isend = counted_isend
        dist.isend = counted_isend
        CommCounter._installed = self
        return self

    def __exit__(self, *exc: object) -> None:
        import torch.distributed as dist

        for name, orig in self._originals.items():
            setattr(dist, name, orig)
        self._originals.clear()
        from torch.distributed import _functional_collectives as funcol

        for name, orig in self._funcol_originals.items():
            setattr(funcol, name, orig)
        self._funcol_originals.clear()
        if self._p2p_original is not None:
            from torch.distributed import distributed_c10d as c10d

            c10d.isend = dist.isend = self._p2p_original
            self._p2p_original = None
        CommCounter._installed = None

    def _wrap(self, orig: Callable[..., Any], op: str, size_fn: _SizeFn) -> Callable[..., Any]:
        local = self._local

        def counted(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(local, "depth", 0)
            group = self._record(op, size_fn, args, kwargs) if depth == 0 and self._enabled else _NOTHING
            timing = self._timing if group is not _NOTHING else None
            local.depth = depth + 1
            try:
                if timing is None:
                    return orig(*args, **kwargs)
                sync, clock = timing
                sync()  # compute queued before the call (forward, backward) is not communication
                t0 = clock()
                work = orig(*args, **kwargs)
                if hasattr(work, "trigger_wait"):  # a functional collective's AsyncCollectiveTensor
                    work.trigger_wait()
                elif work is not None and hasattr(work, "wait"):
                    work.wait()  # the caller's own wait() on a completed Work returns at once
                sync()
                dt = clock() - t0
                self.add_timed(dt, _ranks_of(group))
                return work
            finally:
                local.depth = depth

        counted.__wrapped__ = orig  # type: ignore[attr-defined]
        counted.__name__ = getattr(orig, "__name__", op)
        return counted

    def _wrap_send(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        """`isend` counted as op "send" by the sender (the receiver counts nothing): its tensor's bytes, bus factor 1,
        by dtype and by the link between the two ranks. Not timed in place: a pipeline posts sends and receives
        together and waits on them later, so making a send synchronous could wait on a receive its peer has not
        posted yet (gloo sends once the receiver has posted); in timed mode it is recorded in `timed_sends`."""
        local = self._local

        def counted(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> Any:
            depth = getattr(local, "depth", 0)
            if depth == 0 and self._enabled:
                self._record_send(tensor, dst, group, group_dst)
            local.depth = depth + 1
            try:
                return orig(tensor, dst, group, tag, group_dst=group_dst)
            finally:
                local.depth = depth

        counted.__wrapped__ = orig  # type: ignore[attr-defined]
        counted.__name__ = getattr(orig, "__name__", "isend")
        return counted

    def _record_send(self, tensor: Any, dst: int | None, group: Any, group_dst: int | None) -> None:
        import torch.distributed as dist

        peer = dst
        if peer is None and group_dst is not None:
            peer = group_dst if group is None else dist.get_global_rank(group, group_dst)
        size = _nbytes(_payload(tensor))
        link = self._link_of((dist.get_rank(), peer)) if peer is not None else "intra"
        with self._lock:
            self._add(f"send:{self.send_dtype() or dtype_name(tensor.dtype)}", size, size, link)
            if self._timing is not None and peer is not None:
                self.timed_sends.append((int(peer), tuple(int(d) for d in tensor.shape), tensor.dtype, self.send_label()))

    def _record(
        self, op: str, size_fn: _SizeFn, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Count one call; its group (None: the default group), or `_NOTHING` when it moves nothing."""
        sizes, group = size_fn(args, kwargs)
        n = _group_size(group)
        if n <= 1:  # a group of one rank (HSDP's replicate group on one node) moves nothing
            return _NOTHING
        factor = bus_factor(op, n)
        link = self.link(group)
        for size, dtype in sizes:
            self._add(f"{op}:{dtype_name(dtype)}", size, size * factor, link)
        return group

    def add_timed(self, seconds: float, ranks: tuple[int, ...]) -> None:
        """One timed call of `seconds` over the group of global `ranks` (a point-to-point transfer timed after the
        step: its sender alone, `training.p2p_timing`)."""
        with self._lock:  # a codec hook may launch from a backend thread
            self.durations.append(seconds)
            self.duration_groups.append(ranks)

    def timed_calls(self) -> list[tuple[float, tuple[int, ...]]]:
        """(seconds, group ranks) of each timed call so far, in call order (what `comm_time_per_step` takes)."""
        return list(zip(self.durations, self.duration_groups, strict=True))

    @property
    def timing(self) -> tuple[Callable[[], None], Callable[[], float]] | None:
        """(sync, clock) while in timed mode, else None."""
        return self._timing

    @classmethod
    def active(cls) -> CommCounter | None:
        """The counter installed now, if any."""
        return cls._installed

    def _add(self, key: str, size: int, bus: float, link: str) -> None:
        """One call of "op:dtype" `key`: its nccl-tests size and bus bytes, on link `link`."""
        self.calls[key] += 1
        self.size_bytes[key] += size
        self.bus_bytes[key] += bus
        self.link_bytes[link][key] += bus

    def link(self, group: Any) -> str:
        """ "inter" when `group`'s ranks sit on more than one node, else "intra"."""
        if self.node_of_rank is None:
            return "intra"
        import torch.distributed as dist

        return self._link_of(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))

    def _link_of(self, ranks: Any) -> str:
        """ "inter" when `ranks` (global) sit on more than one node, else "intra"."""
        if self.node_of_rank is None:
            return "intra"
        return "inter" if len({self.node_of_rank[r] for r in ranks}) > 1 else "intra"

    # -- control -------------------------------------------------------------------------------
    def timed(self, sync: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.perf_counter) -> _Timed:
        """Context manager: counted calls inside are made synchronous and their durations appended to
        `durations` (`sync` waits for the device before the clock starts and after the call; `clock` in seconds).
        Bytes are counted as before."""
        return _Timed(self, sync, clock)

    def reset(self) -> None:
        """Forget everything counted so far (durations included)."""
        self.durations.clear()
        self.duration_groups.clear()
        self.timed_sends.clear()
        self.calls.clear()
        self.size_bytes.clear()
        self.bus_bytes.clear()
        for d in self.link_bytes.values():
            d.clear()

    def paused(self) -> _Paused:
        """Context manager: collectives issued inside are not counted."""
        return _Paused(self)

    def snapshot(self) -> dict[str, float]:
        """Per "op:dtype" bus bytes counted so far (a copy)."""
        return dict(self.bus_bytes)

    def snapshot_links(self) -> dict[str, dict[str, float]]:
        """Bus bytes counted so far by link, then by "op:dtype" (a copy)."""
        return {link: dict(d) for link, d in self.link_bytes.items()}

    def total(self) -> float:
        """All bus bytes counted so far."""
        return float(sum(self.bus_bytes.values()))

    def wire_bytes(self, backend: str, n: int) -> float:
        """Bytes a rank really sends on `backend`: gloo's reduce_scatter is an all_reduce of the input."""
        total = 0.0
        for key, size in self.size_bytes.items():
            op = key.split(":", 1)[0]
            real = BACKEND_OPS.get((backend, op), (op, ""))[0]
            total += size * bus_factor(real, n)
        return total


def comm_time_per_step(per_rank: Sequence[Sequence[Sequence[Any]]]) -> list[float]:
    """Communication time of each step from timed-mode calls, `per_rank[rank][step][call]` (any unit).

    A call is `(seconds, group ranks)` (`CommCounter.timed_calls`) or bare seconds (a call over every rank). A call
    is the k-th call of its group on each of the group's ranks; its time is the minimum over them (the others'
    extra is waiting for the last one to arrive). A rank's step time is the sum of its calls' times; the step's is
    the mean over the ranks. Every rank of a group must have timed the same calls: ValueError names the first step
    where the counts differ.
    """
    if not per_rank:
        return []
    n, steps = len(per_rank), len(per_rank[0])
    if any(len(r) != steps for r in per_rank):
        raise ValueError(f"ranks timed different numbers of steps: {[len(r) for r in per_rank]}")
    world = tuple(range(n))
    out: list[float] = []
    for s in range(steps):
        keyed: list[list[tuple[tuple[tuple[int, ...], int], float]]] = []
        for calls in (r[s] for r in per_rank):
            seen: dict[tuple[int, ...], int] = defaultdict(int)
            mine = []
            for c in calls:
                secs, group = (float(c[0]), tuple(c[1])) if isinstance(c, (tuple, list)) else (float(c), world)
                mine.append(((group, seen[group]), secs))
                seen[group] += 1
            keyed.append(mine)
        have = [{key for key, _ in mine} for mine in keyed]
        best: dict[tuple[tuple[int, ...], int], float] = {}
        for mine in keyed:
            for key, secs in mine:
                if any(q < n and key not in have[q] for q in key[0]):
                    counts = [sum(1 for (g, _), _ in m if g == key[0]) for m in keyed]
                    raise ValueError(f"step {s}: ranks timed different numbers of collectives: {counts}")
                best[key] = min(best.get(key, secs), secs)
        out.append(sum(sum(best[key] for key, _ in mine) for mine in keyed) / n)
    return out


class _Timed:
    def __init__(self, counter: CommCounter, sync: Callable[[], None], clock: Callable[[], float]) -> None:
        self.counter, self.timing = counter, (sync, clock)

    def __enter__(self) -> None:
        self.counter._timing = self.timing

    def __exit__(self, *exc: object) -> None:
        self.counter._timing = None


class _Paused:
    def __init__(self, counter: CommCounter) -> None:
        self.counter = counter
        self.prev = True

    def __enter__(self) -> None:
        self.prev = self.counter._enabled
        self.counter._enabled = False

    def __exit__(self, *exc: object) -> None:
        self.counter._enabled = self.prev
