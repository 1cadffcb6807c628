"""A parallel layout (TP x CP x DP x PP, virtual stages, micro-batch, global batch, recompute): its rules, its pipeline
split and the FLOPs each stage runs.

Rank order is Megatron-LM's: TP fastest, then CP, then DP, then PP (``initialize_model_parallel``'s default
``tp-cp-ep-dp-pp``), so a TP group is ``tp`` consecutive ranks, a CP group ``cp`` ranks ``tp`` apart, a DP group
``dp`` ranks ``tp*cp`` apart and a PP stage boundary ``tp*cp*dp`` ranks apart; ranks are placed node by node.

FLOPs (Narayanan et al. 2021, appendix; Korthikanti et al. 2022, section 6), per token of one layer's forward:

* attention projections ``2*h*h*(2 + 2*kv/a)`` (Q and the output h x h, K and V h x h*kv/a: grouped-query heads),
* the attention core ``4*s*h`` (QK^T and the product with V, the full s x s square as Megatron counts it),
* the MLP ``2*h*ffn*k`` with ``k`` = 3 for a gated (SwiGLU) MLP, 2 for GeLU,

and the logits ``2*h*V`` once per token. Backward is twice the forward, except flash attention's, which recomputes
QK^T first: its core's backward is 2.5 forwards (:attr:`~commbench.planning.activations.Attention.backward_core`).
Model FLOPs (MFU's numerator) are 3 passes; hardware FLOPs add the recomputation: ``full`` reruns every layer's
forward (Megatron's ``96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h))`` at ffn = 4h, kv = a: 4 passes of the layers, 3 of the
logits),
``selective`` reruns the attention core (``4*s*h`` per layer). For GPT-3 175B the model count per token is
``72*h^2*l*(1 + s/(6h)) + 6*h*V``, the same formula's three-pass form.

The pipeline split: ``split`` (layers per stage, given) or the default that balances each stage's compute with the
logits on the last stage (the embedding lookup is no FLOPs; its memory counts on the first stage): layers are
dealt one at a time to the least loaded stage, which for unit-cost layers is the split with the smallest largest
stage. With ``vpp`` virtual stages each stage's layers are dealt to its ``vpp`` chunks as evenly as they go.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from commbench.planning.activations import RECOMPUTES, Attention, Recompute
from commbench.planning.presets import ModelShape

MAX_GPUS = 2**22
"""A layout over more GPUs than this is refused as absurd (four million)."""


@dataclass(frozen=True, slots=True)
class Parallel:
    """One parallel layout: the degrees, the batch and the recompute mode."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    vpp: int = 1
    """Virtual pipeline stages per stage (interleaved 1F1B; 1: plain 1F1B)."""
    micro_batch: int = 1
    """Sequences per micro-batch."""
    global_batch: int = 1
    """Sequences per optimizer step (dp x micro-batches x micro_batch)."""
    recompute: Recompute = RECOMPUTES["none"]
    split: tuple[int, ...] | None = None
    """Layers per pipeline stage (None: balanced, module docstring)."""
    sp: bool = False
    """Sequence parallelism with TP (Megatron's ``--sequence-parallel``): TP's all-reduces become all-gather +
    reduce-scatter (the same ring steps and bytes) and the norms' and dropouts' activations are split by TP."""

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def microbatches(self) -> int:
        """Micro-batches per step and DP rank (gradient accumulation steps)."""
        return self.global_batch // (self.dp * self.micro_batch)


def _int(name: str, v: object, lo: int = 1, hi: int = MAX_GPUS) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..{hi}, got {v!r}")
    return v


def check_layout(p: Parallel, m: ModelShape, gpus: int | None = None) -> None:
    """ValueError (one line naming the rule) for a layout that cannot run ``m``: TP dividing the heads and the kv
    heads, PP at most the layers (and the layers at least pp x vpp chunks), CP dividing the sequence, a split that
    sums to the layers, tp*pp*dp*cp equal to ``gpus`` when given, a global batch of at least one micro-batch per DP
    rank."""
    for name in ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "global_batch"):
        _int(name, getattr(p, name), hi=MAX_GPUS if name != "global_batch" else 2**40)
    if p.gpus > MAX_GPUS:
        raise ValueError(f"tp*pp*dp*cp = {p.gpus} GPUs is more than {MAX_GPUS}: not a cluster anyone runs")
    if m.heads % p.tp or m.kv_heads % p.tp:
        valid = [d for d in range(1, m.kv_heads + 1) if m.kv_heads % d == 0 and m.heads % d == 0]
        raise ValueError(f"--tp {p.tp} must divide the heads ({m.heads}) and kv heads ({m.kv_heads}); valid: "
                         f"{', '.join(map(str, valid))}")  # fmt: skip
    if p.pp > m.layers:
        raise ValueError(f"--pp {p.pp} is more stages than the model's {m.layers} layers")
    if p.vpp > 1 and p.pp < 2:
        raise ValueError(f"--vpp {p.vpp} needs pipeline parallelism (--pp >= 2)")
    if p.pp * p.vpp > m.layers + 2:  # the embedding and the head may be chunks of their own (Llama 3, section 3.3.2)
        raise ValueError(f"--pp {p.pp} x --vpp {p.vpp} = {p.pp * p.vpp} chunks is more than the {m.layers} layers "
                         "+ the embedding and the head")  # fmt: skip
    if m.seq % p.cp or (p.cp > 1 and (m.seq // p.cp) % 2):
        raise ValueError(f"--cp {p.cp} must divide the sequence {m.seq} into chunks of an even length")
    if p.split is not None:
        if len(p.split) != p.pp or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in p.split):
            raise ValueError(f"the pipeline split must give {p.pp} stage sizes >= 1, got {list(p.split)}")
        if sum(p.split) != m.layers:
            raise ValueError(f"the pipeline split {list(p.split)} sums to {sum(p.split)}, not the {m.layers} layers")
    if gpus is not None and p.gpus != gpus:
        raise ValueError(f"tp*pp*dp*cp = {p.tp}*{p.pp}*{p.dp}*{p.cp} = {p.gpus} is not the {gpus} GPUs "
                         "(--nodes x --gpus-per-node)")  # fmt: skip
    if p.global_batch < p.dp * p.micro_batch:
        raise ValueError(f"a global batch of {p.global_batch} sequences holds less than one micro-batch of "
                         f"{p.micro_batch} per DP rank ({p.dp})")  # fmt: skip
    if p.vpp > 1 and p.microbatches % p.pp:
        raise ValueError(f"interleaved 1F1B (--vpp {p.vpp}) needs micro-batches ({p.microbatches}) divisible by "
                         f"--pp {p.pp} (Megatron-LM's rule)")  # fmt: skip


def round_batch(global_batch: int, dp: int, micro_batch: int, multiple: int = 1) -> tuple[int, str]:
    """The global batch as a whole number of micro-batches per DP rank (the nearest multiple of ``multiple``:
    interleaving needs micro-batches divisible by PP) and the one line that says so when it differs ("" when it is
    already whole). ValueError when it holds less than that one multiple: a batch is never rounded up past it."""
    unit = dp * micro_batch
    if global_batch < unit * multiple:
        raise ValueError(f"a global batch of {global_batch} sequences holds less than {multiple} micro-batch(es) of "
                         f"{micro_batch} per DP rank ({dp})")  # fmt: skip
    m = max(multiple, round(global_batch / (unit * multiple)) * multiple)
    used = m * unit
    if used == global_batch:
        return used, ""
    return used, (f"global batch {global_batch} sequences priced as {used} (= {m} micro-batches of {micro_batch} "
                  f"x {dp} DP ranks, the nearest whole number)")  # fmt: skip


# ----------------------------------------------------------------------------------------------- FLOPs
@dataclass(frozen=True, slots=True)
class LayerFlops:
    """FLOPs per token of one layer's forward, by part, and of the logits (module docstring)."""

    proj: float
    core: float
    mlp: float
    logits: float

    @property
    def layer(self) -> float:
        return self.proj + self.core + self.mlp

    def model_per_token(self, layers: int) -> float:
        """Model FLOPs per token of a step (3 passes, no recomputation): MFU's numerator."""
        return 3.0 * (layers * self.layer + self.logits)

    def layer_passes(self, recompute: Recompute, attention: Attention) -> float:
        """Hardware FLOPs per token of one layer per step: forward, backward (the attention core's as the kernel
        computes it, :attr:`~commbench.planning.activations.Attention.backward_core`) and what ``recompute``
        reruns."""
        extra = self.layer if not recompute.keeps_layer else (0.0 if recompute.keeps_scores else self.core)
        return 3.0 * self.layer + (attention.backward_core - 2.0) * self.core + extra


def layer_flops(m: ModelShape) -> LayerFlops:
    """The model's per-token forward FLOPs per layer and of the logits."""
    h, s = m.hidden, m.seq
    return LayerFlops(
        proj=2.0 * h * h * (2.0 + 2.0 * m.kv_heads / m.heads),
        core=4.0 * s * h,
        mlp=2.0 * h * m.ffn * (3.0 if m.gated_mlp else 2.0),
        logits=2.0 * h * m.vocab,
    )


def stage_split(m: ModelShape, p: Parallel, f: LayerFlops | None = None) -> tuple[int, ...]:
    """Layers per pipeline stage: the given split, else the balanced one (module docstring)."""
    if p.split is not None:
        return tuple(p.split)
    if p.pp == 1:
        return (m.layers,)
    f = f or layer_flops(m)
    return _balanced(m.layers, p.pp, f.logits / f.layer)


@functools.lru_cache(maxsize=4096)
def _balanced(layers: int, pp: int, head: float) -> tuple[int, ...]:
    """The balanced split of ``layers`` over ``pp`` stages, the logits (``head`` layers' worth) on the last: each
    layer to the least loaded stage (a heap of (load, stage); ties to the earlier stage), the first ones in bulk
    below the last stage's balanced share, so O(pp log pp) for any layer count."""
    base = max(min(layers // pp, int((layers + head) / pp - head)) - 1, 0)
    counts = [base] * pp
    loads = [(float(base), i) for i in range(pp - 1)] + [(base + head, pp - 1)]
    heapq.heapify(loads)
    for _ in range(layers - base * pp):
        load, i = heapq.heappop(loads)
        counts[i] += 1
        heapq.heappush(loads, (load + 1.0, i))
    if min(counts) < 1:  # every stage holds a layer
        return even_split(layers, pp)
    return tuple(counts)


def even_split(layers: int, pp: int) -> tuple[int, ...]:
    """Layers dealt evenly, the first stages one more where they do not divide."""
    q, r = divmod(layers, pp)
    return tuple(q + (1 if i < r else 0) for i in range(pp))


def parse_split(text: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """``"13,12,12,11"`` (or a list) -> a split; ValueError (one line) for anything else."""
    if text is None:
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        out = tuple(int(x) for x in items)
    except (TypeError, ValueError):
        raise ValueError(f"the pipeline split takes layers per stage, e.g. 13,12,12,11; got {text!r}") from None
    return out


def interleave_memory_factor(pp: int, vpp: int) -> float:
    """Activations the first stage holds under interleaved 1F1B relative to plain 1F1B (Megatron-LM
    ``theoretical_memory_usage.py``: ``1 + (pp - 1) / (pp * vpp)``)."""
    return 1.0 + (pp - 1) / (pp * vpp) if vpp > 1 else 1.0


def bubble_fraction(pp: int, vpp: int, microbatches: int) -> float:
    """The schedule's bubble over its ideal compute (Narayanan et al. 2021, section 2.2): ``(p-1)/m`` for 1F1B,
    ``(p-1)/(v*m)`` interleaved."""
    return (pp - 1) / (vpp * microbatches) if microbatches else math.nan


__all__ = [
    "MAX_GPUS", "LayerFlops", "Parallel", "bubble_fraction", "check_layout", "even_split", "interleave_memory_factor",
    "layer_flops", "parse_split", "round_batch", "stage_split",
]  # fmt: skip
