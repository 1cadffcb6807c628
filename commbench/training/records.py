"""A policy's measurements (`PolicyRun`, its `StepRecord`s) and the `training.csv` / `training_steps.csv` rows made of
them: drift against the fp32 baseline at the same step, gains against the policy's reference, percentiles.

Numerics are compared with the fp32 baseline, which always runs first: loss_drift = loss - loss_fp32 at the same
step; grad_norm_drift = (grad_norm - grad_norm_fp32) / grad_norm_fp32. Step times are sampled policy after policy,
so against the fp32 baseline the speed-up is an unpaired ratio of the two medians' order-statistic intervals
(`commbench.core.stats`), claimed at 95 % only from 6 steps each; a compared policy's speed-up against its reference
comes from paired rounds interleaved with a second session of the reference (`pairing`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from commbench.core import stats
from commbench.core.records import TrainingStep, TrainingSummary
from commbench.training import pitfalls as pitfalls_mod
from commbench.training.config import TrainingConfig
from commbench.training.models import tokens_per_sample
from commbench.training.pairing import Paired
from commbench.training.policies import BASELINE, Policy


@dataclass
class StepRecord:
    """What one step measured (already reduced over ranks where that is meaningful)."""

    step: int
    warmup: bool
    loss: float
    grad_norm: float
    step_time_us: float
    skipped: bool
    nonfinite: bool
    underflow_frac: float
    comm: dict[str, float]
    comm_links: dict[str, dict[str, float]] | None = None
    """`comm` split by link ("intra" / "inter")."""



@dataclass
class PolicyRun:
    """Everything measured for one policy (rank-reduced), before drift against the baseline."""

    policy: Policy
    steps: list[StepRecord]
    psi: int
    peak_mem_bytes: float
    peak_mem_kind: str
    model_state_bytes: int
    comm_expected: dict[str, float]
    comm_wire_bytes: float
    notes: list[str]
    pitfalls: list[str]
    error: str = ""
    nodes: int = 1
    comm_expected_inter: dict[str, float] | None = None
    comm_time_us: stats.Estimate | None = None
    """Communication time per step from the timed extra steps (`PolicySession.timed_comm_step`)."""
    paired: Paired | None = None
    """The paired rounds against the policy's reference (`pairing`); None where it was not compared."""
    profile: dict[str, Any] | None = None
    """Summary fields the sharding measured itself (`Sharding.step_profile`: a pipeline's bubble, P2P time)."""



def mean_comm(records: list[StepRecord], link: str | None = None) -> dict[str, float]:
    """Mean bus bytes per step by "op:dtype" (of one link's collectives when `link` is given)."""
    if not records:
        return {}
    per = [r.comm if link is None else (r.comm_links or {}).get(link, {}) for r in records]
    keys = sorted({k for c in per for k in c})
    return {k: sum(c.get(k, 0.0) for c in per) / len(records) for k in keys}


def _pct(values: list[float], q: float) -> float:
    vals = sorted(v for v in values if math.isfinite(v))
    if not vals:
        return math.nan
    # linear interpolation between closest ranks (numpy's default "linear" method)
    pos = (len(vals) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


# --- rows --------------------------------------------------------------------------------------------


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def reference_of(policy: Policy) -> str:
    """The policy a row's low-precision gain is measured against, written into the row so the views need no
    registry: its own `reference` (the full-precision twin of the same parallelism), else the fp32 DDP baseline
    when some stage of it is narrower than fp32 (`Policy.underflow`: it loses elements fp32 keeps), else "" (a
    full-precision policy is a reference, not a gain)."""
    if policy.reference:
        return policy.reference
    low = policy.underflow
    return BASELINE if low.absolute > 0 or low.relative > 0 else ""


def build_rows(
    run: PolicyRun, baseline: PolicyRun | None, section: TrainingConfig, n: int, backend: str, device: torch.device
) -> tuple[TrainingSummary, list[TrainingStep]]:
    """Summary record and step records for one policy, with drift and gains against the fp32 baseline."""
    p = run.policy
    base_steps = {r.step: r for r in baseline.steps} if baseline is not None else {}
    step_rows: list[TrainingStep] = []
    for r in run.steps:
        b = base_steps.get(r.step)
        step_rows.append(
            TrainingStep(
                policy=p.name,
                step=r.step,
                warmup=r.warmup,
                loss=r.loss,
                grad_norm=r.grad_norm,
                step_time_us=r.step_time_us,
                skipped=r.skipped,
                nonfinite=r.nonfinite,
                underflow_frac=r.underflow_frac,
                loss_drift=r.loss - b.loss if b is not None else math.nan,
                grad_norm_drift=(r.grad_norm - b.grad_norm) / b.grad_norm
                if b is not None and b.grad_norm
                else math.nan,
                comm_bytes=sum(r.comm.values()),
            )
        )
    measured = [r for r in run.steps if not r.warmup]
    times = [r.step_time_us for r in measured]
    p50, p95 = _pct(times, 0.5), _pct(times, 0.95)
    samples = int(section.batch_size) * n / (p50 * 1e-6) if p50 and math.isfinite(p50) else math.nan
    comm_by_op = mean_comm(measured)
    comm_inter = mean_comm(measured, "inter")
    comm_total = sum(comm_by_op.values())
    expected_total = sum(run.comm_expected.values())
    skipped = sum(r.skipped for r in run.steps)
    nonfinite = sum(r.nonfinite for r in run.steps)
    underflow = sum(r.underflow_frac for r in run.steps) / len(run.steps) if run.steps else math.nan
    base_under = (
        sum(r.underflow_frac for r in baseline.steps) / len(baseline.steps) if baseline and baseline.steps else 0.0
    )
    pitfalls = list(run.pitfalls)
    msg = pitfalls_mod.fp16_unscaled(p, underflow, base_under, nonfinite, skipped)
    if msg:
        pitfalls.insert(0, msg)
    if comm_by_op and run.comm_expected and not close(comm_by_op, run.comm_expected):
        run.notes.append("measured comm bytes differ from the formula")
    base_final = baseline.steps[-1] if baseline is not None and baseline.steps else None
    final = run.steps[-1] if run.steps else None
    gdrifts = [abs(row.grad_norm_drift) for row in step_rows if math.isfinite(row.grad_norm_drift)]
    base_summary = _base_numbers(baseline, section, n) if baseline is not None else {}
    step_ci = stats.median_ci(times)
    comm_time = run.comm_time_us or stats.Estimate(math.nan, math.nan, math.nan, 0)
    speedup, vs_ref, basis = _speedups(run, baseline, step_ci)
    fields: dict[str, Any] = {
        "policy": p.name,
        "family": p.family,
        "parallelism": p.sharding.parallelism,
        "reference_policy": reference_of(p),
        "description": p.description,
        "comm_dtype": p.comm_dtype,
        "model": section.model,
        "params": run.psi,
        "world_size": n,
        "backend": backend,
        "device": str(device),
        "steps": len(measured),
        "warmup_steps": int(section.warmup_steps),
        "step_time_us_p50": p50,
        "step_time_us_p95": p95,
        "step_time_us_ci_low": step_ci.low,
        "step_time_us_ci_high": step_ci.high,
        "samples_per_s": samples,
        "tokens_per_s": samples * tokens_per_sample(section),
        "peak_mem_bytes": run.peak_mem_bytes,
        "peak_mem_kind": run.peak_mem_kind,
        "model_state_bytes": run.model_state_bytes,
        "model_state_kind": "analytic",
        "comm_bytes_per_step": comm_total,
        "comm_bytes_expected": expected_total,
        "comm_wire_bytes_per_step": run.comm_wire_bytes,
        "nodes": run.nodes,
        "comm_bytes_intra_per_step": sum(mean_comm(measured, "intra").values()),
        "comm_bytes_inter_per_step": sum(comm_inter.values()),
        "comm_bytes_inter_expected": sum((run.comm_expected_inter or {}).values()),
        "comm_inter_by_op": json.dumps(comm_inter, sort_keys=True),
        "comm_by_op": json.dumps(comm_by_op, sort_keys=True),
        "comm_expected_by_op": json.dumps(run.comm_expected, sort_keys=True),
        "comm_time_us": comm_time.value,
        "comm_time_ci_low_us": comm_time.low,
        "comm_time_ci_high_us": comm_time.high,
        "final_loss": final.loss if final else math.nan,
        "final_loss_drift": final.loss - base_final.loss if final and base_final else math.nan,
        "max_grad_norm_drift": max(gdrifts) if gdrifts else math.nan,
        "skipped_steps": skipped,
        "nonfinite_steps": nonfinite,
        "underflow_frac": underflow,
        "speedup_vs_fp32": speedup.value if run.paired and run.paired.reference == BASELINE
        else _ratio(base_summary.get("p50", math.nan), p50),
        "speedup_ci_low": speedup.low,
        "speedup_ci_high": speedup.high,
        "speedup_significant": stats.significant(speedup) if baseline is not None and baseline is not run else None,
        "speedup_vs_reference": vs_ref.value,
        "speedup_ref_ci_low": vs_ref.low,
        "speedup_ref_ci_high": vs_ref.high,
        "speedup_ref_rounds": vs_ref.n if run.paired else None,
        "speedup_ref_basis": basis,
        "speedup_ref_times_us": json.dumps(list(run.paired.reference_times_us)) if run.paired else None,
        "mem_saved_vs_fp32": 1.0 - _ratio(run.peak_mem_bytes, base_summary.get("mem", math.nan)),
        "comm_saved_vs_fp32": 1.0 - _ratio(comm_total, base_summary.get("comm", math.nan)),
        "warnings": "; ".join(pitfalls),
        "notes": "; ".join(run.notes),
        "error": run.error,
        **(run.profile or {}),
    }  # fmt: skip
    summary = TrainingSummary(**fields)
    return summary, step_rows


def _speedups(
    run: PolicyRun, baseline: PolicyRun | None, step_ci: stats.Estimate
) -> tuple[stats.Estimate, stats.Estimate, str]:
    """(speed-up against the fp32 baseline, against the policy's reference, how the latter was formed).

    Against the reference, from the paired rounds (`pairing`) when they ran: the reference's time over the
    policy's, median of the per-round ratios; "paired rounds", or "n too small ..." with no interval below the
    rounds a 95 % interval needs. Against the baseline: the same estimate where the baseline is the reference, else
    the unpaired ratio of the two runs' medians (intervals combined in log space), with no interval where either
    median's own falls short of 95 % (fewer than `stats.MIN_SAMPLES_95` steps)."""
    nan = stats.Estimate(math.nan, math.nan, math.nan, 0)
    vs_ref, basis = nan, ""
    if run.paired is not None:
        vs_ref = stats.claimable(stats.invert(run.paired.ratio))
        enough = vs_ref.n >= stats.MIN_SAMPLES_95 and math.isfinite(vs_ref.low)
        basis = "paired rounds" if enough else stats.too_few_text(vs_ref.n, run.paired.round_steps)
    if baseline is None:
        return nan, vs_ref, basis
    if baseline is run:
        return stats.Estimate(1.0, 1.0, 1.0, 0), vs_ref, basis
    if run.paired is not None and run.paired.reference == BASELINE:
        return vs_ref, vs_ref, basis
    base_ci = stats.median_ci([r.step_time_us for r in baseline.steps if not r.warmup])
    unpaired = stats.invert(stats.ratio_of(step_ci, base_ci))
    if min(step_ci.coverage, base_ci.coverage) < 0.95:
        unpaired = stats.Estimate(unpaired.value, math.nan, math.nan, unpaired.n, 0.0)
    return unpaired, vs_ref, basis


def close(a: dict[str, float], b: dict[str, float]) -> bool:
    keys = set(a) | set(b)
    return all(abs(a.get(k, 0.0) - b.get(k, 0.0)) <= 1e-6 * max(1.0, abs(b.get(k, 0.0))) for k in keys)


def _base_numbers(baseline: PolicyRun, section: TrainingConfig, n: int) -> dict[str, float]:
    measured = [r for r in baseline.steps if not r.warmup]
    return {
        "p50": _pct([r.step_time_us for r in measured], 0.5),
        "mem": baseline.peak_mem_bytes,
        "comm": sum(mean_comm(measured).values()),
    }


def skip_error(name: str, reason: str) -> str:
    """The `error` of a policy skipped before it ran, on every rank (a layout the world cannot form, a package or
    device the policy needs): one line with the reason."""
    return f"{name} skipped: {reason}"


def skipped_before_running(row: Mapping[str, Any]) -> bool:
    """Whether a training row (as a dict) is of a policy skipped before it ran (`skip_error`), not one that failed."""
    return str(row.get("error") or "").startswith(skip_error(str(row.get("policy")), ""))


def error_row(
    policy: Policy, section: TrainingConfig, n: int, backend: str, device: torch.device, err: str,
    agreed_failure: bool = True,
) -> TrainingSummary:
    """The row of a policy skipped on every rank: `error` names the failing ranks and their errors; `warnings`
    says so too (the console prints a row's warnings). Without `agreed_failure` (a layout the world cannot form)
    `err` is the whole line."""
    return TrainingSummary(
        policy=policy.name,
        family=policy.family,
        parallelism=policy.sharding.parallelism,
        reference_policy=reference_of(policy),
        description=policy.description,
        comm_dtype=policy.comm_dtype,
        model=section.model,
        world_size=n,
        backend=backend,
        device=str(device),
        steps=0,
        warnings=f"policy skipped on every rank: {err}" if agreed_failure else err,
        notes="",
        error=err,
    )

