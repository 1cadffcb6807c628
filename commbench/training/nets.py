"""The small trainable models (torch modules) that `commbench.training.models` registers.

Kept apart from the registry so that naming and validating a model (a suite's `[training]` table, `--help`,
`list`) imports no torch; a model is built, and this module imported, only when a policy runs.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


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
