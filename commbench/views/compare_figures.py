"""compare's figures: the aligned runs overlaid, one panel per collective (their own registry,
:data:`COMPARE_FIGURES`, which a plugin can add to).

What a person reads off them: one colour (and marker) per precision, one line style per run, the same in the
legend, whose entries are the drawn lines themselves; both y axes logarithmic with at least three labelled ticks
(``log_y_axis``), every panel's y axis labelled; each run's 95 % interval of the point as a shaded band of its
line's colour (busbw's from time's: busbw is bytes over time). Views only: nothing here reads a run directory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from commbench.core.units import human_rate, human_time
from commbench.views.compare_align import NO_PLACEMENT, PLACEMENT
from commbench.views.plots import FigureRegistry, grid, log2_size_axis, log_y_axis, no_math
from commbench.views.rundata import COLLECTIVE_ORDER, FP32_PRECISION, order

__all__ = ["COMPARE_FIGURES", "LINESTYLES", "Comparison"]

LINESTYLES = ["-", "--", ":", "-."]
"""Line style of run i (cycled): the baseline solid."""
MARKERS = "os^vDP"
"""Marker per precision (cycled)."""


@dataclass(frozen=True, slots=True)
class Comparison:
    """What compare's figures draw: the aligned points and the run labels, baseline first."""

    aligned: pd.DataFrame
    """`aligned()` of the runs: one row per common point, `<metric>|<label>` columns."""
    labels: list[str]
    """One label per run; the first is the baseline A."""


COMPARE_FIGURES: FigureRegistry[Comparison] = FigureRegistry()
"""compare's figures (overlays of the aligned runs), in the document's order."""


def _band(g: pd.DataFrame, metric: str, lab: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The 95 % interval of ``metric`` of run ``lab`` at each point of ``g``: time's own, busbw's from time's."""
    lo_t, hi_t = f"time_ci_low_us|{lab}", f"time_ci_high_us|{lab}"
    if lo_t not in g.columns or hi_t not in g.columns:
        return None
    lo, hi = g[lo_t].to_numpy(dtype=float), g[hi_t].to_numpy(dtype=float)
    if metric != "time_us":
        value, t = g[f"{metric}|{lab}"].to_numpy(dtype=float), g[f"time_us|{lab}"].to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            lo, hi = value * t / hi, value * t / lo  # a rate: the slow end of time is its low end
    ok = np.isfinite(lo) & np.isfinite(hi) & (lo > 0)
    return (lo, hi) if ok.any() else None


def _panel(ax: Axes, g: pd.DataFrame, labels: list[str], metric: str, colour: dict[str, str], precs: list[str]) -> None:
    placements = sorted(g[PLACEMENT].astype(str).unique()) if PLACEMENT in g.columns else [NO_PLACEMENT]
    for p_i, prec in enumerate(precs):
        for pl in placements:
            sel = g["precision"] == prec
            if PLACEMENT in g.columns:
                sel &= g[PLACEMENT].astype(str) == pl
            gp = g[sel].sort_values("size_bytes")
            if gp.empty:
                continue
            name = prec if pl == NO_PLACEMENT else f"{prec} {pl}"
            x = gp["size_bytes"].to_numpy(dtype=float)
            for i, lab in enumerate(labels):
                y = gp[f"{metric}|{lab}"].to_numpy(dtype=float)
                ax.plot(
                    x, y, linestyle=LINESTYLES[i % len(LINESTYLES)], marker=MARKERS[p_i % len(MARKERS)], markersize=3,
                    color=colour[prec], label=no_math(f"{name} [{lab}]"),
                )  # fmt: skip
                band = _band(gp, metric, lab)
                if band is not None:
                    ok = np.isfinite(band[0]) & np.isfinite(band[1]) & (band[0] > 0)
                    ax.fill_between(x[ok], band[0][ok], band[1][ok], color=colour[prec], alpha=0.12, linewidth=0)


def _overlay(c: Comparison, metric: str, ylabel: str, what: str, unit: Callable[[float], str]) -> Figure | None:
    al, labels = c.aligned, c.labels
    if al.empty:
        return None
    colls = order(al["collective"].unique(), COLLECTIVE_ORDER)
    fig, axes = grid(len(colls))
    precs = order(al["precision"].unique(), (FP32_PRECISION,))
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    colour = {p: ("black" if p == FP32_PRECISION else cycle[i % len(cycle)]) for i, p in enumerate(precs)}
    for ax, coll in zip(axes, colls, strict=True):
        g = al[al["collective"] == coll]
        _panel(ax, g, labels, metric, colour, precs)
        log2_size_axis(ax, g["size_bytes"])
        values = pd.to_numeric(pd.concat([g[f"{metric}|{lab}"] for lab in labels]), errors="coerce")
        if bool((values > 0).any()):
            log_y_axis(ax, unit)
        ax.set_title(coll)
        ax.set_xlabel("message size (bytes on the wire)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    # one legend below the panels whose entries are the drawn lines (their colour, marker and line style)
    seen: dict[str, Artist] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    styles = ", ".join(f"{lab} {LINESTYLES[i % len(LINESTYLES)]!r}" for i, lab in enumerate(labels))
    fig.suptitle(f"{what}: {' vs '.join(labels)} (line style = run: {styles}; band = 95 % interval)", fontsize=10,
                 parse_math=False)  # fmt: skip
    fig.tight_layout(rect=(0.0, 0.08 + 0.02 * math.ceil(len(seen) / 4), 1.0, 1.0))
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=min(4, len(seen)), fontsize=7)
    return fig


@COMPARE_FIGURES.register(
    "compare_busbw",
    "Bus bandwidth of the aligned points (log scale), one colour per precision, one line style per run, bands: 95 % intervals.",
)
def fig_compare_busbw(c: Comparison) -> Figure | None:
    return _overlay(c, "busbw_gbps", "bus bandwidth", "Bus bandwidth", human_rate)


@COMPARE_FIGURES.register("compare_latency", "Time per op of the aligned points (log-log), bands: 95 % intervals.")
def fig_compare_latency(c: Comparison) -> Figure | None:
    return _overlay(c, "time_us", "time per op", "Latency", human_time)
