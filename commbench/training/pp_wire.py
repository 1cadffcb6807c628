"""A pipeline boundary through a codec: the activation a stage sends, and the gradient that comes back for it, as
codec wire bytes (fp8 e4m3 codes + a float32 scale per token, `commbench.measure.codec`), never as floats.

`torch.distributed.pipelining` sends a stage's output tensor and, in the backward, a gradient of the same shape and
dtype; only floating tensors carry gradients, so the wire bytes travel as a float32 *view* of the uint8 wire, a
[b, s, wire_bytes(h) / 4] tensor, and nothing does arithmetic on it: `pack` (the sending stage's last op) encodes
the fp32 activation, its backward decodes the packed gradient received; `unpack` (the receiving stage's first op)
decodes, its backward encodes the fp32 gradient into the packed tensor sent back. Each token's h features are one
codec chunk (`measure.chunked.ChunkWire`, the packed layout: codes then scales), so a chunk's scale is its token's
amax (row-wise scaling, as torchao's float8 "rowwise" recipe) and the shape [b, s] survives the trip. The wire
needs wire_bytes(h) divisible by 4 (fp8 e4m3: h divisible by 4): `PipelineParallel` refuses other layouts
before anything runs.

The counter counts the view's bytes, which are the wire's (codes + scales), under "uint8" (`CommCounter.send_dtype`).
"""

from __future__ import annotations

from typing import Any

import torch

from commbench.measure.chunked import ChunkWire
from commbench.measure.codec import Codec


def wire_words(codec: Codec, hidden: int) -> int:
    """float32 words of one token's wire (codes + scales of its `hidden` features)."""
    return codec.wire_bytes(hidden) // 4


def _encode(codec: Codec, x: torch.Tensor) -> torch.Tensor:
    """fp32 [b, s, h] -> the float32 view [b, s, words] of its wire bytes (one chunk per token)."""
    *lead, h = x.shape
    flat = x.detach().float().contiguous().reshape(-1)
    wire = ChunkWire(codec, flat.numel() // h, h, x.device)
    wire.encode_chunks(flat)
    return wire.wire.view(torch.float32).view(*lead, wire_words(codec, h))


def _decode(codec: Codec, packed: torch.Tensor, hidden: int) -> torch.Tensor:
    """The float32 view [b, s, words] -> fp32 [b, s, hidden]."""
    *lead, _ = packed.shape
    n = packed.numel() // wire_words(codec, hidden)
    wire = ChunkWire(codec, n, hidden, packed.device)
    wire.wire.copy_(packed.detach().contiguous().reshape(-1).view(torch.uint8))
    out = torch.empty(n * hidden, dtype=torch.float32, device=packed.device)
    wire.decode_chunks(out)
    return out.view(*lead, hidden)


class _Pack(torch.autograd.Function):
    """The sending side: encode forward, decode the packed gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, codec: Codec) -> torch.Tensor:
        ctx.codec, ctx.hidden, ctx.dtype = codec, int(x.shape[-1]), x.dtype
        return _encode(codec, x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _decode(ctx.codec, g, ctx.hidden).to(ctx.dtype), None


class _Unpack(torch.autograd.Function):
    """The receiving side: decode forward, encode the fp32 gradient backward (what is sent back)."""

    @staticmethod
    def forward(ctx: Any, packed: torch.Tensor, codec: Codec, hidden: int) -> torch.Tensor:
        ctx.codec = codec
        return _decode(codec, packed, hidden)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _encode(ctx.codec, g), None, None


def pack(x: torch.Tensor, codec: Codec) -> torch.Tensor:
    """`x` [b, s, h] as the float32 view of its wire bytes; the gradient coming back is decoded."""
    out: torch.Tensor = _Pack.apply(x, codec)
    return out


def unpack(packed: torch.Tensor, codec: Codec, hidden: int) -> torch.Tensor:
    """The activation a `pack` sent, fp32 [b, s, hidden]; its gradient goes back encoded."""
    out: torch.Tensor = _Unpack.apply(packed, codec, hidden)
    return out
