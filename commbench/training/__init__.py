"""Training section of commbench: DDP / FSDP1 / FSDP2 / ZeRO steps under precision policies.

Public API (used by the suite runner):
- `list_policies()` -> stable policy names (documented in `commbench.training.policies`).
- `TrainingConfig.from_dict(d)` -> the validated `[training]` table; ValueError on bad input.
- `run_training(config, *, device, on_policy_done=None, skip=(), hosts=None)` -> (TrainingSummary records, TrainingStep records).

Everything but `list_policies` is imported on first use (PEP 562): the config pulls in the models (torch), the
runner torch.distributed; `commbench list` pays for neither. The views over training.csv rows live in
`commbench.views.training_tables` (views never import this package).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from commbench.training.policies import list_policies

if TYPE_CHECKING:
    from commbench.training.config import TrainingConfig
    from commbench.training.runner import run_training

__all__ = ["TrainingConfig", "list_policies", "run_training"]

_LAZY = {
    "TrainingConfig": "commbench.training.config",
    "run_training": "commbench.training.runner",
}
"""Public name -> the module that owns it (the module's own object, not a copy of its signature)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
