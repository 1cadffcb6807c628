"""The drawing every view's figures share: the figure registry (`FigureRegistry`: name, builder, caption) and
`save_figure`, and the helpers (`grid`, `log2_size_axis`, `log_y_axis`, `no_math`, `title`, `figure_legend`,
`palette`, `style`, `lines`). The run figures (`commbench.views.plots`) and the compare figures
(`commbench.views.compare`) draw with them; nothing here reads a run directory.

Axes a person reads: sizes on a log-2 axis with human labels; a log y axis that always carries at least three
labelled ticks (a range of less than a decade gets 1-2-5 or finer ticks, and a very narrow one is widened around
its data); each series' 95 % interval as a shaded band of the line's colour; one legend below the panels, whose
entries are the drawn lines themselves (so their colour, marker and line style are the lines').
"""

from __future__ import annotations

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
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

from commbench.core.units import human_bytes
from commbench.views.rundata import FP32_PRECISION, as_tuple, order, series_label

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
        `progress` is told the name of each figure drawn before it is saved (saving is the slow part); a figure the
        subject has nothing for (the training figures of a run without training) is skipped without a word."""
        out_dir.mkdir(parents=True, exist_ok=True)
        written: dict[str, dict[str, Path]] = {}
        for name, spec in self._specs.items():
            fig = spec.build(subject)
            if fig is None:
                continue
            if progress is not None:
                progress(f"figure {len(written) + 1}: {name}")
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
            # laid out once: the next formats reuse the positions the first save computed (the layout engine's
            # pass over every tick label is most of a save)
            fig.set_layout_engine("none")
        return paths
    finally:
        plt.close(fig)





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


MIN_LOG_SPAN = 3.0
"""The smallest ratio of top to bottom a log y axis shows: a narrower range of data (a latency that barely moves
with size) is widened around its geometric centre, so the axis has room for three labelled ticks."""


def _log_subs(decades: float) -> tuple[float, ...]:
    """Major-tick mantissas for a log axis spanning ``decades``: powers of ten alone from three decades on."""
    if decades >= 3:
        return (1.0,)
    if decades >= 1:
        return (1.0, 2.0, 5.0)
    return (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0)


def log_y_axis(ax: Axes, unit: Callable[[float], str] | None = None) -> None:
    """Log y axis with at least three labelled major ticks over the data already drawn; `unit` formats them
    (human_time, human_rate) so the axis reads '1 ms', '10 MB/s'. Call it after the lines are drawn: the ticks are
    chosen for their range (a range of less than :data:`MIN_LOG_SPAN` is widened around its data)."""
    # no minor tick labels: they cost most of the drawing time and clutter small panels.
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    if lo > 0 and hi > 0 and math.isfinite(lo) and math.isfinite(hi):
        if hi / lo < MIN_LOG_SPAN:
            mid = math.sqrt(lo * hi)
            lo, hi = mid / math.sqrt(MIN_LOG_SPAN), mid * math.sqrt(MIN_LOG_SPAN)
            ax.set_ylim(lo, hi)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=_log_subs(math.log10(hi / lo)), numticks=12))
    ax.yaxis.set_minor_formatter(NullFormatter())
    fmt = unit if unit is not None else _plain
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt(v) if v > 0 else ""))


def _plain(v: float) -> str:
    """A tick value without a unit, as a person writes it: 0.002, 1.5e-05, 300."""
    return f"{v:.3g}"


def no_math(s: str) -> str:
    """Text from data for legends and tick labels: '$' escaped so matplotlib never parses mathtext."""
    return str(s).replace("$", r"\$")


def title(fig: Figure, meta: dict[str, Any], what: str) -> None:
    # parse_math=False: host names and device strings come from the user and may contain '$'.
    fig.suptitle(run_title(meta, what), fontsize=11, parse_math=False)
    if fig.get_layout_engine() is None:
        fig.tight_layout()


def figure_legend(fig: Figure, axes: Iterable[Axes], extra: Iterable[tuple[Any, str]] = ()) -> None:
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


def palette(df: pd.DataFrame, cols: list[str]) -> dict[str, Any]:
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


def style(label: str, palette: dict[str, Any] | None) -> dict[str, Any]:
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


def lines(
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
        style_kw = style(label, palette)
        text = label + ((extra_label or {}).get(label, ""))
        (line,) = ax.plot(g[x], g[y], label=no_math(text), linestyle=linestyle, **style_kw)
        drawn[label] = line
        if band and band[0] in g.columns and band[1] in g.columns:
            lo, hi = g[band[0]].to_numpy(dtype=float), g[band[1]].to_numpy(dtype=float)
            ok = np.isfinite(lo) & np.isfinite(hi) & ((lo > 0) | (not positive))
            if ok.any():
                ax.fill_between(
                    g[x].to_numpy(dtype=float)[ok], lo[ok], hi[ok], color=line.get_color(), alpha=0.1, linewidth=0
                )
    return drawn


__all__ = [
    "MARKERS",
    "FigureRegistry",
    "FigureSpec",
    "figure_legend",
    "grid",
    "lines",
    "log2_size_axis",
    "log_y_axis",
    "no_math",
    "palette",
    "run_title",
    "save_figure",
    "style",
    "title",
]
