"""Activation memory per rank of a transformer, as Megatron-LM counts it, for an attention kernel and a recompute mode.

Sources: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", section 4 and
Table 2 (bytes per layer with 16-bit activations, ``t`` the tensor-parallel degree, ``a`` heads):

==========================================  ===========================
no parallelism                              ``s*b*h*(34 + 5*a*s/h)``
tensor parallel (TP)                        ``s*b*h*(10 + 24/t + 5*a*s/(h*t))``
TP + sequence parallel (SP)                 ``s*b*h/t*(34 + 5*a*s/h)``
TP + selective recompute                    ``s*b*h*(10 + 24/t)``
TP + SP + selective recompute               ``s*b*h*34/t``
full recompute                              ``2*s*b*h`` (the layer's input; ``/t`` with SP)
==========================================  ===========================

and Megatron-LM's ``megatron/training/theoretical_memory_usage.py`` (``compute_activation_memory``), which this
module follows for what the table leaves out:

* the MLP width: ``34 = 18 + 4*ffn/h`` at ``ffn = 4h`` (Megatron writes ``18 + 4*ffn/h``); without SP the part not
  split by TP stays 10 (LayerNorm inputs, dropout masks, the attention and MLP inputs) and the split part is
  ``8 + 4*ffn/h``. A gated MLP's extra tensor is not counted (Megatron does not either).
* the attention kernel: ``5*a*s^2*b`` (QK^T, softmax, its dropout mask and output) exists only with an eager
  attention; flash attention keeps no ``s x s`` tensor (its softmax statistics, ``a*s*b`` floats, are left out), so
  with ``flash`` (the default) no recompute and selective recompute keep the same bytes.
* the pipeline: the first stage holds its ``L/p`` layers for ``min(m, p)`` micro-batches in flight under 1F1B, so the
  per-layer bytes count ``L * min(1, m/p)`` layers (``m`` micro-batches per step).
* the embedding: its input ``8*s*b`` (int64 token ids) and dropout ``s*b*h``, for ``p`` micro-batches in flight;
  the output layer and loss, on a single stage only (``p = 1``): ``4*s*b*h*(1 + V/h)`` (fp32 logits).
* everything divided by ``t`` (Megatron divides its whole sum by the TP size).

The per-layer and embedding-dropout constants assume 2-byte activations; other compute dtypes scale them by
``itemsize/2`` (token ids and fp32 logits keep their bytes).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Attention:
    """An attention kernel: whether it keeps the ``s x s`` scores for backward."""

    name: str
    keeps_scores: bool
    description: str
    backward_core: float = 2.0
    """Forward-equivalents of the attention core its backward computes: 2 (dV, dP, dQ, dK from the kept scores);
    flash attention recomputes QK^T from Q and K first, 5 matmuls to forward's 2: 2.5 (Dao-AILab/flash-attention
    ``benchmarks/benchmark_flash_attention.py``, ``flops(..., mode="bwd")`` = 2.5 x forward)."""

    def score_bytes(self, s: int, b: int, heads: int) -> float:
        """Bytes per layer of the scores (16-bit; Korthikanti section 4.1: ``5*a*s^2*b``), before TP."""
        return 5.0 * heads * s * s * b if self.keeps_scores else 0.0


ATTENTIONS: dict[str, Attention] = {
    a.name: a
    for a in (
        Attention("flash", False, "flash attention: no s x s tensor kept, QK^T recomputed in backward (Dao et al. "
                  "2022)", backward_core=2.5),
        Attention("eager", True, "eager attention: QK^T, softmax, dropout mask and output kept (5*a*s^2*b)"),
    )
}
"""Attention name (the CLI's --attention) -> kernel."""


@dataclass(frozen=True, slots=True)
class Recompute:
    """A recompute mode: what a layer keeps from forward to backward (bytes per layer, 16-bit)."""

    name: str
    keeps_layer: bool
    """The layer's activations are kept (none, selective); False: only its input (full)."""
    keeps_scores: bool
    """The attention scores are kept when the kernel has them (False: recomputed, selective)."""
    extra_forward: float
    """Forward passes added per step, as a fraction of one (full: 1)."""
    description: str

    def layer_bytes(
        self, s: int, b: int, h: int, ffn: int, heads: int, t: int, sp: bool, attention: Attention
    ) -> float:
        """Bytes per layer and rank (module docstring's table)."""
        if not self.keeps_layer:
            return 2.0 * s * b * h / (t if sp else 1)
        scores = attention.score_bytes(s, b, heads) / t if self.keeps_scores else 0.0
        if sp:
            return s * b * h * (18.0 + 4.0 * ffn / h) / t + scores
        return s * b * h * (10.0 + (8.0 + 4.0 * ffn / h) / t) + scores


RECOMPUTES: dict[str, Recompute] = {
    r.name: r
    for r in (
        Recompute("none", True, True, 0.0, "no recomputation"),
        Recompute("selective", True, False, 0.0, "selective: the attention core recomputed (Korthikanti section 5)"),
        Recompute("full", False, False, 1.0, "full: each layer's forward rerun in backward; its input kept"),
    )
}
"""Recompute name (the CLI's --recompute) -> mode."""


@dataclass(frozen=True, slots=True)
class Activations:
    """Activation bytes per rank, by part."""

    layers: float
    embedding: float
    logits: float

    @property
    def total(self) -> float:
        return self.layers + self.embedding + self.logits


def activation_bytes(
    *, seq: int, micro_batch: int, hidden: int, ffn: int, heads: int, layers: int, vocab: int,
    tp: int = 1, pp: int = 1, microbatches: int = 1, sequence_parallel: bool = True,
    attention: Attention = ATTENTIONS["flash"], recompute: Recompute = RECOMPUTES["none"], elem_bytes: float = 2.0,
) -> Activations:  # fmt: skip
    """Activation bytes of the most loaded (first) pipeline stage's rank (module docstring). Sequence parallelism
    applies only with ``tp > 1``."""
    s, b, h, t, p = seq, micro_batch, hidden, tp, pp
    sp = sequence_parallel and t > 1
    scale = elem_bytes / 2.0
    in_flight = min(1.0, microbatches / p) if p > 1 else 1.0
    per_layer = recompute.layer_bytes(s, b, h, ffn, heads, t, sp, attention)
    layer_part = per_layer * layers * in_flight * scale
    embedding = (8.0 * s * b * p + s * b * h * p * scale) * in_flight / t
    logits = 4.0 * s * b * h * (1.0 + vocab / h) / t if p == 1 else 0.0
    return Activations(layer_part, embedding, logits)


__all__ = ["ATTENTIONS", "RECOMPUTES", "Activations", "Attention", "Recompute", "activation_bytes"]
