"""Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
arXiv:2310.01889): causal self-attention over a sequence split into `cp` contiguous chunks, one per rank of a
context-parallel group, K/V blocks passed around the ring with `torch.distributed` point-to-point
(`batch_isend_irecv`), the blocks' partial softmaxes merged online (log-sum-exp), as FlashAttention does within one
device. Not torch's `torch.distributed.tensor.experimental.context_parallel`: that one swaps the SDPA flash /
memory-efficient kernels, which CPU SDPA does not dispatch to (see docs/training.md, "Context parallelism").

Forward, on rank i holding queries, keys and values of chunk i: at step t = 0 .. cp-1 it holds the K/V block of
chunk j = (i - t) mod cp; j < i is attended in full, j = i with the causal (diagonal) mask, j > i not at all (every
key is in the future; the block still travels); after each step but the last the block goes to rank i+1 and the
one of rank i-1 comes in: cp - 1 exchanges of [K; V] (2 b s/cp h elements) per layer. The own block comes first, so
every query row has a finite log-sum-exp before anything is merged.

Backward (a custom `autograd.Function`, no recomputation by gathering): the FlashAttention-2 gradient per block
from the saved output and log-sum-exp, D = rowsum(dO * O), P = exp(S - lse), dV_j += P^T dO, dS = P (dO V_j^T - D),
dQ += dS K_j, dK_j += dS^T Q (times the softmax scale). The K/V blocks circulate again with their dK/dV accumulators
([K; V; dK; dV], 4 blocks, cp - 1 exchanges), and a last exchange of [dK; dV] (2 blocks) brings each block's
finished gradient home to its owner. Per layer per rank, in elements of one block n = b (s/cp) h:
forward 2 (cp-1) n, backward 4 (cp-1) n + 2 n (`ring_elements`). Everything crossing the ring is cast to the wire
dtype (the accumulators are kept in the compute dtype, at least fp32, between exchanges).

The ring is an object with `index`, `size` and `exchange(t)` (send `t` to the next rank, return what the previous
one sent): `GroupRing` over a process group; tests run the same code on a ring of threads (`ThreadRing`).
"""

from __future__ import annotations

import queue
from typing import Any, Protocol

import torch
import torch.nn as nn


class Ring(Protocol):
    """A ring of `size` members; this one is `index`; `exchange` sends to index+1 and receives from index-1."""

    index: int
    size: int

    def exchange(self, t: torch.Tensor) -> torch.Tensor: ...


class GroupRing:
    """The ring of a process group's ranks, in their group order (global ranks `ranks`), over `batch_isend_irecv`
    (counted as op "send" by `CommCounter`, which replaces `dist.isend`: the `P2POp` is built at call time)."""

    def __init__(self, group: Any, ranks: tuple[int, ...], rank: int) -> None:
        self.group, self.ranks = group, ranks
        self.index, self.size = ranks.index(rank), len(ranks)

    def exchange(self, t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        t = t.contiguous()
        got = torch.empty_like(t)
        nxt, prv = self.ranks[(self.index + 1) % self.size], self.ranks[(self.index - 1) % self.size]
        ops = [dist.P2POp(dist.isend, t, nxt, self.group), dist.P2POp(dist.irecv, got, prv, self.group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return got


class ThreadRing:
    """A ring of threads in one process (tests): member `index` of `size`, queues shared by all members."""

    def __init__(self, queues: list[queue.Queue[torch.Tensor]], index: int) -> None:
        self.queues, self.index, self.size = queues, index, len(queues)

    def exchange(self, t: torch.Tensor) -> torch.Tensor:
        self.queues[(self.index + 1) % self.size].put(t.clone())
        return self.queues[self.index].get(timeout=60)


def ring_elements(cp: int, block: int) -> tuple[int, int]:
    """(forward, backward) elements one rank sends per layer, `block` = b (s/cp) h elements of one K or V block."""
    return 2 * (cp - 1) * block, (4 * (cp - 1) + 2) * block


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, diagonal: bool) -> torch.Tensor:
    s = (q @ k.transpose(-2, -1)) * scale
    if diagonal:
        n = s.shape[-1]
        future = torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    return s


def _visible(i: int, j: int) -> bool:
    """Chunk i's queries see chunk j's keys (contiguous chunks, causal): j at or before i."""
    return j <= i


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring, wire: torch.dtype
    ) -> torch.Tensor:
        acc = _acc_dtype(q.dtype)
        qa = q.to(acc)
        scale = q.shape[-1] ** -0.5
        out = torch.zeros_like(qa)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
        kv = torch.stack([k, v])
        i = ring.index
        for t in range(ring.size):
            j = (i - t) % ring.size
            if _visible(i, j):
                kb, vb = kv[0].to(acc), kv[1].to(acc)
                s = _scores(qa, kb, scale, diagonal=j == i)
                blk = torch.logsumexp(s, dim=-1)
                o_b = torch.exp(s - blk.unsqueeze(-1)) @ vb
                new = torch.logaddexp(lse, blk)
                out = out * torch.exp(lse - new).unsqueeze(-1) + o_b * torch.exp(blk - new).unsqueeze(-1)
                lse = new
            if t < ring.size - 1:
                kv = ring.exchange(kv.to(wire)).to(k.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.wire = ring, wire
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        ring, wire = ctx.ring, ctx.wire
        acc = out.dtype
        qa, do = q.to(acc), grad.to(acc)
        scale = q.shape[-1] ** -0.5
        d = (do * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(qa)
        carry = torch.cat([torch.stack([k, v]).to(acc), torch.zeros((2, *k.shape), dtype=acc, device=k.device)])
        i = ring.index
        for t in range(ring.size):
            j = (i - t) % ring.size
            if _visible(i, j):
                kb, vb = carry[0], carry[1]
                p = torch.exp(_scores(qa, kb, scale, diagonal=j == i) - lse.unsqueeze(-1))
                ds = p * (do @ vb.transpose(-2, -1) - d)
                dq = dq + (ds @ kb) * scale
                carry = torch.stack([kb, vb, carry[2] + (ds.transpose(-2, -1) @ qa) * scale,
                                     carry[3] + p.transpose(-2, -1) @ do])  # fmt: skip
            if t < ring.size - 1:
                carry = ring.exchange(carry.to(wire)).to(acc)
        grads = ring.exchange(carry[2:].to(wire)).to(acc) if ring.size > 1 else carry[2:]
        return dq.to(q.dtype), grads[0].to(k.dtype), grads[1].to(v.dtype), None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring, wire: torch.dtype) -> torch.Tensor:
    """Causal attention of this member's chunk of queries `q` [b, heads, s/cp, d] over the keys and values of its
    own and every earlier chunk (`k`, `v` of the same shape, this member's), K/V and their gradients crossing the
    ring in `wire`."""
    out: torch.Tensor = _RingAttention.apply(q, k, v, ring, wire)
    return out


class RingSelfAttention(nn.Module):
    """A GPT block's causal self-attention (`nets.CausalSelfAttention`) on this member's chunk, over the ring: the
    original's own qkv and proj (its weights), its heads."""

    def __init__(self, attn: Any, ring: Ring, wire: torch.dtype) -> None:
        super().__init__()
        self.qkv, self.proj, self.n_heads = attn.qkv, attn.proj, int(attn.n_heads)
        self.ring, self.wire = ring, wire

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=2)
        h = self.n_heads
        q, k, v = (z.reshape(b, t, h, z.shape[-1] // h).transpose(1, 2) for z in (q, k, v))
        y = ring_attention(q, k, v, self.ring, self.wire)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class CPGPT(nn.Module):
    """This member's part of a `nets.GPT` under context parallelism: the model's own modules (its weights) on chunk
    `ring.index` of every sequence, the embeddings at the chunk's positions, each block's attention over the ring."""

    def __init__(self, model: Any, ring: Ring, wire: torch.dtype) -> None:
        super().__init__()
        self.ring = ring
        self.tok, self.pos, self.ln_f, self.head = model.tok, model.pos, model.ln_f, model.head
        self.blocks = model.blocks
        for block in self.blocks:
            block.attn = RingSelfAttention(block.attn, ring, wire)

    def chunk(self, seq_len: int) -> slice:
        """This member's tokens of a sequence of `seq_len`."""
        c = seq_len // self.ring.size
        return slice(self.ring.index * c, (self.ring.index + 1) * c)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        start = self.ring.index * idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(start, start + idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
