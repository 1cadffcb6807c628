"""Validation of the `[training]` suite table: known keys, types, ranges, defaults.

Every problem raises one ValueError naming the key, the bad value and the valid choices; the CLI
turns it into exit code 2. The defaults are a tiny GPT that runs every policy on 2 CPU ranks in
well under a minute.
"""

from __future__ import annotations

import math
from typing import Any

from commbench.training.models import MODELS, check_shape
from commbench.training.policies import list_policies

DEFAULTS: dict[str, Any] = {
    "model": "gpt",
    "policies": "all",
    "steps": 5,
    "warmup_steps": 2,
    "batch_size": 8,
    "seq_len": 32,
    "d_model": 64,
    "n_layers": 2,
    "n_heads": 4,
    "vocab": 128,
    "seed": 0,
    "lr": 1e-3,
    "loss_multiplier": 1.0,
    "init_std": None,
    "measure_memory": True,
}

_DOC: dict[str, str] = {
    "model": f"one of {', '.join(MODELS)}",
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
    "measure_memory": "measure peak memory on the last warm-up step (bool)",
}

_INTS = ("steps", "warmup_steps", "batch_size", "seq_len", "d_model", "n_layers", "n_heads", "vocab", "seed")
_MIN = {"vocab": 2, "seed": 0}


def validate_training_section(d: dict[str, Any]) -> dict[str, Any]:
    """Validate a `[training]` table and return a new dict with every default filled in."""
    if not isinstance(d, dict):
        raise ValueError(f"[training] must be a table, got {type(d).__name__}")
    unknown = sorted(set(d) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown key training.{unknown[0]}; valid keys: {', '.join(DEFAULTS)}")
    out = {**DEFAULTS, **d}
    if out["model"] not in MODELS:
        raise ValueError(f"training.model={out['model']!r} is not valid; valid: {', '.join(MODELS)}")
    for key in _INTS:
        v = out[key]
        lo = _MIN.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"training.{key}={v!r} is not valid; expected {_DOC[key]}")
    for key in ("lr", "loss_multiplier"):
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"training.{key}={v!r} is not valid; expected {_DOC[key]}")
        out[key] = float(v)
    v = out["init_std"]
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
        raise ValueError(f"training.init_std={v!r} is not valid; expected {_DOC['init_std']}")
    if not isinstance(out["measure_memory"], bool):
        raise ValueError(f"training.measure_memory={out['measure_memory']!r} is not valid; expected true or false")
    out["policies"] = _resolve_policies(out["policies"])
    check_shape(out)
    return out


def _resolve_policies(value: Any) -> list[str]:
    valid = list_policies()
    if value == "all":
        return valid
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"training.policies={value!r} is not valid; expected {_DOC['policies']}")
    for name in value:
        if name not in valid:
            raise ValueError(f"training.policies: unknown policy {name!r}; valid: all, {', '.join(valid)}")
    if len(set(value)) != len(value):
        raise ValueError(f"training.policies lists a policy twice: {value!r}")
    return list(value)
