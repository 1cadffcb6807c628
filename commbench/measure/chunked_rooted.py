"""The chunked codec algorithm for the rooted and point-to-point collectives (broadcast, gather, scatter,
sendrecv, pp_sendrecv; reduce), registered next to :mod:`commbench.measure.chunked`'s and built on its wire.

- Data movement (:class:`ChunkedMove`): the collective itself moves the packed chunks (codes followed by their
  scales) as uint8 bytes, one chunk per nccl-tests ``count`` elements: the buffer for broadcast and the
  point-to-point sends, one rank's share for gather and scatter, so a chunk's scales travel with its codes and
  every receiver decodes what it got on its own. One encoding, as all_gather's. Every rank runs every phase (the
  ranks off the root encode what they do not send, decode what they do not keep): alongside the root's, so the
  time of a phase, which its slowest rank sets, is the root's.
- reduce (:class:`ChunkedReduce`): all_reduce's algorithm (all_to_all of the per-destination chunks, decode and
  **sum in float32**, re-encode the owned partial sum) with the last stage a gather to the root instead of an
  all-gather: two encodings, the root decodes the n gathered partial sums.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from commbench.measure.chunked import ChunkedAllReduce, ChunkedOp, ChunkWire
from commbench.measure.codec import Codec
from commbench.measure.collectives import CHUNKED_ALGORITHMS, Collective, Layout
from commbench.measure.collectives_rooted import Gather


class ChunkedMove(ChunkedOp):
    """Encode the input's chunks, move the wire with ``collective`` itself, decode the received chunks."""

    def __init__(
        self,
        codec: Codec,
        numel: int,
        group: dist.ProcessGroup | None,
        device: torch.device,
        *,
        collective: Collective,
        layout: Layout,
    ) -> None:
        super().__init__(codec, group)
        self.coll = collective
        self.m = layout.count
        self.x = torch.empty(layout.input_numel, dtype=torch.float32, device=device)
        self.send = ChunkWire(codec, layout.input_numel // self.m, self.m, device)
        # an in-place collective (broadcast) moves one wire: the root encodes into what every rank receives
        self.recv = (
            ChunkWire(codec, layout.output_numel // self.m, self.m, device) if collective.out_of_place() else self.send
        )
        self.y = torch.empty(layout.output_numel, dtype=torch.float32, device=device)
        self.wire_bytes = layout.total // self.m * codec.wire_bytes(self.m)

    def encode(self) -> None:
        self.send.encode_chunks(self.x)

    def comm(self) -> None:
        self.coll.run(self.send.wire, self.recv.wire, self.group)


class ChunkedReduce(ChunkedAllReduce):
    """all_reduce's chunked algorithm ending in a gather of the owned partial sums to the root."""

    def __init__(
        self,
        codec: Codec,
        total: int,
        group: dist.ProcessGroup | None,
        device: torch.device,
        *,
        collective: Collective,
        layout: Layout,
    ) -> None:
        super().__init__(codec, total, group, device, gather_by_all_to_all=False)
        self.gather_collective = Gather().configured(root=collective.root)


def _register() -> None:
    algorithms: tuple[Any, ...] = (ChunkedMove, ChunkedReduce)
    for algorithm in algorithms:
        CHUNKED_ALGORITHMS.register(algorithm.__name__, algorithm)


_register()
