"""The training precision-policy registry: stable names -> how a model is wrapped, cast, scaled and reduced.

Names are stable because reports and `training.csv` rows use them:

DDP (family "ddp"; every DDP policy uses `gradient_as_bucket_view=True` and a Python comm hook, so
the gradient all-reduce goes through `dist.all_reduce` where it can be counted; the non-compressing
policies use torch's own `default_hooks.allreduce_hook`, the same mean all-reduce as the builtin):
  fp32               fp32 compute, fp32 all-reduce (the baseline every drift is measured against)
  amp_bf16           autocast bf16, fp32 gradients and all-reduce
  amp_fp16           autocast fp16 + GradScaler
  amp_fp16_noscaler  autocast fp16 without loss scaling (the pitfall: gradients underflow)
  fp16_hook          fp32 compute, gradients all-reduced in fp16 (our hook, like fp16_compress_hook)
  bf16_hook          fp32 compute, gradients all-reduced in bf16 (our hook: torch's bf16_compress_hook
                     refuses to run without NCCL)
  fp8_hook           fp32 compute, gradients reduced as fp8 e4m3 with per-chunk tensor scaling
                     (all_to_all of bytes + scales, fp32 sum, re-encode, all_gather)
FSDP2 (family "fsdp2": `fully_shard` per block then the root, `MixedPrecisionPolicy`):
  fsdp2_bf16_fp32reduce  params bf16, gradient reduce-scatter fp32
  fsdp2_bf16             params bf16, reduce-scatter bf16
  fsdp2_fp16_scaler      params fp16, reduce-scatter fp16, ShardedGradScaler
FSDP1 (family "fsdp1": FULL_SHARD, `MixedPrecision(param_dtype, reduce_dtype, buffer_dtype)`):
  fsdp1_bf16             MixedPrecision(bf16, fp32, bf16)  (buffers in bf16: BatchNorm statistics too)
ZeRO stages in torch (family "zero"):
  zero1_fp32, zero1_bf16  ZeroRedundancyOptimizer over DDP (bf16: autocast bf16 + bf16 gradient hook)
  zero2_fp32, zero2_bf16  FSDP1 SHARD_GRAD_OP (no resharding after forward); bf16: MixedPrecision(bf16, bf16)
  zero3_fp32, zero3_bf16  FSDP1 FULL_SHARD; bf16: MixedPrecision(bf16, bf16)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    """One precision policy. Pure description: `runner.py` turns it into a wrapped model and a step."""

    name: str
    """Stable registry name (used in rows and reports)."""
    family: str
    """ddp | fsdp1 | fsdp2 | zero."""
    description: str
    """One line for reports."""
    wrapper: str = "ddp"
    """ddp | fsdp1 | fsdp2: which torch wrapper runs it (zero policies use ddp or fsdp1)."""
    autocast: torch.dtype | None = None
    """Autocast compute dtype, or None for no autocast."""
    scaler: str | None = None
    """None | "grad" (torch.amp.GradScaler) | "sharded" (ShardedGradScaler)."""
    hook: str | None = None
    """DDP gradient hook: None (torch's allreduce_hook) | "fp16" | "bf16" | "fp8"."""
    zero_optimizer: bool = False
    """Wrap the optimizer in ZeroRedundancyOptimizer (ZeRO-1)."""
    param_dtype: torch.dtype = torch.float32
    """FSDP: dtype the parameters are all-gathered and computed in."""
    reduce_dtype: torch.dtype = torch.float32
    """FSDP: dtype of the gradient reduce-scatter."""
    buffer_dtype: torch.dtype | None = None
    """FSDP1: dtype of buffers (None keeps fp32)."""
    reshard_after_forward: bool = True
    """FSDP: free the gathered parameters after forward (FULL_SHARD / ZeRO-3) or keep them (ZeRO-2)."""

    @property
    def comm_dtype(self) -> str:
        """Dtype the gradients are communicated in (for reports)."""
        if self.wrapper == "ddp":
            return {None: "fp32", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8_e4m3"}[self.hook]
        return _SHORT[self.reduce_dtype]

    @property
    def grad_low_dtype(self) -> str:
        """The lowest precision a gradient passes through (compute or communication): fp32|bf16|fp16|fp8_e4m3."""
        order = ["fp8_e4m3", "fp16", "bf16", "fp32"]
        cands = [self.comm_dtype]
        if self.autocast is not None:
            cands.append(_SHORT[self.autocast])
        if self.wrapper != "ddp":
            cands.append(_SHORT[self.param_dtype])
        return min(cands, key=order.index)

    @property
    def uses_fp16(self) -> bool:
        """True when any fp16 arithmetic or communication touches the gradients."""
        return self.grad_low_dtype == "fp16"


_SHORT: dict[torch.dtype, str] = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}

BF16, FP16 = torch.bfloat16, torch.float16

_POLICIES: tuple[Policy, ...] = (
    Policy(name="fp32", family="ddp", description="DDP, fp32 compute and all-reduce (baseline)"),
    Policy(name="amp_bf16", family="ddp", description="DDP, autocast bf16", autocast=BF16),
    Policy(name="amp_fp16", family="ddp", description="DDP, autocast fp16 + GradScaler", autocast=FP16, scaler="grad"),
    Policy(
        name="amp_fp16_noscaler",
        family="ddp",
        description="DDP, autocast fp16 without loss scaling (pitfall)",
        autocast=FP16,
    ),
    Policy(name="fp16_hook", family="ddp", description="DDP, fp32 compute, fp16 gradient all-reduce hook", hook="fp16"),
    Policy(name="bf16_hook", family="ddp", description="DDP, fp32 compute, bf16 gradient all-reduce hook", hook="bf16"),
    Policy(
        name="fp8_hook",
        family="ddp",
        description="DDP, fp32 compute, fp8 e4m3 (scaled) gradient reduction hook",
        hook="fp8",
    ),
    Policy(
        name="fsdp2_bf16_fp32reduce",
        family="fsdp2",
        wrapper="fsdp2",
        description="FSDP2, params bf16, reduce-scatter fp32",
        param_dtype=BF16,
        reduce_dtype=torch.float32,
    ),
    Policy(
        name="fsdp2_bf16",
        family="fsdp2",
        wrapper="fsdp2",
        description="FSDP2, params bf16, reduce-scatter bf16",
        param_dtype=BF16,
        reduce_dtype=BF16,
    ),
    Policy(
        name="fsdp2_fp16_scaler",
        family="fsdp2",
        wrapper="fsdp2",
        description="FSDP2, params fp16, reduce-scatter fp16, ShardedGradScaler",
        param_dtype=FP16,
        reduce_dtype=FP16,
        scaler="sharded",
    ),
    Policy(
        name="fsdp1_bf16",
        family="fsdp1",
        wrapper="fsdp1",
        description="FSDP1 FULL_SHARD, MixedPrecision(param bf16, reduce fp32, buffers bf16)",
        param_dtype=BF16,
        reduce_dtype=torch.float32,
        buffer_dtype=BF16,
    ),
    Policy(
        name="zero1_fp32", family="zero", description="ZeRO-1: ZeroRedundancyOptimizer + DDP, fp32", zero_optimizer=True
    ),
    Policy(
        name="zero1_bf16",
        family="zero",
        description="ZeRO-1: ZeroRedundancyOptimizer + DDP, autocast bf16, bf16 hook",
        zero_optimizer=True,
        autocast=BF16,
        hook="bf16",
    ),
    Policy(
        name="zero2_fp32",
        family="zero",
        wrapper="fsdp1",
        description="ZeRO-2: FSDP1 SHARD_GRAD_OP, fp32",
        reshard_after_forward=False,
    ),
    Policy(
        name="zero2_bf16",
        family="zero",
        wrapper="fsdp1",
        description="ZeRO-2: FSDP1 SHARD_GRAD_OP, params/reduce bf16",
        reshard_after_forward=False,
        param_dtype=BF16,
        reduce_dtype=BF16,
    ),
    Policy(name="zero3_fp32", family="zero", wrapper="fsdp1", description="ZeRO-3: FSDP1 FULL_SHARD, fp32"),
    Policy(
        name="zero3_bf16",
        family="zero",
        wrapper="fsdp1",
        description="ZeRO-3: FSDP1 FULL_SHARD, params/reduce bf16",
        param_dtype=BF16,
        reduce_dtype=BF16,
    ),
)

POLICIES: dict[str, Policy] = {p.name: p for p in _POLICIES}


def list_policies() -> list[str]:
    """Stable policy names in registry order (fp32 first: it is the baseline)."""
    return list(POLICIES)


def get_policy(name: str) -> Policy:
    """Look a policy up by name; unknown names raise ValueError listing the valid ones."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown training policy {name!r}; valid: {', '.join(POLICIES)}") from None
