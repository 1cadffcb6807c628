"""Views over training.csv rows: the gain of each policy against fp32 and BF16 against FP16 side by side.

Pure pandas over the summary rows a run wrote: nothing here runs a policy or imports torch (the views never
import torch.distributed), so the pairs of the side-by-side table come from the rows' names and families.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from commbench.core.units import human_bytes
from commbench.views.rundata import memory_kind_text
from commbench.views.tables import Table, as_float, fmt, frame_table, interval, time_interval, verdict

__all__ = [
    "GAIN_COLUMNS",
    "bf16_vs_fp16",
    "bf16_fp16_pairs",
    "gain_table",
    "training_bf16_fp16_table",
    "training_gain_table",
    "training_speed",
]

GAIN_COLUMNS: tuple[str, ...] = (
    "policy",
    "family",
    "comm_dtype",
    "speedup_vs_fp32",
    "mem_saved_vs_fp32",
    "comm_saved_vs_fp32",
    "final_loss_drift",
    "max_grad_norm_drift",
    "skipped_steps",
    "nonfinite_steps",
    "underflow_frac",
    "warnings",
)

BF16, FP16 = "bf16", "fp16"
"""The two 16-bit formats the side-by-side table pairs, as policy names spell them (amp_bf16, fp16_hook)."""


def gain_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Each policy against DDP fp32: speed-up, memory saved, communication saved, final-loss drift."""
    cols = [c for c in GAIN_COLUMNS if c in summary.columns]
    return summary.loc[:, cols].reset_index(drop=True)


def bf16_fp16_pairs(summary: pd.DataFrame) -> list[tuple[str, str]]:
    """(bf16 policy, fp16 policy) pairs of `summary` that differ only in the 16-bit format, in row order.

    An fp16 policy's counterpart is the longest bf16 policy of the same family whose name is the fp16 name with
    fp16 spelled bf16, or a prefix of it (amp_bf16 for amp_fp16 and amp_fp16_noscaler, fsdp2_bf16 for
    fsdp2_fp16_scaler): read off the rows, so a plugin's pair of policies is paired like the built-in ones.
    """
    if summary.empty or "policy" not in summary.columns:
        return []
    names = [str(p) for p in summary["policy"]]
    family = dict(zip(names, summary["family"].astype(str), strict=True)) if "family" in summary.columns else {}
    bf16 = [p for p in dict.fromkeys(names) if BF16 in p]
    out: list[tuple[str, str]] = []
    for fp in dict.fromkeys(names):
        if FP16 not in fp:
            continue
        target = fp.replace(FP16, BF16)
        cands = [
            bf for bf in bf16 if (target == bf or target.startswith(bf + "_")) and family.get(bf) == family.get(fp)
        ]
        if cands:
            out.append((max(cands, key=len), fp))
    return out


def bf16_vs_fp16(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (bf16 policy, fp16 policy) pair present in `summary`, their gains side by side."""
    by_name = summary.set_index("policy") if "policy" in summary.columns else pd.DataFrame()
    metrics = (
        "speedup_vs_fp32",
        "comm_saved_vs_fp32",
        "final_loss_drift",
        "skipped_steps",
        "nonfinite_steps",
        "underflow_frac",
    )
    rows = []
    for bf, fp in bf16_fp16_pairs(summary):
        row: dict[str, object] = {"bf16_policy": bf, "fp16_policy": fp}
        for m in metrics:
            if m in by_name.columns:
                row[f"bf16_{m}"] = by_name.at[bf, m]
                row[f"fp16_{m}"] = by_name.at[fp, m]
        rows.append(row)
    return pd.DataFrame(rows)


def training_speed(r: Any) -> tuple[str, str]:
    """A training.csv row's speed-up over fp32 with its interval, and the verdict that interval allows."""
    return (
        interval(r.get("speedup_vs_fp32"), r.get("speedup_ci_low"), r.get("speedup_ci_high")),
        verdict(r.get("speedup_ci_low"), r.get("speedup_ci_high")),
    )


def _pct(v: Any) -> str:
    x = as_float(v)
    return "" if math.isnan(x) else f"{-x * 100:+.0f} %"


def training_gain_table(t: pd.DataFrame) -> Table | None:
    """One row per policy in human units: step time and speed-up with intervals (a verdict only when the
    interval excludes 1), memory and bytes per step with their change against fp32, and the drift."""
    if t.empty or "policy" not in t.columns:
        return None
    rows = []
    for _, r in t.iterrows():
        speed, word = training_speed(r)
        mem, comm = as_float(r.get("peak_mem_bytes")), as_float(r.get("comm_bytes_per_step"))
        rows.append(
            [
                fmt(r.get("policy")),
                time_interval(r.get("step_time_us_p50"), r.get("step_time_us_ci_low"), r.get("step_time_us_ci_high")),
                speed,
                word,
                f"{human_bytes(mem)} ({_pct(r.get('mem_saved_vs_fp32'))})" if not math.isnan(mem) else "",
                f"{human_bytes(comm)} ({_pct(r.get('comm_saved_vs_fp32'))})" if not math.isnan(comm) else "",
                fmt(r.get("final_loss_drift")),
                fmt(r.get("max_grad_norm_drift")),
            ]
        )
    kinds = {str(k) for k in t.get("peak_mem_kind", pd.Series(dtype=object)).dropna().unique()}
    return Table(
        "training-gain",
        "Training: gain and cost of each policy vs fp32",
        [
            "policy",
            "step time (median) [95 % CI]",
            "speed-up vs fp32 [95 % CI]",
            "verdict",
            "peak memory (vs fp32)",
            "comm per step per rank (vs fp32)",
            "final-loss drift",
            "max grad-norm drift",
        ],
        rows,
        "Peak memory: " + "; ".join(memory_kind_text(k) for k in sorted(kinds)) + "." if kinds else "",
    )


def training_bf16_fp16_table(t: pd.DataFrame) -> Table | None:
    """BF16 against FP16 policies side by side (pairs that differ only in the 16-bit format)."""
    if t.empty or "policy" not in t.columns:
        return None
    pairs = bf16_vs_fp16(t)
    if pairs.empty:
        return None
    return frame_table("training-bf16-fp16", "Training: BF16 against FP16, side by side", pairs)
