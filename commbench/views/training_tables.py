"""Views over `training.csv` rows: the performance-gain table and BF16 against FP16 side by side.

Pure pandas: reads summary rows, never runs anything, never imports torch.
"""

from __future__ import annotations

import pandas as pd

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

# Policies that differ only in bf16 versus fp16, paired for the side-by-side table.
BF16_FP16_PAIRS: tuple[tuple[str, str], ...] = (
    ("amp_bf16", "amp_fp16"),
    ("amp_bf16", "amp_fp16_noscaler"),
    ("bf16_hook", "fp16_hook"),
    ("fsdp2_bf16", "fsdp2_fp16_scaler"),
)


def gain_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Each policy against DDP fp32: speed-up, memory saved, communication saved, final-loss drift."""
    cols = [c for c in GAIN_COLUMNS if c in summary.columns]
    return summary.loc[:, cols].reset_index(drop=True)


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
    for bf, fp in BF16_FP16_PAIRS:
        if bf in by_name.index and fp in by_name.index:
            row: dict[str, object] = {"bf16_policy": bf, "fp16_policy": fp}
            for m in metrics:
                if m in by_name.columns:
                    row[f"bf16_{m}"] = by_name.at[bf, m]
                    row[f"fp16_{m}"] = by_name.at[fp, m]
            rows.append(row)
    return pd.DataFrame(rows)
