"""Collective registry: what a collective moves, nccl-tests' size/count/bus-factor definitions, how to run it
natively on a process group, where each peer's input lands in a rank's output, and its float64 reference.

Definitions follow nccl-tests doc/PERFORMANCE.md: ``size`` is the all_reduce buffer, the all_gather *total
output*, the reduce_scatter *total input* and the all_to_all per-rank buffer; ``algbw = size / time`` and
``busbw = algbw * bus_factor(n)``. The printed ``count`` column is nccl-tests' per-call parameter count:
the whole buffer for all_reduce, the per-rank share for all_gather, reduce_scatter and all_to_all. The bus factor
and the count convention of every collective nccl-tests has are read from :mod:`commbench.core.nccl_tests` (the
importer's table), never restated here. The rooted collectives (broadcast, reduce, gather, scatter) live in
:mod:`commbench.measure.collectives_rooted`, the point-to-point ones (sendrecv) in :mod:`commbench.measure.p2p`.

A registered collective is a template: the sweep asks it for the suite's root and reduction op
(:meth:`Collective.configured`, nccl-tests' ``-r`` and ``-o``).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from commbench.cluster.dist_ops import ALL_GATHER_OPS, dist_op, reduce_op
from commbench.core.nccl_tests import NCCL_COLLECTIVES, REDUCE_OPS, NcclTestsCollective
from commbench.core.registry import Registry

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

# torch is imported by the methods that run tensors, never at module level: `commbench list` and the
# importer's bus factors read this registry without paying for torch.

GLOO_OPS = ("sum", "prod", "min", "max")
"""The ops gloo reduces with (torch's ProcessGroupGloo has no AVG)."""


class Unsupported(RuntimeError):
    """Raised by :meth:`Precision.make_op <commbench.measure.precision.Precision.make_op>` when the precision cannot
    run here after all (a probe of what the backend really does refused it, or a collective configuration its
    algorithm cannot run). The decision must be the same on every rank of the group (agreed across them), so
    every rank skips the point together: the sweep skips it with this message as its note."""


@dataclass(frozen=True, slots=True)
class Piece:
    """Where one peer's input enters a rank's expected output: ``[in_offset, +length)`` of ``peer``'s input goes to
    ``[out_offset, +length)`` of the output (reductions: combined with the other peers' pieces there)."""

    peer: int
    in_offset: int
    length: int
    out_offset: int


@dataclass(frozen=True, slots=True)
class Layout:
    """Element counts of one collective call on one rank."""

    total: int
    """Elements in nccl-tests' size definition (``size = total * element size``)."""
    input_numel: int
    output_numel: int
    count: int
    """nccl-tests' ``count`` column."""


class Collective(ABC):
    """One collective: size semantics, bus factor, native execution and float64 reference.

    What differs between the nccl-tests collectives only in a number or a name is class data that the base
    class turns into :meth:`bus_factor`, :meth:`layout` and :meth:`chunked_op`; a collective whose shape none
    of that data describes overrides those methods instead."""

    name: ClassVar[str]
    redop: str
    """nccl-tests' ``redop`` column: the reduction op (``sum`` by default, :meth:`configured` sets another) for
    reductions, ``none`` otherwise."""
    reduces: ClassVar[bool]
    """True when the output is a reduction over ranks (the reduction happens in the wire dtype)."""
    rooted: ClassVar[bool] = False
    """The collective has a root rank (nccl-tests' ``-r``: broadcast, reduce, gather, scatter)."""
    root: int = 0
    """The root rank inside the group (:meth:`configured` sets it; meaningful where :attr:`rooted`)."""
    nccl_tests_name: ClassVar[str]
    """The nccl-tests binary that measures it (``all_reduce_perf``)."""
    size_convention: ClassVar[str]
    """What nccl-tests' ``size`` counts, in words."""
    order: ClassVar[int]
    """Display order (tables, ``list``)."""
    bus_passes: ClassVar[int] = 1
    """Passes over the ring, each of n-1 steps in which a rank sends (n-1)/n of ``size``; all_reduce makes two
    (reduce-scatter, then all-gather). The ring's latency steps (:meth:`latency_steps`), and the bus factor
    ``bus_passes * (n-1)/n`` of a collective nccl-tests lacks (the others take nccl-tests' own)."""
    nccl_tree: ClassVar[bool] = False
    """NCCL also runs it as a double binary tree (reduce up, broadcast down: all_reduce); the cost model's tree
    algorithm applies to it."""
    input_per_rank: ClassVar[bool] = False
    """The input holds one rank's share (``total / n`` elements) rather than ``total`` (all_gather)."""
    output_per_rank: ClassVar[bool] = False
    """The output holds one rank's share rather than ``total`` (reduce_scatter)."""
    count_per_rank: ClassVar[bool] = True
    """nccl-tests' ``count`` column is the per-rank share (``total / n``), for a collective nccl-tests lacks (a
    plugin's); for the others its table decides (:meth:`per_rank_count`: all_reduce's count is the buffer)."""
    chunked_variant: ClassVar[str | None] = None
    """Name of the chunked codec algorithm that runs this collective, in :data:`CHUNKED_ALGORITHMS` (built as
    ``algorithm(codec, input elements, group, device, **chunked_kwargs(layout))``); None: codecs cannot run it. A name rather than the class
    because the algorithms (:mod:`commbench.measure.chunked`) build on torch and on this registry, and register
    themselves there."""
    chunked_encodings: ClassVar[int] = 1
    """How many times the chunked low-precision algorithm encodes a value on its way (the error bound's
    ``quantisations``): all_reduce re-encodes the partial sums, so 2."""

    nccl_tests_key: ClassVar[str | None] = None
    """The entry of :data:`commbench.core.nccl_tests.NCCL_COLLECTIVES` that defines this collective's bus factor and
    count (None: its own :attr:`name`; the pipeline pair is nccl-tests' ``sendrecv``)."""

    @property
    def nccl_tests(self) -> NcclTestsCollective | None:
        """nccl-tests' definition of this collective (bus factor, count convention); None for one it lacks."""
        return NCCL_COLLECTIVES.get(self.nccl_tests_key or self.name)

    @property
    def bus_factor_formula(self) -> str:
        """:meth:`bus_factor` in words (for ``commbench list``)."""
        if self.nccl_tests is not None:
            return self.nccl_tests.formula
        return f"{self.bus_passes if self.bus_passes != 1 else ''}(n-1)/n"

    @property
    def description(self) -> str:
        """One line for ``commbench list``: size definition; busbw factor."""
        return f"{self.size_convention}; {self.bus_factor_formula}"

    def bus_factor(self, n: int) -> float:
        """nccl-tests' factor from algbw to busbw for ``n`` ranks (its table where it has the collective)."""
        if self.nccl_tests is not None:
            return self.nccl_tests.bus_factor(n)
        return self.bus_passes * (n - 1) / n

    def latency_steps(self, n: int) -> float:
        """Sequential steps of the ring algorithm on ``n`` ranks (the cost model's latency term): ``bus_passes``
        passes of n-1 steps; a point-to-point exchange takes one."""
        return float(self.bus_passes * (n - 1))

    def per_rank_count(self) -> bool:
        """nccl-tests' ``count`` column is the per-rank share (its table; :attr:`count_per_rank` for others)."""
        return self.nccl_tests.per_rank_count if self.nccl_tests is not None else self.count_per_rank

    def round_total(self, total: int, n: int, elt_bytes: int = 4) -> int:
        """Largest element count <= ``total`` the collective runs for ``n`` ranks, as nccl-tests rounds it.

        nccl-tests (src/all_gather.cu, reduce_scatter.cu, alltoall.cu, gather.cu, scatter.cu
        ``*GetCollByteCount``) rounds the per-rank count down to a 16-byte multiple: ``base = (count/nranks) &
        -(16/eltSize)``, total ``base * nranks``; the collectives whose count is the whole buffer (all_reduce,
        broadcast, reduce, sendrecv) take ``count`` as it is. ``elt_bytes`` is 4: commbench's sizes count the user's
        fp32 elements, so its rows line up with an fp32 nccl-tests log of the same size."""
        if not self.per_rank_count():
            return total
        align = max(16 // elt_bytes, 1)
        return n * ((total // n) // align * align)

    def layout(self, total: int, n: int) -> Layout:
        """Per-rank input/output element counts for a size of ``total`` elements (already rounded)."""
        share = total // n

        def count(per_rank: bool) -> int:
            return share if per_rank else total

        return Layout(
            total=total,
            input_numel=count(self.input_per_rank),
            output_numel=count(self.output_per_rank),
            count=count(self.per_rank_count()),
        )

    def configured(self, root: int = 0, op: str = "sum") -> Collective:
        """This collective with nccl-tests' ``-r`` root (rooted collectives) and ``-o`` reduction op (reductions);
        the registered instance itself when both are the defaults or mean nothing to it. ``ValueError`` (one line)
        for an op outside :data:`REDUCE_OPS` or a negative root."""
        if op not in REDUCE_OPS:
            raise ValueError(f"unknown reduction op {op!r}; valid choices: {', '.join(REDUCE_OPS)}")
        if root < 0:
            raise ValueError(f"root must be a rank >= 0, got {root}")
        root = root if self.rooted else 0
        op = op if self.reduces else self.redop
        if root == self.root and op == self.redop:
            return self
        out = copy.copy(self)
        out.root, out.redop = root, op
        return out

    def unsupported(self, backend: str, n: int) -> str | None:
        """Why this configuration cannot run on ``backend`` with ``n`` ranks (one line), None when it can."""
        if self.rooted and self.root >= n:
            return f"root {self.root} (-r) is not a rank of a group of {n} (valid roots: 0..{n - 1})"
        if self.reduces and backend == "gloo" and self.redop not in GLOO_OPS:
            return f"gloo has no {self.redop!r} reduction (-o; valid on gloo: {', '.join(GLOO_OPS)}; avg needs NCCL)"
        return None

    def scale_invariant(self) -> bool:
        """Whether the reduction commutes with one positive scale shared by every rank (sum, avg, min, max: so codes
        scaled alike reduce to the scaled result; prod does not: its result carries the scale n times)."""
        return self.redop != "prod"

    def reduce_op(self) -> Any:
        """torch's ``ReduceOp`` of :attr:`redop`."""
        return reduce_op(self.redop)

    def sources(self, rank: int, n: int, layout: Layout) -> list[Piece] | None:
        """Where each peer's input enters ``rank``'s expected output (the checks build their float64 expectation
        from these, block by block; :func:`commbench.measure.check.references` confirms them against
        :meth:`reference` once per collective and world). No piece: nothing of this rank's output is defined
        (reduce or gather off the root), so nothing of it is compared.

        By default guessed from the shapes: reductions combine each peer's ``[reduced_offset, +output_numel)``
        (all_reduce: all, reduce_scatter: this rank's slice); the others concatenate one piece per peer
        (all_gather: the peer's whole input, all_to_all: its chunk for this rank); None when the shapes say nothing
        (the checks then stack the world's inputs and ask :meth:`reference`)."""
        m_in, m_out = layout.input_numel, layout.output_numel
        if self.reduces:
            off = self.reduced_offset(rank, layout)
            return [Piece(r, off, m_out, 0) for r in range(n)] if off + m_out <= m_in else None
        k = m_out // n
        if k * n != m_out or m_in not in (k, m_out):
            return None
        start = 0 if m_in == k else rank * k
        return [Piece(r, start, k, r * k) for r in range(n)]

    def expected_numel(self, rank: int, n: int, layout: Layout) -> int:
        """Elements at the start of ``rank``'s output that :meth:`sources` defines (the part the checks compare; the
        whole output when the sources are unknown)."""
        pieces = self.sources(rank, n, layout)
        if pieces is None:
            return layout.output_numel
        return max((p.out_offset + p.length for p in pieces), default=0)

    def combine(self, acc: torch.Tensor, x: torch.Tensor) -> None:
        """``acc <- acc op x`` in place (float64), for :attr:`redop`; ``avg`` sums (:meth:`finish` divides)."""
        import torch

        if self.redop in ("sum", "avg"):
            acc.add_(x)
        elif self.redop == "prod":
            acc.mul_(x)
        elif self.redop == "min":
            torch.minimum(acc, x, out=acc)
        else:
            torch.maximum(acc, x, out=acc)

    def finish(self, acc: torch.Tensor, n: int) -> None:
        """The last step of a reduction over ``n`` ranks: ``avg`` divides the sum by ``n``."""
        if self.redop == "avg":
            acc.div_(n)

    def reduce_stack(self, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        """``xs`` reduced elementwise by :attr:`redop`, in float64 (the references' reduction)."""
        import torch

        stacked = torch.stack(list(xs)).to(torch.float64)
        reducers: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
            "sum": lambda t: t.sum(dim=0),
            "prod": lambda t: t.prod(dim=0),
            "min": lambda t: t.amin(dim=0),
            "max": lambda t: t.amax(dim=0),
            "avg": lambda t: t.mean(dim=0),
        }
        return reducers[self.redop](stacked)

    def op_tolerance(self, abs_sum: torch.Tensor, precision: Any) -> torch.Tensor | float:
        """What the reduction op itself rounds on exactly representable inputs, on top of ``precision``'s
        tolerance: ``avg`` divides by n (inexact unless n is a power of two), at most ``eps * sum |x|`` in the
        precision's wire dtype whichever way the backend divides (after the sum, or each term as NCCL's
        pre-multiplied sum); sum, min and max of those inputs are exact, and so is prod unless it overflows the wire
        dtype (then counted wrong). ``precision`` is a :class:`~commbench.measure.precision.Precision` (typed
        loosely: that module builds on this one)."""
        if self.redop != "avg":
            return 0.0
        import torch

        wire = precision.wire_dtype
        return abs_sum * (torch.finfo(wire).eps if wire.is_floating_point else 0.0)

    dist_ops: ClassVar[tuple[str, ...]] = ()
    """torch.distributed's out-of-place ``fn(out, inp, group=, async_op=)`` for this collective, newest name
    first; a collective with another call shape overrides :meth:`run` instead."""

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        """Run natively on tensors of the wire dtype (``out`` may be ``inp`` for in-place collectives); with
        ``async_op`` returns the torch ``Work`` handle, else None."""
        kwargs = {"op": self.reduce_op()} if self.reduces else {}
        return dist_op(*self.dist_ops)(out, inp, group=group, async_op=async_op, **kwargs)

    @abstractmethod
    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        """Expected output of ``rank`` given every rank's input (float64, computed locally, no communication)."""

    def out_of_place(self) -> bool:
        return True

    def reduced_offset(self, rank: int, layout: Layout) -> int:
        """Index, in the summed vector, of this rank's first output element (reduce_scatter: its slice)."""
        return 0

    def supports_chunked(self) -> bool:
        """Whether the chunked codec algorithm (:mod:`commbench.measure.chunked`) implements this collective."""
        return self.chunked_variant is not None

    def chunked_kwargs(self, layout: Layout) -> dict[str, Any]:
        """Keyword arguments of this collective's chunked algorithm beyond ``(codec, input elements, group,
        device)`` (the rooted and point-to-point collectives pass themselves and their layout)."""
        return {}

    def chunked_op(self, codec: Any, layout: Layout, group: dist.ProcessGroup | None, device: torch.device) -> Any:
        """The chunked codec algorithm for this collective (encode per chunk, exchange, decode): the
        :class:`~commbench.measure.precision.PointOp` running ``codec`` (a :class:`~commbench.measure.codec.Codec`).
        Both are typed loosely here because both modules build on this one. The algorithms reduce by an fp32 sum:
        another op is :class:`~commbench.measure.precision.Unsupported` (the same on every rank: skipped, said once)."""
        if self.chunked_variant is None:
            raise ValueError(f"the chunked codec algorithm does not implement {self.name!r}")
        if self.reduces and self.redop != "sum":
            raise Unsupported(f"the chunked codec algorithm reduces by an fp32 sum; --op {self.redop} needs a "
                              "native or cast precision")  # fmt: skip
        algorithm = CHUNKED_ALGORITHMS[self.chunked_variant]
        return algorithm(codec, layout.input_numel, group, device, **self.chunked_kwargs(layout))


class AllReduce(Collective):
    name = "all_reduce"
    redop = "sum"
    reduces = True
    nccl_tests_name = "all_reduce_perf"
    size_convention = "buffer"
    order = 0
    bus_passes = 2
    nccl_tree = True
    chunked_variant = "ChunkedAllReduce"
    chunked_encodings = 2

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        import torch.distributed as dist

        # torch's all_reduce is in place; the op object passes the same tensor as inp and out.
        return dist.all_reduce(out, op=self.reduce_op(), group=group, async_op=async_op)

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        return self.reduce_stack(inputs)

    def out_of_place(self) -> bool:
        return False


class AllGather(Collective):
    name = "all_gather"
    redop = "none"
    reduces = False
    nccl_tests_name = "all_gather_perf"
    size_convention = "total output"
    order = 1
    input_per_rank = True
    chunked_variant = "ChunkedAllGather"
    dist_ops = ALL_GATHER_OPS

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        import torch

        return torch.cat(inputs)


class ReduceScatter(Collective):
    name = "reduce_scatter"
    redop = "sum"
    reduces = True
    nccl_tests_name = "reduce_scatter_perf"
    size_convention = "total input"
    order = 2
    output_per_rank = True
    chunked_variant = "ChunkedReduceScatter"
    dist_ops = ("reduce_scatter_single", "reduce_scatter_tensor")

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        m = inputs[0].numel() // len(inputs)
        return self.reduce_stack([x[rank * m : (rank + 1) * m] for x in inputs])

    def reduced_offset(self, rank: int, layout: Layout) -> int:
        return rank * layout.output_numel


class AllToAll(Collective):
    name = "all_to_all"
    redop = "none"
    reduces = False
    nccl_tests_name = "alltoall_perf"
    size_convention = "per-rank buffer"
    order = 3
    chunked_variant = "ChunkedAllToAll"
    dist_ops = ("all_to_all_single",)

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        import torch

        m = inputs[0].numel() // len(inputs)
        return torch.cat([x[rank * m : (rank + 1) * m] for x in inputs])


class CollectiveRegistry(Registry[Collective]):
    """The collectives, kept in display order (:attr:`Collective.order`, then registration order)."""

    def register(self, name: str, obj: Collective, *, replace: bool = False) -> Collective:
        super().register(name, obj, replace=replace)
        self._items = dict(sorted(self._items.items(), key=lambda kv: kv[1].order))
        return obj


COLLECTIVES = CollectiveRegistry("collective")
"""Registered collectives by name, in display order."""

ChunkedAlgorithm = Callable[..., Any]
"""Builds the chunked codec algorithm of a collective: ``(codec, input elements, group, device) -> PointOp``."""

CHUNKED_ALGORITHMS: Registry[ChunkedAlgorithm] = Registry("chunked algorithm")
"""The chunked codec algorithms by name (:attr:`Collective.chunked_variant`); the built-in ones register from
:mod:`commbench.measure.chunked`, which the plugin loader imports at the first lookup."""


def register_collective(collective: Collective, *, replace: bool = False) -> Collective:
    """Add ``collective`` to the registry (kept in ``order``); returns it so a module can keep a handle. A taken
    name is an error unless ``replace``."""
    return COLLECTIVES.register(collective.name, collective, replace=replace)


for _c in (AllReduce(), AllGather(), ReduceScatter(), AllToAll()):
    register_collective(_c)


def get_collective(name: str) -> Collective:
    """The collective ``name``, or a ``ValueError`` naming the valid choices."""
    return COLLECTIVES.get(name)


def check_configuration(names: Sequence[str], root: int, op: str, backend: str, world_size: int) -> None:
    """``ValueError``, one line, when the suite's root (``-r``) or reduction op (``-o``) cannot run in this world
    for any of the collectives ``names``: a root outside the world, or an op the backend lacks (checked on every
    rank before the first point). A group smaller than the world that cannot hold the root skips its points
    instead (:meth:`Collective.unsupported`, asked per group by the sweep)."""
    for name in names:
        coll = get_collective(name).configured(root=root, op=op)
        why = Collective.unsupported(coll, backend, world_size)  # the root and op rules, not a collective's own
        if why is not None:
            raise ValueError(f"{name}: {why}")
