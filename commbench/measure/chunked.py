"""The chunked low-precision algorithm, codec-agnostic: used by the sweep's codec precisions and the DDP hook.

Every variant splits a float32 buffer into chunks, encodes each with a :class:`~commbench.measure.codec.Codec`, moves
the encoded chunks with one primitive collective per buffer, and decodes (in fp32) on arrival:

- all_gather: encode the rank's tensor into one chunk; all_gather the chunks; decode each source's chunk.
- reduce_scatter (ZeRO++ qgZ): encode the n per-destination chunks; all_to_all; decode the n received chunks
  and **sum in float32** (deterministic: the CPU kernel adds in source order 0..n-1, the vectorised path CUDA takes sums over the chunk dimension in one reduction): one encoding, no
  re-encoding along a ring. The local sum is part of decode: it is the codec -> fp32 work.
- all_reduce: that reduce_scatter, re-encode the owned partial sum, gather it to every rank (the local middle
  step sits between two transfers, so the sweep's ``comm`` phase holds it); decode every gathered chunk. A
  buffer whose length is not a multiple of n is zero-padded to ``n * ceil(N / n)``. The gather is an
  all_gather, except (sweep, gloo) where an all_to_all of the chunk copied into every slot moves the same bytes
  several times faster. Every rank decodes the same bytes: results are identical across ranks.
- all_to_all: encode per destination chunk; all_to_all; decode each received chunk.

The wire layout (:class:`ChunkWire`) lives here once. A chunk is its codes followed by its float32 scales.
*Packed* (the sweep): the chunks back to back in one uint8 buffer, so codes and scales move in a single
collective call. *Split* (the DDP hook): every chunk's codes in one uint8 buffer, every chunk's scales in one
float32 buffer, two calls per stage (the training byte accounting reports codes and scales by dtype).
:func:`ChunkWire.nbytes` gives the bytes of either layout; ``wire_bytes`` (nccl-tests ``size`` on the wire,
scales included) and the hook's byte formula both derive from it.

Each stage can run asynchronously (``async_op=True`` returns the collectives' ``Work`` handles), which the DDP
hook chains with futures so backward overlaps the communication.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from commbench.measure.codec import Codec
from commbench.measure.collectives import CHUNKED_ALGORITHMS, AllGather, AllToAll, Collective
from commbench.measure.precision import ReceivedChunk

# The primitives every variant is built of (the algorithm's own, whatever else is registered under their names).
_ALL_TO_ALL = AllToAll()
_ALL_GATHER = AllGather()


class ChunkWire:
    """``n`` encoded chunks of ``m`` elements each, in the packed or the split layout."""

    def __init__(self, codec: Codec, n: int, m: int, device: torch.device, packed: bool = True) -> None:
        self.codec, self.n, self.m, self.packed = codec, n, m, packed
        self.code_bytes = codec.code_bytes(m)
        self.s_wire = codec.scale_count(m)
        # Aligned float32 homes for every chunk's scales (the codec reads and writes these): in the packed
        # layout a chunk's scales sit at an offset that is not 4-byte aligned in general, so they are copied
        # byte-wise (a few bytes per chunk) rather than viewed.
        self.scales = torch.ones(n, codec.num_scales(m), dtype=torch.float32, device=device)
        if packed:
            self.stride = self.code_bytes + 4 * self.s_wire
            self.wire = torch.zeros(n * self.stride, dtype=torch.uint8, device=device)
            self._buffers = [self.wire]
        else:
            self.codes_buf = torch.zeros(n * self.code_bytes, dtype=torch.uint8, device=device)
            self.scales_buf = torch.ones(n * self.s_wire, dtype=torch.float32, device=device)
            self._buffers = [self.codes_buf] + ([self.scales_buf] if self.s_wire else [])
        # [n, code_bytes] code slots and [n, 4 * s_wire] scale bytes of every chunk, as views of the wire: the
        # codec's batched methods encode and decode all chunks through them at once
        if packed:
            rows = self.wire.view(n, self.stride)
            self.code_rows = rows[:, : self.code_bytes]
            self.scale_rows = rows[:, self.code_bytes :] if self.s_wire else None
        else:
            self.code_rows = self.codes_buf.view(n, self.code_bytes)
            self.scale_rows = self.scales_buf.view(n, self.s_wire).view(torch.uint8) if self.s_wire else None
        self.workspace: dict[str, torch.Tensor] = {}
        """Codec scratch owned by this wire (one op uses a wire at a time; nothing is shared across wires, so
        ops on different streams never share a buffer)."""

    @staticmethod
    def nbytes(codec: Codec, n: int, m: int, packed: bool) -> dict[torch.dtype, int]:
        """Bytes of each wire buffer's dtype for ``n`` chunks of ``m`` elements."""
        if packed:
            return {torch.uint8: n * codec.wire_bytes(m)}
        out = {torch.uint8: n * codec.code_bytes(m)}
        if codec.scale_count(m):
            out[torch.float32] = n * 4 * codec.scale_count(m)
        return out

    def buffers(self) -> list[torch.Tensor]:
        """The tensors a collective moves, in a fixed order (the same on every rank)."""
        return self._buffers

    def total_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers)

    def codes(self, i: int) -> torch.Tensor:
        if self.packed:
            return self.wire[i * self.stride : i * self.stride + self.code_bytes]
        return self.codes_buf[i * self.code_bytes : (i + 1) * self.code_bytes]

    def received(self) -> list[ReceivedChunk]:
        """Every chunk's code and travelling-scale bytes (views into the wire)."""
        return [
            ReceivedChunk(
                self.codes(i), max(1, self.code_bytes // max(self.m, 1)), self._scale_slot(i) if self.s_wire else None
            )
            for i in range(self.n)
        ]

    def _scale_slot(self, i: int) -> torch.Tensor:
        """Chunk ``i``'s travelling scales as bytes on the wire."""
        if self.packed:
            start = i * self.stride + self.code_bytes
            return self.wire[start : start + 4 * self.s_wire]
        return self.scales_buf[i * self.s_wire : (i + 1) * self.s_wire].view(torch.uint8)

    def encode_chunks(self, x: torch.Tensor) -> None:
        """Encode ``x`` (contiguous, ``k * m`` elements, ``k <= n``) into chunks 0..k-1 with one batched codec call."""
        k = x.numel() // self.m if self.m else self.n
        rows = x.view(k, self.m)
        sr = self.scale_rows[:k] if self.scale_rows is not None else None
        self.codec.encode_chunks(rows, self.code_rows[:k], self.scales[:k], sr, workspace=self.workspace)

    def decode_chunks(self, out: torch.Tensor, reduce: bool = False) -> None:
        """Decode every chunk into ``out`` (``n * m`` elements, chunk r at slice r), or with ``reduce`` their
        float32 sum (deterministic, see ``fp8.sum_chunks``) into ``out`` (``m`` elements)."""
        target = out if reduce else out.view(self.n, self.m)
        self.codec.decode_chunks(
            self.code_rows, self.scales, self.scale_rows, target, reduce=reduce, workspace=self.workspace
        )

    def encode(self, i: int, x: torch.Tensor) -> None:
        self.codec.encode(x, self.codes(i), self.scales[i])
        if self.s_wire:
            self._scale_slot(i).copy_(self.scales[i, : self.s_wire].view(torch.uint8))

    def decode(self, i: int, out: torch.Tensor, accumulate: bool = False) -> None:
        if self.s_wire:
            self.scales[i, : self.s_wire].view(torch.uint8).copy_(self._scale_slot(i))
        self.codec.decode(self.codes(i), self.scales[i], out, accumulate=accumulate)

    def replicate_first(self) -> None:
        """Copy chunk 0 into every other slot (a gather done as an all_to_all sends each rank the same chunk)."""
        for buf in self._buffers:
            rows = buf.view(self.n, buf.numel() // self.n)
            rows[1:].copy_(rows[:1].expand(self.n - 1, rows.shape[1]))  # one copy per buffer


def exchange(
    collective: Collective, send: ChunkWire, recv: ChunkWire, group: dist.ProcessGroup | None, async_op: bool
) -> list[Any]:
    """Move every buffer of ``send`` into ``recv`` with ``collective``; the ``Work`` handles when async."""
    works = [
        collective.run(s, r, group, async_op=async_op) for s, r in zip(send.buffers(), recv.buffers(), strict=True)
    ]
    return [w for w in works if w is not None]


class ChunkedOp:
    """Shared state of the point ops (the sweep's ``PointOp`` protocol: load, encode, comm, decode, result).

    By default the input ``x`` is loaded as is and chunk ``r`` received decodes into slice ``r`` of ``y``
    (chunks of ``m`` elements), the output."""

    has_codec = True
    recv: ChunkWire
    x: torch.Tensor
    y: torch.Tensor
    m: int

    def __init__(self, codec: Codec, group: dist.ProcessGroup | None) -> None:
        self.codec = codec
        self.group = group
        self.n = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def received(self) -> list[ReceivedChunk]:
        """The received chunks ``decode`` reads, for fault injection."""
        return self.recv.received()

    def load(self, x: torch.Tensor) -> None:
        self.x.copy_(x)

    def decode(self) -> None:
        self.recv.decode_chunks(self.y)

    def result(self) -> torch.Tensor:
        return self.y


class ChunkedAllGather(ChunkedOp):
    def __init__(
        self, codec: Codec, m: int, group: dist.ProcessGroup | None, device: torch.device, packed: bool = True
    ) -> None:
        super().__init__(codec, group)
        self.m = m
        self.x = torch.empty(m, dtype=torch.float32, device=device)
        self.send = ChunkWire(codec, 1, m, device, packed)
        self.recv = ChunkWire(codec, self.n, m, device, packed)
        self.y = torch.empty(self.n * m, dtype=torch.float32, device=device)
        self.wire_bytes = self.recv.total_bytes()

    def encode(self) -> None:
        self.send.encode_chunks(self.x)

    def comm(self) -> None:
        exchange(_ALL_GATHER, self.send, self.recv, self.group, async_op=False)


class ChunkedAllToAll(ChunkedOp):
    """all_to_all, and the base of reduce_scatter (which sums instead of concatenating on decode)."""

    def __init__(
        self, codec: Codec, total: int, group: dist.ProcessGroup | None, device: torch.device, packed: bool = True
    ) -> None:
        super().__init__(codec, group)
        self.m = total // self.n
        self.x = torch.empty(total, dtype=torch.float32, device=device)
        self.send = ChunkWire(codec, self.n, self.m, device, packed)
        self.recv = ChunkWire(codec, self.n, self.m, device, packed)
        self.y = torch.empty(total, dtype=torch.float32, device=device)
        self.wire_bytes = self.send.total_bytes()

    def encode(self) -> None:
        self.send.encode_chunks(self.x)

    def exchange(self, async_op: bool = False) -> list[Any]:
        return exchange(_ALL_TO_ALL, self.send, self.recv, self.group, async_op)

    def comm(self) -> None:
        self.exchange()


class ChunkedReduceScatter(ChunkedAllToAll):
    def __init__(
        self, codec: Codec, total: int, group: dist.ProcessGroup | None, device: torch.device, packed: bool = True
    ) -> None:
        super().__init__(codec, total, group, device, packed)
        self.y = torch.empty(self.m, dtype=torch.float32, device=device)

    def reduce(self) -> None:
        """Decode the n received chunks and sum them in float32 (deterministically)."""
        self.recv.decode_chunks(self.y, reduce=True)

    def decode(self) -> None:
        self.reduce()


class ChunkedAllReduce(ChunkedReduceScatter):
    """reduce_scatter, re-encode the owned chunk, gather; in stages the DDP hook can chain asynchronously."""

    def __init__(
        self,
        codec: Codec,
        total: int,
        group: dist.ProcessGroup | None,
        device: torch.device,
        packed: bool = True,
        gather_by_all_to_all: bool | None = None,
    ) -> None:
        n = dist.get_world_size(group)
        self.total = total
        padded = n * -(-total // n)
        super().__init__(codec, padded, group, device, packed)
        self.x.zero_()  # the pad tail stays zero: load() writes only the first `total` elements
        self.acc = self.y  # the owned chunk's fp32 sum
        # Gloo's all_gather_into_tensor is several times slower than its all_to_all_single for the same bytes
        # (figures: benchmarks/results/2026-12-01_2core-vm_gloo.md), so by default on gloo the gather stage is an
        # all_to_all of the owned chunk copied into every slot: same bytes received, (n-1) local copies more.
        if gather_by_all_to_all is None:
            gather_by_all_to_all = dist.get_backend(group) == "gloo"
        self.gather_by_a2a = gather_by_all_to_all
        self.gather_collective: Collective = _ALL_TO_ALL if gather_by_all_to_all else _ALL_GATHER
        self.gsend = ChunkWire(codec, self.n if gather_by_all_to_all else 1, self.m, device, packed)
        self.grecv = ChunkWire(codec, self.n, self.m, device, packed)
        self.out = torch.empty(padded, dtype=torch.float32, device=device)
        self.wire_bytes = self.grecv.total_bytes()

    @staticmethod
    def stage_bytes(
        codec: Codec, total: int, n: int, packed: bool, gather_by_all_to_all: bool
    ) -> list[tuple[Collective, torch.dtype, int]]:
        """(collective, dtype, nccl-tests size in bytes) of every call one all_reduce of ``total`` elements makes.

        Both stages move n chunks of ``ceil(total / n)`` elements: the all_to_all's per-rank buffer, and the
        gather's total output (or, gathered by all_to_all, its per-rank buffer of n copies)."""
        m = -(-total // n)
        gather = _ALL_TO_ALL if gather_by_all_to_all else _ALL_GATHER
        nbytes = ChunkWire.nbytes(codec, n, m, packed)
        return [(coll, dt, b) for coll in (_ALL_TO_ALL, gather) for dt, b in nbytes.items()]

    def load(self, x: torch.Tensor) -> None:
        self.x[: self.total].copy_(x)

    def reencode(self) -> None:
        """The middle step: fp32 sum of the owned chunk, re-encoded for the gather."""
        self.reduce()
        self.gsend.encode_chunks(self.acc)
        if self.gather_by_a2a:
            self.gsend.replicate_first()

    def gather(self, async_op: bool = False) -> list[Any]:
        return exchange(self.gather_collective, self.gsend, self.grecv, self.group, async_op)

    def comm(self) -> None:
        self.exchange()
        self.reencode()
        self.gather()

    def decode(self) -> None:
        self.grecv.decode_chunks(self.out)

    def received(self) -> list[ReceivedChunk]:
        """The gathered partial sums (the last stage's received chunks)."""
        return self.grecv.received()

    def result(self) -> torch.Tensor:
        return self.out[: self.total]


# What the collectives name as their chunked variant (``Collective.chunked_variant``).
for _algorithm in (ChunkedAllGather, ChunkedAllToAll, ChunkedReduceScatter, ChunkedAllReduce):
    CHUNKED_ALGORITHMS.register(_algorithm.__name__, _algorithm)
