"""The report's tables: the `Table` type both renderings read, cell formatting, and the collective-results tables.

A `Table` holds already formatted cell strings, so the HTML and the Markdown rendering (`commbench.views.render`)
never disagree; escaping happens at render time. The builders here turn results.csv and crossover.csv into the
summary tables (peak bus bandwidth, best precision per size range, crossovers, gain against fp32); the training
tables live in `commbench.views.training_tables`, the run's setup in `commbench.views.metadata_tables`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from commbench.core.records import crossover_phrase
from commbench.core.units import human_bytes, human_rate, human_time
from commbench.views.rundata import (
    COLLECTIVE_ORDER,
    FP32_PRECISION,
    RunData,
    as_tuple,
    has_intervals,
    has_values,
    numeric,
    order,
    primary_payload,
    reference_precisions,
    series_name,
    speed_rows,
)

__all__ = [
    "NO_WINNER",
    "Table",
    "as_float",
    "best_precision_table",
    "crossover_table",
    "fmt",
    "frame_table",
    "gain_table",
    "interval",
    "peak_busbw_table",
    "ratio_text",
    "time_interval",
    "verdict",
]


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
    """A DataFrame as a `Table`: its columns as headers, every cell through `fmt`."""
    return Table(key, title, [str(c) for c in df.columns], [[fmt(v) for v in r] for r in df.itertuples(False)], note)


def as_float(v: Any) -> float:
    """A cell as a float (NaN for missing, None, '' or text)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x


def ratio_text(v: float) -> str:
    """A ratio to 2 decimals (3 significant digits below 0.1)."""
    return f"{v:.2f}" if abs(v) >= 0.1 else f"{v:.2g}"


def interval(value: Any, low: Any = math.nan, high: Any = math.nan, unit: str = "×") -> str:
    """'1.41× [1.30–1.52]': a ratio with its 95 % interval ('1.41×' alone when the run has no interval)."""
    v, lo, hi = as_float(value), as_float(low), as_float(high)
    if math.isnan(v):
        return ""
    if math.isnan(lo) or math.isnan(hi):
        return f"{ratio_text(v)}{unit}"
    return f"{ratio_text(v)}{unit} [{ratio_text(lo)}–{ratio_text(hi)}]"


NO_WINNER = "no significant difference"
"""The verdict where a 95 % interval of a speed-up contains 1."""


def verdict(low: Any, high: Any) -> str:
    """What a speed-up's 95 % interval lets one say: 'faster', 'slower', 'no significant difference',
    or '' when there is no interval (runs from before intervals, imports)."""
    lo, hi = as_float(low), as_float(high)
    if math.isnan(lo) or math.isnan(hi):
        return ""
    if lo > 1.0:
        return "faster"
    if hi < 1.0:
        return "slower"
    return NO_WINNER


def time_interval(value: Any, low: Any, high: Any) -> str:
    """'14.7 ms [14.2–15.3]' (the interval in the centre's unit)."""
    v, lo, hi = as_float(value), as_float(low), as_float(high)
    if math.isnan(v):
        return ""
    text = human_time(v)
    if math.isnan(lo) or math.isnan(hi):
        return text
    num, unit = text.split(" ")
    scale = {"µs": 1.0, "ms": 1e3, "s": 1e6}[unit]
    return f"{num} {unit} [{lo / scale:.3g}–{hi / scale:.3g}]"


def _gains(df: pd.DataFrame) -> pd.DataFrame:
    """Speed rows of the non-fp32 series with columns series, size (fp32 bytes), gain, lo, hi (total-time
    speed-up over fp32 at the same size: the paired one when the run has it, else the effective-bandwidth
    ratio, without interval)."""
    d = speed_rows(df).copy()
    if d.empty or "fp32_bytes" not in d.columns:
        return pd.DataFrame(columns=["collective", "series", "precision", "size", "gain", "lo", "hi"])
    d["series"] = series_name(d)
    d["size"] = numeric(d, "fp32_bytes")
    if has_values(d, "gain_vs_fp32"):
        d["gain"], d["lo"], d["hi"] = numeric(d, "gain_vs_fp32"), numeric(d, "gain_ci_low"), numeric(d, "gain_ci_high")
    else:
        eff = numeric(d, "effective_gbps")
        ref = d[d["precision"] == FP32_PRECISION].assign(_e=eff).groupby(["collective", "size"])["_e"].median()
        d["gain"] = [e / ref.get((c, s), math.nan) for c, s, e in zip(d["collective"], d["size"], eff, strict=True)]
        d["lo"] = d["hi"] = math.nan
    if "wrong" in d.columns:  # a fast wrong answer is not a choice
        d = d[~(numeric(d, "wrong") > 0)]
    d = d[d["precision"] != FP32_PRECISION].dropna(subset=["gain", "size"])
    return d


def peak_busbw_table(df: pd.DataFrame) -> Table | None:
    """Each series' highest bus bandwidth and the size it reached it at: nccl-tests' headline number, per precision."""
    if df.empty or numeric(df, "busbw_gbps").isna().all():
        return None
    d = speed_rows(df).copy()
    d["series"] = series_name(d)
    d["busbw"] = numeric(d, "busbw_gbps")
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


def best_precision_table(df: pd.DataFrame, refs: set[str] = frozenset()) -> Table | None:  # type: ignore[assignment]
    """Per collective and size range, the precision significantly fastest end to end (total time, paired with
    fp32), or 'no significant difference' / 'fp32' when no precision is significantly faster.

    Only points with no wrong elements compete: a fast wrong answer is not a choice.
    """
    g = _gains(df)
    if g.empty:
        return None
    g = g[~g["precision"].astype(str).isin(refs)]
    ci = has_intervals(g)
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
    """crossover.csv in words: from which fp32 size each precision is significantly faster than fp32 end to end."""
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
    d["series"] = series_name(d)
    d["comm"] = numeric(d, "comm_us").fillna(numeric(d, "time_us"))
    d["size"] = numeric(d, "fp32_bytes")
    if has_values(d, "gain_vs_fp32"):
        d["gain"], d["lo"], d["hi"] = numeric(d, "gain_vs_fp32"), numeric(d, "gain_ci_low"), numeric(d, "gain_ci_high")
    else:
        d["gain"], d["lo"], d["hi"] = math.nan, math.nan, math.nan
    keys = ["collective", "payload", "size"] if "payload" in d.columns else ["collective", "size"]
    ref = d[d["precision"] == FP32_PRECISION].groupby(keys)[["comm", "effective_gbps"]].median()
    if ref.empty:
        return None
    m = d[d["precision"] != FP32_PRECISION].join(ref.add_suffix("_fp32"), on=keys)
    m["comm_speedup"] = m["comm_fp32"] / m["comm"]
    no_paired = m["gain"].isna()
    m.loc[no_paired, "gain"] = numeric(m, "effective_gbps")[no_paired] / m.loc[no_paired, "effective_gbps_fp32"]
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
            best = "none significant" if has_intervals(g) else ""
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
