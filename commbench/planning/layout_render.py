"""Rendering a fixed-layout plan: ``plan.csv``, ``plan.md``, ``plan.html`` and the console view, every time with its
unit (ms, s, min; never an exponent), every size in GB as the device is labelled (1e9 bytes), no console line
longer than the terminal (columns dropped by priority, text wrapped).

Views of :func:`commbench.planning.layout_plan.plan_layout`'s frame (its rows and ``df.attrs``); nothing here
prices anything. The search's console table (:func:`format_rows`) is the same view over its best rows.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd

from commbench.planning.layout_plan import LAYOUT_COLUMNS, fmt_gb, fmt_rate, fmt_time

CONSOLE = (
    ("rank", 1), ("layout", 1), ("option", 1), ("fits", 1), ("mem", 2), ("step", 1), ("interval", 3),
    ("tokens/s", 2), ("TFLOP/s", 2), ("MFU", 2), ("bubble", 4), ("exposed", 3), ("recompute", 5), ("mb", 5),
)  # fmt: skip
"""Console columns and their priority (1 kept longest on a narrow terminal)."""


def width() -> int:
    """The terminal's width (80 when it is not a terminal)."""
    return shutil.get_terminal_size((80, 24)).columns


def wrap(text: str, cols: int) -> list[str]:
    """``text`` wrapped to ``cols`` (continuation lines indented)."""
    return textwrap.wrap(text, cols, subsequent_indent="  ", break_on_hyphens=False) or [""]


def console_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The console's cells of layout rows (strings with their units)."""
    def layout(r: Any) -> str:
        out = f"{r['tp']}x{r['pp']}" + (f"v{r['vpp']}" if r["vpp"] > 1 else "") + f"x{r['dp']}"
        return out + (f"xCP{r['cp']}" if r["cp"] > 1 else "")

    return pd.DataFrame({
        "rank": df["rank"].astype(str),
        "layout": [layout(r) for _, r in df.iterrows()],
        "option": df["strategy"] + "/" + df["precision"],
        "fits": df["fits"].map(lambda v: "yes" if v else "NO"),
        "mem": [fmt_gb(v) for v in df["mem_total_bytes"]],
        "step": [fmt_time(v) for v in df["step_time_s"]],
        "interval": [f"{fmt_time(a)}-{fmt_time(b)}" for a, b in zip(df["step_time_low_s"], df["step_time_high_s"],
                                                                    strict=True)],
        "tokens/s": [fmt_rate(v) for v in df["tokens_per_s"]],
        "TFLOP/s": [f"{v:.0f}" for v in df["tflops_per_gpu"]],
        "MFU": [f"{v:.0%}" for v in df["mfu"]],
        "bubble": [f"{v:.0%}" for v in df["bubble_frac"]],
        "exposed": [fmt_time(v) for v in df["comm_exposed_s"]],
        "recompute": df["recompute"].astype(str),
        "mb": df["micro_batch"].astype(str),
    })  # fmt: skip


def table_lines(view: pd.DataFrame, cols: int, priority: tuple[tuple[str, int], ...] = CONSOLE) -> list[str]:
    """The table as text no wider than ``cols``: the lowest-priority columns dropped until it fits."""
    keep = [c for c, _ in priority if c in view.columns]
    prio = dict(priority)
    while True:
        text = view[keep].to_string(index=False)
        lines = text.splitlines()
        if max(len(x) for x in lines) <= cols or len(keep) <= 2:
            return [x[:cols] for x in lines]
        keep.remove(max(reversed(keep), key=lambda c: prio.get(c, 9)))


def format_layout(df: pd.DataFrame, cols: int | None = None) -> str:
    """The answer, the batch note, the rows, what would fit: every line at most ``cols`` wide."""
    cols = cols or width()
    lines = wrap(df.attrs.get("answer", ""), cols)
    for note in df.attrs.get("notes", []):
        lines += wrap(f"# {note}", cols)
    lines += table_lines(console_frame(df), cols)
    for k, v in (df.attrs.get("skipped") or {}).items():
        lines += wrap(f"# not an option: {k}: {v}", cols)
    return "\n".join(lines)


def format_rows(df: pd.DataFrame, cols: int | None = None) -> list[str]:
    """The console table of any layout rows (the search's best rows)."""
    return table_lines(console_frame(df), cols or width())


def output_paths(out: str | os.PathLike[str], stem: str) -> dict[str, Path]:
    """``out/<stem>.csv|md|html`` with ``out/plots`` created; ValueError (one line) where it cannot be."""
    d = Path(out)
    try:
        (d / "plots").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"output directory {d} cannot be created: {e.strerror or e}") from None
    return {"csv": d / f"{stem}.csv", "md": d / f"{stem}.md", "html": d / f"{stem}.html"}


def write_layout(df: pd.DataFrame, out: str | os.PathLike[str], stem: str = "plan", title: str = "") -> dict[str, Path]:
    """``out/<stem>.csv`` (every column), ``.md`` and ``.html`` (answer, notes, rows with units, sources, exposure,
    assumptions, the columns' meaning); returns the paths."""
    from commbench.views.render import render_html, render_markdown
    from commbench.views.tables import Table

    paths = output_paths(out, stem)
    df.to_csv(paths["csv"], index=False)
    view = console_frame(df)
    tables = [Table("answer", "Answer", ["answer"], [[df.attrs.get("answer", "")]])]
    notes = [*df.attrs.get("notes", []), *([df.attrs["would_fit"]] if df.attrs.get("would_fit") else [])]
    if notes:
        tables.append(Table("notes", "Notes", ["note"], [[n] for n in notes]))
    tables.append(Table("rows", "Options, ranked", list(view.columns), view.values.tolist(),
                        "GB = 1e9 bytes, per GPU; times per optimizer step"))  # fmt: skip
    src = [c for c in df.columns if c.startswith("source_")] + ["comm_exposure"]
    tables.append(Table("sources", "What priced each part, and what is exposed", ["rank", *src],
                        [[str(r["rank"]), *(str(r[c]) for c in src)] for _, r in df.iterrows()]))  # fmt: skip
    parts = ["compute_s", "imbalance_s", "bubble_s", "comm_exposed_s", "optimizer_s", "comm_total_s"]
    tables.append(Table("parts", "Step time by part", ["rank", *parts],
                        [[str(r["rank"]), *(fmt_time(float(r[c])) for c in parts)] for _, r in df.iterrows()]))  # fmt: skip
    tables.append(Table("assumptions", "Assumptions", ["assumption"], [[a] for a in df.attrs.get("assumptions", [])]))
    tables.append(Table("columns", f"Columns of {stem}.csv", ["column", "meaning"],
                        [[k, v] for k, v in LAYOUT_COLUMNS.items()]))  # fmt: skip
    sections = [("summary", "Plan", tables)]
    title = title or "commbench plan: one layout"
    paths["html"].write_text(render_html(title, sections, [], None), encoding="utf-8")
    paths["md"].write_text(render_markdown(title, sections, [], None, paths["csv"].parent), encoding="utf-8")
    return paths


__all__ = [
    "CONSOLE", "console_frame", "format_layout", "format_rows", "output_paths", "table_lines", "width", "wrap",
    "write_layout",
]  # fmt: skip
