"""Models and synthetic data for the training section: a GPT-style decoder, an MLP, a conv net with BatchNorm.

The models are registered in `MODELS` (a `ModelKind` each: build, synthetic batch, tokens per sample, shape
check), so a plugin adds one with a `MODELS.register` call. Every model exposes `blocks` (an `nn.ModuleList`): FSDP wraps each block as its own unit and the
root last, so the all-gather/reduce-scatter formulas can be written per unit.
Data come from a generator seeded by (seed, rank, step), never from the global RNG, so every policy
sees exactly the same batches and drift against the fp32 baseline means something.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from commbench.core.registry import Registry

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from commbench.training.config import TrainingConfig


IMAGE_SIZE = 16


def _nets() -> Any:
    from commbench.training import nets

    return nets


def _one_token(cfg: TrainingConfig) -> int:
    return 1


def _any_shape(cfg: TrainingConfig) -> None:
    return None


@dataclass(frozen=True, slots=True)
class ModelKind:
    """One trainable model: how to build it and its synthetic data from a `[training]` section. Everything the
    runner needs of a model is asked of this object, so a plugin's model is one `MODELS.register` call."""

    name: str
    """The `training.model` value (recorded in `training.csv`)."""
    build: Callable[[TrainingConfig], nn.Module]
    """The model (its weights drawn from the global RNG, which `build_model` seeds); it exposes `blocks`."""
    batch: Callable[[TrainingConfig, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    """(inputs, targets) of one rank's step, drawn from the generator only (seeded by seed, rank and step)."""
    tokens_per_sample: Callable[[TrainingConfig], int] = _one_token
    """Tokens in one sample (the `tokens_per_s` column)."""
    check: Callable[[TrainingConfig], None] = _any_shape
    """Raise ValueError when the section's shape does not fit the model."""


def _gpt_batch(cfg: TrainingConfig, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    import torch
    # Next-token prediction on a random walk over the vocabulary: learnable, not pure noise.
    b, vocab, t = int(cfg.batch_size), int(cfg.vocab), int(cfg.seq_len) + 1
    steps = torch.randint(-2, 3, (b, t), generator=g)
    start = torch.randint(0, vocab, (b, 1), generator=g)
    seq = (start + steps.cumsum(dim=1)) % vocab
    return seq[:, :-1], seq[:, 1:]


def _gpt_check(cfg: TrainingConfig) -> None:
    if int(cfg.d_model) % int(cfg.n_heads) != 0:
        raise ValueError(f"training.d_model={cfg.d_model} must be divisible by training.n_heads={cfg.n_heads}")


def _mlp_batch(cfg: TrainingConfig, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    import torch
    b, vocab = int(cfg.batch_size), int(cfg.vocab)
    x = torch.randn(b, int(cfg.d_model), generator=g)
    return x, (x[:, :vocab].argmax(dim=1) + (x.sum(dim=1) > 0).long()) % vocab


def _mlp_check(cfg: TrainingConfig) -> None:
    if int(cfg.vocab) > int(cfg.d_model):
        raise ValueError(f"training.vocab={cfg.vocab} (classes) must be <= training.d_model={cfg.d_model} for the mlp")


def _convnet_batch(cfg: TrainingConfig, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    import torch
    x = torch.randn(int(cfg.batch_size), 3, IMAGE_SIZE, IMAGE_SIZE, generator=g)
    return x, (x.mean(dim=(1, 2, 3)) * 1e3).long() % int(cfg.vocab)


MODELS: Registry[ModelKind] = Registry("model")
"""The models by `training.model` name, in registration order."""
for _kind in (
    ModelKind(
        name="gpt",
        build=lambda c: _nets().GPT(int(c.vocab), int(c.seq_len), int(c.d_model), int(c.n_layers), int(c.n_heads)),
        batch=_gpt_batch,
        tokens_per_sample=lambda c: int(c.seq_len),
        check=_gpt_check,
    ),
    ModelKind(
        name="mlp",
        build=lambda c: _nets().MLP(int(c.d_model), int(c.d_model), int(c.n_layers), int(c.vocab)),
        batch=_mlp_batch,
        check=_mlp_check,
    ),
    ModelKind(
        name="convnet",
        build=lambda c: _nets().ConvNet(int(c.d_model), int(c.n_layers), int(c.vocab)),
        batch=_convnet_batch,
    ),
):
    MODELS.register(_kind.name, _kind)


def build_model(cfg: TrainingConfig) -> nn.Module:
    """Build the section's model with the section's seed (identical weights on every rank)."""
    import torch
    torch.manual_seed(int(cfg.seed))
    model = MODELS.get(cfg.model).build(cfg)
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
    import torch
    g = torch.Generator().manual_seed(int(cfg.seed) * 1_000_003 + rank * 10_007 + step)
    x, y = MODELS.get(cfg.model).batch(cfg, g)
    return x.to(device), y.to(device)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (in fp32 whatever the logits dtype: autocast does the same)."""
    import torch.nn.functional as F
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def tokens_per_sample(cfg: TrainingConfig) -> int:
    """Tokens in one sample: seq_len for the GPT, 1 otherwise."""
    return MODELS.get(cfg.model).tokens_per_sample(cfg)


def param_count(model: nn.Module) -> int:
    """Number of trainable parameters (Psi)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
