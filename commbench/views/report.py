"""The run report: one self-contained report.html (figures embedded) and a report.md.

This module owns the report's content (metadata, summary tables, pitfalls, full tables) and its two
renderings. Both renderings come from the same `Table` objects so they never disagree. Every string
that comes from a run (metadata, file names, table cells) is escaped: HTML through jinja2's
autoescape, Markdown through `md_escape`. The report reads run directories only.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from commbench.core.records import crossover_phrase
from commbench.views import plots
from commbench.views.rundata import (
    COLLECTIVE_ORDER,
    FP32_PRECISION,
    RunData,
    as_tuple,
    has_values,
    human_bytes,
    human_rate,
    human_time,
    load_run,
    memory_kind_text,
    order,
    primary_payload,
    series_columns,
    speed_rows,
)

__all__ = [
    "Table",
    "build_tables",
    "findings",
    "fmt",
    "interval",
    "md_escape",
    "md_table",
    "pitfalls",
    "render_html",
    "render_markdown",
    "suite_text",
    "write_report",
]

TEMPLATES = Path(__file__).parent / "templates"

# pyperf's thresholds: a coefficient of variation of 10 % or more makes a number untrustworthy.
CV_WARN = 0.10
RANK_SPREAD_WARN = 0.25
REL_ERR_WARN = 0.10


@dataclass(slots=True)
class Table:
    """A rendered-agnostic table: already formatted cell strings (escaping happens at render)."""

    key: str
    """Anchor id (ASCII, from code, never from data)."""
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""


def fmt(v: Any) -> str:
    """A table cell: empty for missing, integers plain, floats to 4 significant digits."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        if 1e4 <= abs(v) < 1e15:  # microseconds and bytes: whole numbers read better than 1.467e+04
            return f"{v:.0f}"
        return f"{v:.4g}"
    try:
        if pd.isna(v):
            return ""
    except (TypeError, ValueError):
        pass
    if hasattr(v, "item"):  # numpy scalars
        return fmt(v.item())
    return str(v)


def frame_table(key: str, title: str, df: pd.DataFrame, note: str = "") -> Table:
    return Table(key, title, [str(c) for c in df.columns], [[fmt(v) for v in r] for r in df.itertuples(False)], note)


def _f(v: Any) -> float:
    """A cell as a float (NaN for missing, None, '' or text)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x


def _r(v: float) -> str:
    """A ratio to 2 decimals (3 significant digits below 0.1)."""
    return f"{v:.2f}" if abs(v) >= 0.1 else f"{v:.2g}"


def interval(value: Any, low: Any = math.nan, high: Any = math.nan, unit: str = "×") -> str:
    """'1.41× [1.30–1.52]': a ratio with its 95 % interval ('1.41×' alone when the run has no interval)."""
    v, lo, hi = _f(value), _f(low), _f(high)
    if math.isnan(v):
        return ""
    if math.isnan(lo) or math.isnan(hi):
        return f"{_r(v)}{unit}"
    return f"{_r(v)}{unit} [{_r(lo)}–{_r(hi)}]"


def verdict(low: Any, high: Any) -> str:
    """What a speed-up's 95 % interval lets one say: 'faster', 'slower', 'no significant difference',
    or '' when there is no interval (runs from before intervals, imports)."""
    lo, hi = _f(low), _f(high)
    if math.isnan(lo) or math.isnan(hi):
        return ""
    if lo > 1.0:
        return "faster"
    if hi < 1.0:
        return "slower"
    return "no significant difference"


def _time_ci(value: Any, low: Any, high: Any) -> str:
    """'14.7 ms [14.2–15.3]' (the interval in the centre's unit)."""
    v, lo, hi = _f(value), _f(low), _f(high)
    if math.isnan(v):
        return ""
    text = human_time(v)
    if math.isnan(lo) or math.isnan(hi):
        return text
    num, unit = text.split(" ")
    scale = {"µs": 1.0, "ms": 1e3, "s": 1e6}[unit]
    return f"{num} {unit} [{lo / scale:.3g}–{hi / scale:.3g}]"


# --------------------------------------------------------------------------- summary content


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series(math.nan, index=df.index)


def _series_name(df: pd.DataFrame) -> pd.Series:
    """precision plus whichever of impl/placement/redop varies within a precision (as in the plots)."""
    cols = series_columns(df)
    name = df["precision"].astype(str)
    for c in cols[1:]:
        name = name + " " + c + "=" + df[c].astype(str)
    return name


def reference_precisions(run: RunData) -> set[str]:
    """Precisions in the results that the suite did not ask for: the sweep's own references (fp32 through the
    chunked algorithm, which splits a codec's gain into algorithm and precision). They explain gains; they are
    not candidates a user would choose."""
    suite = run.metadata.get("suite") or {}
    asked = {str(p).split(":", 1)[0] for p in suite.get("precisions") or []} | {
        str(p) for p in suite.get("precisions") or []
    }
    df = run.results
    if not asked or df.empty or "precision" not in df.columns:
        return set()
    return {str(p) for p in df["precision"].dropna().unique()} - asked - {FP32_PRECISION}


def _has_ci(df: pd.DataFrame) -> bool:
    return has_values(df, "gain_ci_low") and has_values(df, "gain_ci_high")


def _gains(df: pd.DataFrame) -> pd.DataFrame:
    """Speed rows of the non-fp32 series with columns series, size (fp32 bytes), gain, lo, hi (total-time
    speed-up over fp32 at the same size: the paired one when the run has it, else the effective-bandwidth
    ratio, without interval)."""
    d = speed_rows(df).copy()
    if d.empty or "fp32_bytes" not in d.columns:
        return pd.DataFrame(columns=["collective", "series", "precision", "size", "gain", "lo", "hi"])
    d["series"] = _series_name(d)
    d["size"] = _num(d, "fp32_bytes")
    if has_values(d, "gain_vs_fp32"):
        d["gain"], d["lo"], d["hi"] = _num(d, "gain_vs_fp32"), _num(d, "gain_ci_low"), _num(d, "gain_ci_high")
    else:
        eff = _num(d, "effective_gbps")
        ref = d[d["precision"] == FP32_PRECISION].assign(_e=eff).groupby(["collective", "size"])["_e"].median()
        d["gain"] = [e / ref.get((c, s), math.nan) for c, s, e in zip(d["collective"], d["size"], eff, strict=True)]
        d["lo"] = d["hi"] = math.nan
    if "wrong" in d.columns:  # a fast wrong answer is not a choice
        d = d[~(_num(d, "wrong") > 0)]
    d = d[d["precision"] != FP32_PRECISION].dropna(subset=["gain", "size"])
    return d


def peak_busbw_table(df: pd.DataFrame) -> Table | None:
    if df.empty or _num(df, "busbw_gbps").isna().all():
        return None
    d = speed_rows(df).copy()
    d["series"] = _series_name(d)
    d["busbw"] = _num(d, "busbw_gbps")
    d = d.dropna(subset=["busbw"])
    idx = d.groupby(["collective", "series"])["busbw"].idxmax()
    best = d.loc[idx]
    colls = order(best["collective"].unique(), COLLECTIVE_ORDER)
    series = order(best["series"].unique(), (FP32_PRECISION,))
    rows = []
    # one row per precision, one column per collective: a handful of columns fit any page width
    for s in series:
        row = [s]
        for c in colls:
            hit = best[(best["collective"] == c) & (best["series"] == s)]
            row.append(
                ""
                if hit.empty
                else f"{human_rate(float(hit['busbw'].iloc[0]))} @ {human_bytes(float(hit['size_bytes'].iloc[0]))}"
            )
        rows.append(row)
    return Table(
        "peak-busbw",
        "Peak bus bandwidth (@ message size) per precision and collective",
        ["precision", *colls],
        rows,
        "Sizes are bytes on the wire (nccl-tests size). Speed numbers use the "
        + (primary_payload(df) or "only")
        + " payload.",
    )


def _ranges(points: list[tuple[float, str, str]]) -> list[tuple[float, float, str, str]]:
    """Merge consecutive sizes that share a verdict: [(lo, hi, verdict, speed-up text of the range's best)]."""
    out: list[tuple[float, float, str, str]] = []
    for size, win, gain in points:
        if out and out[-1][2] == win:
            lo, _, w, g = out[-1]
            out[-1] = (lo, size, w, g or gain)
        else:
            out.append((size, size, win, gain))
    return out


NO_WINNER = "no significant difference"


def best_precision_table(df: pd.DataFrame, refs: set[str] = frozenset()) -> Table | None:  # type: ignore[assignment]
    """Per collective and size range, the precision significantly fastest end to end (total time, paired with
    fp32), or 'no significant difference' / 'fp32' when no precision is significantly faster.

    Only points with no wrong elements compete: a fast wrong answer is not a choice.
    """
    g = _gains(df)
    if g.empty:
        return None
    g = g[~g["precision"].astype(str).isin(refs)]
    ci = _has_ci(g)
    rows = []
    for coll in order(g["collective"].unique(), COLLECTIVE_ORDER):
        pts: list[tuple[float, str, str]] = []
        for size, gs in g[g["collective"] == coll].groupby("size", sort=True):
            if ci:
                wins = gs[gs["lo"] > 1.0]
                if not wins.empty:
                    top = wins.loc[wins["gain"].idxmax()]
                    pts.append((float(size), str(top["series"]), interval(top["gain"], top["lo"], top["hi"])))
                elif (gs["hi"] < 1.0).all():
                    pts.append((float(size), f"{FP32_PRECISION} (every other precision slower)", ""))
                else:
                    pts.append((float(size), NO_WINNER, ""))
            else:
                top = gs.loc[gs["gain"].idxmax()]
                win = str(top["series"]) if top["gain"] > 1.0 else FP32_PRECISION
                pts.append((float(size), win, interval(top["gain"]) if top["gain"] > 1.0 else ""))
        for lo, hi, win, gain in _ranges(pts):
            span = human_bytes(lo) if lo == hi else f"{human_bytes(lo)} – {human_bytes(hi)}"
            rows.append([coll, span, win, gain])
    note = (
        "Sizes are the user's tensor size in fp32. A precision wins only where its paired 95 % interval of the "
        "speed-up over fp32 lies above 1; the speed-up shown is at the first size of the range. "
        if ci
        else "This run has no intervals: winners are not tested for significance. "
    )
    return Table(
        "best-precision",
        "Best precision per size range (end to end, encode and decode included)",
        ["collective", "fp32 size range", "fastest precision", "speed-up vs fp32 [95 % CI]"],
        rows,
        note + "Points with wrong elements are excluded.",
    )


def crossover_table(run: RunData) -> Table | None:
    cx = run.crossover
    if cx.empty:
        return None
    refs = reference_precisions(run)
    payloads = cx["payload"].dropna().unique() if "payload" in cx.columns else []
    with_payload = len(payloads) > 1
    rows = []
    for _, r in cx.iterrows():
        prec = fmt(r.get("precision"))
        if prec in refs:
            prec += " (algorithm reference)"
        row = [fmt(r.get("collective")), *([fmt(r.get("payload"))] if with_payload else []), prec]
        row.append(crossover_phrase(r, human_bytes))
        row.append(
            interval(r.get("gain_at_largest"), r.get("gain_at_largest_ci_low"), r.get("gain_at_largest_ci_high"))
        )
        rows.append(row)
    return Table(
        "crossover",
        "Crossover sizes: from where a precision is faster than fp32 end to end",
        ["collective", *(["payload"] if with_payload else []), "precision", "crossover (fp32 tensor size)",
         "speed-up at the largest size [95 % CI]"],
        rows,
        "A crossover is the smallest size from which the precision is significantly faster (paired 95 % interval "
        "above 1) at that and every larger size. Below it, the crossover lies above the largest size at which fp32 "
        "is significantly faster; where that is not the size just below, the crossover is only known to a range "
        "(near it the two are about equally fast, and the first significant win moves between identical runs).",
    )  # fmt: skip


def gain_table(df: pd.DataFrame, refs: set[str] = frozenset()) -> Table | None:  # type: ignore[assignment]
    """Each precision against fp32 at the same point: end-to-end speed-up (encode + decode included) with its
    interval and verdict at the largest size, its split into algorithm and precision where the precision runs
    through another algorithm than fp32, the comm-only speed-up, and the best significant speed-up."""
    if df.empty or not (has_values(df, "gain_vs_fp32") or has_values(df, "effective_gbps")):
        return None
    d = df.copy()
    d["series"] = _series_name(d)
    d["comm"] = _num(d, "comm_us").fillna(_num(d, "time_us"))
    d["size"] = _num(d, "fp32_bytes")
    if has_values(d, "gain_vs_fp32"):
        d["gain"], d["lo"], d["hi"] = _num(d, "gain_vs_fp32"), _num(d, "gain_ci_low"), _num(d, "gain_ci_high")
    else:
        d["gain"], d["lo"], d["hi"] = math.nan, math.nan, math.nan
    keys = ["collective", "payload", "size"] if "payload" in d.columns else ["collective", "size"]
    ref = d[d["precision"] == FP32_PRECISION].groupby(keys)[["comm", "effective_gbps"]].median()
    if ref.empty:
        return None
    m = d[d["precision"] != FP32_PRECISION].join(ref.add_suffix("_fp32"), on=keys)
    m["comm_speedup"] = m["comm_fp32"] / m["comm"]
    no_paired = m["gain"].isna()
    m.loc[no_paired, "gain"] = _num(m, "effective_gbps")[no_paired] / m.loc[no_paired, "effective_gbps_fp32"]
    m = m.dropna(subset=["gain"])
    has_split = has_values(m, "algo_gain")
    err = d.groupby(["collective", "series"])["rel_err"].max() if "rel_err" in d.columns else None
    group_keys = ["collective", "payload", "series"] if "payload" in m.columns else ["collective", "series"]
    corder = order(m["collective"].unique(), COLLECTIVE_ORDER)
    m = m.assign(_c=m["collective"].map(corder.index)).sort_values(["_c", *group_keys[1:]])
    rows = []
    for k, g in m.groupby(group_keys, sort=False):
        k = as_tuple(k)
        g = g.sort_values("size")
        last = g.iloc[-1]
        sig = g[g["lo"] > 1.0]
        if not sig.empty:
            b = sig.loc[sig["gain"].idxmax()]
            best = f"{interval(b['gain'], b['lo'], b['hi'])} @ {human_bytes(float(b['size']))}"
        else:
            best = "none significant" if _has_ci(g) else ""
        labels = [fmt(x) for x in k]
        if k[-1] in refs:
            labels[-1] += " (algorithm reference)"
        row = [*labels, interval(last["gain"], last["lo"], last["hi"]), verdict(last["lo"], last["hi"])]
        if has_split:
            row.append(
                f"{interval(last['algo_gain'], last.get('algo_gain_ci_low'), last.get('algo_gain_ci_high'))} × "
                f"{interval(last['precision_gain'], last.get('precision_gain_ci_low'), last.get('precision_gain_ci_high'))}"
                if pd.notna(last.get("algo_gain"))
                else ""
            )
        e = err.get((k[0], k[-1]), math.nan) if err is not None else math.nan
        row += [interval(last["comm_speedup"]), best, fmt(e)]
        rows.append(row)
    cols = ["collective", "payload", "precision"] if "payload" in m.columns else ["collective", "precision"]
    return Table(
        "gain",
        "Performance gain vs fp32 (speed-up above 1 = faster)",
        [
            *cols,
            "speed-up @ largest size [95 % CI]",
            "verdict",
            *(["= algorithm × precision"] if has_split else []),
            "comm-only speed-up",
            "best significant speed-up",
            "max rel. error",
        ],
        rows,
        "Speed-up = fp32's total time / this precision's (encode + collective + decode), paired per round. "
        + (
            "Where a precision reduces through the chunked all_to_all algorithm, its speed-up is the product of the "
            "algorithm's (native fp32 / fp32 through that algorithm) and the precision's (fewer bytes, same "
            "algorithm). "
            if has_split
            else ""
        )
        + "Comm-only: the collective alone, without encode and decode.",
    )


def _training_speed(r: Any) -> tuple[str, str]:
    return (
        interval(r.get("speedup_vs_fp32"), r.get("speedup_ci_low"), r.get("speedup_ci_high")),
        verdict(r.get("speedup_ci_low"), r.get("speedup_ci_high")),
    )


def _pct(v: Any) -> str:
    x = _f(v)
    return "" if math.isnan(x) else f"{-x * 100:+.0f} %"


def training_gain_table(t: pd.DataFrame) -> Table | None:
    """One row per policy in human units: step time and speed-up with intervals (a verdict only when the
    interval excludes 1), memory and bytes per step with their change against fp32, and the drift."""
    if t.empty or "policy" not in t.columns:
        return None
    rows = []
    for _, r in t.iterrows():
        speed, word = _training_speed(r)
        mem, comm = _f(r.get("peak_mem_bytes")), _f(r.get("comm_bytes_per_step"))
        rows.append(
            [
                fmt(r.get("policy")),
                _time_ci(r.get("step_time_us_p50"), r.get("step_time_us_ci_low"), r.get("step_time_us_ci_high")),
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
    from commbench.training.tables import bf16_vs_fp16

    pairs = bf16_vs_fp16(t)
    if pairs.empty:
        return None
    return frame_table("training-bf16-fp16", "Training: BF16 against FP16, side by side", pairs)


def _largest_row(df: pd.DataFrame, coll: str, payload: Any, prec: str) -> pd.Series | None:
    sel = (df["collective"].astype(str) == coll) & (df["precision"].astype(str) == prec)
    if payload is not None and "payload" in df.columns and isinstance(payload, str) and payload:
        sel &= df["payload"].astype(str) == payload
    d = df[sel]
    if d.empty or "fp32_bytes" not in d.columns:
        return None
    return d.loc[_num(d, "fp32_bytes").idxmax()]


def slower_cause(df: pd.DataFrame, coll: str, payload: Any, prec: str) -> str:
    """Why a precision is slower than fp32 at the largest size, from what its row measured: the algorithm it
    reduces through (its algorithm part significantly below 1), encode/decode time that eats the faster
    collective, or a collective that is itself no faster with this dtype (a native dtype has no encode/decode:
    the backend's kernels for it cost more than the bytes saved)."""
    r = _largest_row(df, coll, payload, prec)
    base = _largest_row(df, coll, payload, FP32_PRECISION)
    if r is None or base is None:
        return ""
    enc = (_f(r.get("encode_us")) if pd.notna(r.get("encode_us")) else 0.0) + (
        _f(r.get("decode_us")) if pd.notna(r.get("decode_us")) else 0.0
    )
    total = _f(r.get("total_us"))
    comm = _f(r.get("comm_us")) if pd.notna(r.get("comm_us")) else _f(r.get("time_us"))
    base_comm = _f(base.get("comm_us")) if pd.notna(base.get("comm_us")) else _f(base.get("time_us"))
    comm_speedup = base_comm / comm if comm > 0 else math.nan
    parts: list[str] = []
    if _f(r.get("algo_gain_ci_high")) < 1.0:
        parts.append(
            "the chunked algorithm it reduces through is slower than fp32's native collective "
            f"(fp32 through it: {interval(r.get('algo_gain'), r.get('algo_gain_ci_low'), r.get('algo_gain_ci_high'))})"
        )
    if comm_speedup < 1.0 and not parts:
        alone = "" if enc == 0 else " without encode/decode"  # a native dtype has none to mention
        parts.append(
            f"the collective itself is slower with this data type ({_r(comm_speedup)}× fp32's speed{alone}): "
            "the backend's kernels for it cost more than the bytes saved"
        )
    if enc > 0 and total > 0 and (comm_speedup >= 1.0 or parts):
        share = enc / total
        if comm_speedup >= 1.0 and not parts:
            parts.append(
                f"encode + decode take {share:.0%} of its time and outweigh the faster collective "
                f"({_r(comm_speedup)}× fp32's speed without them)"
            )
        elif share >= 0.1:
            parts.append(f"encode + decode add {share:.0%} of its time")
    return "; ".join(parts)


def pitfalls(run: RunData) -> list[str]:
    """Plain-language problems found in the run: wrong results, large errors, noisy timings, compression that
    never pays (with the cause that applies), and the training section's own warnings."""
    out: list[str] = []
    df = run.results
    if not df.empty:
        label_cols = [c for c in ("collective", "precision", "payload") if c in df.columns]

        def where(r: Any) -> str:
            return " ".join(str(r[c]) for c in label_cols) + f" at {human_bytes(float(r['size_bytes']))}"

        wrong = df[_num(df, "wrong") > 0]
        for _, r in wrong.head(10).iterrows():
            out.append(f"{where(r)}: {int(r['wrong'])} wrong element(s) on exactly representable inputs.")
        if len(wrong) > 10:
            out.append(f"... and {len(wrong) - 10} more point(s) with wrong elements.")
        err = _num(df, "rel_err")
        big = df[err >= REL_ERR_WARN]
        for k, g in big.groupby(label_cols, sort=False):
            k = as_tuple(k)
            out.append(
                f"{' '.join(map(str, k))}: relative error up to {fmt(float(_num(g, 'rel_err').max()))} "
                "(>= 10 %): this precision/payload combination loses the signal (underflow or outliers?)."
            )
        if not ("noisy" in df.columns and df["noisy"].notna().any()):  # else: counted in the findings
            noisy_cv = df[_num(df, "cv") >= CV_WARN]
            if len(noisy_cv):
                out.append(
                    f"{len(noisy_cv)} of {len(df)} point(s) have a coefficient of variation >= {CV_WARN:.0%}: "
                    "their times are noisy (other load on the machine, too few samples)."
                )
        skew = df[_num(df, "rank_spread") >= RANK_SPREAD_WARN]
        if len(skew):
            out.append(
                f"{len(skew)} point(s) have ranks disagreeing by >= {RANK_SPREAD_WARN:.0%} "
                "(rank_spread): a slow rank or link dominates those numbers."
            )
    cx = run.crossover
    refs = reference_precisions(run)
    if not cx.empty and "note" in cx.columns and not df.empty:
        payload = primary_payload(df)  # speed does not depend on the values sent: one payload speaks for all
        if payload is not None and "payload" in cx.columns:
            cx = cx[cx["payload"].astype(str) == payload]
        for _, r in cx[cx["note"].astype(str) == "never in range"].iterrows():
            if str(r["precision"]) in refs:
                continue
            cause = slower_cause(df, str(r["collective"]), r.get("payload"), str(r["precision"]))
            out.append(
                f"{r['collective']} {r['precision']}: slower than fp32 end to end at the largest size "
                f"({interval(r.get('gain_at_largest'), r.get('gain_at_largest_ci_low'), r.get('gain_at_largest_ci_high'))})"
                + (f": {cause}." if cause else ".")
            )
    for e in run.metadata.get("skipped") or []:  # refused at run time on some rank, so skipped on all
        group = e.get("group", "world")
        where = e.get("collective", "?") + ("" if group in (None, "world") else f" [{group}]")
        out.append(f"{where} {e.get('precision', '?')}: skipped, {e.get('reason', 'not usable here')}.")
    t = run.training
    if not t.empty and "warnings" in t.columns:
        for _, r in t.iterrows():
            w = r["warnings"]
            if isinstance(w, str) and w.strip():
                out.append(f"training policy {r['policy']}: {w}")
    return out


def _is_true(v: Any) -> bool:
    return v is True or str(v) == "True"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _sweep_findings(run: RunData) -> list[str]:
    df = run.results
    cx = run.crossover
    if df.empty or cx.empty or "note" not in cx.columns:
        return []
    out: list[str] = []
    payload = primary_payload(df)
    if payload is not None and "payload" in cx.columns:
        cx = cx[cx["payload"].astype(str) == payload]
    refs = reference_precisions(run)
    ci = _has_ci(df)
    if not ci:
        out.append(
            "This run carries no confidence intervals (an imported or older run): the comparisons below are not "
            "tested for significance."
        )
    speed = speed_rows(df)
    for coll in order(cx["collective"].unique(), COLLECTIVE_ORDER):
        c = cx[(cx["collective"] == coll) & ~cx["precision"].astype(str).isin(refs)]
        sizes = _num(speed[speed["collective"] == coll], "fp32_bytes")
        if c.empty or sizes.isna().all():
            continue
        smallest, largest = float(sizes.min()), float(sizes.max())
        wins: list[tuple[float, str]] = []
        ties: list[str] = []
        losses: list[tuple[str, str]] = []
        for _, r in c.iterrows():
            prec = str(r["precision"])
            g = interval(r.get("gain_at_largest"), r.get("gain_at_largest_ci_low"), r.get("gain_at_largest_ci_high"))
            b = _f(r.get("crossover_bytes"))
            if not math.isnan(b):
                text = (
                    f"{prec} {coll} is faster than fp32 from {human_bytes(b)}: {g} at {human_bytes(largest)}"
                    if b < largest
                    else f"{prec} {coll} is faster than fp32 at {human_bytes(b)}, the largest size measured: {g}"
                )
                low = _f(r.get("crossover_low_bytes"))
                if _is_true(r.get("significant")) and b > smallest:
                    text += f"; at {human_bytes(low)} fp32 is significantly faster"
                elif not math.isnan(low):
                    text += f" (the crossover lies between {human_bytes(low)} and {human_bytes(b)})"
                elif b > smallest:
                    text += f" (below {human_bytes(b)} no significant difference either way)"
                wins.append((_f(r.get("gain_at_largest")), text + "."))
            elif str(r.get("note")) == "never in range":
                losses.append((prec, g))
            else:
                ties.append(prec)
        out += [t for _, t in sorted(wins, key=lambda w: -w[0] if not math.isnan(w[0]) else 0.0)]
        if losses:
            out.append(
                f"{_join([p for p, _ in losses])} {'does' if len(losses) == 1 else 'do'} not pay for {coll} in the "
                f"measured range ({human_bytes(smallest)} – {human_bytes(largest)}): fp32 is faster at "
                f"{human_bytes(largest)} (speed-up {_join([f'{p} {g}' if len(losses) > 1 else g for p, g in losses])})."
            )
        if ties:
            out.append(f"{coll}: no significant difference from fp32 at {human_bytes(largest)} for {_join(ties)}.")
    out += _split_findings(speed, refs)
    return out


def _split_findings(speed: pd.DataFrame, refs: set[str]) -> list[str]:
    """Where a precision reduces through the chunked algorithm: how much of its speed-up is the algorithm and
    how much the fewer bytes, at the largest size (stated only for the parts whose interval excludes 1)."""
    if not has_values(speed, "algo_gain"):
        return []
    out: list[str] = []
    d = speed[_num(speed, "algo_gain").notna() & ~speed["precision"].astype(str).isin(refs)]
    for (coll, prec), g in d.groupby(["collective", "precision"], sort=False):
        last = g.loc[_num(g, "fp32_bytes").idxmax()]
        algo = verdict(last.get("algo_gain_ci_low"), last.get("algo_gain_ci_high"))
        prec_part = verdict(last.get("precision_gain_ci_low"), last.get("precision_gain_ci_high"))
        if algo in ("", NO_WINNER) and prec_part in ("", NO_WINNER):
            continue
        total = interval(last.get("gain_vs_fp32"), last.get("gain_ci_low"), last.get("gain_ci_high"))
        a = interval(last.get("algo_gain"), last.get("algo_gain_ci_low"), last.get("algo_gain_ci_high"))
        p = interval(last.get("precision_gain"), last.get("precision_gain_ci_low"), last.get("precision_gain_ci_high"))
        ns = " (not significant)"
        at = human_bytes(float(last["fp32_bytes"]))
        if verdict(last.get("gain_ci_low"), last.get("gain_ci_high")) == "faster":
            out.append(
                f"Of {prec}'s {total} on {coll} at {at}, {a}{ns if algo == NO_WINNER else ''} comes from the "
                f"chunked all_to_all algorithm and {p}{ns if prec_part == NO_WINNER else ''} from fewer bytes."
            )
        else:
            out.append(
                f"{prec} {coll} at {at}: {total} against fp32 = {a}{ns if algo == NO_WINNER else ''} from the "
                f"chunked all_to_all algorithm × {p}{ns if prec_part == NO_WINNER else ''} from fewer bytes."
            )
    return out


def _training_findings(t: pd.DataFrame) -> list[str]:
    if t.empty or "policy" not in t.columns or not has_values(t, "speedup_vs_fp32"):
        return []
    out: list[str] = []
    same: list[str] = []
    has_ci = has_values(t, "speedup_ci_low")
    for _, r in t.iterrows():
        pol = str(r["policy"])
        s = _f(r.get("speedup_vs_fp32"))
        if pol == FP32_PRECISION or math.isnan(s):
            continue
        speed, word = _training_speed(r)
        if word == "faster":
            out.append(f"Training: {pol} steps are {speed} faster than fp32.")
        elif word == "slower":
            note = str(r.get("notes") or "").strip()
            out.append(f"Training: {pol} steps are slower than fp32 ({speed})" + (f": {note}." if note else "."))
        elif has_ci:
            same.append(pol)
    if same:
        out.append(f"Training: no significant step-time difference from fp32 for {_join(same)}.")
    saved = [
        (str(r["policy"]), _f(r.get("comm_saved_vs_fp32")))
        for _, r in t.iterrows()
        if _f(r.get("comm_saved_vs_fp32")) > 0.005
    ]
    if saved:
        out.append(
            "Training: "
            + _join([f"{p} sends {v:.0%} fewer bytes" for p, v in saved])
            + " per step than fp32 (counted, not timed)."
        )
    return out


def findings(run: RunData) -> list[str]:
    """The report's first section: sentences built from significant results only (a winner, a crossover, a
    speed-up is stated only where its 95 % interval excludes 1), then the noisy points counted."""
    out = _sweep_findings(run) + _training_findings(run.training)
    df = run.results
    if not df.empty and "noisy" in df.columns and df["noisy"].notna().any():
        noisy = int(df["noisy"].map(_is_true).sum())
        out.append(
            f"{noisy} of {len(df)} points are noisy (their 95 % interval stayed wider than the target): "
            "comparisons involving them are less often significant; raise --max-time or run on a quieter machine."
            if noisy
            else f"All {len(df)} points reached the target interval."
        )
    return out


def metadata_table(meta: dict[str, Any]) -> Table:
    keys = [
        ("date (start)", "start_time"),
        ("end", "end_time"),
        ("host", "host"),
        ("hosts", "hosts"),
        ("device", "device_name"),
        ("backend", "backend"),
        ("world size", "world_size"),
        ("nodes", "nodes"),
        ("processes per node", "nproc_per_node"),
        ("threads per rank", "threads_per_rank"),
        ("launcher", "launcher"),
        ("commbench", "commbench_version"),
        ("git commit", "git_commit"),
        ("torch", "torch_version"),
        ("NCCL", "nccl_version"),
        ("python", "python_version"),
        ("platform", "platform"),
        ("timing", "timing"),
        ("command", "argv"),
    ]
    rows = []
    for label, k in keys:
        if k not in meta:
            continue
        v = meta[k]
        if isinstance(v, list) and k == "argv":
            v = " ".join(map(str, v))
        elif isinstance(v, dict):  # key=value pairs read better than a JSON object in a cell
            v = ", ".join(f"{kk}={_toml_value(vv)}" for kk, vv in sorted(v.items()) if vv is not None)
        elif isinstance(v, list):
            v = ", ".join(map(str, v))
        rows.append([label, fmt(v) if v is not None else "n/a"])
    return Table("metadata", "Run metadata", ["field", "value"], rows)


def _ranks(ranks: list[int]) -> str:
    """0,1,2,3,6 -> "0-3, 6"."""
    from commbench.core.units import int_ranges

    return int_ranges(ranks, ", ")


def _nic(n: dict[str, Any]) -> str:
    speed = n.get("speed_mbps")
    return f"{n.get('name')} ({speed / 1000:g} Gbit/s)" if speed else str(n.get("name"))


def _bound(node: dict[str, Any]) -> str:
    """`` (cores 0 | 1)``: the cores each rank of a node was bound to, in rank order; empty when none was bound
    (every rank may run on every core) or the run did not record it."""
    cores = node.get("rank_cores") or []
    if not cores or any(c is None for c in cores) or len(set(cores)) == 1:
        return ""
    return f" (cores {' | '.join(cores)})"


def nodes_table(meta: dict[str, Any]) -> Table | None:
    """One row per node: what each node reported about itself (metadata ``node_reports``)."""
    nodes = meta.get("node_reports") or []
    if not nodes:
        return None
    rows = []
    for n in nodes:
        env = n.get("env") or {}
        rows.append(
            [
                str(n.get("host")),
                _ranks(list(n.get("ranks") or [])) + _bound(n),
                fmt(n.get("cpu")) + (f" ({n['cpu_count']} cores)" if n.get("cpu_count") else ""),
                "; ".join(n.get("gpus") or []) or "none",
                _rank_devices(n),
                ", ".join(_nic(x) for x in n.get("nics") or []),
                " ".join(f"{k}={v}" for k, v in sorted(env.items())),
            ]
        )
    return Table(
        "nodes",
        "Nodes",
        ["host", "ranks", "CPU", "GPUs", "each rank's GPU (PCI bus) and NCCL transport (--nccl-debug)",
         "NICs (speed where /sys/class/net says)", "communication environment (NCCL, TORCH_NCCL, GLOO, FI, UCX, OMPI_MCA, CUDA)"],
        rows,
    )  # fmt: skip


def _rank_devices(node: dict[str, Any]) -> str:
    """``0: 0000:1B:00.0 NVLS, P2P/CUMEM | 1: ...``: each rank's GPU by PCI bus id and the transport NCCL chose,
    where the run recorded them (``rank_gpus``, ``rank_transports``); ``-`` when it recorded neither."""
    ranks = list(node.get("ranks") or [])
    gpus = list(node.get("rank_gpus") or [None] * len(ranks))
    transports = list(node.get("rank_transports") or [None] * len(ranks))
    parts = []
    for r, g, t in zip(ranks, gpus, transports, strict=False):
        bits = [str(g.get("pci_bus_id") or g.get("uuid") or "") if isinstance(g, dict) else "", t or ""]
        if any(bits):
            parts.append(f"{r}: " + " ".join(b for b in bits if b))
    return " | ".join(parts) or "-"


def topology_tables(meta: dict[str, Any]) -> list[Table]:
    """``nvidia-smi topo -m`` of every node that has it, as a matrix (its legend dropped)."""
    out: list[Table] = []
    for n in meta.get("node_reports") or []:
        text = n.get("nvidia_topo")
        if not text:
            continue
        lines = [ln for ln in text.splitlines() if ln.strip()]
        end = next((i for i, ln in enumerate(lines) if ln.strip().startswith("Legend")), len(lines))
        cells = [[c.strip() for c in ln.split("\t")] for ln in lines[:end]]
        width = max(len(r) for r in cells)
        if len(cells) > 1 and all(len(r) == width for r in cells):
            table = Table(
                f"topo-{len(out)}", f"GPU topology of {n.get('host')} (nvidia-smi topo -m)", cells[0], cells[1:]
            )
        else:  # not the tab-separated matrix this parser knows: keep the lines
            table = Table(f"topo-{len(out)}", f"GPU topology of {n.get('host')} (nvidia-smi topo -m)", ["line"],
                          [[ln] for ln in lines[:end]])  # fmt: skip
        out.append(table)
    return out


def _toml_value(v: Any) -> str:
    # JSON's strings, numbers, booleans and arrays of them are valid TOML values
    return json.dumps(v, ensure_ascii=False)


def suite_text(suite: dict[str, Any]) -> str:
    """The resolved suite as TOML (what `commbench run FILE.toml` reads back): scalars first, then one table
    per nested section; unset (None) values are left out."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for k, v in suite.items():
        if isinstance(v, dict):
            tables.append((k, v))
        elif v is not None:
            lines.append(f"{k} = {_toml_value(v)}")
    for name, t in tables:
        lines += ["", f"[{name}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in t.items() if v is not None and not isinstance(v, dict)]
    return "\n".join(lines)


FULL_RESULT_COLUMNS = [
    "collective",
    "precision",
    "impl",
    "placement",
    "redop",
    "payload",
    "size_bytes",
    "count",
    "dtype",
    "time_us",
    "algbw_gbps",
    "busbw_gbps",
    "wrong",
    "fp32_bytes",
    "encode_us",
    "comm_us",
    "decode_us",
    "total_us",
    "effective_gbps",
    "rel_err",
    "max_abs_err",
    "cv",
    "time_us_max",
]


def build_tables(run: RunData) -> dict[str, list[Table]]:
    """The report's tables, grouped: 'metadata', 'summary' and 'full'."""
    df = run.results
    summary = [
        t
        for t in (
            best_precision_table(df, reference_precisions(run)),
            crossover_table(run),
            gain_table(df, reference_precisions(run)),
            training_gain_table(run.training),
            training_bf16_fp16_table(run.training),
            peak_busbw_table(df),
        )
        if t is not None
    ]
    full: list[Table] = []
    if not df.empty:
        cols = [c for c in FULL_RESULT_COLUMNS if c in df.columns and not df[c].isna().all()]
        sort = [c for c in ("collective", "precision", "payload", "size_bytes") if c in df.columns]
        full.append(
            frame_table(
                "results",
                "All collective points (nccl-tests columns first: size, count, type, time, algbw, busbw, #wrong)",
                df.sort_values(sort)[cols],
                "As in results.csv: sizes in bytes, times in microseconds, bandwidths in GB/s (1e9 bytes/s).",
            )
        )
    if not run.training.empty:
        full.append(frame_table("training", "Training summary (training.csv)", run.training))
    if not run.training_steps.empty:
        full.append(frame_table("training-steps", "Training steps (training_steps.csv)", run.training_steps))
    meta = metadata_table(run.metadata)
    meta.rows.insert(0, ["run directory", str(run.run_dir)])
    nodes = nodes_table(run.metadata)
    return {
        "metadata": [meta, *([nodes] if nodes else []), *topology_tables(run.metadata)],
        "summary": summary,
        "full": full,
    }


# --------------------------------------------------------------------------- rendering


def md_escape(s: str) -> str:
    """Markdown-safe text: '&' and '<' as entities (renderers pass raw HTML through; '>' alone opens no tag and
    stays readable), pipes and backslashes escaped so a cell cannot break the table, newlines flattened."""
    s = str(s).replace("&", "&amp;").replace("<", "&lt;")
    for ch in "\\|`$*":
        s = s.replace(ch, "\\" + ch)
    return s.replace("\n", " ").replace("\r", " ")


def md_table(t: Table) -> str:
    lines = [f"### {md_escape(t.title)}", ""]
    if not t.rows:
        return "\n".join([*lines, "(no rows)", ""])
    lines.append("| " + " | ".join(md_escape(c) for c in t.columns) + " |")
    lines.append("|" + "|".join("---" for _ in t.columns) + "|")
    for r in t.rows:
        lines.append("| " + " | ".join(md_escape(c) for c in r) + " |")
    if t.note:
        lines += ["", f"_{md_escape(t.note)}_"]
    lines.append("")
    return "\n".join(lines)


def _env() -> jinja2.Environment:
    # autoescape everything: hosts, device names, paths and cells come from users and files.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.tests["numeric_cell"] = lambda c: bool(_NUMERIC.match(str(c)))
    return env


_NUMERIC = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?( @ \S+)?$")
"""Cells right-aligned in HTML: numbers, and 'number @ size' pairs."""


def _data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def report_title(meta: dict[str, Any]) -> str:
    return (
        f"commbench report: {meta.get('backend', '?')}, {meta.get('world_size', '?')} ranks on "
        f"{meta.get('nodes', 1)} node(s), host {meta.get('host', '?')}"
    )


def render_html(
    title: str,
    sections: Sequence[tuple[str, str, Sequence[Table]]],
    figures: Iterable[tuple[str, str, Path, Path | None]],
    pitfall_list: Sequence[str] | None,
    warnings: Sequence[str] = (),
    template: str = "report.html.j2",
    *,
    findings: Sequence[str] | None = None,
    suite: str = "",
) -> str:
    """sections: (anchor, heading, tables); figures: (name, caption, png, svg).

    With `findings` (the run report) the page reads: warnings, Findings (with the pitfalls), Figures, the
    sections in order, the suite last. Without (compare) the figures follow the 'summary' section.
    """
    figs = [
        {"name": n, "caption": c, "src": _data_uri(png), "svg": svg.name if svg else None} for n, c, png, svg in figures
    ]
    return (
        _env()
        .get_template(template)
        .render(
            title=title, sections=sections, figures=figs, pitfalls=pitfall_list, warnings=warnings,
            findings=findings, suite=suite,
        )
    )  # fmt: skip


def _md_figures(figures: list[tuple[str, str, Path, Path | None]], base: Path) -> list[str]:
    out = ["## Figures", ""]
    for _name, cap, png, _svg in figures:
        rel = png.relative_to(base).as_posix() if png.is_relative_to(base) else png.as_posix()
        out += [f"![{md_escape(cap)}]({rel.replace(' ', '%20')})", "", f"_{md_escape(cap)}_", ""]
    return out


def _md_pitfalls(pitfall_list: Sequence[str]) -> list[str]:
    out = ["### Pitfalls found", ""]
    out += [f"- {md_escape(p)}" for p in pitfall_list] if pitfall_list else ["None found."]
    return [*out, ""]


def render_markdown(
    title: str,
    sections: Sequence[tuple[str, str, Sequence[Table]]],
    figures: Iterable[tuple[str, str, Path, Path | None]],
    pitfall_list: Sequence[str] | None,
    base: Path,
    warnings: Sequence[str] = (),
    *,
    findings: Sequence[str] | None = None,
    suite: str = "",
) -> str:
    """The same document as `render_html`, in Markdown (figures as relative links to plots/)."""
    out = [f"# {md_escape(title)}", ""]
    if warnings:
        out += ["## Warnings", ""] + [f"- {md_escape(w)}" for w in warnings] + [""]
    figs = list(figures)
    if findings is not None:
        out += ["## Findings", ""]
        out += [f"- {md_escape(f)}" for f in findings] if findings else ["No result to state."]
        out.append("")
        if pitfall_list is not None:
            out += _md_pitfalls(pitfall_list)
        if figs:
            out += _md_figures(figs, base)
    for anchor, heading, tables in sections:
        out += [f"## {md_escape(heading)}", ""]
        for t in tables:
            out.append(md_table(t))
        if anchor == "summary" and findings is None:
            if pitfall_list is not None:
                out += _md_pitfalls(pitfall_list)
            if figs:
                out += _md_figures(figs, base)
    if suite:
        # a fenced block: the suite stays readable and copyable, and nothing in it is Markdown
        fence = "````" if "```" in suite else "```"
        out += ["## Suite (resolved)", "", f"{fence}toml", suite, fence, ""]
    return "\n".join(out) + "\n"


def write_report(
    run_dir: Path, out_dir: Path | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, Path]:
    """Write report.html, report.md and plots/*.png|svg for a run into out_dir (default: run_dir).

    Returns {"html": ..., "md": ..., "<figure>.png": ..., "<figure>.svg": ...}.
    Raises ValueError (commbench.store.results.RunDirError) for a directory that is not a run.
    """
    run = load_run(Path(run_dir))
    out = Path(out_dir) if out_dir is not None else Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = plots.write_plots(run, out / "plots", progress=progress)
    if progress is not None:
        progress("tables and findings")
    figures = [(name, plots.FIGURES[name].caption, paths["png"], paths.get("svg")) for name, paths in written.items()]
    tables = build_tables(run)
    # the answer first (findings, figures, tables), how it was measured last
    sections = [
        ("summary", "Tables", tables["summary"]),
        ("full", "Full tables", tables["full"]),
        ("metadata", "Metadata", tables["metadata"]),
    ]
    suite = run.metadata.get("suite")
    suite_toml = suite_text(suite) if isinstance(suite, dict) else ""
    found = pitfalls(run)
    if run.results.empty and run.training.empty:
        found.insert(0, "This run directory holds no collective results and no training results yet.")
    said = findings(run)
    title = report_title(run.metadata)
    html_path = out / "report.html"
    md_path = out / "report.md"
    banner = []
    if run.metadata.get("end_time") is None:
        # metadata.json gets its end_time when the run completes: without it the rows are a partial run
        banner.append(
            f"Unfinished run: started {run.metadata.get('start_time', '?')} and never completed (no end time in "
            f"metadata.json); the tables hold the points finished so far. Continue it with `commbench run --resume {run_dir}`."
        )
    html_path.write_text(
        render_html(title, sections, figures, found, banner, findings=said, suite=suite_toml), encoding="utf-8"
    )
    md_path.write_text(
        render_markdown(title, sections, figures, found, out, banner, findings=said, suite=suite_toml), encoding="utf-8"
    )
    result: dict[str, Path] = {"html": html_path, "md": md_path}
    for name, paths in written.items():
        for f, p in paths.items():
            result[f"{name}.{f}"] = p
    return result
