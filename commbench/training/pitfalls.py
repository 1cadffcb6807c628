"""Pitfall detectors: turn what a policy's steps measured into the warnings carried by `training.csv`.

Pure functions over measurements (no torch.distributed), so each detector is tested on its own:
- fp16 without loss scaling: gradient elements lost to underflow beyond the fp32 baseline's own
  zeros, or non-finite steps;
- BatchNorm running in fp16 (its input) or with low-precision running statistics;
- gradients left in low precision after communication when the parameters are fp32;
- a plain GradScaler where sharded (FSDP/ZeRO-3) fp16 needs ShardedGradScaler (the loss-scaling
  strategy's own `pitfall`, asked through `Policy.pitfalls`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from commbench.training.policies import Policy

UNDERFLOW_WARN_FRAC = 0.01
"""Warn when more than this fraction of gradient elements underflow beyond the fp32 baseline's zeros."""

_LOW = {torch.float16, torch.bfloat16}


def fp16_unscaled(
    policy: Policy, underflow_frac: float, baseline_underflow_frac: float, nonfinite_steps: int, skipped_steps: int
) -> str | None:
    """fp16 arithmetic or communication on gradients without a loss scaler, and it shows (any format whose range
    needs loss scaling: `Underflow.needs_loss_scaling`)."""
    fmt = policy.loss_scaling_format
    if fmt is None or policy.loss_scaling.scales:
        return None
    excess = underflow_frac - baseline_underflow_frac
    if excess <= UNDERFLOW_WARN_FRAC and nonfinite_steps == 0:
        return None
    return (
        f"{fmt} without loss scaling: {underflow_frac:.1%} of gradient elements underflow to zero in {fmt} "
        f"(fp32 baseline {baseline_underflow_frac:.1%}), {nonfinite_steps} non-finite and {skipped_steps} "
        "skipped steps; use a GradScaler"
    )


def batchnorm_low_precision(seen: Iterable[tuple[str, str]]) -> list[str]:
    """BatchNorm calls seen as (input dtype, running-statistics dtype) names; fp16 input or low-precision stats."""
    out = []
    for in_dt, buf_dt in sorted(set(seen)):
        if in_dt == "float16" or buf_dt in ("float16", "bfloat16"):
            out.append(f"BatchNorm running in low precision (input {in_dt}, running statistics {buf_dt})")
    return out


def low_precision_grads(pairs: Iterable[tuple[torch.dtype, torch.dtype]], asked: bool = False) -> str | None:
    """(parameter dtype, gradient dtype) pairs seen after communication; warn on fp32 params with fp16/bf16 grads."""
    if asked:
        return None
    low = sorted({str(g).removeprefix("torch.") for p, g in pairs if p == torch.float32 and g in _LOW})
    if not low:
        return None
    return f"gradients left in {', '.join(low)} after communication (parameters are float32)"
