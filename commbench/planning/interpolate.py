"""Pricing a call from the measured points themselves: one measured curve per layout, interpolated between its
points, with an interval.

Why: a latency-bandwidth line cannot bend where real curves bend (NCCL switches protocol and algorithm with the
size: a published 2-node H100 all_reduce log is flat from 16 to 32 MiB, then steeper), so inside the measured sizes
the points are the better price and the fitted model (:mod:`commbench.planning.costmodel`) only extrapolates.

A :class:`MeasuredCurve` holds the points of one (collective, precision, group) on one layout: the group's ranks
``n``, the nodes it spans and the groups sharing each node link (the cost model's "Layouts"); a call is priced
from a curve only on exactly that layout and inside its sizes.

Between two neighbouring points the time follows the straight line through them, ``t = t_i + u (t_{i+1} - t_i)``
with ``u = (S - S_i) / (S_{i+1} - S_i)``: the latency-bandwidth law of that one segment, exact wherever one
protocol holds between the points (a log-log line through the same two points errs by up to ~1.5 % per factor-2
gap at the knee of ``alpha + beta S``; on a log-log plot the two are the same segment to the eye). On two published
logs of real clusters, every other size held out, the line misses by a median of 0.7-0.8 %, log-log by 1.6-2.9 %
(benchmarks/results/2026-12-02_2core-vm_gloo.md).

Interval: each point's own bounds (its 95 % interval when the run measured one; else the range of the rows at that
size, e.g. nccl-tests' out-of-place and in-place times; else, for a curve of single rows, ``Z95`` times the rms of
the curve's leave-one-out log errors, its points' scatter about their neighbours), interpolated in log, and widened
between points by what the same interpolation misses on this curve: the leave-one-out error of the two points
bounding the segment (each predicted from its neighbours), scaled by ``4u(1-u)`` so that it is zero on a point and
whole at mid-gap. No distribution is assumed beyond that; the widening is conservative (its gap is twice the real one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054
"""The two-sided 95 % quantile of the normal distribution."""

SPREADS = ("interval", "range", "none")
"""How a curve's point bounds were obtained: the runs' 95 % intervals, the range of repeated rows, or nothing."""


@dataclass(frozen=True, slots=True)
class MeasuredCurve:
    """The measured times (seconds) of one (collective, precision, group) on one layout, by wire bytes (nccl-tests
    sizes, ascending and distinct)."""

    world_size: int
    """Ranks of the group (``group_size``, else ``world_size``), as ``CostModel.predict`` takes it."""
    spans: int
    """Nodes the group spans (1: within a node)."""
    link_share: int
    """Groups of this kind crossing each node link at once (:func:`commbench.planning.costmodel.link_sharing`);
    0 within a node."""
    sizes: tuple[float, ...]
    time_s: tuple[float, ...]
    low_s: tuple[float, ...]
    high_s: tuple[float, ...]
    spread: str
    """One of :data:`SPREADS`."""

    def __post_init__(self) -> None:
        m = len(self.sizes)
        if not m or any(len(x) != m for x in (self.time_s, self.low_s, self.high_s)):
            raise ValueError("a measured curve needs one time, low and high per size, and at least one size")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)):
            raise ValueError("a measured curve's sizes must be ascending and distinct")
        if self.spread not in SPREADS:
            raise ValueError(f"unknown spread {self.spread!r}; known: {', '.join(SPREADS)}")

    @property
    def min_bytes(self) -> float:
        return self.sizes[0]

    @property
    def max_bytes(self) -> float:
        return self.sizes[-1]

    def covers(self, wire: float) -> bool:
        """Whether ``wire`` bytes lie within the measured sizes (a relative 1e-9 of slack for rounding)."""
        return self.sizes[0] * (1 - 1e-9) <= wire <= self.sizes[-1] * (1 + 1e-9)

    def loo_log_errors(self) -> tuple[float, ...]:
        """ln(measured / interpolated from the two neighbours) per point; 0 at the ends (no neighbour pair)."""
        s, t = self.sizes, self.time_s
        out = [0.0] * len(s)
        for i in range(1, len(s) - 1):
            u = (s[i] - s[i - 1]) / (s[i + 1] - s[i - 1])
            guess = t[i - 1] + u * (t[i + 1] - t[i - 1])
            out[i] = math.log(t[i] / guess) if guess > 0 and t[i] > 0 else 0.0
        return tuple(out)

    def at(self, wire: float) -> tuple[float, float, float, str]:
        """(time, low, high, where) at ``wire`` bytes inside the measured sizes; ``where`` names the point(s)."""
        if not self.covers(wire):
            raise ValueError(f"{wire:.0f} bytes lie outside the measured {self.min_bytes:.0f}..{self.max_bytes:.0f}")
        s = self.sizes
        wire = min(max(wire, s[0]), s[-1])
        j = int(np.searchsorted(np.asarray(s), wire, side="left"))
        errs = self.loo_log_errors()
        # no spread measured: each point is as uncertain as the curve's points are off their neighbours' line
        floor = Z95 * self.scatter() if self.spread == "none" else 0.0
        if j < len(s) and abs(s[j] - wire) <= 1e-9 * s[j]:
            t = self.time_s[j]
            return t, self.low_s[j] * math.exp(-floor), self.high_s[j] * math.exp(floor), f"measured at {_human(s[j])}"
        i = j - 1  # s[i] < wire < s[i + 1]
        u = (wire - s[i]) / (s[i + 1] - s[i])
        t0, t1 = self.time_s[i], self.time_s[i + 1]
        t = t0 + u * (t1 - t0)
        lo = (1 - u) * _ln(self.low_s[i], t0) + u * _ln(self.low_s[i + 1], t1) - floor
        hi = (1 - u) * _ln(self.high_s[i], t0) + u * _ln(self.high_s[i + 1], t1) + floor
        bracket = [abs(e) for e in (errs[i], errs[i + 1]) if e != 0.0]
        widen = Z95 * (max(bracket) if bracket else 0.0) * 4.0 * u * (1.0 - u)
        where = f"interpolated between the measured {_human(s[i])} and {_human(s[i + 1])}"
        return t, t * math.exp(lo - widen), t * math.exp(hi + widen), where

    def scatter(self) -> float:
        """Root mean square of the leave-one-out log errors of the inner points (0 with fewer than three points):
        the interval of a curve that measured no spread (one row per size, no interval)."""
        inner = self.loo_log_errors()[1:-1]
        return math.sqrt(sum(e * e for e in inner) / len(inner)) if inner else 0.0


def _ln(bound: float, t: float) -> float:
    """ln(bound / t): 0 where the bound is unknown (a point with no spread)."""
    return math.log(bound / t) if bound > 0 and t > 0 and math.isfinite(bound) else 0.0


def _human(b: float) -> str:
    for unit, s in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if b >= s:
            return f"{b / s:g}{unit}"
    return f"{b:g}"


def curve_from_rows(
    world_size: int, spans: int, link_share: int, sizes: Sequence[float], times_s: Sequence[float],
    lows_s: Sequence[float], highs_s: Sequence[float],
) -> MeasuredCurve:  # fmt: skip
    """One curve from the rows of one layout (several rows per size allowed: passes, runs, nccl-tests' out-of-place
    and in-place). Per size: the median time; bounds from the rows' intervals (NaN where a row has none), their
    envelope with the rows' times; with no interval but several rows, their range; else none."""
    size = np.asarray(sizes, float)
    t = np.asarray(times_s, float)
    lo = np.asarray(lows_s, float)
    hi = np.asarray(highs_s, float)
    if not (len(size) == len(t) == len(lo) == len(hi)) or not len(size):
        raise ValueError("curve_from_rows needs one size, time, low and high per row, and at least one row")
    have_iv = bool(np.all(np.isfinite(lo) & np.isfinite(hi)))
    out_s, out_t, out_lo, out_hi = [], [], [], []
    repeated = False
    for s in np.unique(size):
        m = size == s
        ts = t[m]
        med = float(np.median(ts))
        repeated |= len(ts) > 1
        if have_iv:
            low, high = float(min(lo[m].min(), ts.min())), float(max(hi[m].max(), ts.max()))
        else:
            low, high = float(ts.min()), float(ts.max())
        out_s.append(float(s))
        out_t.append(med)
        out_lo.append(min(low, med))
        out_hi.append(max(high, med))
    spread = "interval" if have_iv else ("range" if repeated else "none")
    return MeasuredCurve(
        world_size=int(world_size), spans=int(spans), link_share=int(link_share), sizes=tuple(out_s),
        time_s=tuple(out_t), low_s=tuple(out_lo), high_s=tuple(out_hi), spread=spread,
    )  # fmt: skip


def find_curve(
    curves: Sequence[MeasuredCurve], world_size: int, spans: int | None, link_share: int
) -> MeasuredCurve | None:
    """The curve measured on exactly this layout (``spans`` None: any nodes, when only one was measured)."""
    hits = [
        c for c in curves
        if c.world_size == world_size and c.link_share == link_share and (spans is None or c.spans == spans)
    ]  # fmt: skip
    return hits[0] if len(hits) == 1 else None


def layouts(curves: Sequence[MeasuredCurve]) -> str:
    """The measured layouts, as a reason names them: ``n=16 on 2 nodes, n=8 on 1 node``."""
    return ", ".join(f"n={c.world_size} on {c.spans} node{'s' if c.spans != 1 else ''}" for c in curves) or "none"


__all__ = ["MeasuredCurve", "SPREADS", "Z95", "curve_from_rows", "find_curve", "layouts"]
