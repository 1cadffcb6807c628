"""Point-to-point collectives: nccl-tests' ``sendrecv`` ring and the pipeline-stage pair, each one registered class.

``sendrecv`` is nccl-tests' (src/sendrecv.cu): every rank sends its buffer to rank+1 and receives rank-1's, around
the ring, in one group of a send and a receive. ``pp_sendrecv`` is what pipeline parallelism sends at a stage
boundary: rank r to rank r+1 of the group, without the wrap-around (the first stage receives nothing, the last sends
nothing), so the pair's placement is the group's: in an ``intra`` group every pair is inside a node, in an
``inter`` group (the same local rank on consecutive nodes) every pair crosses nodes, in ``world`` the pairs at a
node boundary do. Both move the whole buffer (``size`` = ``count`` x width) with nccl-tests' sendrecv bus factor, 1
(:mod:`commbench.core.nccl_tests`), and one step of latency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from commbench.measure.collectives import Collective, Layout, Piece, register_collective

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist


class _Works:
    """The ``Work`` handles of one batch of sends and receives, waited as one."""

    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self) -> bool:
        for w in self.works:
            w.wait()
        return True


class _PointToPoint(Collective):
    """Sends to and receives from fixed peers; a rank with neither takes no part in the call."""

    redop = "none"
    reduces = False
    size_convention = "buffer"
    chunked_variant = "ChunkedMove"

    def peers(self, rank: int, n: int) -> tuple[int | None, int | None]:
        """(rank to send to, rank to receive from) inside the group, None where there is none."""
        raise NotImplementedError

    def latency_steps(self, n: int) -> float:
        return 1.0

    def chunked_kwargs(self, layout: Layout) -> dict[str, Any]:
        return {"collective": self, "layout": layout}

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        import torch.distributed as dist

        rank, n = dist.get_rank(group), dist.get_world_size(group)
        to, frm = self.peers(rank, n)
        if to == rank and frm == rank:  # a ring of one: the buffer reaches itself (torch refuses a send to self)
            out.copy_(inp)
            return None
        ops = []
        if to is not None:
            ops.append(dist.P2POp(dist.isend, inp, group=group, group_peer=to))
        if frm is not None:
            ops.append(dist.P2POp(dist.irecv, out, group=group, group_peer=frm))
        works = dist.batch_isend_irecv(ops) if ops else []
        if async_op:
            return _Works(works)
        for w in works:
            w.wait()
        return None

    def sources(self, rank: int, n: int, layout: Layout) -> list[Piece]:
        frm = self.peers(rank, n)[1]
        return [] if frm is None else [Piece(frm, 0, layout.output_numel, 0)]

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        frm = self.peers(rank, len(inputs))[1]
        return inputs[0].new_empty(0) if frm is None else inputs[frm].clone()


class SendRecv(_PointToPoint):
    """nccl-tests' sendrecv: rank r sends to (r+1) mod n and receives from (r-1) mod n."""

    name = "sendrecv"
    nccl_tests_name = "sendrecv_perf"
    order = 8

    def peers(self, rank: int, n: int) -> tuple[int | None, int | None]:
        return (rank + 1) % n, (rank - 1) % n


class PipelineSendRecv(_PointToPoint):
    """A pipeline stage boundary: rank r sends to r+1 and receives from r-1, no wrap-around."""

    name = "pp_sendrecv"
    nccl_tests_name = "sendrecv_perf"
    nccl_tests_key = "sendrecv"
    order = 9

    def peers(self, rank: int, n: int) -> tuple[int | None, int | None]:
        return (rank + 1 if rank + 1 < n else None), (rank - 1 if rank > 0 else None)

    def unsupported(self, backend: str, n: int) -> str | None:
        if n < 2:
            return "a pipeline-stage pair needs a group of at least 2 ranks"
        return super().unsupported(backend, n)


for _c in (SendRecv(), PipelineSendRecv()):
    register_collective(_c)
