"""Model presets: published transformer shapes, overridable field by field, and the parameter counts that follow.

A plan of a real model needs more than Psi: layers and hidden size decide the FSDP units (one per layer, so the
comm buffers are a layer's, not the whole model's), heads decide which tensor-parallel degrees exist, the vocabulary
the logits' activations, the sequence the tokens of a micro-batch. Each preset cites where its shape comes from.

Parameters are counted as Megatron-LM's ``theoretical_memory_usage.py`` counts them
(``compute_weight_and_optimizer_memory``): per layer ``2*h*(ffn*g + n) + 2*h*h*(1 + kv/heads)`` with ``g = 3/2`` for a
gated (SwiGLU) MLP, else 1, and ``n`` = 1 for RMSNorm, 2 for LayerNorm; plus the final norm ``n*h`` and the
embeddings ``h*V`` (twice when the output layer is untied). Biases are left out, as there (GPT-3's are 0.01 %).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A decoder-only transformer as the plan sees it."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    """Key/value heads (grouped-query attention; = heads for multi-head attention)."""
    ffn: int
    """MLP hidden size (the gate/up projection's width for a gated MLP)."""
    vocab: int
    seq: int
    """Training sequence length (tokens per sample)."""
    gated_mlp: bool = True
    """SwiGLU: three h x ffn matrices instead of two."""
    norm_params: int = 1
    """Parameters per hidden unit of one norm: 1 for RMSNorm, 2 for LayerNorm (weight and bias)."""
    tied_embeddings: bool = False
    """The output layer shares the input embedding's weights."""
    biases: bool = False
    """Count the Linear layers' biases (Megatron's count leaves them out; commbench's own GPT has them)."""
    source: str = ""

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer layer (Megatron-LM's count, module docstring)."""
        h = self.hidden
        gated = 1.5 if self.gated_mlp else 1.0
        attn = 2 * h * h * (1 + self.kv_heads / self.heads)
        bias = 0.0
        if self.biases:  # q, k, v and the output projection; the MLP's up (and gate) and down projections
            bias = 2 * h + 2 * h * self.kv_heads / self.heads + self.ffn * (2 if self.gated_mlp else 1) + h
        return int(round(2 * h * (self.ffn * gated + self.norm_params) + attn + bias))

    @property
    def embedding_params(self) -> int:
        """One embedding table, h x V."""
        return self.hidden * self.vocab

    @property
    def params(self) -> int:
        """Psi: layers, final norm and the embedding (twice when untied)."""
        emb = self.embedding_params * (1 if self.tied_embeddings else 2)
        return self.layers * self.layer_params + self.norm_params * self.hidden + emb


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        # meta-llama/Llama-2-7b-hf config.json: num_hidden_layers 32, hidden_size 4096, num_attention_heads 32,
        # num_key_value_heads 32, intermediate_size 11008, vocab_size 32000, max_position_embeddings 4096,
        # rms_norm, tie_word_embeddings false (Touvron et al. 2023, Table 1: 4k context).
        ModelShape("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096,
                   source="meta-llama/Llama-2-7b-hf config.json"),
        # meta-llama/Meta-Llama-3-8B config.json: 32 layers, hidden 4096, 32 heads, 8 kv heads, intermediate 14336,
        # vocab 128256, max_position_embeddings 8192, untied.
        ModelShape("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, source="meta-llama/Meta-Llama-3-8B config.json"),
        # meta-llama/Meta-Llama-3-70B config.json: 80 layers, hidden 8192, 64 heads, 8 kv heads, intermediate 28672,
        # vocab 128256, max_position_embeddings 8192, untied.
        ModelShape("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192,
                   source="meta-llama/Meta-Llama-3-70B config.json"),
        # Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1 (GPT-3 175B: n_layers 96,
        # d_model 12288, n_heads 96, d_head 128, n_ctx 2048; d_ff = 4 d_model); GPT-2's BPE vocabulary of 50257;
        # LayerNorm, GeLU MLP, tied input/output embeddings (Radford et al. 2019).
        ModelShape("gpt3-175b", 96, 12288, 96, 96, 49152, 50257, 2048, gated_mlp=False, norm_params=2,
                   tied_embeddings=True, source="Brown et al. 2020, Table 2.1"),
    )
}  # fmt: skip
"""Preset name (the CLI's --model-preset) -> its published shape."""

SHAPE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq")
"""The fields a shape given without a preset must name (the CLI's --layers, --hidden, ...)."""


def model_shape(preset: str | None = None, **overrides: Any) -> ModelShape | None:
    """The preset with ``overrides`` (None values ignored) applied field by field; without a preset, the shape the
    overrides give, which must then be complete (``kv_heads`` defaults to ``heads``). None when neither a preset
    nor any shape field is given. ValueError (one line) for an unknown preset, an unknown field, a partial shape,
    a non-positive field, or heads that do not divide the hidden size or that the kv heads do not divide."""
    given = {k: v for k, v in overrides.items() if v is not None}
    known = {f.name for f in fields(ModelShape)} - {"name", "source"}
    for k in given:
        if k not in known:
            raise ValueError(f"unknown model field {k!r}; valid: {', '.join(sorted(known))}")
    if preset is not None:
        if preset not in MODELS:
            raise ValueError(f"unknown model preset {preset!r}; valid: {', '.join(MODELS)}")
        base = MODELS[preset]
        shape = replace(base, **given) if given else base
        if given:
            shape = replace(
                shape, source=f"{base.source}; overridden: {', '.join(f'{k}={v}' for k, v in given.items())}"
            )
    else:
        if not any(k in given for k in SHAPE_FIELDS if k != "seq"):  # a sequence alone is tokens, not a shape
            return None
        if "heads" in given and "kv_heads" not in given:
            given["kv_heads"] = given["heads"]
        missing = [k for k in SHAPE_FIELDS if k not in given and k != "kv_heads"]  # kv heads default to heads
        if missing:
            raise ValueError(
                f"a model shape without --model-preset needs {', '.join('--' + k.replace('_', '-') for k in missing)} "
                f"too (or a preset: {', '.join(MODELS)})"
            )
        shape = ModelShape(name="custom", source="given", **given)
    for k in SHAPE_FIELDS:
        v = getattr(shape, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{k} must be an integer >= 1, got {v!r}")
    if shape.hidden % shape.heads:
        raise ValueError(f"hidden={shape.hidden} must be divisible by heads={shape.heads}")
    if shape.heads % shape.kv_heads:
        raise ValueError(f"heads={shape.heads} must be divisible by kv_heads={shape.kv_heads}")
    return shape


__all__ = ["MODELS", "SHAPE_FIELDS", "ModelShape", "model_shape"]
