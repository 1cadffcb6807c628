"""Training section of commbench: DDP / FSDP1 / FSDP2 / ZeRO steps under precision policies.

Public API (used by the suite runner):
- `list_policies()` -> stable policy names (documented in `commbench.training.policies`).
- `TrainingConfig.from_dict(d)` -> the validated `[training]` table; ValueError on bad input.
- `run_training(config, *, device, on_policy_done=None, skip=(), hosts=None)` -> (TrainingSummary records, TrainingStep records).
- `gain_table(summary)` -> the "performance gain" table (pure pandas, for views).

`run_training` is imported lazily so that views importing `gain_table` do not pull in torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from commbench.training.config import TrainingConfig
from commbench.training.policies import list_policies
from commbench.training.tables import bf16_vs_fp16, gain_table

if TYPE_CHECKING:
    import torch

    from commbench.training.records import TrainingStep, TrainingSummary

__all__ = ["TrainingConfig", "bf16_vs_fp16", "gain_table", "list_policies", "run_training"]


def run_training(
    section: TrainingConfig | Mapping[str, Any],
    *,
    device: torch.device,
    on_policy_done: Callable[[list[TrainingSummary], list[TrainingStep]], None] | None = None,
    skip: Collection[str] = (),
    hosts: Sequence[str] | None = None,
) -> tuple[list[TrainingSummary], list[TrainingStep]]:
    """Run every policy of a `[training]` section (see `commbench.training.runner.run_training`)."""
    from commbench.training.runner import run_training as _run

    return _run(section, device=device, on_policy_done=on_policy_done, skip=skip, hosts=hosts)
