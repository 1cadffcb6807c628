"""The training tables as typed records: one `TrainingSummary` per policy, one `TrainingStep` per step.

Columns and their order are those of `training.csv` / `training_steps.csv`. Imports neither torch nor
pandas (views load these tables too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from commbench.records import Record, col

_NAN = math.nan


@dataclass(kw_only=True, slots=True)
class TrainingSummary(Record):
    """One policy's run: speed, memory, communication and numerics against the fp32 baseline."""

    TABLE: ClassVar[str] = "training"

    policy: str = col("stable policy name (commbench.training.policies)")
    family: str = col("policy family: ddp, fsdp1, fsdp2, hsdp or zero")
    description: str = col("one-line description of the policy")
    comm_dtype: str = col("dtype the gradients are communicated in (fp32, bf16, fp16, fp8_e4m3)")
    model: str = col("model trained: gpt, mlp or convnet")
    params: int | None = col("trainable parameters, Psi (count)", None)
    world_size: int = col("ranks in the group (count)")
    backend: str = col("torch.distributed backend (gloo, nccl)")
    device: str = col("torch device the ranks trained on")
    steps: int = col("measured (non-warm-up) steps (count)")
    warmup_steps: int | None = col("warm-up steps before the measured ones (count)", None)
    step_time_us_p50: float = col("median step time over measured steps, max over ranks, microseconds", _NAN)
    step_time_us_p95: float = col("95th percentile step time, max over ranks, microseconds", _NAN)
    step_time_us_ci_low: float = col("lower end of the 95 % interval of step_time_us_p50, microseconds", _NAN)
    step_time_us_ci_high: float = col("upper end of the 95 % interval of step_time_us_p50, microseconds", _NAN)
    samples_per_s: float = col("samples per second over all ranks at the median step time", _NAN)
    tokens_per_s: float = col("tokens per second over all ranks at the median step time", _NAN)
    peak_mem_bytes: float = col("measured peak memory of one step, max over ranks, bytes", _NAN)
    peak_mem_kind: str | None = col("how peak_mem_bytes was measured (cuda_allocator, cpu_heap, cpu_memtracker)", None)
    model_state_bytes: int | None = col("analytic model-state bytes per rank (params + grads + optimizer)", None)
    model_state_kind: str | None = col("how model_state_bytes was obtained (analytic)", None)
    comm_bytes_per_step: float = col("measured bus bytes per measured step, per rank, bytes", _NAN)
    comm_bytes_expected: float = col("formula bus bytes per step, per rank, bytes", _NAN)
    comm_wire_bytes_per_step: float = col("bytes a rank really sends per step on this backend, bytes", _NAN)
    nodes: int | None = col("nodes the ranks ran on (distinct host names) (count)", None)
    comm_bytes_intra_per_step: float = col(
        "measured bus bytes per step of collectives whose group stays on one node, per rank, bytes", _NAN
    )
    comm_bytes_inter_per_step: float = col(
        "measured bus bytes per step of collectives whose group spans nodes, per rank, bytes", _NAN
    )
    comm_bytes_inter_expected: float = col("formula bus bytes per step crossing nodes, per rank, bytes", _NAN)
    comm_inter_by_op: str | None = col('measured inter-node bus bytes per step by "op:dtype", JSON', None)
    comm_by_op: str | None = col('measured bus bytes per step by "op:dtype", JSON', None)
    comm_expected_by_op: str | None = col('formula bus bytes per step by "op:dtype", JSON', None)
    final_loss: float = col("loss of the last step (mean over ranks)", _NAN)
    final_loss_drift: float = col("final_loss minus the fp32 baseline's at the same step", _NAN)
    max_grad_norm_drift: float = col("largest |relative gradient-norm drift| against fp32 over the steps", _NAN)
    skipped_steps: int | None = col("steps the loss scaler skipped (count)", None)
    nonfinite_steps: int | None = col("steps with a non-finite loss or gradient (count)", None)
    underflow_frac: float = col("mean fraction of gradient elements lost to underflow (0..1)", _NAN)
    speedup_vs_fp32: float = col("fp32 baseline median step time over this one's (ratio)", _NAN)
    speedup_ci_low: float = col("lower end of speedup_vs_fp32's 95 % interval", _NAN)
    speedup_ci_high: float = col("upper end of speedup_vs_fp32's 95 % interval", _NAN)
    speedup_significant: bool | None = col("True when speedup_vs_fp32's interval excludes 1", None)
    mem_saved_vs_fp32: float = col("1 - peak memory / the fp32 baseline's (fraction)", _NAN)
    comm_saved_vs_fp32: float = col("1 - comm bytes per step / the fp32 baseline's (fraction)", _NAN)
    warnings: str = col("pitfalls detected, '; '-separated")
    notes: str = col("remarks on the run (codec source, backend quirks), '; '-separated")
    error: str = col("the exception that stopped this policy, or empty")


@dataclass(kw_only=True, slots=True)
class TrainingStep(Record):
    """One training step of one policy."""

    TABLE: ClassVar[str] = "training_steps"

    policy: str = col("stable policy name")
    step: int = col("step index from 0, warm-up steps included")
    warmup: bool = col("a warm-up step (not timed into the summary)")
    loss: float = col("loss, mean over ranks")
    grad_norm: float = col("global gradient L2 norm after communication")
    step_time_us: float = col("forward + backward + optimizer step, max over ranks, microseconds")
    skipped: bool = col("the loss scaler skipped this step (lowered its scale)")
    nonfinite: bool = col("non-finite loss or gradient at this step")
    underflow_frac: float = col("fraction of gradient elements lost to underflow in the lowest precision (0..1)")
    loss_drift: float = col("loss minus the fp32 baseline's at the same step")
    grad_norm_drift: float = col("(grad_norm - fp32 grad_norm) / fp32 grad_norm at the same step")
    comm_bytes: float = col("bus bytes counted this step, per rank, bytes")
