"""The rooted collectives of nccl-tests: broadcast, reduce, gather and scatter, each one registered class.

Sizes and counts as nccl-tests defines them (src/broadcast.cu, reduce.cu, gather.cu, scatter.cu
``*GetCollByteCount``): broadcast and reduce move the whole buffer (``count`` = the buffer), gather's size is the
root's *total output* and scatter's the root's *total input* (``count`` = one rank's share, rounded down to 16
bytes like all_gather's). Bus factors come from :mod:`commbench.core.nccl_tests` (broadcast, reduce: 1; gather,
scatter: (n-1)/n). The root is a rank of the group (nccl-tests' ``-r``, :meth:`Collective.configured`); only
the root's output of reduce and gather is defined, so only it is checked (nccl-tests' ``ReduceInitData``,
``GatherInitData``: the expected buffer is the input elsewhere, and the output is not compared there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from commbench.measure.collectives import Collective, Layout, Piece, register_collective

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist


def _shares(t: torch.Tensor, group: dist.ProcessGroup | None, root: int) -> list[torch.Tensor] | None:
    """``t`` as the n per-rank views the root gathers into or scatters from (in rank order); None off the root."""
    import torch.distributed as dist

    if dist.get_rank(group) != root:
        return None
    return list(t.view(dist.get_world_size(group), -1).unbind(0))


def _empty_like(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(0)


class _Rooted(Collective):
    """A collective with a root; its chunked codec algorithm needs the collective itself (the root)."""

    rooted = True

    def chunked_kwargs(self, layout: Layout) -> dict[str, Any]:
        return {"collective": self, "layout": layout}


class Broadcast(_Rooted):
    """The root's buffer to every rank (torch's broadcast is in place: the op passes one tensor as inp and out)."""

    name = "broadcast"
    redop = "none"
    reduces = False
    nccl_tests_name = "broadcast_perf"
    size_convention = "buffer"
    order = 4
    chunked_variant = "ChunkedMove"

    def out_of_place(self) -> bool:
        return False

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        import torch.distributed as dist

        return dist.broadcast(out, group=group, group_src=self.root, async_op=async_op)

    def sources(self, rank: int, n: int, layout: Layout) -> list[Piece]:
        return [Piece(self.root, 0, layout.output_numel, 0)]

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        return inputs[self.root].clone()


class Reduce(_Rooted):
    """Every rank's buffer reduced into the root's (in place, like torch's reduce); defined on the root only."""

    name = "reduce"
    redop = "sum"
    reduces = True
    nccl_tests_name = "reduce_perf"
    size_convention = "buffer"
    order = 5
    chunked_variant = "ChunkedReduce"
    chunked_encodings = 2
    """The codec path is all_reduce's up to the gather: one encoding, the owned partial sums re-encoded."""

    def out_of_place(self) -> bool:
        return False

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        import torch.distributed as dist

        return dist.reduce(out, group=group, group_dst=self.root, op=self.reduce_op(), async_op=async_op)

    def sources(self, rank: int, n: int, layout: Layout) -> list[Piece]:
        return [Piece(r, 0, layout.output_numel, 0) for r in range(n)] if rank == self.root else []

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        return self.reduce_stack(inputs) if rank == self.root else _empty_like(inputs[0])


class Gather(_Rooted):
    """Every rank's buffer, concatenated in rank order, into the root's output."""

    name = "gather"
    redop = "none"
    reduces = False
    nccl_tests_name = "gather_perf"
    size_convention = "total output"
    order = 6
    input_per_rank = True
    chunked_variant = "ChunkedMove"

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        import torch.distributed as dist

        return dist.gather(inp, _shares(out, group, self.root), group=group, group_dst=self.root, async_op=async_op)

    def sources(self, rank: int, n: int, layout: Layout) -> list[Piece]:
        m = layout.input_numel
        return [Piece(r, 0, m, r * m) for r in range(n)] if rank == self.root else []

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        import torch

        return torch.cat(inputs) if rank == self.root else _empty_like(inputs[0])


class Scatter(_Rooted):
    """The root's buffer split in rank order: share r to rank r."""

    name = "scatter"
    redop = "none"
    reduces = False
    nccl_tests_name = "scatter_perf"
    size_convention = "total input"
    order = 7
    output_per_rank = True
    chunked_variant = "ChunkedMove"

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        import torch.distributed as dist

        return dist.scatter(out, _shares(inp, group, self.root), group=group, group_src=self.root, async_op=async_op)

    def sources(self, rank: int, n: int, layout: Layout) -> list[Piece]:
        m = layout.output_numel
        return [Piece(self.root, rank * m, m, 0)]

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        m = inputs[0].numel() // len(inputs)
        return inputs[self.root][rank * m : (rank + 1) * m].clone()


for _c in (Broadcast(), Reduce(), Gather(), Scatter()):
    register_collective(_c)
