"""Training section of commbench: DDP / FSDP1 / FSDP2 / ZeRO steps under precision policies.

Public API (used by the suite runner):
- `list_policies()` -> stable policy names (documented in `commbench.training.policies`).
- `TrainingConfig.from_dict(d)` -> the validated `[training]` table; ValueError on bad input.
- `run_training(config, *, device, on_policy_done=None, skip=(), hosts=None)` -> (TrainingSummary records, TrainingStep records).
- `gain_table(summary)` -> the "performance gain" table (pure pandas, for views).

`run_training` is imported lazily so that views importing `gain_table` do not pull in torch.distributed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from commbench.training.config import TrainingConfig
from commbench.training.policies import list_policies
from commbench.training.tables import bf16_vs_fp16, gain_table

if TYPE_CHECKING:
    from commbench.training.runner import run_training

__all__ = ["TrainingConfig", "bf16_vs_fp16", "gain_table", "list_policies", "run_training"]


def __getattr__(name: str) -> Any:
    """`run_training`, imported on first use (PEP 562): the runner's own function, not a copy of its signature."""
    if name == "run_training":
        from commbench.training.runner import run_training

        return run_training
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
