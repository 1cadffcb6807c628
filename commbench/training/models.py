"""Models and synthetic data for the training section: a GPT-style decoder, an MLP, a conv net with BatchNorm.

Every model exposes `blocks` (an `nn.ModuleList`): FSDP wraps each block as its own unit and the
root last, so the all-gather/reduce-scatter formulas can be written per unit.
Data come from a generator seeded by (seed, rank, step), never from the global RNG, so every policy
sees exactly the same batches and drift against the fp32 baseline means something.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

if TYPE_CHECKING:
    from commbench.training.config import TrainingConfig

MODELS: tuple[str, ...] = ("gpt", "mlp", "convnet")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention (one fused qkv projection, like nanoGPT)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        k = k.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        v = v.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


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


IMAGE_SIZE = 16


def build_model(cfg: TrainingConfig) -> nn.Module:
    """Build the section's model with the section's seed (identical weights on every rank)."""
    torch.manual_seed(int(cfg.seed))
    name = cfg.model
    d, layers, vocab = int(cfg.d_model), int(cfg.n_layers), int(cfg.vocab)
    if name == "gpt":
        model: nn.Module = GPT(vocab, int(cfg.seq_len), d, layers, int(cfg.n_heads))
    elif name == "mlp":
        model = MLP(d, d, layers, vocab)
    elif name == "convnet":
        model = ConvNet(d, layers, vocab)
    else:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    init_std = cfg.init_std
    if init_std is not None:
        # Shrinks every weight: a tiny-gradient regime where fp16 without loss scaling underflows.
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, float(init_std))
    return model


def make_batch(cfg: TrainingConfig, rank: int, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic (inputs, targets) for `rank` at `step`; depends only on (seed, rank, step)."""
    g = torch.Generator().manual_seed(int(cfg.seed) * 1_000_003 + rank * 10_007 + step)
    b, vocab = int(cfg.batch_size), int(cfg.vocab)
    name = cfg.model
    if name == "gpt":
        # Next-token prediction on a random walk over the vocabulary: learnable, not pure noise.
        t = int(cfg.seq_len) + 1
        steps = torch.randint(-2, 3, (b, t), generator=g)
        start = torch.randint(0, vocab, (b, 1), generator=g)
        seq = (start + steps.cumsum(dim=1)) % vocab
        x, y = seq[:, :-1], seq[:, 1:]
    elif name == "mlp":
        x = torch.randn(b, int(cfg.d_model), generator=g)
        y = (x[:, :vocab].argmax(dim=1) + (x.sum(dim=1) > 0).long()) % vocab
    else:
        x = torch.randn(b, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g)
        y = (x.mean(dim=(1, 2, 3)) * 1e3).long() % vocab
    return x.to(device), y.to(device)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (in fp32 whatever the logits dtype: autocast does the same)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def tokens_per_sample(cfg: TrainingConfig) -> int:
    """Tokens in one sample: seq_len for the GPT, 1 otherwise."""
    return int(cfg.seq_len) if cfg.model == "gpt" else 1


def param_count(model: nn.Module) -> int:
    """Number of trainable parameters (Psi)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def check_shape(cfg: TrainingConfig) -> None:
    """Raise ValueError when the model shape is inconsistent (e.g. d_model not divisible by n_heads)."""
    if cfg.model == "gpt" and int(cfg.d_model) % int(cfg.n_heads) != 0:
        raise ValueError(f"training.d_model={cfg.d_model} must be divisible by training.n_heads={cfg.n_heads}")
    if cfg.model == "mlp" and int(cfg.vocab) > int(cfg.d_model):
        raise ValueError(f"training.vocab={cfg.vocab} (classes) must be <= training.d_model={cfg.d_model} for the mlp")
    if not math.isfinite(float(cfg.lr)) or float(cfg.lr) <= 0:
        raise ValueError(f"training.lr must be a positive number, got {cfg.lr!r}")
