"""The views as Python functions returning tables (``commbench.compare``, ``commbench.check``,
``commbench.figures``): what ``python -m commbench compare`` / ``check`` / ``report`` compute, without writing
files, for a notebook or a script (docs/api.md)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from commbench.core import stats
from commbench.views.compare import aligned, compare_warnings, ratio_frame, resolve_labels
from commbench.views.gate import CHECK_COLUMNS, Bars, check_run, parse_slowdown
from commbench.views.rundata import load_run

__all__ = ["check", "compare", "figures"]

PathLike = str | os.PathLike[str]


def _fraction(v: float | str | None, flag: str) -> float | None:
    if v is None or isinstance(v, float | int):
        return None if v is None else float(v)
    return parse_slowdown(v, flag)


def compare(
    a: PathLike,
    b: PathLike,
    *more: PathLike,
    labels: Sequence[str] | None = None,
    min_effect: float = 0.0,
    threshold: float | str = stats.DEFAULT_THRESHOLD,
) -> pd.DataFrame:
    """Every point the runs share, one row per point and run after the first (the baseline): time B/A with its
    interval and verdict, as ``compare.csv`` (``commbench.views.compare.COMPARE_COLUMNS``). ``threshold``
    (``0.05`` or ``"5%"``) judges points without intervals (nccl-tests text logs); ``min_effect`` those with.
    ``df.attrs["warnings"]`` lists why the comparison may be unfair. Bad input raises ValueError."""
    dirs = [a, b, *more]
    labs = resolve_labels([Path(d) for d in dirs], list(labels) if labels is not None else None)
    runs = [load_run(Path(d)) for d in dirs]
    bar = _fraction(threshold, "threshold")
    df = ratio_frame(aligned(runs, labs), labs, min_effect, stats.DEFAULT_THRESHOLD if bar is None else bar)
    df.attrs["warnings"] = compare_warnings(runs, labs)
    return df


def check(
    run: PathLike,
    *,
    min_busbw: float | None = None,
    max_slowdown: float | str | None = None,
    baseline: PathLike | None = None,
    min_link_util: float | None = None,
    from_size: int | None = None,
) -> pd.DataFrame:
    """The gate of ``commbench check``: one row per judged point and bar (``commbench.views.gate.CHECK_COLUMNS``),
    ``passed`` False where the point lies significantly beyond the bar (or, without intervals, its value does);
    ``df.attrs["failures"]`` has check's lines and ``df.attrs["notes"]`` its notes. ``max_slowdown`` (``0.1`` or
    ``"10%"``) needs ``baseline``. Bad input raises ValueError, as the command exits 2."""
    bars = Bars(min_busbw, _fraction(max_slowdown, "max_slowdown"), min_link_util, from_size)
    result = check_run(Path(run), bars, Path(baseline) if baseline is not None else None)
    df = pd.DataFrame(result.rows, columns=CHECK_COLUMNS)
    df.attrs["failures"] = list(result.failures)
    df.attrs["notes"] = list(result.notes)
    return df


def figures(run: PathLike, names: Sequence[str] | None = None) -> dict[str, Figure]:
    """The report's figures of a run directory (``commbench.FIGURES``, in its order), built but not saved: name ->
    matplotlib Figure, leaving out those the run has nothing for; ``names`` picks some (an unknown one is a
    ValueError naming the valid ones)."""
    from commbench.views.plots import FIGURES

    data = load_run(Path(run))
    chosen = list(FIGURES) if names is None else list(names)
    unknown = [n for n in chosen if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure(s) {', '.join(unknown)}; valid choices: {', '.join(FIGURES)}")
    out: dict[str, Figure] = {}
    for name in chosen:
        fig = FIGURES[name](data)
        if fig is not None:
            out[name] = fig
    return out
