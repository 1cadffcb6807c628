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

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from commbench.codec import Codec
    from commbench.precision import PointOp

# torch >= 2.10 renamed the tensor-in/tensor-out collectives (*_single) and deprecates the old names; resolve
# once so every torch >= 2.4 works without a warning per call.
# Looked up per call, not once, so a CommCounter (training/comm.py) installed later still sees the calls.
def all_gather_tensor(*args: Any, **kwargs: Any) -> Any:
    fn: Callable[..., Any] = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(*args, **kwargs)


def reduce_scatter_tensor(*args: Any, **kwargs: Any) -> Any:
    fn: Callable[..., Any] = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(*args, **kwargs)


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
    """One collective: size semantics, bus factor, native execution and float64 reference."""

    name: ClassVar[str]
    redop: ClassVar[str]
    """nccl-tests' ``redop`` column: ``sum`` for reductions, ``none`` otherwise."""
    reduces: ClassVar[bool]
    """True when the output is a sum over ranks (the reduction happens in the wire dtype)."""
    nccl_tests_name: ClassVar[str]
    """The nccl-tests binary that measures it (``all_reduce_perf``)."""
    size_convention: ClassVar[str]
    """What nccl-tests' ``size`` counts, in words."""
    bus_factor_formula: ClassVar[str]
    """:meth:`bus_factor` in words (for ``commbench list``)."""
    order: ClassVar[int]
    """Display order (tables, ``list``)."""
    chunked_encodings: ClassVar[int] = 1
    """How many times the chunked low-precision algorithm encodes a value on its way (the error bound's
    ``quantisations``): all_reduce re-encodes the partial sums, so 2."""

    @property
    def description(self) -> str:
        """One line for ``commbench list``: size definition; busbw factor."""
        return f"{self.size_convention}; {self.bus_factor_formula}"

    @abstractmethod
    def bus_factor(self, n: int) -> float:
        """nccl-tests' factor from algbw to busbw for ``n`` ranks."""

    def round_total(self, total: int, n: int, elt_bytes: int = 4) -> int:
        """Largest element count <= ``total`` the collective runs for ``n`` ranks, as nccl-tests rounds it.

        nccl-tests (src/all_gather.cu, reduce_scatter.cu, alltoall.cu ``*GetCollByteCount``) rounds the
        per-rank count down to a 16-byte multiple: ``base = (count/nranks) & -(16/eltSize)``, total
        ``base * nranks``. ``elt_bytes`` is 4: commbench's sizes count the user's fp32 elements, so its rows line
        up with an fp32 nccl-tests log of the same size."""
        align = max(16 // elt_bytes, 1)
        return n * ((total // n) // align * align)

    @abstractmethod
    def layout(self, total: int, n: int) -> Layout:
        """Per-rank input/output element counts for a size of ``total`` elements (already rounded)."""

    @abstractmethod
    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        """Run natively on tensors of the wire dtype (``out`` may be ``inp`` for in-place collectives); with
        ``async_op`` returns the torch ``Work`` handle, else None."""

    @abstractmethod
    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        """Expected output of ``rank`` given every rank's input (float64, computed locally, no communication)."""

    def out_of_place(self) -> bool:
        return True

    def reduced_offset(self, rank: int, layout: Layout) -> int:
        """Index, in the summed vector, of this rank's first output element (reduce_scatter: its slice)."""
        return 0

    def supports_chunked(self) -> bool:
        """Whether the chunked codec algorithm (:mod:`commbench.chunked`) implements this collective."""
        return False

    def chunked_op(
        self, codec: Codec, layout: Layout, group: dist.ProcessGroup | None, device: torch.device
    ) -> PointOp:
        """The chunked codec algorithm for this collective (encode per chunk, exchange, decode)."""
        raise ValueError(f"the chunked codec algorithm does not implement {self.name!r}")


class AllReduce(Collective):
    name = "all_reduce"
    redop = "sum"
    reduces = True
    nccl_tests_name = "all_reduce_perf"
    size_convention = "buffer"
    bus_factor_formula = "2(n-1)/n"
    order = 0
    chunked_encodings = 2

    def bus_factor(self, n: int) -> float:
        return 2.0 * (n - 1) / n

    def round_total(self, total: int, n: int, elt_bytes: int = 4) -> int:
        return total

    def layout(self, total: int, n: int) -> Layout:
        return Layout(total=total, input_numel=total, output_numel=total, count=total)

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        # torch's all_reduce is in place; the op object passes the same tensor as inp and out.
        return dist.all_reduce(out, group=group, async_op=async_op)

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        return torch.stack(inputs).sum(dim=0)

    def out_of_place(self) -> bool:
        return False

    def supports_chunked(self) -> bool:
        return True

    def chunked_op(
        self, codec: Codec, layout: Layout, group: dist.ProcessGroup | None, device: torch.device
    ) -> PointOp:
        from commbench import chunked  # the algorithm builds on these collectives: imported at use

        return chunked.ChunkedAllReduce(codec, layout.input_numel, group, device)


class AllGather(Collective):
    name = "all_gather"
    redop = "none"
    reduces = False
    nccl_tests_name = "all_gather_perf"
    size_convention = "total output"
    bus_factor_formula = "(n-1)/n"
    order = 1

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def layout(self, total: int, n: int) -> Layout:
        return Layout(total=total, input_numel=total // n, output_numel=total, count=total // n)

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        return all_gather_tensor(out, inp, group=group, async_op=async_op)

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        return torch.cat(inputs)

    def supports_chunked(self) -> bool:
        return True

    def chunked_op(
        self, codec: Codec, layout: Layout, group: dist.ProcessGroup | None, device: torch.device
    ) -> PointOp:
        from commbench import chunked  # the algorithm builds on these collectives: imported at use

        return chunked.ChunkedAllGather(codec, layout.input_numel, group, device)


class ReduceScatter(Collective):
    name = "reduce_scatter"
    redop = "sum"
    reduces = True
    nccl_tests_name = "reduce_scatter_perf"
    size_convention = "total input"
    bus_factor_formula = "(n-1)/n"
    order = 2

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def layout(self, total: int, n: int) -> Layout:
        return Layout(total=total, input_numel=total, output_numel=total // n, count=total // n)

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        return reduce_scatter_tensor(out, inp, group=group, async_op=async_op)

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        m = inputs[0].numel() // len(inputs)
        return torch.stack([x[rank * m : (rank + 1) * m] for x in inputs]).sum(dim=0)

    def supports_chunked(self) -> bool:
        return True

    def chunked_op(
        self, codec: Codec, layout: Layout, group: dist.ProcessGroup | None, device: torch.device
    ) -> PointOp:
        from commbench import chunked  # the algorithm builds on these collectives: imported at use

        return chunked.ChunkedReduceScatter(codec, layout.input_numel, group, device)

    def reduced_offset(self, rank: int, layout: Layout) -> int:
        return rank * layout.output_numel


class AllToAll(Collective):
    name = "all_to_all"
    redop = "none"
    reduces = False
    nccl_tests_name = "alltoall_perf"
    size_convention = "per-rank buffer"
    bus_factor_formula = "(n-1)/n"
    order = 3

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def layout(self, total: int, n: int) -> Layout:
        return Layout(total=total, input_numel=total, output_numel=total, count=total // n)

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        return dist.all_to_all_single(out, inp, group=group, async_op=async_op)

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        m = inputs[0].numel() // len(inputs)
        return torch.cat([x[rank * m : (rank + 1) * m] for x in inputs])

    def supports_chunked(self) -> bool:
        return True

    def chunked_op(
        self, codec: Codec, layout: Layout, group: dist.ProcessGroup | None, device: torch.device
    ) -> PointOp:
        from commbench import chunked  # the algorithm builds on these collectives: imported at use

        return chunked.ChunkedAllToAll(codec, layout.input_numel, group, device)


COLLECTIVES: dict[str, Collective] = {}
"""Registered collectives by name, in display order."""


def register_collective(collective: Collective) -> Collective:
    """Add ``collective`` to the registry (kept in ``order``); returns it so a module can keep a handle."""
    COLLECTIVES[collective.name] = collective
    ordered = sorted(COLLECTIVES.values(), key=lambda c: c.order)
    COLLECTIVES.clear()
    COLLECTIVES.update((c.name, c) for c in ordered)
    return collective


for _c in (AllReduce(), AllGather(), ReduceScatter(), AllToAll()):
    register_collective(_c)


def get_collective(name: str) -> Collective:
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; valid choices: {', '.join(COLLECTIVES)}") from None
