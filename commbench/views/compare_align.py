"""Aligning runs for ``compare`` and ``check``: the same point in every run, with the interval of its time.

Points are aligned by (collective, precision, group, size_bytes) on each run's primary payload (normal first)
and, when every run has them (nccl-tests imports), by placement: out-of-place and in-place are compared
separately. When only some runs have placements, theirs enter as the median of the two.

A commbench run's point carries the 95 % interval of its time. An nccl-tests import has one averaged measurement
per point and no interval, unless the import holds more than that:

- per-iteration times (``-I 1`` with ``-J``: the ``nccl_iterations`` table): the interval is the order-statistic
  interval of the iterations' median (the slowest rank's time per iteration, the leading ``-K`` ones left out),
  scaled to the row's own time;
- repeated cycles (``-N``): with at least :data:`~commbench.core.stats.MIN_SAMPLES_95` cycles of a point, the
  interval of their median (the point's time is then that median).

Otherwise the point stays a point estimate, and ``compare`` judges it against a threshold
(:func:`commbench.core.stats.judge`).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from commbench.core import stats
from commbench.store.results import load_table
from commbench.views.rundata import WORLD_GROUP, RunData, speed_rows

__all__ = ["ALIGN_KEYS", "NO_PLACEMENT", "PLACEMENT", "aligned", "has_placement", "point_frame"]

ALIGN_KEYS = ["collective", "precision", "group", "size_bytes"]
"""A point is the same point in two runs when these agree (group: world, intra, inter; "world" for runs
written before groups existed); and the placement, when every run has one (`PLACEMENT`)."""
PLACEMENT = "placement"
NO_PLACEMENT = "-"
"""The placement of a point from a run without placements (commbench's own runs), or of the median of an
import's out-of-place and in-place rows when it is compared with such a run."""
VALUES = ("busbw_gbps", "time_us", "time_ci_low_us", "time_ci_high_us", "algbw_gbps", "effective_gbps")
ITER_KEYS = ["block", "collective", "dtype", "size_bytes", "placement"]
"""What ties an imported row to its iterations in ``nccl_iterations``."""


def has_placement(run: RunData) -> bool:
    return PLACEMENT in run.results.columns and bool(run.results[PLACEMENT].notna().any())


def _scaled(time_us: float, ci: stats.Estimate) -> tuple[float, float]:
    """``ci`` (an interval of a median) moved to ``time_us``: the same relative width around the row's time."""
    if not (ci.value > 0 and math.isfinite(ci.low) and math.isfinite(ci.high) and time_us > 0):
        return math.nan, math.nan
    return time_us * ci.low / ci.value, time_us * ci.high / ci.value


def _iteration_intervals(run: RunData, df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with time_ci_low_us/high_us from the run's per-iteration times where it has them (and none yet)."""
    if not all(c in df.columns for c in ITER_KEYS):
        return df
    try:
        its = load_table(run.run_dir, "nccl_iterations")
    except ValueError:
        return df
    if its.empty or "time_us" not in its.columns:
        return df
    its = its[pd.to_numeric(its["process"], errors="coerce") == -1]  # the slowest rank of each iteration
    by_point = {tuple(k): g for k, g in its.groupby(ITER_KEYS, sort=False)}
    df = df.copy()
    for col in ("time_ci_low_us", "time_ci_high_us"):
        if col not in df.columns:
            df[col] = math.nan
    for i, r in df.iterrows():
        if math.isfinite(float(r["time_ci_low_us"])):
            continue
        g = by_point.get(tuple(r[k] for k in ITER_KEYS))
        if g is None:
            continue
        skipped = int(r["iter_skipped"]) if "iter_skipped" in df.columns and pd.notna(r["iter_skipped"]) else 0
        times = pd.to_numeric(g[g["iteration"] >= skipped]["time_us"], errors="coerce").dropna().tolist()
        if len(times) >= stats.MIN_SAMPLES_95:
            df.loc[i, ["time_ci_low_us", "time_ci_high_us"]] = _scaled(float(r["time_us"]), stats.median_ci(times))
    return df


def _cycle_interval(g: pd.DataFrame) -> pd.Series:
    """One point's rows (several: -N cycles, or placements entering as their median): medians, and where the
    rows are cycles of one placement, at least 6 of them, and carry no interval, the interval of their median."""
    out = g[_present(g)].median()
    times = pd.to_numeric(g["time_us"], errors="coerce").dropna().tolist()
    lone = g["_placement"].nunique() == 1 if "_placement" in g.columns else True
    if lone and len(times) >= stats.MIN_SAMPLES_95 and not g["time_ci_low_us"].notna().any():
        ci = stats.median_ci(times)
        out["time_us"], out["time_ci_low_us"], out["time_ci_high_us"] = ci.value, ci.low, ci.high
    return out


def _present(df: pd.DataFrame) -> list[str]:
    return [c for c in VALUES if c in df.columns]


def point_frame(run: RunData, by_placement: bool) -> pd.DataFrame:
    """One row per point of ``run`` (its primary payload) keyed by ALIGN_KEYS + placement, with the values
    compare reads and the interval of its time (module docstring)."""
    df = run.results
    keys = [*ALIGN_KEYS, PLACEMENT]
    if df.empty:
        return pd.DataFrame(columns=[*keys, *VALUES])
    df = speed_rows(df)
    df = df.assign(group=df["group"].fillna(WORLD_GROUP) if "group" in df.columns else WORLD_GROUP)
    df = _iteration_intervals(run, df)
    own = df[PLACEMENT].fillna(NO_PLACEMENT).astype(str) if PLACEMENT in df.columns else NO_PLACEMENT
    df = df.assign(_placement=own, placement=own if by_placement else NO_PLACEMENT)
    for c in ("time_ci_low_us", "time_ci_high_us"):
        if c not in df.columns:
            df[c] = math.nan
    vals = _present(df)
    d = df[[*keys, *vals, "_placement"]].copy()
    for c in vals:
        d[c] = pd.to_numeric(d[c], errors="coerce")
    rows = [
        {**dict(zip(keys, k, strict=True)), **_cycle_interval(g).to_dict()}
        for k, g in d.groupby(keys, sort=False)
    ]
    return pd.DataFrame(rows, columns=[*keys, *vals])


def aligned(runs: list[RunData], labels: list[str]) -> pd.DataFrame:
    """Inner join of every run's points on (collective, precision, group, size_bytes, placement); columns
    `<metric>|<label>` per run. The placement is the rows' own when every run has placements, else "-" (the
    median over an import's placements)."""
    merged: Any = None
    by_placement = bool(runs) and all(has_placement(r) for r in runs)
    for run, lab in zip(runs, labels, strict=True):
        p = point_frame(run, by_placement).set_index([*ALIGN_KEYS, PLACEMENT])
        p.columns = [f"{c}|{lab}" for c in p.columns]
        merged = p if merged is None else merged.join(p, how="inner")
    if merged is None or merged.empty:
        return pd.DataFrame()
    return pd.DataFrame(merged.reset_index())
