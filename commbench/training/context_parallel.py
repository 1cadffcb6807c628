"""Context parallelism on the GPT: each sample's sequence split over a CP group of `cp` ranks, attention computed
with ring attention over that group (`ring_attention.py`), as a `Sharding` and its policies cp_fp32, cp_bf16comm
(fp32 compute, K/V and their gradients on the ring in bf16) and cp_bf16 (autocast bf16, the ring in bf16).

Layout: CP groups of `cp` consecutive ranks (the suite's cp_degree; 0: the whole world); with a world larger than
cp, data parallel over the groups. Rank i of a group holds the contiguous chunk i of s/cp tokens of every sample of
its group's batch (no zig-zag load balancing: the causal chunks' work is uneven, the bytes are not). The model's
own modules compute it (`CPGPT`): the embeddings with the chunk's positions, every block's attention through a
`RingSelfAttention` on the block's own qkv and proj, the final LayerNorm and head on the chunk; the rest of a block
is token-wise. The step is the sharding's (`pipeline_step`): this rank's chunk of inputs and targets, its loss
(the mean over its tokens), backward (the ring's dK/dV come home to their owners), then the gradients all-reduced
over the world as one flat fp32 buffer and averaged: the global batch's mean loss is the mean of the ranks' chunk
losses (equal chunks), so the averaged gradients are the unsplit model's on the global batch, the fp32 DDP
baseline's.

Data: a CP group computes one batch together, so each of its ranks trains on the batches of every rank of its group
concatenated (`data_ranks`), as a TP group does.

Bytes, per layer per rank, with n = b' (s/cp) h the elements of one K or V block (b' = the group's samples, h =
d_model; `ring_attention.ring_elements`): forward 2 (cp-1) n sent, backward 4 (cp-1) n + 2 n, in the wire dtype (op
"send", bus factor 1: what a rank puts on the wire); plus, per step, the gradient all-reduce of 4 Psi bytes, bus
factor 2 (world-1)/world (nccl-tests). `Layout.tokens` is this rank's b' s/cp and `Layout.activations` one
(KV_BLOCK, h) per block (`describe_activations`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from commbench.training.comm import bus_factor, dtype_name
from commbench.training.policies import Policy, register_policy
from commbench.training.strategies import (
    ADAM_FP32,
    BF16,
    DTYPE_UNDERFLOW,
    FP32,
    SHORT,
    GradComm,
    ModelState,
    Sharding,
    Underflow,
    World,
    add_bytes,
    blocks,
)

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

KV_BLOCK = "kv_block"
"""`Layout.activations` label of one layer's K (or V) features per token on the ring."""


@dataclass(frozen=True, slots=True)
class ContextParallel(Sharding):
    """Context parallelism over `cp` ranks (0: the whole world), data parallel over the CP groups; `wire_dtype_name`
    is what K/V and their gradients cross the ring in."""

    kind: str = "cp"
    parallelism: str = "cp"
    shards_grads: bool = False
    takes_hooks: bool = False
    cp: int = 0
    """Ranks per CP group; 0: the whole world."""
    wire_dtype_name: str = FP32
    seq_len: int = 0
    """The suite's seq_len (from `configure`; 0: not known)."""
    gpt: bool = True
    """The suite's model is the gpt (from `configure`)."""

    def degree(self, world_size: int) -> int:
        cp = self.cp or world_size
        if cp < 2:
            raise ValueError(
                f"context parallelism needs at least 2 ranks per group; world_size={world_size}, cp_degree={self.cp}"
            )
        if world_size % cp:
            raise ValueError(
                f"context parallelism: cp_degree={cp} does not divide world_size={world_size}; "
                f"valid: a divisor of {world_size} (>= 2), or 0 for the whole world"
            )
        return cp

    def configure(self, section: Any) -> ContextParallel:
        """cp_degree (0 resolved to the running world's size) and seq_len from the suite's `[training]` table."""
        cp = int(getattr(section, "cp_degree", 0))
        import torch.distributed as dist

        if not cp and dist.is_available() and dist.is_initialized():
            cp = dist.get_world_size()
        par = "cp+dp" if dist.is_available() and dist.is_initialized() and dist.get_world_size() > cp > 0 else "cp"
        return replace(self, cp=cp, parallelism=par, seq_len=int(getattr(section, "seq_len", 0)),
                       gpt=getattr(section, "model", "gpt") == "gpt")  # fmt: skip

    def _split_error(self, cp: int, seq_len: int) -> str | None:
        if seq_len and seq_len % cp:
            return f"context parallelism: seq_len={seq_len} does not split into cp_degree={cp} chunks; valid: a multiple of {cp}"
        return None

    def config_error(self, section: Any) -> str | None:
        """What no world can run: a model other than the gpt, a given cp_degree that does not divide seq_len."""
        if getattr(section, "model", "gpt") != "gpt":
            return f"context parallelism needs the gpt model (its attention runs over the ring); model={section.model}"
        cp = int(getattr(section, "cp_degree", 0))
        return self._split_error(cp, int(section.seq_len)) if cp else None

    def layout_error(self, world_size: int, nodes: int = 1) -> str | None:
        try:
            cp = self.degree(world_size)
        except ValueError as exc:
            return str(exc)
        if not self.gpt:
            return "context parallelism needs the gpt model (its attention runs over the ring)"
        return self._split_error(cp, self.seq_len)

    def data_ranks(self, rank: int, world_size: int) -> tuple[int, ...]:
        cp = self.degree(world_size)
        first = rank // cp * cp
        return tuple(range(first, first + cp))

    def layout_tokens(self, step_tokens: int) -> int:
        """This rank's tokens: its chunk of the group's batch."""
        return step_tokens // max(self.cp, 1)

    def describe_activations(self, model: nn.Module) -> tuple[tuple[str, int], ...]:
        """One (KV_BLOCK, d_model) per block: each layer's K (and V) features per token on the ring."""
        ln: list[Any] = [getattr(b, "ln1", None) for b in blocks(model)]
        return tuple((KV_BLOCK, int(x.normalized_shape[0])) for x in ln if x is not None)

    def comm_dtype(self, grad_comm: GradComm) -> str:
        return SHORT[self.wire_dtype_name]

    def comm_underflow(self, grad_comm: GradComm) -> Underflow:
        return DTYPE_UNDERFLOW[self.wire_dtype_name]

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        return (state.param_bytes + state.grad_bytes + state.optimizer_bytes) * psi

    def _comm_bytes(self, w: World) -> dict[str, float]:
        from commbench.training.ring_attention import ring_elements

        cp = self.degree(w.world_size)
        out: dict[str, float] = {}
        per = _itemsize(self.wire_dtype_name)
        for label, h in w.layout.activations:
            if label == KV_BLOCK:
                fwd, bwd = ring_elements(cp, w.layout.tokens * h)
                add_bytes(out, f"send:{dtype_name(self.wire_dtype_name)}", (fwd + bwd) * per)
        add_bytes(out, "all_reduce:float", bus_factor("all_reduce", w.world_size) * 4 * w.psi)
        return out

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        import torch
        import torch.distributed as dist

        from commbench.training.ring_attention import CPGPT, GroupRing

        n = world.world_size
        cp = self.degree(n)
        reason = self.layout_error(n)
        if reason:
            raise ValueError(reason)
        rank = dist.get_rank()
        groups = [dist.new_group(list(range(g * cp, g * cp + cp))) for g in range(n // cp)]  # collective: every rank
        ranks = self.data_ranks(rank, n)
        return CPGPT(model, GroupRing(groups[rank // cp], ranks, rank), getattr(torch, self.wire_dtype_name))

    def pipeline_step(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        scale: float,
        autocast: Callable[[], Any],
        scaler: Any = None,
    ) -> torch.Tensor | None:
        """Forward and backward of this rank's chunk, then the gradients averaged over the world; its chunk's loss."""
        import torch

        rank: Any = model
        sl = rank.chunk(int(x.shape[1]))
        xc, yc = x[:, sl], y[:, sl]
        if scaler is not None:
            scale *= float(scaler.scale(torch.ones((), device=x.device)))
        with autocast():
            logits = rank(xc)
        value = loss(logits, yc)
        (value * scale).backward()
        from commbench.training.tp_pp_dp import average_local_grads

        average_local_grads(rank, None)  # over the world
        return value.detach()


def _itemsize(name: str) -> int:
    import torch

    return int(torch.empty((), dtype=getattr(torch, name)).element_size())


def _cp(name: str, description: str, wire: str, autocast: str | None = None) -> Policy:
    return Policy(
        name=name, family="cp", description=description, sharding=ContextParallel(wire_dtype_name=wire),
        autocast_name=autocast, reference=None if name == "cp_fp32" else "cp_fp32",
    )  # fmt: skip


_POLICIES = (
    _cp("cp_fp32", "context parallel (ring attention over cp_degree ranks, data parallel over the rest), fp32; K/V sent fp32", FP32),
    _cp("cp_bf16comm", "context parallel (ring attention), fp32 compute; K/V and their gradients sent bf16", BF16),
    _cp("cp_bf16", "context parallel (ring attention), autocast bf16; K/V and their gradients sent bf16", BF16, BF16),
)  # fmt: skip
for _p in _POLICIES:
    register_policy(_p)
