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
from typing import Any, ClassVar

import torch
import torch.distributed as dist

# torch >= 2.10 renamed the tensor-in/tensor-out collectives (*_single) and deprecates the old names; resolve
# once so every torch >= 2.4 works without a warning per call.
all_gather_tensor: Callable[..., Any] = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_tensor: Callable[..., Any] = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


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
    description: ClassVar[str]
    """One line for ``commbench list``: nccl-tests' size definition and busbw factor."""

    @abstractmethod
    def bus_factor(self, n: int) -> float:
        """nccl-tests' factor from algbw to busbw for ``n`` ranks."""

    def round_total(self, total: int, n: int) -> int:
        """Largest element count <= ``total`` the collective accepts for ``n`` ranks (nccl-tests rounds down)."""
        return total - total % n

    @abstractmethod
    def layout(self, total: int, n: int) -> Layout:
        """Per-rank input/output element counts for a size of ``total`` elements (already rounded)."""

    @abstractmethod
    def run(self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
        """Run natively on tensors of the wire dtype (``out`` may be ``inp`` for in-place collectives)."""

    @abstractmethod
    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        """Expected output of ``rank`` given every rank's input (float64, computed locally, no communication)."""

    def out_of_place(self) -> bool:
        return True


class AllReduce(Collective):
    name = "all_reduce"
    description = "buffer; 2(n-1)/n"
    redop = "sum"
    reduces = True

    def bus_factor(self, n: int) -> float:
        return 2.0 * (n - 1) / n

    def round_total(self, total: int, n: int) -> int:
        return total

    def layout(self, total: int, n: int) -> Layout:
        return Layout(total=total, input_numel=total, output_numel=total, count=total)

    def run(self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
        # torch's all_reduce is in place; the op object passes the same tensor as inp and out.
        dist.all_reduce(out, group=group)

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        return torch.stack(inputs).sum(dim=0)

    def out_of_place(self) -> bool:
        return False


class AllGather(Collective):
    name = "all_gather"
    description = "total output; (n-1)/n"
    redop = "none"
    reduces = False

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def layout(self, total: int, n: int) -> Layout:
        return Layout(total=total, input_numel=total // n, output_numel=total, count=total // n)

    def run(self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
        all_gather_tensor(out, inp, group=group)

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        return torch.cat(inputs)


class ReduceScatter(Collective):
    name = "reduce_scatter"
    description = "total input; (n-1)/n"
    redop = "sum"
    reduces = True

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def layout(self, total: int, n: int) -> Layout:
        return Layout(total=total, input_numel=total, output_numel=total // n, count=total // n)

    def run(self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
        reduce_scatter_tensor(out, inp, group=group)

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        m = inputs[0].numel() // len(inputs)
        return torch.stack([x[rank * m : (rank + 1) * m] for x in inputs]).sum(dim=0)


class AllToAll(Collective):
    name = "all_to_all"
    description = "per-rank buffer; (n-1)/n"
    redop = "none"
    reduces = False

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def layout(self, total: int, n: int) -> Layout:
        return Layout(total=total, input_numel=total, output_numel=total, count=total // n)

    def run(self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
        dist.all_to_all_single(out, inp, group=group)

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        m = inputs[0].numel() // len(inputs)
        return torch.cat([x[rank * m : (rank + 1) * m] for x in inputs])


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (AllReduce(), AllGather(), ReduceScatter(), AllToAll())}


def get_collective(name: str) -> Collective:
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r}; valid choices: {', '.join(COLLECTIVES)}") from None
