"""The small trainable models (torch modules) that `commbench.training.models` registers.

Kept apart from the registry so that naming and validating a model (a suite's `[training]` table, `--help`,
`list`) imports no torch; a model is built, and this module imported, only when a policy runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from commbench.training.pp_wire import pack, unpack


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention (one fused qkv projection, like nanoGPT)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Sizes from the qkv output and `n_heads`, not from x: under tensor parallelism each rank holds
        # n_heads / tp whole heads of q, k and v (`tensor_parallel.py` sets `n_heads` and orders the rows).
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=2)
        h = self.n_heads
        q, k, v = (z.reshape(b, t, h, z.shape[-1] // h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: attention and a 4x MLP, each with a residual."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A small GPT-style decoder: token + position embeddings, blocks, final LayerNorm, untied head."""

    def __init__(self, vocab: int, seq_len: int, d_model: int, n_layers: int, n_heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class MLP(nn.Module):
    """Input projection, `n_layers` hidden Linear+GELU blocks, classifier head."""

    def __init__(self, d_in: int, d_model: int, n_layers: int, n_classes: int) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, d_model)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(d_model, d_model), nn.GELU()) for _ in range(n_layers))
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.inp(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class ConvNet(nn.Module):
    """Conv-BatchNorm-ReLU blocks on 16x16 images, global pooling, linear classifier (the BatchNorm pitfall)."""

    def __init__(self, channels: int, n_layers: int, n_classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())
            for _ in range(n_layers)
        )
        self.head = nn.Linear(channels, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        x = x.mean(dim=(2, 3))
        # BatchNorm may run as an fp32 unit under FSDP mixed precision: meet the head in its dtype.
        return self.head(x.to(self.head.weight.dtype))


class GPTStage(nn.Module):
    """One pipeline stage of a `GPT`: blocks [start, stop) of it, with the embeddings on the first stage and the final
    LayerNorm and head on the last (the modules are the model's own: the weights are the unsplit model's).

    A stage that is not the last sends its output cast to `wire_dtype_name` (the dtype crossing the boundary, so its
    gradient comes back in it too); a stage that is not the first computes from its input cast back to fp32, as the
    unsplit model's residual stream is (fp32 under CPU autocast as well). With a `codec` the boundary carries its
    wire bytes instead, both ways (`pp_wire.pack` / `unpack`). `ctx` (set per step) is the autocast context the
    forward runs in."""

    def __init__(
        self, model: Any, start: int, stop: int, *, first: bool, last: bool, wire_dtype_name: str, codec: str | None = None
    ) -> None:
        super().__init__()
        import contextlib

        from commbench.measure.codec import get_codec

        self.first, self.last = first, last
        self.wire_dtype = getattr(torch, wire_dtype_name)
        self.codec = get_codec(codec) if codec else None
        self.hidden = int(model.ln_f.normalized_shape[0])
        self.tok = model.tok if first else None
        self.pos = model.pos if first else None
        self.blocks = nn.ModuleList(list(model.blocks)[start:stop])
        self.ln_f = model.ln_f if last else None
        self.head = model.head if last else None
        self.ctx: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.ctx():
            if self.tok is not None and self.pos is not None:
                x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
            else:
                x = x.float() if self.codec is None else unpack(x, self.codec, self.hidden)
            for block in self.blocks:
                x = block(x)
            if self.ln_f is not None and self.head is not None:
                return self.head(self.ln_f(x))
        return x.to(self.wire_dtype) if self.codec is None else pack(x, self.codec)


class PipelineRank(nn.Module):
    """This rank's part of a pipeline: its stage modules (`stages`: (global stage index, `GPTStage`), one or, for the
    interleaved and zero-bubble schedules, several; `submod` holds them), their `PipelineStage`s and the schedule
    running them (built on the first step, when the loss is known); under PP x DP the group its gradients are
    averaged over after each step (`dp_group`). `index` is this rank's place in the pipeline, `stages` the
    pipeline's ranks."""

    def __init__(
        self,
        stages: list[tuple[int, GPTStage]],
        index: int,
        ranks: int,
        microbatches: int,
        schedule: Any,
        group: Any,
        device: torch.device,
        dp_group: Any = None,
    ) -> None:
        super().__init__()
        self.submod = nn.ModuleList([stage for _, stage in stages])
        self.stage_ids = [s for s, _ in stages]
        self.total = len(stages) * ranks  # every rank holds as many stages
        self.index, self.stages, self.microbatches, self.schedule_plan = index, ranks, microbatches, schedule
        self.group, self.device = group, device
        self.dp_group = dp_group
        self._schedule: Any = None
        self._loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        self._scale = 1.0
        from commbench.training.p2p_timing import StageClock

        self.clock = StageClock()
        """Busy and wall time of each step (`training.p2p_timing`)."""
        self.p2p: list[dict[str, float]] = []
        """Per timed step: this rank's point-to-point send seconds by direction (`p2p_timing.time_transfers`)."""

    def _scaled_loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self._loss is None:
            raise RuntimeError("PipelineRank: the schedule ran outside step()")
        return self._loss(out, target) * self._scale

    def step(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        scale: float,
        autocast: Callable[[], Any],
        timed: bool = False,
    ) -> torch.Tensor:
        """One schedule step over `microbatches` micro-batches of (x, y) (under PP x DP, then the gradients averaged
        over the stage's data-parallel group); the mean micro-batch loss on the last stage (the full batch's mean loss:
        the micro-batches are equal), zero elsewhere."""
        from torch.distributed import pipelining

        if self._schedule is None:
            built = [
                pipelining.PipelineStage(mod, s, self.total, self.device, group=self.group)
                for s, mod in zip(self.stage_ids, self.submod, strict=True)
            ]
            for stage in built:
                self.clock.wrap(stage)
            cls = getattr(pipelining, self.schedule_plan.torch_class)
            self._schedule = cls(built if len(built) > 1 or self.schedule_plan.placement != "single" else built[0],
                                 n_microbatches=self.microbatches, loss_fn=self._scaled_loss)  # fmt: skip
        self._loss, self._scale = loss, scale
        for mod in self.submod:
            mod.ctx = autocast  # type: ignore[assignment]
        losses: list[torch.Tensor] = []  # the schedule's own: one per micro-batch, on the last stage's rank
        first, last = 0 in self.stage_ids, self.total - 1 in self.stage_ids
        from commbench.training.comm import CommCounter

        counter = CommCounter.active()
        if counter is not None:  # a timed send carries the phase of the compute before it (p2p_timing)
            counter.send_label = lambda: self.clock.phase
            wire = "uint8" if any(getattr(m, "codec", None) is not None for m in self.submod) else None
            counter.send_dtype = lambda: wire  # codec bytes travel in a float32 view (pp_wire)
        self.clock.start()
        if first and last:
            self._schedule.step(x, target=y, losses=losses)
        elif first:
            self._schedule.step(x)
        elif last:
            self._schedule.step(target=y, losses=losses)
        else:
            self._schedule.step()
        self.clock.stop(timed)
        if self.dp_group is not None:
            self._average_grads()
        if not losses:
            return torch.zeros((), device=self.device)
        return torch.stack([loss.detach() for loss in losses]).mean() / scale

    def _average_grads(self) -> None:
        """The stage's gradients all-reduced over its data-parallel group as one flat buffer, then averaged (DDP's
        result, without DDP: see pipeline_parallel's docstring)."""
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        params = [p for p in self.submod.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.dp_group)
        flat /= dist.get_world_size(self.dp_group)
        for p, g in zip(params, _unflatten_dense_tensors(flat, grads), strict=True):
            p.grad = g

    def forward(self, *args: Any) -> Any:
        raise RuntimeError("a pipeline stage runs through its schedule (PipelineRank.step), not forward()")
