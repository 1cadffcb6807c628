"""The gate of acceptance and CI runs (``python -m commbench check RUN``) and the per-node view over ``ranks.csv``.

A point fails a bar only when it is **significantly** below it, judged with the run's own intervals as
``compare`` judges ratios: ``--min-busbw`` and ``--min-link-util`` fail a point whose busbw interval lies
entirely below the bar (its upper end is below it; a point without an interval, an nccl-tests import, is judged
on its value and says so); ``--max-slowdown`` fails a point whose time over the baseline's, with the interval
``compare`` gives it (both runs' intervals combined, adjusted for the many ratios judged together), lies entirely
above ``1 + slowdown``, or, for two runs without intervals (nccl-tests text logs), whose ratio does: the decision
``compare`` makes (:func:`commbench.core.stats.judge`), so ``compare --threshold X`` calls slower exactly the points
``check --max-slowdown X`` fails. The bandwidth bars apply to the largest size of each (collective, precision, group)
series unless ``--from-size`` widens them (busbw at small sizes measures latency, not the link); the slowdown bar
applies to every aligned point of at least ``--from-size``.

A failing point names the node whose link limits its group (``link_host``) when the nodes' links differ. The
node view (:func:`node_view`) puts each node's link (its own report, ``metadata.json``) next to what its ranks
measured: how their per-op times compare with the other ranks' at the same point, how long they waited at the
barriers (the rank the others wait for waits least), how often the others waited for them
(:mod:`commbench.measure.stragglers`) and their spikes (a rank's time at a point far above the others'), as
nccl-tests' ``analyze_perf_json.py --straggler --spikes --nodes`` reads its per-rank JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from commbench.core import stats
from commbench.core.records import link_phrase
from commbench.core.units import human_bytes
from commbench.measure.stragglers import describe, stragglers
from commbench.store.results import load_table
from commbench.views.rundata import WORLD_GROUP, RunData, load_run, numeric, speed_rows

__all__ = ["CHECK_COLUMNS", "SPIKE_RATIO", "Bars", "GateResult", "check_run", "link_lines", "node_view", "parse_slowdown"]

SPIKE_RATIO = 1.5
"""A rank's median time at a point this many times the median of the other ranks' is a spike."""
SERIES = ["collective", "precision", "group"]


def parse_slowdown(text: str, flag: str = "--max-slowdown") -> float:
    """``10%`` or ``0.1`` -> 0.1 (``flag`` names the option in the one-line ValueError otherwise)."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise ValueError(f"{flag} must look like 10% or 0.1, got {text!r}") from None
    if not (0 <= v < 10) or math.isnan(v):
        raise ValueError(f"{flag} must be between 0% and 1000%, got {text!r}")
    return v


@dataclass(frozen=True, slots=True)
class Bars:
    """The bars a run must clear (None: not checked)."""

    min_busbw: float | None = None
    """GB/s."""
    max_slowdown: float | None = None
    """Fraction: 0.1 allows the run's time to be up to 10 % above the baseline's."""
    min_link_util: float | None = None
    """Fraction of the link (``link_util``)."""
    from_size: int | None = None
    """Gate every point of at least this many bytes (``size_bytes``); None: the bandwidth bars take the largest size
    of each series, the slowdown bar every size."""

    def any(self) -> bool:
        return any(v is not None for v in (self.min_busbw, self.max_slowdown, self.min_link_util))


CHECK_COLUMNS = [
    "bar", "collective", "precision", "group", "placement", "size_bytes", "value", "ci_low", "ci_high", "limit",
    "basis", "passed",
]  # fmt: skip
"""Columns of :attr:`GateResult.rows` (``commbench.check``'s table): one row per point a bar judged. bar: busbw
(GB/s), link_util (a fraction of the link) or slowdown (time over the baseline's); value with its interval (NaN
ends: a point estimate); limit: the bar (busbw, link_util: the least allowed; slowdown: 1 + --max-slowdown, the
most); basis: interval or point estimate (``threshold``); passed: False for a failing point."""


@dataclass(slots=True)
class GateResult:
    """What ``check`` found: failing points (one line each), how many points each bar judged, and notes."""

    failures: list[str] = field(default_factory=list)
    judged: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    """One dict per judged point and bar (:data:`CHECK_COLUMNS`), passing and failing."""

    def judge(self, bar: str, r: Any, value: float, low: float, high: float, limit: float, basis: str, ok: bool) -> None:
        """Record one judged point (``r``: its row, for the key columns)."""
        place = r.get("placement")
        self.rows.append({
            "bar": bar, "collective": r.get("collective"), "precision": r.get("precision"),
            "group": r.get("group") if isinstance(r.get("group"), str) else WORLD_GROUP,
            "placement": place if isinstance(place, str) else "", "size_bytes": int(_f(r.get("size_bytes"))),
            "value": value, "ci_low": low, "ci_high": high, "limit": limit, "basis": basis, "passed": ok,
        })  # fmt: skip

    @property
    def exit_code(self) -> int:
        return 1 if self.failures else 0


def _f(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _where(r: Any) -> str:
    grp = r.get("group")
    grp = WORLD_GROUP if grp is None or (isinstance(grp, float) and math.isnan(grp)) else grp
    place = r.get("placement")  # an nccl-tests import keeps out-of-place and in-place rows of one size
    place = f" {place}" if isinstance(place, str) and place else ""
    return f"{r['collective']} {r['precision']} [{grp}]{place} {human_bytes(_f(r['size_bytes']))}"


def _limited_by(r: Any) -> str:
    """Which node's link limits the point's group, when the nodes' links differ (``group_link``'s words)."""
    host, link = r.get("link_host"), str(r.get("link") or "")
    if isinstance(host, str) and host and "slowest of" in link:
        what, _, rest = link.partition(": ")[2].partition("; ")
        return f"; the slowest link is {host}'s: {what.removesuffix(f' on {host}')} ({rest})"
    return ""


def _gated(df: pd.DataFrame, from_size: int | None) -> pd.DataFrame:
    """The points the bandwidth bars judge: sizes from ``from_size``, else each series' largest size."""
    if df.empty:
        return df
    df = df.assign(group=df["group"].fillna(WORLD_GROUP) if "group" in df.columns else WORLD_GROUP)
    if from_size is not None:
        return df[numeric(df, "size_bytes") >= from_size]
    sizes = numeric(df, "size_bytes")
    largest = sizes.groupby([df[c] for c in SERIES]).transform("max")
    return df[sizes == largest]


def _bandwidth_bar(
    df: pd.DataFrame, name: str, bar: float, rate: pd.Series, unit: str, fmt: str, out: GateResult
) -> None:
    """Fail each point whose busbw interval, divided by ``rate`` (1 for GB/s, the link for link_util), lies below
    ``bar``."""
    value = numeric(df, "busbw_gbps") / rate
    high = numeric(df, "busbw_ci_high_gbps") / rate if "busbw_ci_high_gbps" in df.columns else value * math.nan
    low = numeric(df, "busbw_ci_low_gbps") / rate if "busbw_ci_low_gbps" in df.columns else value * math.nan
    judged = 0
    for i, r in df.iterrows():
        v, lo, hi = float(value[i]), float(low[i]), float(high[i])
        if math.isnan(v):
            continue
        judged += 1
        top, ci = (hi, f" [{lo:{fmt}}-{hi:{fmt}}]") if not math.isnan(hi) else (v, " (no interval)")
        out.judge(name, r, v, lo, hi, bar, "interval" if not math.isnan(hi) else "threshold", not top < bar)
        if top < bar:
            out.failures.append(f"{_where(r)}: {name} {v:{fmt}}{unit}{ci} is below {bar:{fmt}}{unit}{_limited_by(r)}")
    out.judged[name] = judged


def _slowdown_bar(run: RunData, base: RunData, bars: Bars, out: GateResult) -> None:
    from commbench.views.compare import aligned, compare_warnings, ratio_frame

    labels = ["baseline", "run"]
    out.notes += [f"warning: {w}" for w in compare_warnings([base, run], labels)]
    al = aligned([base, run], labels)
    rf = ratio_frame(al, labels)
    if bars.from_size is not None and not rf.empty:
        rf = rf[rf["size_bytes"] >= bars.from_size]
    limit = 1.0 + float(bars.max_slowdown or 0.0)
    links = (
        run.results.assign(group=run.results["group"].fillna(WORLD_GROUP)) if "group" in run.results else run.results
    )
    for _, r in rf.iterrows():
        ratio, lo, hi = _f(r["time_ratio"]), _f(r["time_ratio_ci_low"]), _f(r["time_ratio_ci_high"])
        # the decision compare makes (stats.judge), at the bar: the adjusted interval, else the point estimate
        j = stats.judge(stats.Estimate(ratio, lo, hi, 0), float(bars.max_slowdown or 0.0))
        ci = f" [{lo:.3f}-{hi:.3f}]" if j.basis == "interval" else " (point estimates, no interval)"
        out.judge("slowdown", r, ratio, lo, hi, limit, j.basis, j.direction <= 0)
        if j.direction > 0:
            sel = links
            for k in (*SERIES, "size_bytes"):
                sel = sel[sel[k].astype(str) == str(r[k])] if k in sel.columns else sel
            lim = _limited_by(sel.iloc[0]) if len(sel) else ""
            out.failures.append(
                f"{_where(r)}: time {ratio:.3f}x the baseline's{ci}, more than {limit:.3f}x "
                f"(--max-slowdown {bars.max_slowdown:.0%}){lim}"
            )
    out.judged["slowdown"] = len(rf)


def check_run(run_dir: Path | str, bars: Bars, baseline: Path | str | None = None) -> GateResult:
    """Judge a run directory against ``bars`` (and a baseline run for ``max_slowdown``).

    Raises ValueError (one line) when a bar cannot be judged at all: no bar given, ``max_slowdown`` without a
    baseline, ``min_link_util`` on a run none of whose points has a link rate."""
    if not bars.any():
        raise ValueError(
            "check needs at least one bar: --min-busbw GB/s, --max-slowdown 10% (with --baseline) or --min-link-util 0.8"
        )
    if bars.max_slowdown is not None and baseline is None:
        raise ValueError("--max-slowdown needs --baseline RUN (the run the slowdown is measured against)")
    run = load_run(run_dir)
    out = GateResult()
    df = speed_rows(run.results)
    if df.empty:
        raise ValueError(f"{run_dir} has no collective results to check")
    gated = _gated(df, bars.from_size)
    if bars.min_busbw is not None:
        _bandwidth_bar(gated, "busbw", bars.min_busbw, pd.Series(1.0, index=gated.index), " GB/s", ".4g", out)
    if bars.min_link_util is not None:
        rate = numeric(gated, "link_gbps") if "link_gbps" in gated.columns else pd.Series(math.nan, index=gated.index)
        with_link = gated[rate > 0]
        if with_link.empty:
            why = sorted({str(x) for x in gated.get("link", pd.Series(dtype=object)).dropna() if str(x)})
            raise ValueError(
                f"--min-link-util: no point of {run_dir} has a link rate"
                + (f" ({'; '.join(why)})" if why else " (a run from before link_util, or an import)")
                + "; use --min-busbw"
            )
        _bandwidth_bar(with_link, "link_util", bars.min_link_util, rate[rate > 0], "", ".2f", out)
        if len(with_link) < len(gated):
            out.notes.append(f"--min-link-util: {len(gated) - len(with_link)} point(s) without a link rate not judged")
    if bars.max_slowdown is not None:
        assert baseline is not None
        _slowdown_bar(run, load_run(baseline), bars, out)
    return out


def _node_links(meta: dict[str, Any]) -> dict[str, str]:
    """host -> its inter-node link as it reported it (``metadata.json``'s ``node_reports``)."""
    out: dict[str, str] = {}
    for n in meta.get("node_reports") or []:
        link = n.get("link") or {}
        out[str(n.get("host"))] = str(link.get("label", "")) if link else ""
    return out


def node_view(run_dir: Path | str) -> tuple[list[str], list[str]]:
    """The per-node view of a run: (table lines, findings). One line per node: its ranks, its link, the median over
    points of its ranks' time over the point's median rank time, its ranks' median barrier wait, how many points
    the others waited for one of its ranks, and its spikes; findings name the stragglers
    (:func:`commbench.measure.stragglers.stragglers`), the spikes (rank, points) and nodes whose links differ."""
    meta = load_run(run_dir).metadata
    ranks = load_table(run_dir, "ranks")
    links = _node_links(meta)
    if ranks.empty or "rank" not in ranks.columns:
        return [], ["no per-rank table (ranks.csv): nothing to say about nodes"]
    keys = [c for c in ("collective", "precision", "group", "payload", "fp32_bytes") if c in ranks.columns]
    r = ranks.assign(time_us=numeric(ranks, "time_us"), wait_us=numeric(ranks, "wait_us"))
    point_median = r.groupby(keys)["time_us"].transform("median")

    def others(t: pd.Series) -> pd.Series:
        # against the median of the *other* ranks: with 2 ranks the point's own median is halfway to the spike
        return pd.Series([t.drop(index=i).median() if len(t) > 1 else math.nan for i in t.index], index=t.index)

    r = r.assign(
        rel=r["time_us"] / point_median, other_median=r.groupby(keys, group_keys=False)["time_us"].apply(others)
    )
    r["spike"] = r["time_us"] > SPIKE_RATIO * r["other_median"]
    found = stragglers(ranks)
    # who the others waited for at each point (the precisions of a size share their rounds: one per size)
    waits = r.dropna(subset=["wait_us"])
    per_size = [c for c in ("collective", "group", "payload", "fp32_bytes") if c in waits.columns]
    last = waits.loc[waits.groupby(per_size)["wait_us"].idxmin(), "host"] if len(waits) else pd.Series(dtype=object)
    waited_by_node = {str(h): int(n) for h, n in last.astype(str).value_counts().items()}
    lines = [f"{'node':<22} {'ranks':<10} {'time/median':>11} {'wait_us':>9} {'waited for':>10} {'spikes':>6}  link"]
    for host, g in r.groupby("host", sort=False):
        rk = sorted({int(x) for x in g["rank"]})
        shown = ",".join(map(str, rk)) if len(rk) <= 4 else f"{rk[0]}-{rk[-1]}"
        lines.append(
            f"{str(host):<22} {shown:<10} {float(g['rel'].median()):>11.3f} {float(g['wait_us'].median()):>9.0f} "
            f"{waited_by_node.get(str(host), 0):>10d} {int(g['spike'].sum()):>6d}  {links.get(str(host), '')}"
        )
    notes = [f"straggler: {describe(s)}" for s in found]
    spikes = r[r["spike"]]
    for rank, g in spikes.groupby("rank", sort=True):
        where = ", ".join(
            f"{x['collective']} {x['precision']} {human_bytes(_f(x['fp32_bytes']))} ({_f(x['time_us']) / _f(x['other_median']):.1f}x)"
            for _, x in g.head(5).iterrows()
        )
        more = f" and {len(g) - 5} more" if len(g) > 5 else ""
        notes.append(
            f"spikes: rank {rank} on {g['host'].iloc[0]} at {len(g)} point(s), over {SPIKE_RATIO}x the other ranks' median: {where}{more}"
        )
    rated = _rated_links(meta)
    if len({v for v in rated.values()}) > 1:
        top = max(rated.values())
        slow = [f"{h} ({links[h]})" for h, v in rated.items() if v < top]
        notes.append(f"nodes' links differ: {', '.join(slow)} below the fastest {top:.4g} GB/s")
    return lines, notes


def _rated_links(meta: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in meta.get("node_reports") or []:
        g = (n.get("link") or {}).get("gbps")
        if isinstance(g, (int, float)):
            out[str(n.get("host"))] = float(g)
    return out


def link_lines(run_dir: Path | str) -> list[str]:
    """Each series' link_util at its largest size in words (the report's finding), for ``check``'s output."""
    df = _gated(speed_rows(load_run(run_dir).results), None)
    return [p for _, r in df.iterrows() if (p := link_phrase(r, human_bytes))]
