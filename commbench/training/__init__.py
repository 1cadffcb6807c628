"""Training section of commbench: DDP / FSDP1 / FSDP2 / ZeRO steps under precision policies.

Public API (used by the suite runner):
- `list_policies()` -> stable policy names (documented in `commbench.training.policies`).
- `validate_training_section(d)` -> the `[training]` table with defaults filled; ValueError on bad input.
- `run_training(section, *, device, on_policy_done=None)` -> (summary_rows, step_rows), on every rank.
- `gain_table(summary)` -> the "performance gain" table (pure pandas, for views).

`run_training` is imported lazily so that views importing `gain_table` do not pull in torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from commbench.training.policies import list_policies
from commbench.training.section import validate_training_section
from commbench.training.tables import bf16_vs_fp16, gain_table

if TYPE_CHECKING:
    import torch

__all__ = ["bf16_vs_fp16", "gain_table", "list_policies", "run_training", "validate_training_section"]


def run_training(
    section: dict[str, Any],
    *,
    device: torch.device,
    on_policy_done: Callable[[list[dict[str, Any]], list[dict[str, Any]]], None] | None = None,
    skip: Collection[str] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run every policy of a `[training]` section (see `commbench.training.runner.run_training`)."""
    from commbench.training.runner import run_training as _run

    return _run(section, device=device, on_policy_done=on_policy_done, skip=skip)
