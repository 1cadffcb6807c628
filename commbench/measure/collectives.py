"""Collective registry: what a collective moves, nccl-tests' size/count/bus-factor definitions, how to run it
natively on a process group, and its float64 reference.

Definitions follow nccl-tests doc/PERFORMANCE.md: ``size`` is the all_reduce buffer, the all_gather *total
output*, the reduce_scatter *total input* and the all_to_all per-rank buffer; ``algbw = size / time`` and
``busbw = algbw * bus_factor(n)``. The printed ``count`` column is nccl-tests' per-call parameter count:
the whole buffer for all_reduce, the per-rank share for all_gather, reduce_scatter and all_to_all.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from commbench.cluster.dist_ops import ALL_GATHER_OPS, dist_op
from commbench.core.registry import Registry

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

# torch is imported by the methods that run tensors, never at module level: `commbench list` and the
# importer's bus factors read this registry without paying for torch.




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
    redop: ClassVar[str]
    """nccl-tests' ``redop`` column: ``sum`` for reductions, ``none`` otherwise."""
    reduces: ClassVar[bool]
    """True when the output is a sum over ranks (the reduction happens in the wire dtype)."""
    nccl_tests_name: ClassVar[str]
    """The nccl-tests binary that measures it (``all_reduce_perf``)."""
    size_convention: ClassVar[str]
    """What nccl-tests' ``size`` counts, in words."""
    order: ClassVar[int]
    """Display order (tables, ``list``)."""
    bus_passes: ClassVar[int] = 1
    """nccl-tests' bus factor is ``bus_passes * (n-1)/n``: a rank sends (n-1)/n of ``size`` per pass over
    the ring; all_reduce makes two (reduce-scatter, then all-gather)."""
    nccl_tree: ClassVar[bool] = False
    """NCCL also runs it as a double binary tree (reduce up, broadcast down: all_reduce); the cost model's tree
    algorithm applies to it."""
    input_per_rank: ClassVar[bool] = False
    """The input holds one rank's share (``total / n`` elements) rather than ``total`` (all_gather)."""
    output_per_rank: ClassVar[bool] = False
    """The output holds one rank's share rather than ``total`` (reduce_scatter)."""
    count_per_rank: ClassVar[bool] = True
    """nccl-tests' ``count`` column is the per-rank share (``total / n``); all_reduce's is the whole buffer."""
    chunked_variant: ClassVar[str | None] = None
    """Name of the chunked codec algorithm that runs this collective, in :data:`CHUNKED_ALGORITHMS` (built as
    ``algorithm(codec, input elements, group, device)``); None: codecs cannot run it. A name rather than the class
    because the algorithms (:mod:`commbench.measure.chunked`) build on torch and on this registry, and register
    themselves there."""
    chunked_encodings: ClassVar[int] = 1
    """How many times the chunked low-precision algorithm encodes a value on its way (the error bound's
    ``quantisations``): all_reduce re-encodes the partial sums, so 2."""

    @property
    def bus_factor_formula(self) -> str:
        """:meth:`bus_factor` in words (for ``commbench list``)."""
        return f"{self.bus_passes if self.bus_passes != 1 else ''}(n-1)/n"

    @property
    def description(self) -> str:
        """One line for ``commbench list``: size definition; busbw factor."""
        return f"{self.size_convention}; {self.bus_factor_formula}"

    def bus_factor(self, n: int) -> float:
        """nccl-tests' factor from algbw to busbw for ``n`` ranks."""
        return self.bus_passes * (n - 1) / n

    def round_total(self, total: int, n: int, elt_bytes: int = 4) -> int:
        """Largest element count <= ``total`` the collective runs for ``n`` ranks, as nccl-tests rounds it.

        nccl-tests (src/all_gather.cu, reduce_scatter.cu, alltoall.cu ``*GetCollByteCount``) rounds the
        per-rank count down to a 16-byte multiple: ``base = (count/nranks) & -(16/eltSize)``, total
        ``base * nranks``. ``elt_bytes`` is 4: commbench's sizes count the user's fp32 elements, so its rows line
        up with an fp32 nccl-tests log of the same size."""
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
            count=count(self.count_per_rank),
        )

    dist_ops: ClassVar[tuple[str, ...]] = ()
    """torch.distributed's out-of-place ``fn(out, inp, group=, async_op=)`` for this collective, newest name
    first; a collective with another call shape overrides :meth:`run` instead."""

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        """Run natively on tensors of the wire dtype (``out`` may be ``inp`` for in-place collectives); with
        ``async_op`` returns the torch ``Work`` handle, else None."""
        return dist_op(*self.dist_ops)(out, inp, group=group, async_op=async_op)

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

    def chunked_op(self, codec: Any, layout: Layout, group: dist.ProcessGroup | None, device: torch.device) -> Any:
        """The chunked codec algorithm for this collective (encode per chunk, exchange, decode): the
        :class:`~commbench.measure.precision.PointOp` running ``codec`` (a :class:`~commbench.measure.codec.Codec`).
        Both are typed loosely here because both modules build on this one."""
        if self.chunked_variant is None:
            raise ValueError(f"the chunked codec algorithm does not implement {self.name!r}")
        algorithm = CHUNKED_ALGORITHMS[self.chunked_variant]
        return algorithm(codec, layout.input_numel, group, device)


class AllReduce(Collective):
    name = "all_reduce"
    redop = "sum"
    reduces = True
    nccl_tests_name = "all_reduce_perf"
    size_convention = "buffer"
    order = 0
    bus_passes = 2
    nccl_tree = True
    count_per_rank = False
    chunked_variant = "ChunkedAllReduce"
    chunked_encodings = 2

    def round_total(self, total: int, n: int, elt_bytes: int = 4) -> int:
        return total

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        import torch.distributed as dist

        # torch's all_reduce is in place; the op object passes the same tensor as inp and out.
        return dist.all_reduce(out, group=group, async_op=async_op)

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        import torch

        return torch.stack(inputs).sum(dim=0)

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
        import torch

        m = inputs[0].numel() // len(inputs)
        return torch.stack([x[rank * m : (rank + 1) * m] for x in inputs]).sum(dim=0)

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
