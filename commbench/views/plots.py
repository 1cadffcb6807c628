"""Figures over a run directory: bandwidth, latency, numerical error and training views.

This module owns the figure registry (`FigureRegistry`: name, builder, caption), the run figures
registered in `FIGURES`, and the drawing helpers other views reuse (`grid`, `log2_size_axis`, `log_y_axis`,
`no_math`, `save_figure`). Runs are loaded by `commbench.views.rundata` (its `load_run` and `RunData` are
re-exported here for the notebook); nothing here imports torch.distributed or measures anything.

Each `fig_*` function returns a `matplotlib.figure.Figure` (or None when the run has nothing to
draw for it), so the notebook can show them inline; `write_plots` saves them as PNG and SVG.
Adding a figure: decorate its builder with `FIGURES.register(name, caption)`; the report shows it.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import matplotlib

# Agg before pyplot: reports are written on headless nodes and in CI, where no display exists.
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator

from commbench.core.units import human_bytes, human_rate, human_time
from commbench.views.rundata import (
    FP32_PRECISION,
    PAYLOAD_ORDER,
    RunData,
    as_tuple,
    collectives,
    has_values,
    human_size,
    load_run,
    memory_kind_text,
    order,
    primary_payload,
    series_columns,
    series_label,
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

# --------------------------------------------------------------------------- the figure registry


S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class FigureSpec(Generic[S]):
    """One figure a view draws: its name (file stem and anchor), how to build it, what it shows."""

    name: str
    """File stem under plots/ and the report's anchor (ASCII, from code)."""
    build: Callable[[S], Figure | None]
    """Draws the figure from the view's subject, or returns None when the subject has nothing for it."""
    caption: str
    """The sentence under the figure in the report."""

    def __call__(self, subject: S) -> Figure | None:
        return self.build(subject)


class FigureRegistry(Mapping[str, FigureSpec[S]]):
    """Figures of one kind of subject (a run for the report, aligned runs for compare), in drawing order.

    Adding a figure is one `register` call; every view that draws this registry shows it, with its caption.
    """

    def __init__(self) -> None:
        self._specs: dict[str, FigureSpec[S]] = {}

    def register(
        self, name: str, caption: str
    ) -> Callable[[Callable[[S], Figure | None]], Callable[[S], Figure | None]]:
        """Decorator: register `build` under `name` with `caption` (a name may be registered once)."""

        def add(build: Callable[[S], Figure | None]) -> Callable[[S], Figure | None]:
            if name in self._specs:
                raise ValueError(f"figure {name!r} is already registered")
            self._specs[name] = FigureSpec(name, build, caption)
            return build

        return add

    def unregister(self, name: str) -> None:
        del self._specs[name]

    def __getitem__(self, name: str) -> FigureSpec[S]:
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def write(
        self,
        subject: S,
        out_dir: Path,
        formats: tuple[str, ...] = ("png", "svg"),
        dpi: int = 110,
        progress: Callable[[str], None] | None = None,
    ) -> dict[str, dict[str, Path]]:
        """Draw every figure the subject has data for into out_dir; returns {name: {format: path}}.
        `progress` is told each figure's name before it is drawn."""
        out_dir.mkdir(parents=True, exist_ok=True)
        written: dict[str, dict[str, Path]] = {}
        for i, (name, spec) in enumerate(self._specs.items(), 1):
            if progress is not None:
                progress(f"figure {i}/{len(self._specs)}: {name}")
            fig = spec.build(subject)
            if fig is not None:
                written[name] = save_figure(fig, out_dir, name, formats, dpi)
        return written


def save_figure(
    fig: Figure, out_dir: Path, name: str, formats: tuple[str, ...] = ("png", "svg"), dpi: int = 110
) -> dict[str, Path]:
    """Save `fig` as out_dir/name.<format> for each format and close it; returns {format: path}."""
    try:
        paths: dict[str, Path] = {}
        for fmt in formats:
            p = out_dir / f"{name}.{fmt}"
            # no date in svg metadata: rerunning the report on the same run gives the same file.
            meta = {"Date": None} if fmt == "svg" else {}
            fig.savefig(p, format=fmt, dpi=dpi, metadata=meta)
            paths[fmt] = p
        return paths
    finally:
        plt.close(fig)


FIGURES: FigureRegistry[RunData] = FigureRegistry()
"""The run figures, in the report's order; the name is the file stem under plots/ and the report's anchor."""


# --------------------------------------------------------------------------- drawing helpers


def run_title(meta: dict[str, Any], what: str) -> str:
    """A figure title that states what it shows, the backend, the world layout and the host."""
    backend = meta.get("backend") or "?"
    world = meta.get("world_size") or "?"
    nodes = meta.get("nodes") or 1
    ppn = meta.get("nproc_per_node")
    layout = f"{world} ranks = {nodes} node(s) x {ppn}" if ppn else f"{world} ranks on {nodes} node(s)"
    host = meta.get("host") or "?"
    device = meta.get("device_name")
    dev = f", {device}" if device else ""
    return f"{what}\n{backend}, {layout}, host {host}{dev}"


def grid(
    n: int, ncols_max: int = 2, w: float = 6.0, h: float = 4.2, constrained: bool = False
) -> tuple[Figure, list[Axes]]:
    """n panels in rows of ncols_max; `constrained` for figures whose legend sits outside the panels."""
    ncols = min(n, ncols_max)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(w * ncols, h * nrows + 0.9), squeeze=False, layout="constrained" if constrained else None
    )
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def log2_size_axis(ax: Axes, sizes: Iterable[float]) -> None:
    """Log-2 x axis with human size labels at powers of two, thinned to at most ~9 ticks."""
    s = [float(v) for v in sizes if v is not None and math.isfinite(float(v)) and float(v) > 0]
    ax.set_xscale("log", base=2)
    if not s:
        return
    lo, hi = math.floor(math.log2(min(s))), math.ceil(math.log2(max(s)))
    step = max(1, math.ceil((hi - lo + 1) / 9))
    ax.set_xticks([2.0**e for e in range(lo, hi + 1, step)])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: human_bytes(v)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def log_y_axis(ax: Axes, unit: Callable[[float], str] | None = None) -> None:
    """Log y axis; `unit` formats the major ticks (human_time, human_rate) so the axis reads '1 ms', '10 MB/s'."""
    # no minor tick labels: they cost most of the drawing time and clutter small panels.
    ax.set_yscale("log")
    ax.yaxis.set_minor_formatter(NullFormatter())
    if unit is not None:
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: unit(v) if v > 0 else ""))


def no_math(s: str) -> str:
    """Text from data for legends and tick labels: '$' escaped so matplotlib never parses mathtext."""
    return str(s).replace("$", r"\$")


def _title(fig: Figure, meta: dict[str, Any], what: str) -> None:
    # parse_math=False: host names and device strings come from the user and may contain '$'.
    fig.suptitle(run_title(meta, what), fontsize=11, parse_math=False)
    if fig.get_layout_engine() is None:
        fig.tight_layout()


def _figure_legend(fig: Figure, axes: Iterable[Axes], extra: Iterable[tuple[Any, str]] = ()) -> None:
    """One legend for every panel, below them: a legend inside a panel covers its data (fp32's line first)."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    for h, lab in extra:
        seen.setdefault(lab, h)
    if seen:
        # as many columns as the longest label leaves room for (a long crossover label gets a row of its own)
        ncol = max(1, min(len(seen), 4, 150 // max(len(k) for k in seen)))
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=ncol, fontsize=8)


def _palette(df: pd.DataFrame, cols: list[str]) -> dict[str, Any]:
    """One colour per series label for the whole figure, so a precision keeps its colour across
    panels whichever series a panel happens to hold; fp32 is always the thick black reference."""
    if df.empty:
        return {}
    keys = sorted({series_label(tuple(k), cols) for k in df[cols].drop_duplicates().itertuples(index=False)})
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    others = [k for k in keys if k.split(" ")[0] != FP32_PRECISION]
    return {k: cycle[i % len(cycle)] for i, k in enumerate(others)}


MARKERS = ("s", "^", "v", "D", "P", "X", "<", ">", "p", "h")
"""Marker per non-fp32 series: two series that coincide (bf16 and bf16_compress) stay told apart."""


def _style(label: str, palette: dict[str, Any] | None) -> dict[str, Any]:
    """fp32: the thick black reference with filled dots. Others: their palette colour, a marker of their own
    (hollow, so a marker under another shows), and a width that shrinks with the series index, so a line
    drawn over an identical one leaves the one below visible as a coloured edge."""
    if label.split(" ")[0] == FP32_PRECISION:
        return {"color": "black", "linewidth": 2.2, "marker": "o", "markersize": 4, "zorder": 3}
    keys = list(palette or {})
    i = keys.index(label) if label in keys else 0
    return {
        "color": (palette or {}).get(label),
        "marker": MARKERS[i % len(MARKERS)],
        "markersize": 7 - 0.4 * (i % 6),
        "markerfacecolor": "none",
        "linewidth": max(0.8, 2.8 - 0.35 * i),
        "zorder": 4 + i,
    }


def _lines(
    ax: Axes,
    df: pd.DataFrame,
    x: str,
    y: str,
    cols: list[str],
    positive: bool = False,
    palette: dict[str, Any] | None = None,
    band: tuple[str, str] | None = None,
    extra_label: Mapping[str, str] | None = None,
    linestyle: str = "-",
) -> dict[str, Any]:
    """One line per series; repeated points (several runs in one import) become their median. `band`: the
    columns of the 95 % interval, drawn as a shaded band around the line. Returns {series label: line}."""
    drawn: dict[str, Any] = {}
    keep = [*cols, x, y, *(band if band and all(b in df.columns for b in band) else ())]
    sub = df[keep].copy()
    for c in keep[len(cols) :]:
        sub[c] = pd.to_numeric(sub[c], errors="coerce")
    sub = sub.dropna(subset=[x, y])
    if positive:
        sub = sub[sub[y] > 0]
    if sub.empty:
        return drawn
    agg = sub.groupby([*cols, x], dropna=False, sort=True)[keep[len(cols) + 1 :]].median().reset_index()
    precisions = order(agg["precision"].astype(str).unique(), (FP32_PRECISION,))
    for keys, g in sorted(
        agg.groupby(cols, dropna=False, sort=False),
        key=lambda kv: (precisions.index(str(as_tuple(kv[0])[0])), str(kv[0])),
    ):
        keys_t = as_tuple(keys)
        g = g.sort_values(x)
        label = series_label(keys_t, cols)
        style = _style(label, palette)
        text = label + ((extra_label or {}).get(label, ""))
        (line,) = ax.plot(g[x], g[y], label=no_math(text), linestyle=linestyle, **style)
        drawn[label] = line
        if band and band[0] in g.columns and band[1] in g.columns:
            lo, hi = g[band[0]].to_numpy(dtype=float), g[band[1]].to_numpy(dtype=float)
            ok = np.isfinite(lo) & np.isfinite(hi) & ((lo > 0) | (not positive))
            if ok.any():
                ax.fill_between(
                    g[x].to_numpy(dtype=float)[ok], lo[ok], hi[ok], color=line.get_color(), alpha=0.1, linewidth=0
                )
    return drawn


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
    for ax in (a1, a2):
        ax.set_xticks(x, [no_math(p) for p in pol], rotation=30, ha="right", fontsize=8)
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
