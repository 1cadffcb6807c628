"""Figures over a run directory: bandwidth, latency, numerical error and training views.

This module owns the figure registry (`FigureRegistry`: name, builder, caption), the run figures
registered in `FIGURES`, and the drawing helpers other views reuse (`grid`, `log2_size_axis`, `log_y_axis`,
`no_math`, `save_figure`). Runs are loaded by `commbench.rundata` (its `load_run` and `RunData` are
re-exported here for the notebook); nothing here imports torch.distributed or measures anything.

Each `fig_*` function returns a `matplotlib.figure.Figure` (or None when the run has nothing to
draw for it), so the notebook can show them inline; `write_plots` saves them as PNG and SVG.
Adding a figure: decorate its builder with `FIGURES.register(name, caption)`; the report shows it.
"""

from __future__ import annotations

import json
import math
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

from commbench.rundata import (
    FP32_PRECISION,
    PAYLOAD_ORDER,
    RunData,
    as_tuple,
    collectives,
    has_values,
    human_size,
    load_run,
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
        self, subject: S, out_dir: Path, formats: tuple[str, ...] = ("png", "svg"), dpi: int = 110
    ) -> dict[str, dict[str, Path]]:
        """Draw every figure the subject has data for into out_dir; returns {name: {format: path}}."""
        out_dir.mkdir(parents=True, exist_ok=True)
        written: dict[str, dict[str, Path]] = {}
        for name, spec in self._specs.items():
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


def grid(n: int, ncols_max: int = 2, w: float = 6.0, h: float = 4.2) -> tuple[Figure, list[Axes]]:
    ncols = min(n, ncols_max)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows + 0.9), squeeze=False)
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
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: human_size(v)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def log_y_axis(ax: Axes) -> None:
    # no minor tick labels: they cost most of the drawing time and clutter small panels.
    ax.set_yscale("log")
    ax.yaxis.set_minor_formatter(NullFormatter())


def no_math(s: str) -> str:
    """Text from data for legends and tick labels: '$' escaped so matplotlib never parses mathtext."""
    return str(s).replace("$", r"\$")


def _title(fig: Figure, meta: dict[str, Any], what: str) -> None:
    # parse_math=False: host names and device strings come from the user and may contain '$'.
    fig.suptitle(run_title(meta, what), fontsize=11, parse_math=False)
    fig.tight_layout()


def _palette(df: pd.DataFrame, cols: list[str]) -> dict[str, Any]:
    """One colour per series label for the whole figure, so a precision keeps its colour across
    panels whichever series a panel happens to hold; fp32 is always the thick black reference."""
    if df.empty:
        return {}
    keys = sorted({series_label(tuple(k), cols) for k in df[cols].drop_duplicates().itertuples(index=False)})
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    others = [k for k in keys if k.split(" ")[0] != FP32_PRECISION]
    return {k: cycle[i % len(cycle)] for i, k in enumerate(others)}


def _lines(
    ax: Axes,
    df: pd.DataFrame,
    x: str,
    y: str,
    cols: list[str],
    positive: bool = False,
    palette: dict[str, Any] | None = None,
) -> int:
    """One line per series; repeated points (several runs in one import) become their median."""
    n = 0
    sub = df[[*cols, x, y]].dropna(subset=[x, y])
    if positive:
        sub = sub[sub[y] > 0]
    if sub.empty:
        return 0
    agg = sub.groupby([*cols, x], dropna=False, sort=True)[y].median().reset_index()
    precisions = order(agg["precision"].astype(str).unique(), (FP32_PRECISION,))
    for keys, g in sorted(
        agg.groupby(cols, dropna=False, sort=False),
        key=lambda kv: (precisions.index(str(as_tuple(kv[0])[0])), str(kv[0])),
    ):
        keys_t = as_tuple(keys)
        g = g.sort_values(x)
        label = series_label(keys_t, cols)
        style: dict[str, Any] = {"color": "black", "linewidth": 2.2}
        if keys_t[0] != FP32_PRECISION:
            style = {"color": palette[label]} if palette and label in palette else {}
        ax.plot(g[x], g[y], marker="o", markersize=3, label=no_math(label), **style)
        n += 1
    return n


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
    decorate: Callable[[Axes, str, pd.DataFrame], None] | None = None,
) -> Figure:
    """One panel per collective, one line per precision series, log-2 size axis with human labels."""
    colls = collectives(df)
    fig, axes = grid(len(colls))
    cols = series_columns(df)
    pal = _palette(df, cols)
    for ax, coll in zip(axes, colls, strict=True):
        d = df[df["collective"] == coll]
        _lines(ax, d, x, y, cols, positive=log_y, palette=pal)
        log2_size_axis(ax, d[x])
        if log_y:
            log_y_axis(ax)
        if decorate is not None:
            decorate(ax, coll, d)
        ax.set_title(coll)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    _title(fig, run.metadata, title)
    return fig


def _speed_lines(run: RunData, **kw: Any) -> Figure | None:
    """`_per_collective_lines` over the primary payload's rows, or None when they hold no `y` values."""
    df = speed_rows(run.results)
    if df.empty or not has_values(df, kw["y"]):
        return None
    return _per_collective_lines(run, df, **kw)


@FIGURES.register("busbw", "Bus bandwidth vs message size (nccl-tests busbw), one line per precision.")
def fig_busbw(run: RunData) -> Figure | None:
    """busbw vs message size per collective, one line per precision."""
    return _speed_lines(
        run, x="size_bytes", y="busbw_gbps", xlabel="message size (nccl-tests size, bytes on the wire)",
        ylabel="bus bandwidth (GB/s)", title="Bus bandwidth vs message size",
    )  # fmt: skip


@FIGURES.register(
    "effective_bw",
    "fp32-equivalent effective bandwidth including encode and decode; dotted lines mark "
    "the crossover size from which a precision beats fp32.",
)
def fig_effective(run: RunData) -> Figure | None:
    """fp32-equivalent effective bandwidth vs fp32 size, crossover sizes marked."""
    df = speed_rows(run.results)
    if df.empty or not has_values(df, "effective_gbps") or not has_values(df, "fp32_bytes"):
        return None
    payload = primary_payload(df)
    cx = run.crossover

    def mark_crossovers(ax: Axes, coll: str, d: pd.DataFrame) -> None:
        if cx.empty or "crossover_bytes" not in cx.columns:
            return
        sel = cx[cx["collective"] == coll]
        if payload is not None and "payload" in sel.columns:
            sel = sel[sel["payload"].astype(str) == payload]
        for _, r in sel.iterrows():
            b = pd.to_numeric(r["crossover_bytes"], errors="coerce")
            if pd.notna(b) and b > 0:
                ax.axvline(float(b), linestyle=":", color="grey")
                ax.annotate(
                    f"{r['precision']} wins from {human_size(float(b))}",
                    (float(b), 0.97),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    va="top",
                    ha="right",
                    fontsize=7,
                )

    return _per_collective_lines(
        run, df, x="fp32_bytes", y="effective_gbps", xlabel="user tensor size if fp32 (bytes)",
        ylabel="fp32-equivalent GB/s (incl. encode+decode)",
        title="Effective fp32-equivalent bandwidth (dotted: crossover sizes)", decorate=mark_crossovers,
    )  # fmt: skip


@FIGURES.register("latency", "Time per operation vs message size (log-log).")
def fig_latency(run: RunData) -> Figure | None:
    """Latency (time per op) vs message size, log-log, per collective."""
    return _speed_lines(
        run, x="size_bytes", y="time_us", xlabel="message size (bytes on the wire)",
        ylabel="time per op (us)", title="Latency vs message size", log_y=True,
    )  # fmt: skip


@FIGURES.register(
    "error", "Relative error of the decoded result against a float64 reference, per payload distribution."
)
def fig_error(run: RunData) -> Figure | None:
    """Relative error vs size per precision (log y): rows = collective, columns = payload."""
    df = run.results
    if df.empty or not has_values(df, "rel_err"):
        return None
    colls = collectives(df)
    payloads = order(df["payload"].dropna().unique(), PAYLOAD_ORDER) if "payload" in df.columns else [""]
    nr, nc = len(colls), len(payloads)
    fig, axes = plt.subplots(nr, nc, figsize=(4.8 * nc, 3.6 * nr + 0.9), squeeze=False)
    cols = series_columns(df)
    pal = _palette(df, cols)
    size_col = "fp32_bytes" if has_values(df, "fp32_bytes") else "size_bytes"
    for i, coll in enumerate(colls):
        for j, p in enumerate(payloads):
            ax = axes[i][j]
            d = df[df["collective"] == coll]
            if p:
                d = d[d["payload"].astype(str) == p]
            # exact results (error 0) have no place on a log axis; the label says so.
            _lines(ax, d, size_col, "rel_err", cols, positive=True, palette=pal)
            log2_size_axis(ax, d[size_col])
            log_y_axis(ax)
            ax.set_title(f"{coll} / {p}" if p else coll, fontsize=10)
            ax.set_xlabel("user tensor size if fp32 (bytes)", fontsize=8)
            ax.set_ylabel("relative error vs fp64 (0 not shown)", fontsize=8)
            ax.grid(True, which="major", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
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


@FIGURES.register("training_time_mem", "Training step time (p50, whisker to p95) and peak memory per policy.")
def fig_training_bars(run: RunData) -> Figure | None:
    """Step time (p50, p95 whisker) and peak memory bars per policy."""
    t = run.training
    if t.empty or "policy" not in t.columns:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.6))
    pol = t["policy"].astype(str).tolist()
    x = np.arange(len(pol))
    if has_values(t, "step_time_us_p50"):
        p50 = pd.to_numeric(t["step_time_us_p50"], errors="coerce").to_numpy() / 1e3
        err = None
        if has_values(t, "step_time_us_p95"):
            p95 = pd.to_numeric(t["step_time_us_p95"], errors="coerce").to_numpy() / 1e3
            err = np.vstack([np.zeros_like(p50), np.clip(p95 - p50, 0, None)])
        a1.bar(x, p50, yerr=err, capsize=3, color="tab:blue")
    a1.set_ylabel("step time p50 (ms), whisker to p95")
    if has_values(t, "peak_mem_bytes"):
        mem = pd.to_numeric(t["peak_mem_bytes"], errors="coerce").to_numpy() / 2**20
        a2.bar(x, mem, color="tab:orange")
        kind = t["peak_mem_kind"].iloc[0] if "peak_mem_kind" in t.columns else ""
        a2.set_ylabel(f"peak memory (MiB) [{kind}]")
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
    ax.margins(y=0.08)  # keeps the expected-bytes marker of the tallest bar inside the frame
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    _title(fig, run.metadata, "Training: communicated bytes per step by dtype")
    return fig


@FIGURES.register("training_curves", "Loss and gradient norm per step against the fp32 reference.")
def fig_training_curves(run: RunData) -> Figure | None:
    """Loss and grad-norm vs step per policy, the fp32 reference drawn thick and black."""
    s = run.training_steps
    if s.empty or "policy" not in s.columns or "step" not in s.columns:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    ref = _fp32_policy(s["policy"].astype(str).unique())
    for ax, col in zip(axes, ("loss", "grad_norm"), strict=True):
        if not has_values(s, col):
            ax.set_visible(False)
            continue
        for pol, g in s.groupby(s["policy"].astype(str), sort=False):
            g = g.sort_values("step")
            # the reference sits underneath, thick: policies that track it stay visible on top
            style = {"color": "black", "linewidth": 3.5, "alpha": 0.45, "zorder": 1} if pol == ref else {"zorder": 2}
            lab = no_math(f"{pol} (reference)" if pol == ref else pol)
            ax.plot(g["step"], pd.to_numeric(g[col], errors="coerce"), label=lab, **style)
        ax.set_xlabel("step")
        ax.set_ylabel(col)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    _title(fig, run.metadata, "Training: loss and grad norm against fp32")
    return fig


def write_plots(
    run: RunData, out_dir: Path, formats: tuple[str, ...] = ("png", "svg"), dpi: int = 110
) -> dict[str, dict[str, Path]]:
    """Draw every registered figure the run has data for into out_dir; returns {name: {format: path}}."""
    return FIGURES.write(run, out_dir, formats, dpi)
