"""The `[training]` suite table as a typed config: known keys, types, ranges, defaults.

`TrainingConfig.from_dict(table)` validates a parsed TOML table at suite load; every problem raises one
ValueError naming the key, the bad value and the valid choices (the CLI turns it into exit code 2).
The defaults are a tiny GPT that runs every policy on 2 CPU ranks in well under a minute.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from commbench.training.models import MODELS, check_shape
from commbench.training.policies import list_policies


def _positive_int(name: str, v: Any, lo: int = 1) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"training.{name}={v!r} is not valid; expected {_DOCS[name]}")


def _positive_float(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"training.{name}={v!r} is not valid; expected {_DOCS[name]}")
    return float(v)


@dataclass(kw_only=True, slots=True)
class TrainingConfig:
    """The validated `[training]` table (field order is the table's key order in metadata)."""

    model: str = "gpt"
    """Model to train: gpt, mlp or convnet."""
    policies: list[str] | str = "all"
    """"all" or a list of policy names; resolved to the list of names."""
    steps: int = 5
    """Measured steps per policy (int >= 1)."""
    warmup_steps: int = 2
    """Steps before timing starts (int >= 1; the last one carries the memory measurement)."""
    batch_size: int = 8
    """Samples per rank per step (int >= 1)."""
    seq_len: int = 32
    """Tokens per sample for the gpt (int >= 1)."""
    d_model: int = 64
    """Width: embedding (gpt), hidden size (mlp) or channels (convnet) (int >= 1)."""
    n_layers: int = 2
    """Blocks (int >= 1)."""
    n_heads: int = 4
    """Attention heads for the gpt (int >= 1, divides d_model)."""
    vocab: int = 128
    """Vocabulary (gpt) or number of classes (mlp, convnet) (int >= 2)."""
    seed: int = 0
    """Seed for weights and data (int >= 0)."""
    lr: float = 1e-3
    """AdamW learning rate (float > 0)."""
    loss_multiplier: float = 1.0
    """Factor applied to the loss before backward (float > 0; tiny values emulate tiny gradients)."""
    init_std: float | None = None
    """Optional std for all weight matrices (float > 0), default: torch's init."""
    measure_memory: bool = True
    """Measure peak memory on the last warm-up step (bool)."""

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"training.model={self.model!r} is not valid; valid: {', '.join(MODELS)}")
        for name in ("steps", "warmup_steps", "batch_size", "seq_len", "d_model", "n_layers", "n_heads"):
            _positive_int(name, getattr(self, name))
        _positive_int("vocab", self.vocab, 2)
        _positive_int("seed", self.seed, 0)
        self.lr = _positive_float("lr", self.lr)
        self.loss_multiplier = _positive_float("loss_multiplier", self.loss_multiplier)
        if self.init_std is not None:
            _positive_float("init_std", self.init_std)
        if not isinstance(self.measure_memory, bool):
            raise ValueError(f"training.measure_memory={self.measure_memory!r} is not valid; expected true or false")
        self.policies = _resolve_policies(self.policies)
        check_shape(self)

    @classmethod
    def from_dict(cls, table: Mapping[str, Any]) -> TrainingConfig:
        """Validate a parsed `[training]` table; unknown keys raise ValueError listing the valid ones."""
        if not isinstance(table, Mapping):
            raise ValueError(f"[training] must be a table, got {type(table).__name__}")
        keys = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(table) - set(keys))
        if unknown:
            raise ValueError(f"unknown key training.{unknown[0]}; valid keys: {', '.join(keys)}")
        return cls(**table)

    @classmethod
    def coerce(cls, value: TrainingConfig | Mapping[str, Any]) -> TrainingConfig:
        """A config as given, or validated from a table (tests and scripts pass plain dicts)."""
        return value if isinstance(value, cls) else cls.from_dict(value)

    def to_dict(self) -> dict[str, Any]:
        """The table with every default filled in (what metadata records)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainingConfig:
        """A re-validated copy with `changes`."""
        return dataclasses.replace(self, **changes)


_DOCS: dict[str, str] = {
    "policies": '"all" or a list of policy names',
    "steps": "measured steps per policy (int >= 1)",
    "warmup_steps": "steps before timing starts (int >= 1; the last one carries the memory measurement)",
    "batch_size": "samples per rank per step (int >= 1)",
    "seq_len": "tokens per sample for the gpt (int >= 1)",
    "d_model": "width: embedding (gpt), hidden size (mlp) or channels (convnet) (int >= 1)",
    "n_layers": "blocks (int >= 1)",
    "n_heads": "attention heads for the gpt (int >= 1, divides d_model)",
    "vocab": "vocabulary (gpt) or number of classes (mlp, convnet) (int >= 2)",
    "seed": "seed for weights and data (int >= 0)",
    "lr": "AdamW learning rate (float > 0)",
    "loss_multiplier": "factor applied to the loss before backward (float > 0; tiny values emulate tiny gradients)",
    "init_std": "optional std for all weight matrices (float > 0), default: torch's init",
}
"""The "expected ..." half of each error message (kept word for word from the dict-based validator)."""


def _resolve_policies(value: Any) -> list[str]:
    valid = list_policies()
    if value == "all":
        return valid
    if isinstance(value, str):
        value = [value]
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"training.policies={value!r} is not valid; expected {_DOCS['policies']}")
    for name in value:
        if name not in valid:
            raise ValueError(f"training.policies: unknown policy {name!r}; valid: all, {', '.join(valid)}")
    if len(set(value)) != len(value):
        raise ValueError(f"training.policies lists a policy twice: {value!r}")
    return list(value)
