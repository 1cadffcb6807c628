"""Views over training.csv rows: the gain of each policy against fp32, BF16 against FP16 side by side, and the
low-precision gain of each parallelism (DP, TP, PP) against its own full-precision reference.

Pure pandas over the summary rows a run wrote: nothing here runs a policy or imports torch (the views never
import torch.distributed), so the pairs of the side-by-side table come from the rows' names and families, and the
parallelism comparison from the rows' `parallelism` and `reference_policy` columns (the runner asks the policy
objects and writes their answers down).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from commbench.core import stats
from commbench.core.units import human_bytes
from commbench.views.rundata import memory_kind_text
from commbench.views.tables import Table, as_float, fmt, frame_table, interval, time_interval, verdict

__all__ = [
    "CPU_TIMING_NOTE",
    "DEFAULT_PARALLELISM",
    "GAIN_COLUMNS",
    "bf16_vs_fp16",
    "bf16_fp16_pairs",
    "gain_by_parallelism",
    "gain_by_parallelism_lines",
    "gain_table",
    "timed_on_cpu",
    "training_bf16_fp16_table",
    "training_gain_table",
    "training_parallelism_table",
    "training_speed",
]

GAIN_COLUMNS: tuple[str, ...] = (
    "policy",
    "family",
    "parallelism",
    "reference_policy",
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


TOO_FEW = "n too small"
"""The verdict where a speed-up has fewer samples than a 95 % interval needs (`stats.MIN_SAMPLES_95`)."""


def training_speed(r: Any) -> tuple[str, str]:
    """A training.csv row's speed-up over fp32 with its interval, and the verdict that interval allows ("n too
    small" where the row has a speed-up and the interval column but no interval: too few steps for 95 %)."""
    word = verdict(r.get("speedup_ci_low"), r.get("speedup_ci_high"))
    if not word and "speedup_ci_low" in r and math.isfinite(as_float(r.get("speedup_vs_fp32"))):
        word = TOO_FEW
    return interval(r.get("speedup_vs_fp32"), r.get("speedup_ci_low"), r.get("speedup_ci_high")), word


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


# --- the low-precision gain of each parallelism against its own reference ------------------------------------

DEFAULT_PARALLELISM = "dp"
"""What a row without a `parallelism` value was: runs written before the column existed had only data-parallel
policies."""

CPU_TIMING_NOTE = (
    "Timed with gloo on CPU cores: the speed-ups here do not transfer to NCCL over NVLink or InfiniBand, where the "
    "links are faster, the compute of a step is a GPU's and communication is a different share of it; the bytes "
    "saved do transfer (they are counted, not timed)."
)
"""Said wherever a CPU run's training speed-ups are shown (table note, finding, console)."""


def _text(v: Any) -> str:
    """A string cell ('' for missing: an empty string reads back from CSV as NaN)."""
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def timed_on_cpu(summary: pd.DataFrame) -> bool:
    """True when the rows were timed on CPU devices only (the `device` column: cpu, never cuda:N)."""
    if "device" not in summary.columns:
        return False
    devices = {_text(d).split(":")[0] for d in summary["device"]} - {""}
    return bool(devices) and devices == {"cpu"}


def _step_estimate(r: Any) -> stats.Estimate:
    """A summary row's median step time with its 95 % order-statistic interval (what build_rows wrote)."""
    n = as_float(r.get("steps"))
    return stats.Estimate(
        as_float(r.get("step_time_us_p50")),
        as_float(r.get("step_time_us_ci_low")),
        as_float(r.get("step_time_us_ci_high")),
        0 if math.isnan(n) else int(n),
    )


def _step_bytes(steps: pd.DataFrame | None, policy: str) -> list[float]:
    """The bytes counted in each measured (non-warm-up) step of `policy`, when the run has its steps."""
    if steps is None or steps.empty or not {"policy", "comm_bytes"} <= set(steps.columns):
        return []
    sel = steps["policy"].astype(str) == policy
    if "warmup" in steps.columns:
        sel &= ~steps["warmup"].map(lambda w: w is True or str(w) == "True")
    return [float(v) for v in steps.loc[sel, "comm_bytes"] if math.isfinite(as_float(v))]


def _speed_vs_reference(r: Any, ref: Any) -> tuple[stats.Estimate, str]:
    """A row's speed-up over its reference and the verdict it allows: from the paired rounds the runner wrote
    (`speedup_vs_reference`, training/pairing.py) where the row has them, else the unpaired ratio of the two rows'
    medians; "n too small" (and no interval) below the samples a 95 % interval needs."""
    paired = as_float(r.get("speedup_vs_reference"))
    if math.isfinite(paired):
        rounds = as_float(r.get("speedup_ref_rounds"))
        est = stats.Estimate(
            paired, as_float(r.get("speedup_ref_ci_low")), as_float(r.get("speedup_ref_ci_high")),
            0 if math.isnan(rounds) else int(rounds),
        )  # fmt: skip
    else:
        mine, theirs = _step_estimate(r), _step_estimate(ref)
        est = stats.invert(stats.ratio_of(mine, theirs))
        if min(mine.n, theirs.n) < stats.MIN_SAMPLES_95:
            est = stats.Estimate(est.value, math.nan, math.nan, min(mine.n, theirs.n), 0.0)
    if math.isfinite(est.value) and not (math.isfinite(est.low) and math.isfinite(est.high)):
        return est, TOO_FEW
    return est, verdict(est.low, est.high)


def gain_by_parallelism(summary: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per low-precision policy (a row with a `reference_policy`), grouped by parallelism in the order the
    run met them: its speed-up over its reference with the 95 % interval and verdict, and the bytes of both.

    The speed-up is the reference's step time over the policy's from the paired rounds the runner interleaved
    (`speedup_vs_reference`: median of per-round ratios with its order-statistic interval); rows without them
    (`paired = false`, older runs) fall back to the unpaired ratio of the two medians (`stats.ratio_of`). Either way
    the verdict is "n too small", with no interval, below the samples a 95 % interval needs. Bytes are counted, not sampled:
    `comm_bytes_ratio` is the policy's bytes per step over the reference's, and with `steps` (training_steps.csv)
    its range over the measured steps (`comm_ratio_low` / `_high`: the fewest of one over the most of the other),
    a single point where every step sends the same bytes. `final_loss_drift` is against the reference.
    """
    cols = [
        "parallelism", "policy", "reference_policy", "comm_dtype", "speedup", "speedup_ci_low", "speedup_ci_high",
        "verdict", "comm_bytes_per_step", "reference_comm_bytes_per_step", "comm_bytes_ratio", "comm_ratio_low",
        "comm_ratio_high", "comm_saved", "final_loss_drift", "note",
    ]  # fmt: skip
    if summary.empty or not {"policy", "reference_policy"} <= set(summary.columns):
        return pd.DataFrame(columns=cols)
    rows = summary.drop_duplicates("policy", keep="last")
    by_name = {str(r["policy"]): r for _, r in rows.iterrows()}
    out: list[dict[str, Any]] = []
    for _, r in rows.iterrows():
        ref_name = _text(r.get("reference_policy"))
        if not ref_name:
            continue
        pol = str(r["policy"])
        row: dict[str, Any] = dict.fromkeys(cols, math.nan)
        row.update(
            parallelism=_text(r.get("parallelism")) or DEFAULT_PARALLELISM,
            policy=pol,
            reference_policy=ref_name,
            comm_dtype=_text(r.get("comm_dtype")),
            comm_bytes_per_step=as_float(r.get("comm_bytes_per_step")),
            verdict="",
            note="",
        )
        ref = by_name.get(ref_name)
        if ref is None:
            row["note"] = "reference not in this run"
        elif _text(r.get("error")) or _text(ref.get("error")):
            own, refs = bool(_text(r.get("error"))), bool(_text(ref.get("error")))
            row["note"] = "both skipped" if own and refs else "policy skipped" if own else "reference skipped"
        else:
            speed, said = _speed_vs_reference(r, ref)
            ref_bytes = as_float(ref.get("comm_bytes_per_step"))
            ratio = row["comm_bytes_per_step"] / ref_bytes if ref_bytes > 0 else math.nan
            mine, theirs = _step_bytes(steps, pol), _step_bytes(steps, ref_name)
            low = min(mine) / max(theirs) if mine and theirs and max(theirs) > 0 else math.nan
            high = max(mine) / min(theirs) if mine and theirs and min(theirs) > 0 else math.nan
            row.update(
                speedup=speed.value,
                speedup_ci_low=speed.low,
                speedup_ci_high=speed.high,
                verdict=said,
                reference_comm_bytes_per_step=ref_bytes,
                comm_bytes_ratio=ratio,
                comm_ratio_low=low,
                comm_ratio_high=high,
                comm_saved=1.0 - ratio,
                final_loss_drift=as_float(r.get("final_loss")) - as_float(ref.get("final_loss")),
            )
        out.append(row)
    df = pd.DataFrame(out, columns=cols)
    first = {p: i for i, p in reversed(list(enumerate(df["parallelism"])))}
    return df.sort_values("parallelism", key=lambda s: s.map(first), kind="stable").reset_index(drop=True)


def _saved_text(r: Any) -> str:
    """'−50 %' of bytes saved, with the range over the steps when the steps did not all count the same bytes."""
    ratio, low, high = (
        as_float(r.get("comm_bytes_ratio")),
        as_float(r.get("comm_ratio_low")),
        as_float(r.get("comm_ratio_high")),
    )
    if math.isnan(ratio):
        return ""
    text = f"{(ratio - 1) * 100:+.0f} %"
    if not (math.isnan(low) or math.isnan(high)) and f"{(low - 1) * 100:+.0f}" != f"{(high - 1) * 100:+.0f}":
        text += f" [{(low - 1) * 100:+.0f}–{(high - 1) * 100:+.0f}]"
    return text


def _bytes_text(r: Any) -> tuple[str, str]:
    ref, mine = as_float(r.get("reference_comm_bytes_per_step")), as_float(r.get("comm_bytes_per_step"))
    return ("" if math.isnan(ref) else human_bytes(ref)), ("" if math.isnan(mine) else human_bytes(mine))


def training_parallelism_table(t: pd.DataFrame, steps: pd.DataFrame | None = None) -> Table | None:
    """The low-precision gain of each parallelism side by side: each low-precision policy against the full-precision
    policy of its own parallelism (tp_bf16 against tp_fp32, amp_bf16 against DDP fp32), at the run's model and
    world."""
    g = gain_by_parallelism(t, steps)
    if g.empty:
        return None
    rows = []
    for _, r in g.iterrows():
        ref_bytes, my_bytes = _bytes_text(r)
        rows.append(
            [
                str(r["parallelism"]).upper(),
                str(r["policy"]),
                str(r["reference_policy"]) + (f" ({r['note']})" if r["note"] else ""),
                interval(r["speedup"], r["speedup_ci_low"], r["speedup_ci_high"]),
                str(r["verdict"]),
                ref_bytes,
                my_bytes,
                _saved_text(r),
                fmt(r["final_loss_drift"]),
            ]
        )
    worlds = sorted({int(w) for w in t.get("world_size", pd.Series(dtype=float)).dropna()})
    models = sorted({_text(m) for m in t.get("model", pd.Series(dtype=object))} - {""})
    where = ", ".join([*models, *(f"{w} ranks" for w in worlds)])
    note = (f"Same model and world ({where}). " if where else "") + (
        "Speed-up: the reference's step time over the policy's, median of the ratios of paired rounds run "
        "alternately in the same processes, with its 95 % interval (unpaired ratio of the medians where a row has no "
        "rounds); a verdict only where it excludes 1, \"n too small\" below 6 rounds. Bytes per step per rank are counted, not sampled (a range only where the "
        "steps differ). Drift: final loss minus the reference's."
    )
    if timed_on_cpu(t):
        note += " " + CPU_TIMING_NOTE
    return Table(
        "training-parallelism",
        "Training: low-precision gain by parallelism (each policy against its full-precision reference)",
        [
            "parallelism",
            "policy",
            "reference",
            "speed-up vs reference [95 % CI]",
            "verdict",
            "reference comm/step",
            "policy comm/step",
            "bytes (vs reference)",
            "final-loss drift vs reference",
        ],
        rows,
        note,
    )


def gain_by_parallelism_lines(t: pd.DataFrame, steps: pd.DataFrame | None = None) -> list[str]:
    """The same comparison as lines for the end of a training run's console output (the console wraps them to the
    terminal), then the CPU note where it applies; no lines when the run has no low-precision policy with a
    reference."""
    g = gain_by_parallelism(t, steps)
    if g.empty:
        return []
    g = g[g["note"] != "reference not in this run"]  # nothing to say on the console (the report's table says it)
    if g.empty:
        return []
    lines = ["low-precision gain by parallelism: speed-up vs its reference [95 % CI], bytes per step per rank"]
    for _, r in g.iterrows():
        ref_bytes, my_bytes = _bytes_text(r)
        speed = interval(r["speedup"], r["speedup_ci_low"], r["speedup_ci_high"]) or "n/a"
        said = str(r["verdict"]) or str(r["note"])
        moved = f" {ref_bytes} -> {my_bytes} ({_saved_text(r)})" if ref_bytes and my_bytes else ""
        lines.append(
            f"  {str(r['parallelism']).upper():<5} {str(r['policy']):<14} vs {str(r['reference_policy']):<9} "
            f"{speed} {said}{moved}"
        )
    if timed_on_cpu(t):
        lines.append(CPU_TIMING_NOTE)
    return lines
