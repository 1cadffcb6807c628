"""The run figures: bandwidth, latency, numerical error and training views, registered in `FIGURES`.

The registry and the drawing helpers live in `commbench.views.figures` (re-exported here: `FigureRegistry`,
`grid`, `log2_size_axis`, `log_y_axis`, `no_math`, `save_figure`, for the views and plugins that import them from
this module). Runs are loaded by `commbench.views.rundata` (its `load_run` and `RunData` are re-exported here for
the notebook); nothing here imports torch.distributed or measures anything.

Each `fig_*` function returns a `matplotlib.figure.Figure` (or None when the run has nothing to
draw for it), so the notebook can show them inline; `write_plots` saves them as PNG and SVG.
Adding a figure: decorate its builder with `FIGURES.register(name, caption)`; the report shows it.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from commbench.core.units import human_bytes, human_rate, human_time
from commbench.views.figures import (
    MARKERS,
    FigureRegistry,
    FigureSpec,
    grid,
    log2_size_axis,
    log_y_axis,
    no_math,
    run_title,
    save_figure,
)
from commbench.views.figures import figure_legend as _figure_legend
from commbench.views.figures import lines as _lines
from commbench.views.figures import palette as _palette
from commbench.views.figures import title as _title
from commbench.views.rundata import (
    FP32_PRECISION,
    PAYLOAD_ORDER,
    RunData,
    collectives,
    has_values,
    human_size,
    load_run,
    memory_kind_text,
    order,
    primary_payload,
    series_columns,
    speed_rows,
)

__all__ = [
    "FIGURES",
    "FigureRegistry",
    "FigureSpec",
    "RunData",
    "fig_busbw",
    "fig_effective",
    "fig_error",
    "fig_latency",
    "fig_training_bars",
    "fig_training_bytes",
    "fig_training_curves",
    "grid",
    "human_size",
    "load_run",
    "log2_size_axis",
    "log_y_axis",
    "no_math",
    "primary_payload",
    "run_title",
    "save_figure",
    "series_columns",
    "write_plots",
]

FIGURES: FigureRegistry[RunData] = FigureRegistry()
"""The run figures, in the report's order; the name is the file stem under plots/ and the report's anchor."""



# --------------------------------------------------------------------------- collective figures


def _per_collective_lines(
    run: RunData,
    df: pd.DataFrame,
    *,
    x: str,
    y: str,
    xlabel: str,
    ylabel: str,
    title: str,
    log_y: bool = False,
    y_unit: Callable[[float], str] | None = None,
    band: tuple[str, str] | None = None,
    extra_label: Callable[[str], Mapping[str, str]] | None = None,
    decorate: Callable[[Axes, str, pd.DataFrame, dict[str, Any]], None] | None = None,
    legend_extra: Iterable[tuple[Any, str]] = (),
) -> Figure:
    """One panel per collective, one line per precision series (with its 95 % band when `band` names the
    columns), log-2 size axis with human labels, one legend below the panels."""
    colls = collectives(df)
    fig, axes = grid(len(colls), constrained=True)
    cols = series_columns(df)
    pal = _palette(df, cols)
    for ax, coll in zip(axes, colls, strict=True):
        d = df[df["collective"] == coll]
        drawn = _lines(
            ax, d, x, y, cols, positive=log_y, palette=pal, band=band,
            extra_label=extra_label(coll) if extra_label else None,
        )  # fmt: skip
        log2_size_axis(ax, d[x])
        if log_y:
            log_y_axis(ax, y_unit)
        if decorate is not None:
            decorate(ax, coll, d, drawn)
        ax.set_title(coll)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    _figure_legend(fig, axes, legend_extra)
    _title(fig, run.metadata, title)
    return fig


def _speed_figure(name: str, caption: str, doc: str, **kw: Any) -> Callable[[RunData], Figure | None]:
    """Register figure `name`: `_per_collective_lines(**kw)` over the primary payload's rows, or None when they
    hold no `y` values. The figures that differ only in their columns and labels are one call each."""

    def build(run: RunData) -> Figure | None:
        df = speed_rows(run.results)
        if df.empty or not has_values(df, kw["y"]):
            return None
        return _per_collective_lines(run, df, **kw)

    build.__name__ = build.__qualname__ = f"fig_{name}"
    build.__doc__ = doc
    return FIGURES.register(name, caption)(build)


fig_busbw = _speed_figure(
    "busbw",
    "Bus bandwidth vs message size (nccl-tests busbw, log scale), one line per precision; the shaded band is "
    "the 95 % confidence interval.",
    "busbw vs message size per collective, one line per precision, log y with the interval as a band.",
    x="size_bytes", y="busbw_gbps", xlabel="message size (nccl-tests size, bytes on the wire)",
    ylabel="bus bandwidth", title="Bus bandwidth vs message size", log_y=True, y_unit=human_rate,
    band=("busbw_ci_low_gbps", "busbw_ci_high_gbps"),
)  # fmt: skip


@FIGURES.register(
    "effective_bw",
    "fp32-equivalent effective bandwidth including encode and decode (log scale, 95 % band); a star on a curve "
    "marks its crossover: the size from which the precision is significantly faster than fp32 end to end "
    "(also named in the legend).",
)
def fig_effective(run: RunData) -> Figure | None:
    """fp32-equivalent effective bandwidth vs fp32 size, crossover sizes marked on the curves."""
    df = speed_rows(run.results)
    if df.empty or not has_values(df, "effective_gbps") or not has_values(df, "fp32_bytes"):
        return None
    payload = primary_payload(df)
    cx = run.crossover
    if not cx.empty and payload is not None and "payload" in cx.columns:
        cx = cx[cx["payload"].astype(str) == payload]

    def crossovers(coll: str) -> dict[str, float]:
        if cx.empty or "crossover_bytes" not in cx.columns:
            return {}
        sel = cx[cx["collective"] == coll]
        b = pd.to_numeric(sel["crossover_bytes"], errors="coerce")
        return {str(p): float(v) for p, v in zip(sel["precision"], b, strict=True) if pd.notna(v) and v > 0}

    # one legend for the figure: a precision's entry names its crossover in every panel that has one
    where: dict[str, list[str]] = {}
    for c in collectives(df):
        for p, b in crossovers(c).items():
            where.setdefault(p, []).append(f"{c} {human_bytes(b)}")
    named = {p: " (crossover: " + ", ".join(w) + ")" for p, w in where.items()}

    def labels(coll: str) -> dict[str, str]:
        return named

    def mark(ax: Axes, coll: str, d: pd.DataFrame, drawn: dict[str, Any]) -> None:
        # on the curve itself: a star cannot overlap a label, and its colour names the precision
        for prec, b in crossovers(coll).items():
            line = drawn.get(prec)
            if line is None:
                continue
            xs, ys = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
            hit = np.flatnonzero(xs == b)
            if hit.size:
                ax.plot([b], [ys[hit[0]]], marker="*", markersize=15, color=line.get_color(),
                        markeredgecolor="black", linestyle="none", zorder=20, label="_crossover")  # fmt: skip

    star = plt.Line2D([], [], marker="*", markersize=12, color="grey", markeredgecolor="black", linestyle="none")
    fig = _per_collective_lines(
        run, df, x="fp32_bytes", y="effective_gbps", xlabel="user tensor size if fp32",
        ylabel="fp32-equivalent bandwidth (incl. encode+decode)", title="Effective fp32-equivalent bandwidth",
        log_y=True, y_unit=human_rate, band=("effective_ci_low_gbps", "effective_ci_high_gbps"),
        extra_label=labels, decorate=mark,
        legend_extra=[(star, "crossover: significantly faster than fp32 from here on")] if named else [],
    )  # fmt: skip
    return fig


fig_latency = _speed_figure(
    "latency",
    "Time per operation vs message size (log-log), with its 95 % interval as a band.",
    "Latency (time per op) vs message size, log-log, per collective.",
    x="size_bytes", y="time_us", xlabel="message size (bytes on the wire)", ylabel="time per op",
    title="Latency vs message size", log_y=True, y_unit=human_time, band=("time_ci_low_us", "time_ci_high_us"),
)  # fmt: skip


@FIGURES.register(
    "error",
    "Relative error of the result against a float64 reference, per payload distribution. Solid: the total "
    "error, against the float64 result of the unrounded inputs: it includes rounding the inputs to the "
    "precision, which any use of that precision pays. Dashed (where measured): the error the communication "
    "itself adds, against the float64 result of the inputs as sent (0, not drawn, for a lossless collective).",
)
def fig_error(run: RunData) -> Figure | None:
    """Relative error vs size per precision (log y): rows = collective, columns = payload."""
    df = run.results
    if df.empty or not has_values(df, "rel_err"):
        return None
    colls = collectives(df)
    payloads = order(df["payload"].dropna().unique(), PAYLOAD_ORDER) if "payload" in df.columns else [""]
    nr, nc = len(colls), len(payloads)
    fig, axes = plt.subplots(nr, nc, figsize=(4.8 * nc + 1, 3.6 * nr + 1.6), squeeze=False, layout="constrained")
    cols = series_columns(df)
    pal = _palette(df, cols)
    size_col = "fp32_bytes" if has_values(df, "fp32_bytes") else "size_bytes"
    comm = has_values(df, "comm_rel_err")
    for i, coll in enumerate(colls):
        for j, p in enumerate(payloads):
            ax = axes[i][j]
            d = df[df["collective"] == coll]
            if p:
                d = d[d["payload"].astype(str) == p]
            # exact results (error 0) have no place on a log axis; the caption says so.
            _lines(ax, d, size_col, "rel_err", cols, positive=True, palette=pal)
            if comm:
                for line in _lines(ax, d, size_col, "comm_rel_err", cols, positive=True, palette=pal,
                                   linestyle="--").values():  # fmt: skip
                    line.set_label("_comm")  # one legend entry per precision: the style entry explains dashes
            log2_size_axis(ax, d[size_col])
            log_y_axis(ax)
            ax.set_title(f"{coll} / {p}" if p else coll, fontsize=10)
            ax.set_xlabel("user tensor size if fp32", fontsize=8)
            ax.set_ylabel("relative error vs float64", fontsize=8)
            ax.grid(True, which="major", alpha=0.3)
    extra = []
    if comm:
        extra = [
            (plt.Line2D([], [], color="grey"), "solid: total error (input rounding + communication)"),
            (plt.Line2D([], [], color="grey", linestyle="--"), "dashed: error the communication adds"),
        ]
    _figure_legend(fig, [ax for row in axes for ax in row], extra)
    _title(fig, run.metadata, "Numerical error vs size, per payload distribution")
    return fig


# --------------------------------------------------------------------------- training figures


def _fp32_policy(policies: Iterable[str]) -> str | None:
    ps = [str(p) for p in policies]
    for p in ps:
        if p == FP32_PRECISION:
            return p
    for p in ps:
        if FP32_PRECISION in p:
            return p
    return None


@FIGURES.register(
    "training_time_mem",
    "Training step time per policy (median, whisker: its 95 % interval, or to p95 where the run has none) and "
    "peak memory per rank (what was measured is said under the panel).",
)
def fig_training_bars(run: RunData) -> Figure | None:
    """Step time (median with its interval) and peak memory bars per policy."""
    t = run.training
    if t.empty or "policy" not in t.columns:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5.0), layout="constrained")
    pol = t["policy"].astype(str).tolist()
    x = np.arange(len(pol))
    what = "median step time"
    if has_values(t, "step_time_us_p50"):
        p50 = pd.to_numeric(t["step_time_us_p50"], errors="coerce").to_numpy() / 1e3
        err = None
        if has_values(t, "step_time_us_ci_low") and has_values(t, "step_time_us_ci_high"):
            lo = pd.to_numeric(t["step_time_us_ci_low"], errors="coerce").to_numpy() / 1e3
            hi = pd.to_numeric(t["step_time_us_ci_high"], errors="coerce").to_numpy() / 1e3
            err = np.nan_to_num(np.vstack([np.clip(p50 - lo, 0, None), np.clip(hi - p50, 0, None)]))
            what += ", whisker: 95 % interval"
        elif has_values(t, "step_time_us_p95"):
            p95 = pd.to_numeric(t["step_time_us_p95"], errors="coerce").to_numpy() / 1e3
            err = np.vstack([np.zeros_like(p50), np.clip(p95 - p50, 0, None)])
            what += ", whisker to p95"
        a1.bar(x, p50, yerr=err, capsize=3, color="tab:blue")
    a1.set_ylabel(f"{what} (ms)")
    if has_values(t, "peak_mem_bytes"):
        mem = pd.to_numeric(t["peak_mem_bytes"], errors="coerce").to_numpy() / 2**20
        a2.bar(x, mem, color="tab:orange")
        a2.set_ylabel("peak memory per rank (MiB)")
        kinds = sorted({str(k) for k in t["peak_mem_kind"].dropna()}) if "peak_mem_kind" in t.columns else []
        if kinds:
            text = "Measured: " + "; ".join(memory_kind_text(k) for k in kinds) + "."
            a2.set_title(textwrap.fill(text, 70), fontsize=8, loc="left")
    else:
        a2.set_visible(False)  # no memory measured: no empty, unlabelled panel
    for ax in (a1, a2):
        ax.set_xticks(x, [no_math(p) for p in pol], rotation=30, ha="right", fontsize=8)
        ax.set_xlabel("training policy")
        ax.grid(True, axis="y", alpha=0.3)
    _title(fig, run.metadata, "Training: step time and peak memory per policy")
    return fig


def comm_bytes_by_dtype(t: pd.DataFrame) -> pd.DataFrame:
    """comm_by_op JSON ({"all_reduce:bfloat16": bytes, ...}) -> policy x dtype bytes per step."""
    rows: list[dict[str, Any]] = []
    for _, r in t.iterrows():
        raw = r.get("comm_by_op")
        try:
            d = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
        except json.JSONDecodeError:
            d = {}
        for key, val in (d or {}).items():
            dtype = str(key).split(":", 1)[1] if ":" in str(key) else str(key)
            rows.append({"policy": str(r["policy"]), "dtype": dtype, "bytes": float(val)})
    if not rows:
        return pd.DataFrame()
    out = pd.DataFrame(rows).groupby(["policy", "dtype"], sort=False)["bytes"].sum().unstack("dtype")
    return out.reindex([str(p) for p in t["policy"]]).fillna(0.0)


@FIGURES.register("training_bytes", "Bytes communicated per training step, stacked by wire dtype.")
def fig_training_bytes(run: RunData) -> Figure | None:
    """Communicated bytes per step, stacked by wire dtype, per policy."""
    t = run.training
    if t.empty or "comm_by_op" not in t.columns:
        return None
    table = comm_bytes_by_dtype(t)
    if table.empty:
        return None
    fig, ax = plt.subplots(figsize=(10, 4.6))
    x = np.arange(len(table.index))
    bottom = np.zeros(len(x))
    for dtype in table.columns:
        vals = table[dtype].to_numpy() / 2**20
        ax.bar(x, vals, bottom=bottom, label=no_math(str(dtype)))
        bottom += vals
    if has_values(t, "comm_bytes_expected"):
        exp = pd.to_numeric(t["comm_bytes_expected"], errors="coerce").to_numpy() / 2**20
        ax.scatter(x, exp, marker="_", s=400, color="black", label="expected (formula)", zorder=3)
    ax.set_xticks(x, [no_math(p) for p in table.index], rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("training policy")
    ax.set_ylabel("MiB per step per rank")
    # room above the tallest bar and the tallest expected marker (a margin alone clipped them at the top)
    top = float(np.nanmax(np.concatenate([bottom, exp if has_values(t, "comm_bytes_expected") else bottom])))
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    _title(fig, run.metadata, "Training: communicated bytes per step by dtype")
    return fig


@FIGURES.register(
    "training_curves",
    "Loss and gradient norm per step as the difference from the fp32 policy at the same step (fp32 is the zero "
    "line): the drift a lower precision causes.",
)
def fig_training_curves(run: RunData) -> Figure | None:
    """Loss minus fp32's loss and relative grad-norm difference vs step per policy; fp32 is the zero line."""
    s = run.training_steps
    if s.empty or "policy" not in s.columns or "step" not in s.columns:
        return None
    ref = _fp32_policy(s["policy"].astype(str).unique())
    if ref is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), layout="constrained")
    base = s[s["policy"].astype(str) == ref].set_index("step")
    panels = (
        ("loss", lambda v, b: v - b, "loss − fp32 loss"),
        ("grad_norm", lambda v, b: (v - b) / b.where(b != 0), "(grad norm − fp32's) / fp32's"),
    )
    for ax, (col, diff, ylabel) in zip(axes, panels, strict=True):
        if not has_values(s, col):
            ax.set_visible(False)
            continue
        b = pd.to_numeric(base[col], errors="coerce")
        for i, (pol, g) in enumerate(s.groupby(s["policy"].astype(str), sort=False)):
            g = g.sort_values("step")
            v = pd.to_numeric(g[col], errors="coerce").to_numpy(dtype=float)
            d = np.asarray(diff(pd.Series(v, index=g["step"]), b.reindex(g["step"])), dtype=float)
            if pol == ref:
                ax.plot(g["step"], d, label=no_math(f"{pol} (reference)"), color="black", linewidth=2.2, zorder=1)
            else:
                # later policies thinner and on top: one that coincides with an earlier one leaves it visible
                ax.plot(g["step"], d, label=no_math(pol), marker=MARKERS[i % len(MARKERS)], markersize=7 - 0.4 * (i % 6),
                        markerfacecolor="none", linewidth=max(0.8, 3.0 - 0.4 * i), zorder=2 + i)  # fmt: skip
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    _figure_legend(fig, [a for a in axes if a.get_visible()])
    _title(fig, run.metadata, "Training: drift from fp32 per step (loss and gradient norm)")
    return fig


def write_plots(
    run: RunData,
    out_dir: Path,
    formats: tuple[str, ...] = ("png", "svg"),
    dpi: int = 110,
    progress: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Path]]:
    """Draw every registered figure the run has data for into out_dir; returns {name: {format: path}}."""
    return FIGURES.write(run, out_dir, formats, dpi, progress)
