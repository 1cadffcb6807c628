"""Comparing runs: ratio tables judged together, fairness warnings, HTML + Markdown.

This module owns `compare_runs` (the `python -m commbench compare` view), `ratio_frame` (the verdict per point,
which `check --max-slowdown` reads too) and `compare_warnings`. Points are aligned by
:mod:`commbench.views.compare_align` (which also finds an import's intervals: per-iteration times, -N cycles) and
drawn by :mod:`commbench.views.compare_figures`. The first run is the baseline A; every other run B gets B/A
ratios of time and of busbw, each the ratio of the runs' own numbers (their bus factors may differ: different world
sizes). Points with intervals get a significance verdict; point estimates a threshold verdict, labelled as such.
It reads run directories only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from commbench.core import plugins, stats
from commbench.store.results import atomic_write_text
from commbench.views.compare_align import NO_PLACEMENT, PLACEMENT, aligned, has_placement
from commbench.views.compare_figures import COMPARE_FIGURES, Comparison
from commbench.views.render import render_html, render_markdown
from commbench.views.rundata import (
    COLLECTIVE_ORDER,
    FP32_PRECISION,
    IMPORT_LAUNCHER,
    RunData,
    human_size,
    load_run,
    order,
)
from commbench.views.tables import Table, fmt

__all__ = [
    "COMPARE_FIGURES",
    "Comparison",
    "aligned",
    "compare_runs",
    "compare_warnings",
    "ratio_frame",
    "ratio_table",
    "resolve_labels",
]

# metadata fields that make a comparison unfair when they differ, with why (shown to the user).
FAIRNESS: list[tuple[str, str]] = [
    ("world_size", "busbw normalises by world size, but time and algbw do not"),
    ("nodes", "intra-node and inter-node links differ"),
    ("nproc_per_node", "ranks per node change which links carry traffic"),
    ("backend", "gloo and nccl are different transports"),
    ("torch_version", "collective implementations change between torch releases"),
    ("nccl_version", "NCCL algorithms and fp8 support change between versions"),
    ("threads_per_rank", "CPU threads per rank change gloo's speed"),
    ("suite", "the suites differ (sizes, precisions or payloads)"),
    ("timing", "the timing settings differ (warmup, min time, repeats)"),
]
RUN_SETTINGS = ("suite", "timing")
"""FAIRNESS keys holding how commbench measured (too long to show; an nccl-tests import has neither)."""


def resolve_labels(run_dirs: list[Path], labels: list[str] | None) -> list[str]:
    """Labels for the runs: given ones (same count, unique, non-empty) or the directory names."""
    if len(run_dirs) < 2:
        raise ValueError(f"compare needs at least 2 run directories, got {len(run_dirs)}")
    if labels is None:
        names = [Path(d).resolve().name or str(d) for d in run_dirs]
        if len(set(names)) == len(names):
            return names
        return [f"{chr(ord('A') + i) if i < 26 else i}:{n}" for i, n in enumerate(names)]
    labels = [s.strip() for s in labels]
    if len(labels) != len(run_dirs):
        raise ValueError(f"--labels has {len(labels)} label(s) for {len(run_dirs)} run(s); give one label per run")
    if any(not s for s in labels) or len(set(labels)) != len(labels):
        raise ValueError(f"--labels must be non-empty and distinct, got {labels}")
    return labels


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def compare_warnings(runs: Sequence[RunData | Path | str], labels: list[str] | None = None) -> list[str]:
    """Plain-language reasons the comparison may be unfair (differences in layout, versions, suite).

    Accepts run directories or already loaded runs; labels as for `compare_runs`.
    """
    loaded = [r if isinstance(r, RunData) else load_run(Path(r)) for r in runs]
    labels = resolve_labels([r.run_dir for r in loaded], labels)
    runs = loaded
    out: list[str] = []
    imported = [lab for lab, r in zip(labels, runs, strict=True) if r.metadata.get("launcher") == IMPORT_LAUNCHER]
    for key, why in FAIRNESS:
        if imported and key in RUN_SETTINGS:
            continue  # an import has neither in commbench's sense; the import warning below says so
        vals = [r.metadata.get(key) for r in runs]
        # unknown (None) is not a difference: imports know no torch version, CPU runs no NCCL one
        if len({_canon(v) for v in vals if v is not None}) > 1:
            if key in RUN_SETTINGS:
                shown = ", ".join(labels)
            else:
                shown = ", ".join(f"{lab}={v}" for lab, v in zip(labels, vals, strict=True))
            out.append(f"runs differ in {key} ({shown}): {why}.")
    if imported and len(imported) < len(runs):
        out.append(
            f"{', '.join(imported)} imported from nccl-tests: times are nccl-tests' (GPU kernels, no "
            "encode/decode), compared with commbench's own timing protocol."
        )
    placed = [lab for lab, r in zip(labels, runs, strict=True) if has_placement(r)]
    if placed and len(placed) < len(runs):
        out.append(
            f"{', '.join(placed)} report out-of-place and in-place separately and the other run(s) do not: "
            f"{'their' if len(placed) > 1 else 'its'} two placements enter as their median."
        )
    al = aligned(runs, labels)
    if al.empty:
        out.append("the runs have no (collective, precision, size) point in common: nothing to compare.")
    return out


def ratio_table(al: pd.DataFrame, labels: list[str]) -> Table:
    """Per aligned point: baseline busbw and time, then per other run busbw B/A and time B/A."""
    a = labels[0]
    placed = _shows_placement(al)
    cols = ["collective", "precision", "group", *(["placement"] if placed else []), "size", f"busbw {a} (GB/s)", f"time {a} (us)"]
    for b in labels[1:]:
        cols += [f"busbw {b}", f"busbw {b}/{a}", f"time {b}", f"time {b}/{a}"]
    rows = []
    colls = order(al["collective"].unique(), COLLECTIVE_ORDER) if len(al) else []
    for coll in colls:
        g = al[al["collective"] == coll].sort_values(["group", "precision", PLACEMENT, "size_bytes"])
        for _, r in g.iterrows():
            row = [
                str(r["collective"]),
                str(r["precision"]),
                str(r["group"]),
                *([str(r[PLACEMENT])] if placed else []),
                human_size(float(r["size_bytes"])),
                fmt(r.get(f"busbw_gbps|{a}")),
                fmt(r.get(f"time_us|{a}")),
            ]
            for b in labels[1:]:
                row += [
                    fmt(r.get(f"busbw_gbps|{b}")),
                    fmt(_ratio(r.get(f"busbw_gbps|{b}"), r.get(f"busbw_gbps|{a}"))),
                    fmt(r.get(f"time_us|{b}")),
                    fmt(_ratio(r.get(f"time_us|{b}"), r.get(f"time_us|{a}"))),
                ]
            rows.append(row)
    return Table(
        "ratios",
        f"Aligned points: ratios against {a} (busbw B/A > 1 and time B/A < 1 mean B is faster)",
        cols,
        rows,
        "Aligned by collective, precision and size on the wire (and placement, when every run has them); each run's "
        "primary payload. busbw B/A is the ratio of the runs' own busbw (their bus factors differ when their world "
        "sizes do), not the inverse of the time ratio.",
    )


def _shows_placement(al: pd.DataFrame) -> bool:
    """Tables show a placement column only when the points were aligned by placement."""
    return PLACEMENT in al.columns and bool((al[PLACEMENT].astype(str) != NO_PLACEMENT).any())


def _ratio(b: Any, a: Any) -> float:
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError):
        return math.nan
    return fb / fa if fa > 0 and math.isfinite(fa) and math.isfinite(fb) else math.nan


def _gmean(x: pd.Series) -> float:
    x = x[(x > 0) & np.isfinite(x)]
    return float(np.exp(np.log(x).mean())) if len(x) else math.nan


def _estimate(r: Any, lab: str) -> stats.Estimate:
    t = float(r.get(f"time_us|{lab}", math.nan))
    lo = float(r.get(f"time_ci_low_us|{lab}", math.nan))
    hi = float(r.get(f"time_ci_high_us|{lab}", math.nan))
    return stats.Estimate(t, lo, hi, 0)


def ratio_frame(
    al: pd.DataFrame, labels: list[str], min_effect: float = 0.0, threshold: float = stats.DEFAULT_THRESHOLD
) -> pd.DataFrame:
    """One row per aligned point and run B: time B/A with its interval and whether it is significant.

    Each run's interval of the point's time is combined in log space (`stats.ratio_of`). The ratios of one run B
    are then judged together (`stats.adjust_many`: Benjamini-Hochberg at a 5 % false discovery rate, with
    false-coverage-rate intervals), so that a hundred points of two identical runs do not yield five "differences"
    by chance. A ratio is significant when its adjusted interval excludes 1 (and
    ``[1/(1+min_effect), 1+min_effect]``). A point without an interval in either run (an nccl-tests text log: one
    averaged measurement per point) gets a **threshold verdict** instead: B slower when the ratio is above
    ``1 + threshold``, faster below ``1 / (1 + threshold)``, labelled as threshold-based (``basis``); it claims no
    significance (``significant`` None). Both verdicts come from :func:`commbench.core.stats.judge`, which
    ``check --max-slowdown`` asks too, so the two commands agree on the same pair.

    A random-effects widening (DerSimonian-Laird over the sizes of a collective x precision) was tried and dropped:
    a real difference that varies with size (a busy core slows large messages more) reads as heterogeneity and
    hides itself, while the adjustment alone keeps identical runs near its false discovery rate (figures:
    benchmarks/results/2026-12-01_2core-vm_gloo.md).
    """
    a = labels[0]
    rows: list[dict[str, Any]] = []
    if al.empty:
        return pd.DataFrame(columns=COMPARE_COLUMNS)
    for b in labels[1:]:
        points: list[tuple[Any, Any, Any, Any, float, float]] = []  # (coll, prec, grp, row, log ratio, total se)
        for (coll, prec, grp), g in al.groupby(["collective", "precision", "group"], sort=False):
            for _, r in g.sort_values([PLACEMENT, "size_bytes"] if PLACEMENT in g.columns else "size_bytes").iterrows():
                e = stats.ratio_of(_estimate(r, b), _estimate(r, a))
                points.append((coll, prec, grp, r, math.log(e.value) if e.value > 0 else math.nan, e.log_se))
        adj = stats.adjust_many([p[4] for p in points], [p[5] for p in points])
        for (coll, prec, grp, r, lr, se_), chosen, pv in zip(points, adj.selected, adj.p_values, strict=True):
            ta, tb = float(r.get(f"time_us|{a}", math.nan)), float(r.get(f"time_us|{b}", math.nan))
            ratio = tb / ta if ta > 0 else math.nan
            # busbw's own ratio: with different world sizes the bus factors differ, so it is not 1/time ratio
            bus = _ratio(r.get(f"busbw_gbps|{b}"), r.get(f"busbw_gbps|{a}"))
            if math.isfinite(se_):
                est = stats.Estimate(math.exp(lr), math.exp(lr - adj.z * se_), math.exp(lr + adj.z * se_), 0)
                j = stats.judge(est, min_effect)
                sig: bool | None = chosen and j.direction != 0
                lo, hi, bar = est.low, est.high, min_effect
            else:
                j = stats.judge(stats.Estimate(ratio, math.nan, math.nan, 0), threshold)
                sig, lo, hi, bar = None, math.nan, math.nan, threshold
            verdict = _verdict(b, j, bool(sig) if sig is not None else None, bar)
            rows.append(
                {
                    "collective": coll, "precision": prec, "group": grp,
                    "placement": str(r.get(PLACEMENT, NO_PLACEMENT)), "size_bytes": int(r["size_bytes"]),
                    "baseline": a, "run": b, "time_us_baseline": ta, "time_us_run": tb,
                    "time_ratio": ratio, "time_ratio_ci_low": lo, "time_ratio_ci_high": hi,
                    "busbw_ratio": bus, "p_value": pv, "n_compared": adj.m,
                    "significant": sig, "verdict": verdict, "basis": j.basis, "threshold": bar,
                }
            )  # fmt: skip
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


COMPARE_COLUMNS = [
    "collective", "precision", "group", "placement", "size_bytes", "baseline", "run", "time_us_baseline", "time_us_run",
    "time_ratio", "time_ratio_ci_low", "time_ratio_ci_high", "busbw_ratio", "p_value", "n_compared", "significant",
    "verdict", "basis", "threshold",
]  # fmt: skip
"""Columns of compare.csv: time_ratio = run / baseline (< 1: the run is faster) with its interval, adjusted for
the ``n_compared`` ratios judged together (false-coverage-rate interval after Benjamini-Hochberg at 5 %); p_value
is the ratio's own two-sided p-value before adjustment. busbw_ratio = the run's busbw / the baseline's, each as its
run computed it (not 1/time_ratio: two world sizes have two bus factors). placement: out-of-place or in-place when
every run reports both (compared separately), "-" otherwise (an import's two as their median). basis: "interval"
(significance from both runs' intervals) or "threshold" (point estimates: the ratio against ``threshold``, no
significance claimed; ``significant`` empty), "none" without a ratio; threshold: the relative difference the verdict
needed (``--min-effect`` for intervals, ``--threshold`` for point estimates)."""


def _verdict(b: str, j: stats.Judgement, sig: bool | None, bar: float) -> str:
    """The words of a verdict; a threshold verdict says so, with its threshold."""
    if j.basis == "none":
        return "no ratio"
    if j.basis == "threshold":
        if j.direction == 0:
            return f"within threshold (±{bar:.0%}, point estimates)"
        return f"{b} {'slower' if j.direction > 0 else 'faster'} (threshold {bar:.0%}, point estimates)"
    if not sig:
        return "no significant difference"
    return f"{b} {'slower' if j.direction > 0 else 'faster'}"


def significance_table(rf: pd.DataFrame) -> Table:
    """compare.csv as a table: every aligned point's time ratio with its interval and verdict."""
    placed = _shows_placement(rf)
    cols = ["collective", "precision", *(["placement"] if placed else []), "size", "run", "time B/A",
            "interval (adjusted)", "busbw B/A", "verdict"]  # fmt: skip
    rows = []
    for _, r in rf.iterrows():
        ci = f"{fmt(r['time_ratio_ci_low'])}–{fmt(r['time_ratio_ci_high'])}" if pd.notna(r["time_ratio_ci_low"]) else "n/a"
        rows.append(
            [str(r["collective"]), str(r["precision"]), *([str(r[PLACEMENT])] if placed else []),
             human_size(float(r["size_bytes"])), str(r["run"]),
             fmt(r["time_ratio"]), ci, fmt(r["busbw_ratio"]), str(r["verdict"])]
        )  # fmt: skip
    return Table(
        "significance",
        "Ratios with their intervals (time B/A < 1: B is faster; a verdict only when the interval excludes 1)",
        cols,
        rows,
        "Intervals combine both runs' intervals of the point's time in log space, adjusted for the "
        "number of ratios judged together (Benjamini-Hochberg at a 5 % false discovery rate, false-coverage-rate "
        "intervals): identical runs give about no significant ratio, not 5 % of them.",
    )


def summary_table(
    al: pd.DataFrame, labels: list[str], rf: pd.DataFrame | None = None, threshold: float = stats.DEFAULT_THRESHOLD
) -> Table:
    """Geometric-mean ratios per collective x precision (the right mean for ratios); a series of point estimates
    (no intervals) gets the threshold verdict of its geometric mean (:func:`commbench.core.stats.judge`)."""
    a = labels[0]
    placed = _shows_placement(al)
    cols = ["collective", "precision", "group", *(["placement"] if placed else []), "points"]
    for b in labels[1:]:
        cols += [f"busbw {b}/{a} (geomean)", f"time {b}/{a} (geomean)", "95 % CI", "verdict", f"busbw {b}/{a} @ largest"]
    rows = []
    if len(al):
        corder = order(al["collective"].unique(), COLLECTIVE_ORDER)
        porder = order(al["precision"].unique(), (FP32_PRECISION,))
        al = al.assign(_c=al["collective"].map(corder.index), _p=al["precision"].map(porder.index))
        al = al.sort_values(["_c", "_p", "size_bytes"])
        keys = ["collective", "precision", "group", PLACEMENT]
        for (coll, prec, grp, pl), g in al.groupby(keys, sort=False):
            g = g.sort_values("size_bytes")
            row = [str(coll), str(prec), str(grp), *([str(pl)] if placed else []), str(len(g))]
            for b in labels[1:]:
                bus = g[f"busbw_gbps|{b}"] / g[f"busbw_gbps|{a}"]
                tim = g[f"time_us|{b}"] / g[f"time_us|{a}"]
                ci = "n/a"
                verdict = _verdict(b, stats.judge(stats.Estimate(_gmean(tim), math.nan, math.nan, 0), threshold), None, threshold)
                if rf is not None and len(rf):
                    fam = rf[(rf["collective"] == coll) & (rf["precision"] == prec) & (rf["group"] == grp)
                             & (rf[PLACEMENT].astype(str) == str(pl)) & (rf["run"] == b)]  # fmt: skip
                    gm = stats.geometric_mean_ci(
                        [stats.Estimate(float(x.time_ratio), float(x.time_ratio_ci_low), float(x.time_ratio_ci_high), 0)
                         for x in fam.itertuples() if pd.notna(x.time_ratio_ci_low)]
                    )  # fmt: skip
                    if gm.n:
                        ci = f"{fmt(gm.low)}–{fmt(gm.high)}"
                        verdict = _verdict(b, stats.judge(gm), stats.significant(gm), 0.0)
                row += [fmt(_gmean(bus)), fmt(_gmean(tim)), ci, verdict, fmt(float(bus.iloc[-1]))]
            rows.append(row)
    return Table("ratio-summary", f"Summary: ratios against {a}", cols, rows)


def runs_table(runs: list[RunData], labels: list[str]) -> Table:
    keys = ["host", "device_name", "backend", "world_size", "nodes", "nproc_per_node", "torch_version"]
    keys += ["nccl_version", "launcher", "start_time"]
    rows = [[lab, str(r.run_dir), *[fmt(r.metadata.get(k)) for k in keys]] for lab, r in zip(labels, runs, strict=True)]
    return Table("runs", "Runs compared", ["label", "run directory", *keys], rows)


def compare_runs(
    run_dirs: list[Path], labels: list[str] | None, out_dir: Path, min_effect: float = 0.0,
    threshold: float = stats.DEFAULT_THRESHOLD,
) -> dict[str, Path]:
    """Write compare.html, compare.md and plots/compare_*.png|svg into out_dir.

    Returns {"html": ..., "md": ..., "<figure>.<fmt>": ...}; `compare_warnings` gives the warnings
    (also printed at the top of both documents). Bad input raises ValueError.
    """
    run_dirs = [Path(d) for d in run_dirs]
    labs = resolve_labels(run_dirs, labels)
    runs = [load_run(d) for d in run_dirs]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    warns = compare_warnings(runs, labs)
    al = aligned(runs, labs)
    plugins.load(builtins=False)  # a plugin's compare figures are drawn too (the built-in ones are below)
    # no plots/ folder when nothing aligns: the documents say so, and there is nothing to draw.
    written = COMPARE_FIGURES.write(Comparison(al, labs), out / "plots") if not al.empty else {}
    figures = [(n, COMPARE_FIGURES[n].caption, p["png"], p.get("svg")) for n, p in written.items()]
    rf = ratio_frame(al, labs, min_effect, threshold)
    atomic_write_text(out / "compare.csv", rf.to_csv(index=False))
    sections = [
        ("runs", "Runs", [runs_table(runs, labs)]),
        ("summary", "Summary", [summary_table(al, labs, rf, threshold)]),
        ("significance", "Ratios and significance", [significance_table(rf)]),
        ("full", "Aligned points", [ratio_table(al, labs)]),
    ]
    title = f"commbench comparison: {' vs '.join(labs)}"
    html_path, md_path = out / "compare.html", out / "compare.md"
    atomic_write_text(html_path, render_html(title, sections, figures, None, warns))
    atomic_write_text(md_path, render_markdown(title, sections, figures, None, out, warns))
    result: dict[str, Path] = {"html": html_path, "md": md_path, "csv": out / "compare.csv"}
    for name, paths in written.items():
        for f, p in paths.items():
            result[f"{name}.{f}"] = p
    return result


def console_lines(compare_csv: Path, width: int | None = None) -> list[str]:
    """compare.csv as console lines: one per point, ratio with interval and verdict, then a count."""
    rf = pd.read_csv(compare_csv)
    if rf.empty:
        return ["# compare: the runs have no point in common"]
    placed = PLACEMENT in rf.columns and bool((rf[PLACEMENT].astype(str) != NO_PLACEMENT).any())
    pl_head = f" {'placement':<12}" if placed else ""
    out = [f"# {'collective':<15} {'precision':<14} {'group':<6}{pl_head} {'size':>8} {'run':<12} {'time B/A':>8} {'interval':>11} {'busbw B/A':>9}  verdict"]
    for r in rf.itertuples():
        ci = f"{r.time_ratio_ci_low:.2f}-{r.time_ratio_ci_high:.2f}" if pd.notna(r.time_ratio_ci_low) else "n/a"
        pl = f" {str(getattr(r, PLACEMENT))[:12]:<12}" if placed else ""
        out.append(
            f"  {str(r.collective)[:15]:<15} {str(r.precision)[:14]:<14} {str(r.group)[:6]:<6}{pl} "
            f"{human_size(float(r.size_bytes)):>8} {str(r.run)[:12]:<12} {r.time_ratio:>8.3f} {ci:>11} "
            f"{r.busbw_ratio:>9.3f}  {r.verdict}"
        )
    basis = rf["basis"].astype(str) if "basis" in rf.columns else pd.Series("interval", index=rf.index)
    sig = rf["significant"].map(lambda v: v is True or str(v) == "True")
    judged = int((basis == "interval").sum())
    if judged:
        out.append(
            f"# {int(sig.sum())} of {judged} ratios with intervals significant (interval excludes 1, adjusted for the "
            f"{judged} compared: Benjamini-Hochberg, 5 % false discovery rate)"
        )
    point = rf[basis == "threshold"]
    if len(point):
        bar = float(point["threshold"].iloc[0]) if "threshold" in point.columns else stats.DEFAULT_THRESHOLD
        beyond = int(point["verdict"].astype(str).str.contains("slower|faster").sum())
        out.append(
            f"# {beyond} of {len(point)} point estimates differ by more than the threshold (±{bar:.0%}, --threshold): "
            "threshold verdicts, not significance (no samples per point: nccl-tests' one averaged measurement)"
        )
    return out
