"""The run report: one self-contained report.html (figures embedded) and a report.md.

This module owns the report's content (metadata, summary tables, pitfalls, full tables) and its two
renderings. Both renderings come from the same `Table` objects so they never disagree. Every string
that comes from a run (metadata, file names, table cells) is escaped: HTML through jinja2's
autoescape, Markdown through `md_escape`. The report reads run directories only.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from commbench import plots
from commbench.rundata import (
    COLLECTIVE_ORDER,
    FP32_PRECISION,
    RunData,
    as_tuple,
    human_size,
    load_run,
    order,
    primary_payload,
    series_columns,
    speed_rows,
)

__all__ = [
    "Table",
    "build_tables",
    "fmt",
    "md_escape",
    "md_table",
    "pitfalls",
    "render_html",
    "render_markdown",
    "write_report",
]

TEMPLATES = Path(__file__).parent / "templates"

# pyperf's thresholds: a coefficient of variation of 10 % or more makes a number untrustworthy.
CV_WARN = 0.10
RANK_SPREAD_WARN = 0.25
REL_ERR_WARN = 0.10


@dataclass(slots=True)
class Table:
    """A rendered-agnostic table: already formatted cell strings (escaping happens at render)."""

    key: str
    """Anchor id (ASCII, from code, never from data)."""
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""


def fmt(v: Any) -> str:
    """A table cell: empty for missing, integers plain, floats to 4 significant digits."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        if 1e4 <= abs(v) < 1e15:  # microseconds and bytes: whole numbers read better than 1.467e+04
            return f"{v:.0f}"
        return f"{v:.4g}"
    try:
        if pd.isna(v):
            return ""
    except (TypeError, ValueError):
        pass
    if hasattr(v, "item"):  # numpy scalars
        return fmt(v.item())
    return str(v)


def frame_table(key: str, title: str, df: pd.DataFrame, note: str = "") -> Table:
    return Table(key, title, [str(c) for c in df.columns], [[fmt(v) for v in r] for r in df.itertuples(False)], note)


# --------------------------------------------------------------------------- summary content


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series(math.nan, index=df.index)


def _series_name(df: pd.DataFrame) -> pd.Series:
    """precision plus whichever of impl/placement/redop varies within a precision (as in the plots)."""
    cols = series_columns(df)
    name = df["precision"].astype(str)
    for c in cols[1:]:
        name = name + " " + c + "=" + df[c].astype(str)
    return name


def peak_busbw_table(df: pd.DataFrame) -> Table | None:
    if df.empty or _num(df, "busbw_gbps").isna().all():
        return None
    d = speed_rows(df).copy()
    d["series"] = _series_name(d)
    d["busbw"] = _num(d, "busbw_gbps")
    d = d.dropna(subset=["busbw"])
    idx = d.groupby(["collective", "series"])["busbw"].idxmax()
    best = d.loc[idx]
    colls = order(best["collective"].unique(), COLLECTIVE_ORDER)
    series = order(best["series"].unique(), (FP32_PRECISION,))
    rows = []
    for c in colls:
        row = [c]
        for s in series:
            hit = best[(best["collective"] == c) & (best["series"] == s)]
            row.append(
                ""
                if hit.empty
                else f"{fmt(float(hit['busbw'].iloc[0]))} @ {human_size(float(hit['size_bytes'].iloc[0]))}"
            )
        rows.append(row)
    return Table(
        "peak-busbw",
        "Peak bus bandwidth (GB/s @ size) per collective x precision",
        ["collective", *series],
        rows,
        "Speed numbers use the " + (primary_payload(df) or "only") + " payload.",
    )


def _ranges(points: list[tuple[float, str, float]]) -> list[tuple[float, float, str, float]]:
    """Merge consecutive sizes that share a winner: [(lo, hi, winner, best gain vs fp32)]."""
    out: list[tuple[float, float, str, float]] = []
    for size, win, gain in points:
        if out and out[-1][2] == win:
            lo, _, w, g = out[-1]
            out[-1] = (lo, size, w, max(g, gain))
        else:
            out.append((size, size, win, gain))
    return out


def best_precision_table(df: pd.DataFrame) -> Table | None:
    """Per collective, the fastest precision by fp32-equivalent effective bandwidth, over size ranges.

    Only points with no wrong elements compete: a fast wrong answer is not a choice.
    """
    if df.empty or _num(df, "effective_gbps").isna().all():
        return None
    d = speed_rows(df).copy()
    d["series"] = _series_name(d)
    d["eff"] = _num(d, "effective_gbps")
    d = d.dropna(subset=["eff", "fp32_bytes"])
    if "wrong" in d.columns:
        d = d[~(_num(d, "wrong") > 0)]
    rows = []
    for coll in order(d["collective"].unique(), COLLECTIVE_ORDER):
        g = d[d["collective"] == coll].groupby(["fp32_bytes", "series"])["eff"].median().reset_index()
        pts: list[tuple[float, str, float]] = []
        for size, gs in g.groupby("fp32_bytes", sort=True):
            top = gs.loc[gs["eff"].idxmax()]
            ref = gs[gs["series"] == FP32_PRECISION]["eff"]
            gain = float(top["eff"] / ref.iloc[0]) if len(ref) and ref.iloc[0] > 0 else math.nan
            pts.append((float(size), str(top["series"]), gain))
        for lo, hi, win, gain in _ranges(pts):
            span = human_size(lo) if lo == hi else f"{human_size(lo)} - {human_size(hi)}"
            rows.append([coll, span, win, fmt(gain)])
    return Table(
        "best-precision",
        "Best precision per size range (fp32-equivalent effective bandwidth)",
        ["collective", "fp32 size range", "fastest precision", "max speed-up vs fp32"],
        rows,
        "Sizes are the user's tensor size if fp32; points with wrong elements are excluded.",
    )


def crossover_table(run: RunData) -> Table | None:
    cx = run.crossover
    if cx.empty:
        return None
    rows = []
    for _, r in cx.iterrows():
        b = pd.to_numeric(r.get("crossover_bytes"), errors="coerce")
        size = f"{human_size(float(b))} ({int(b)} B)" if pd.notna(b) else "never in range"
        rows.append(
            [fmt(r.get("collective")), fmt(r.get("payload")), fmt(r.get("precision")), size, fmt(r.get("note"))]
        )
    return Table(
        "crossover",
        "Crossover sizes: from where a precision beats fp32 end to end",
        ["collective", "payload", "precision", "crossover (fp32 bytes)", "note"],
        rows,
    )


def gain_table(df: pd.DataFrame) -> Table | None:
    """Performance gain of each precision over fp32 at the same point: effective bandwidth ratio
    (end to end, encode+decode included) and comm-time ratio, at the largest size and at best."""
    if df.empty or _num(df, "effective_gbps").isna().all():
        return None
    d = df.copy()
    d["series"] = _series_name(d)
    d["eff"] = _num(d, "effective_gbps")
    d["comm"] = _num(d, "comm_us").fillna(_num(d, "time_us"))
    keys = ["collective", "payload", "fp32_bytes"] if "payload" in d.columns else ["collective", "fp32_bytes"]
    agg = d.groupby([*keys, "series"])[["eff", "comm"]].median().reset_index()
    ref = agg[agg["series"] == FP32_PRECISION].set_index(keys)[["eff", "comm"]]
    if ref.empty:
        return None
    m = agg[agg["series"] != FP32_PRECISION].join(ref.add_suffix("_fp32"), on=keys).dropna(subset=["eff_fp32"])
    m["gain"] = m["eff"] / m["eff_fp32"]
    m["comm_speedup"] = m["comm_fp32"] / m["comm"]
    err = d.groupby(["collective", "series"])["rel_err"].max() if "rel_err" in d.columns else None
    rows = []
    group_keys = ["collective", "payload", "series"] if "payload" in m.columns else ["collective", "series"]
    corder = order(m["collective"].unique(), COLLECTIVE_ORDER)
    m = m.assign(_c=m["collective"].map(corder.index)).sort_values(["_c", *group_keys[1:]])
    for k, g in m.groupby(group_keys, sort=False):
        k = as_tuple(k)
        g = g.sort_values("fp32_bytes")
        last = g.iloc[-1]
        best = g.loc[g["gain"].idxmax()]
        e = err.get((k[0], k[-1]), math.nan) if err is not None else math.nan
        rows.append(
            [
                *[fmt(x) for x in k],
                fmt(float(last["gain"])),
                fmt(float(last["comm_speedup"])),
                f"{fmt(float(best['gain']))} @ {human_size(float(best['fp32_bytes']))}",
                fmt(e),
            ]
        )
    cols = ["collective", "payload", "precision"] if "payload" in m.columns else ["collective", "precision"]
    return Table(
        "gain",
        "Performance gain vs fp32 (ratio > 1 = faster)",
        [
            *cols,
            "end-to-end gain @ largest size",
            "comm-only speed-up @ largest",
            "best end-to-end gain",
            "max rel_err",
        ],
        rows,
        "End-to-end gain = effective_gbps / effective_gbps(fp32) at the same fp32 size (encode+decode included).",
    )


def training_gain_table(t: pd.DataFrame) -> Table | None:
    want = [
        "policy",
        "family",
        "step_time_us_p50",
        "speedup_vs_fp32",
        "peak_mem_bytes",
        "mem_saved_vs_fp32",
        "comm_bytes_per_step",
        "comm_saved_vs_fp32",
        "final_loss",
        "final_loss_drift",
        "max_grad_norm_drift",
    ]
    if t.empty or "policy" not in t.columns:
        return None
    cols = [c for c in want if c in t.columns]
    return frame_table("training-gain", "Training: gain and cost of each policy vs fp32", t[cols])


def training_bf16_fp16_table(t: pd.DataFrame) -> Table | None:
    """BF16 against FP16 policies side by side (pairs that differ only in the 16-bit format)."""
    if t.empty or "policy" not in t.columns:
        return None
    from commbench.training.tables import bf16_vs_fp16

    pairs = bf16_vs_fp16(t)
    if pairs.empty:
        return None
    return frame_table("training-bf16-fp16", "Training: BF16 against FP16, side by side", pairs)


def pitfalls(run: RunData) -> list[str]:
    """Plain-language problems found in the run: wrong results, large errors, noisy or skewed timings,
    compression that never pays, and the training section's own warnings."""
    out: list[str] = []
    df = run.results
    if not df.empty:
        label_cols = [c for c in ("collective", "precision", "payload") if c in df.columns]

        def where(r: Any) -> str:
            return " ".join(str(r[c]) for c in label_cols) + f" at {human_size(float(r['size_bytes']))}"

        wrong = df[_num(df, "wrong") > 0]
        for _, r in wrong.head(10).iterrows():
            out.append(f"{where(r)}: {int(r['wrong'])} wrong element(s) on exactly representable inputs.")
        if len(wrong) > 10:
            out.append(f"... and {len(wrong) - 10} more point(s) with wrong elements.")
        err = _num(df, "rel_err")
        big = df[err >= REL_ERR_WARN]
        for k, g in big.groupby(label_cols, sort=False):
            k = as_tuple(k)
            out.append(
                f"{' '.join(map(str, k))}: relative error up to {fmt(float(_num(g, 'rel_err').max()))} "
                "(>= 10 %): this precision/payload combination loses the signal (underflow or outliers?)."
            )
        noisy = df[_num(df, "cv") >= CV_WARN]
        if len(noisy):
            out.append(
                f"{len(noisy)} of {len(df)} point(s) have a coefficient of variation >= {CV_WARN:.0%}: "
                "their times are noisy (other load on the machine, too few samples)."
            )
        skew = df[_num(df, "rank_spread") >= RANK_SPREAD_WARN]
        if len(skew):
            out.append(
                f"{len(skew)} point(s) have ranks disagreeing by >= {RANK_SPREAD_WARN:.0%} "
                "(rank_spread): a slow rank or link dominates those numbers."
            )
    cx = run.crossover
    if not cx.empty and "crossover_bytes" in cx.columns:
        never = cx[pd.to_numeric(cx["crossover_bytes"], errors="coerce").isna()]
        for _, r in never.iterrows():
            out.append(
                f"{r['collective']} {r['precision']} ({r.get('payload', '')}): never faster than fp32 end to end "
                "in the measured range: the encode/decode cost outweighs the bytes saved here."
            )
    t = run.training
    if not t.empty and "warnings" in t.columns:
        for _, r in t.iterrows():
            w = r["warnings"]
            if isinstance(w, str) and w.strip():
                out.append(f"training policy {r['policy']}: {w}")
    return out


def metadata_table(meta: dict[str, Any]) -> Table:
    keys = [
        ("date (start)", "start_time"),
        ("end", "end_time"),
        ("host", "host"),
        ("hosts", "hosts"),
        ("device", "device_name"),
        ("backend", "backend"),
        ("world size", "world_size"),
        ("nodes", "nodes"),
        ("processes per node", "nproc_per_node"),
        ("threads per rank", "threads_per_rank"),
        ("launcher", "launcher"),
        ("commbench", "commbench_version"),
        ("git commit", "git_commit"),
        ("torch", "torch_version"),
        ("NCCL", "nccl_version"),
        ("python", "python_version"),
        ("platform", "platform"),
        ("timing", "timing"),
        ("command", "argv"),
    ]
    rows = []
    for label, k in keys:
        if k not in meta:
            continue
        v = meta[k]
        if isinstance(v, list) and k == "argv":
            v = " ".join(map(str, v))
        elif isinstance(v, (list, dict)):
            v = json.dumps(v, sort_keys=True)
        rows.append([label, fmt(v) if v is not None else "n/a"])
    return Table("metadata", "Run metadata", ["field", "value"], rows)


def _ranks(ranks: list[int]) -> str:
    """0,1,2,3,6 -> "0-3, 6"."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and runs[-1][1] == r - 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _nic(n: dict[str, Any]) -> str:
    speed = n.get("speed_mbps")
    return f"{n.get('name')} ({speed / 1000:g} Gbit/s)" if speed else str(n.get("name"))


def nodes_table(meta: dict[str, Any]) -> Table | None:
    """One row per node: what each node reported about itself (metadata ``node_reports``)."""
    nodes = meta.get("node_reports") or []
    if not nodes:
        return None
    rows = []
    for n in nodes:
        env = n.get("env") or {}
        rows.append(
            [
                str(n.get("host")),
                _ranks(list(n.get("ranks") or [])),
                fmt(n.get("cpu")) + (f" ({n['cpu_count']} cores)" if n.get("cpu_count") else ""),
                "; ".join(n.get("gpus") or []) or "none",
                ", ".join(_nic(x) for x in n.get("nics") or []),
                " ".join(f"{k}={v}" for k, v in sorted(env.items())),
            ]
        )
    return Table(
        "nodes",
        "Nodes",
        ["host", "ranks", "CPU", "GPUs", "NICs (speed where /sys/class/net says)", "NCCL_* / GLOO_* environment"],
        rows,
    )


def topology_tables(meta: dict[str, Any]) -> list[Table]:
    """``nvidia-smi topo -m`` of every node that has it, as a matrix (its legend dropped)."""
    out = []
    for n in meta.get("node_reports") or []:
        text = n.get("nvidia_topo")
        if not text:
            continue
        lines = [ln for ln in text.splitlines() if ln.strip()]
        end = next((i for i, ln in enumerate(lines) if ln.strip().startswith("Legend")), len(lines))
        cells = [[c.strip() for c in ln.split("\t")] for ln in lines[:end]]
        width = max(len(r) for r in cells)
        if len(cells) > 1 and all(len(r) == width for r in cells):
            table = Table(
                f"topo-{len(out)}", f"GPU topology of {n.get('host')} (nvidia-smi topo -m)", cells[0], cells[1:]
            )
        else:  # not the tab-separated matrix this parser knows: keep the lines
            table = Table(f"topo-{len(out)}", f"GPU topology of {n.get('host')} (nvidia-smi topo -m)", ["line"],
                          [[ln] for ln in lines[:end]])  # fmt: skip
        out.append(table)
    return out


FULL_RESULT_COLUMNS = [
    "collective",
    "precision",
    "impl",
    "placement",
    "redop",
    "payload",
    "size_bytes",
    "count",
    "dtype",
    "time_us",
    "algbw_gbps",
    "busbw_gbps",
    "wrong",
    "fp32_bytes",
    "encode_us",
    "comm_us",
    "decode_us",
    "total_us",
    "effective_gbps",
    "rel_err",
    "max_abs_err",
    "cv",
    "time_us_max",
]


def build_tables(run: RunData) -> dict[str, list[Table]]:
    """The report's tables, grouped: 'metadata', 'summary' and 'full'."""
    df = run.results
    summary = [
        t
        for t in (
            peak_busbw_table(df),
            best_precision_table(df),
            crossover_table(run),
            gain_table(df),
            training_gain_table(run.training),
            training_bf16_fp16_table(run.training),
        )
        if t is not None
    ]
    full: list[Table] = []
    if not df.empty:
        cols = [c for c in FULL_RESULT_COLUMNS if c in df.columns and not df[c].isna().all()]
        sort = [c for c in ("collective", "precision", "payload", "size_bytes") if c in df.columns]
        full.append(
            frame_table(
                "results",
                "All collective points (nccl-tests columns first: size, count, type, time, algbw, busbw, #wrong)",
                df.sort_values(sort)[cols],
            )
        )
    if not run.training.empty:
        full.append(frame_table("training", "Training summary (training.csv)", run.training))
    if not run.training_steps.empty:
        full.append(frame_table("training-steps", "Training steps (training_steps.csv)", run.training_steps))
    meta = metadata_table(run.metadata)
    meta.rows.insert(0, ["run directory", str(run.run_dir)])
    nodes = nodes_table(run.metadata)
    return {
        "metadata": [meta, *([nodes] if nodes else []), *topology_tables(run.metadata)],
        "summary": summary,
        "full": full,
    }


# --------------------------------------------------------------------------- rendering


def md_escape(s: str) -> str:
    """Markdown-safe text: HTML special characters as entities (renderers pass raw HTML through),
    pipes and backslashes escaped so a cell cannot break the table, newlines flattened."""
    s = html.escape(str(s), quote=False)
    for ch in "\\|`$*":
        s = s.replace(ch, "\\" + ch)
    return s.replace("\n", " ").replace("\r", " ")


def md_table(t: Table) -> str:
    lines = [f"### {md_escape(t.title)}", ""]
    if not t.rows:
        return "\n".join([*lines, "(no rows)", ""])
    lines.append("| " + " | ".join(md_escape(c) for c in t.columns) + " |")
    lines.append("|" + "|".join("---" for _ in t.columns) + "|")
    for r in t.rows:
        lines.append("| " + " | ".join(md_escape(c) for c in r) + " |")
    if t.note:
        lines += ["", f"_{md_escape(t.note)}_"]
    lines.append("")
    return "\n".join(lines)


def _env() -> jinja2.Environment:
    # autoescape everything: hosts, device names, paths and cells come from users and files.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.tests["numeric_cell"] = lambda c: bool(_NUMERIC.match(str(c)))
    return env


_NUMERIC = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?( @ \S+)?$")
"""Cells right-aligned in HTML: numbers, and 'number @ size' pairs."""


def _data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def report_title(meta: dict[str, Any]) -> str:
    return (
        f"commbench report: {meta.get('backend', '?')}, {meta.get('world_size', '?')} ranks on "
        f"{meta.get('nodes', 1)} node(s), host {meta.get('host', '?')}"
    )


def render_html(
    title: str,
    sections: Sequence[tuple[str, str, Sequence[Table]]],
    figures: Iterable[tuple[str, str, Path, Path | None]],
    pitfall_list: Sequence[str] | None,
    warnings: Sequence[str] = (),
    template: str = "report.html.j2",
) -> str:
    """sections: (anchor, heading, tables); figures: (name, caption, png, svg)."""
    figs = [
        {"name": n, "caption": c, "src": _data_uri(png), "svg": svg.name if svg else None} for n, c, png, svg in figures
    ]
    return (
        _env()
        .get_template(template)
        .render(title=title, sections=sections, figures=figs, pitfalls=pitfall_list, warnings=warnings)
    )


def render_markdown(
    title: str,
    sections: Sequence[tuple[str, str, Sequence[Table]]],
    figures: Iterable[tuple[str, str, Path, Path | None]],
    pitfall_list: Sequence[str] | None,
    base: Path,
    warnings: Sequence[str] = (),
) -> str:
    out = [f"# {md_escape(title)}", ""]
    if warnings:
        out += ["## Warnings", ""] + [f"- {md_escape(w)}" for w in warnings] + [""]
    for anchor, heading, tables in sections:
        out += [f"## {md_escape(heading)}", ""]
        for t in tables:
            out.append(md_table(t))
        if anchor == "summary":
            if pitfall_list is not None:
                out += ["### Pitfalls found", ""]
                out += [f"- {md_escape(p)}" for p in pitfall_list] if pitfall_list else ["None found."]
                out.append("")
            figs = list(figures)
            if figs:
                out += ["## Figures", ""]
                for _name, cap, png, _svg in figs:
                    rel = png.relative_to(base).as_posix() if png.is_relative_to(base) else png.as_posix()
                    out += [f"![{md_escape(cap)}]({rel.replace(' ', '%20')})", "", f"_{md_escape(cap)}_", ""]
    return "\n".join(out) + "\n"


def write_report(run_dir: Path, out_dir: Path | None = None) -> dict[str, Path]:
    """Write report.html, report.md and plots/*.png|svg for a run into out_dir (default: run_dir).

    Returns {"html": ..., "md": ..., "<figure>.png": ..., "<figure>.svg": ...}.
    Raises ValueError (commbench.results.RunDirError) for a directory that is not a run.
    """
    run = load_run(Path(run_dir))
    out = Path(out_dir) if out_dir is not None else Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = plots.write_plots(run, out / "plots")
    figures = [(name, plots.FIGURES[name].caption, paths["png"], paths.get("svg")) for name, paths in written.items()]
    tables = build_tables(run)
    sections = [
        ("metadata", "Metadata", tables["metadata"]),
        ("summary", "Summary", tables["summary"]),
        ("full", "Full tables", tables["full"]),
    ]
    suite = run.metadata.get("suite")
    if suite:
        tables["metadata"].append(
            Table("suite", "Suite (resolved)", ["suite"], [[json.dumps(suite, indent=1, sort_keys=True)]])
        )
    found = pitfalls(run)
    if run.results.empty and run.training.empty:
        found.insert(0, "This run directory holds no collective results and no training results yet.")
    title = report_title(run.metadata)
    html_path = out / "report.html"
    md_path = out / "report.md"
    banner = []
    if run.metadata.get("end_time") is None:
        # metadata.json gets its end_time when the run completes: without it the rows are a partial run
        banner.append(
            f"Unfinished run: started {run.metadata.get('start_time', '?')} and never completed (no end time in "
            f"metadata.json); the tables hold the points finished so far. Continue it with `commbench run --resume {run_dir}`."
        )
    html_path.write_text(render_html(title, sections, figures, found, banner), encoding="utf-8")
    md_path.write_text(render_markdown(title, sections, figures, found, out, banner), encoding="utf-8")
    result: dict[str, Path] = {"html": html_path, "md": md_path}
    for name, paths in written.items():
        for f, p in paths.items():
            result[f"{name}.{f}"] = p
    return result
