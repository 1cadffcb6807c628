"""nccl-tests' collectives as data: how each binary's size and count columns relate and its bus factor.

The definitions are the tool's own (nccl-tests ``src/*.cu``: ``*GetCollByteCount`` and ``*GetBw``;
doc/PERFORMANCE.md): the importer of its logs (``commbench.store.nccl_common``) and commbench's own collectives
(``commbench.measure.collectives``, which read their bus factor and count convention here) share them, so a
measured row and an imported one are computed by one rule. Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

REDUCE_OPS = ("sum", "prod", "min", "max", "avg")
"""nccl-tests' ``-o`` reduction ops that commbench runs (src/common.cu ``test_opnames``; its ``mulsum`` is NCCL's
internal pre-multiplied sum and ``all`` a loop over the others: neither is offered)."""


def _ring(n: int) -> float:
    return 2 * (n - 1) / n


def _share(n: int) -> float:
    return (n - 1) / n


def _one(n: int) -> float:
    return 1.0


FACTOR_FORMULAS: dict[Callable[[int], float], str] = {_ring: "2(n-1)/n", _share: "(n-1)/n", _one: "1"}
"""Each bus factor in words (``commbench list``)."""


@dataclass(frozen=True, slots=True)
class NcclTestsCollective:
    """One nccl-tests binary: how its size and count columns relate and its bus factor (doc/PERFORMANCE.md)."""

    name: str
    """The collective's name in commbench results (all_reduce, all_to_all, ...)."""
    names: tuple[str, ...]
    """How the tools name it: the binary stem (``alltoall`` of ``alltoall_perf``) and rccl-tests' testColl name."""
    per_rank_count: bool
    """The count column is one rank's share: size = count x ranks x type width (all_gather, reduce_scatter,
    alltoall, gather, scatter); otherwise size = count x width. The per-rank share is also what nccl-tests rounds
    down to a 16-byte multiple (``(count/nranks) & -(16/eltSize)``)."""
    bus_factor: Callable[[int], float]
    """busbw / algbw as a function of the rank count n, as the binary's ``GetBw`` computes it."""

    @property
    def formula(self) -> str:
        """:attr:`bus_factor` in words."""
        return FACTOR_FORMULAS[self.bus_factor]

    def world_from_count(self, size: int, count: int, width: int) -> int | None:
        """The rank count a per-rank count implies (size / (count x width)), None where the count says nothing."""
        if not self.per_rank_count or count <= 0 or size % (count * width):
            return None
        return size // (count * width)

    def count_for(self, size: int, width: int, n: int) -> int:
        """The count column nccl-tests would print for ``size`` bytes on ``n`` ranks."""
        return size // width // n if self.per_rank_count else size // width


NCCL_COLLECTIVES: dict[str, NcclTestsCollective] = {
    c.name: c
    for c in (
        NcclTestsCollective("all_reduce", ("all_reduce", "allreduce"), False, _ring),
        NcclTestsCollective("all_gather", ("all_gather", "allgather"), True, _share),
        NcclTestsCollective("reduce_scatter", ("reduce_scatter", "reducescatter"), True, _share),
        NcclTestsCollective("all_to_all", ("alltoall", "all_to_all"), True, _share),
        NcclTestsCollective("all_to_allv", ("alltoallv",), True, _share),
        NcclTestsCollective("broadcast", ("broadcast",), False, _one),
        NcclTestsCollective("reduce", ("reduce",), False, _one),
        NcclTestsCollective("sendrecv", ("sendrecv",), False, _one),
        NcclTestsCollective("gather", ("gather",), True, _share),
        NcclTestsCollective("scatter", ("scatter",), True, _share),
        NcclTestsCollective("hypercube", ("hypercube",), True, _one),
    )
}
"""Every nccl-tests / rccl-tests binary by results name."""

_BY_NAME = {n: c for c in NCCL_COLLECTIVES.values() for n in (c.name, *c.names)}


def collective_for(name: str) -> NcclTestsCollective | None:
    """The collective a binary stem, an rccl-tests name (``AllReduce``, ``AlltoAll``) or a results name means."""
    return _BY_NAME.get(name.lower().replace("-", "_")) or _BY_NAME.get(name.lower().replace("_", ""))
