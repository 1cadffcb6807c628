"""nccl-tests' table layout for rows as they finish, with commbench's extra columns to the right of #wrong
(so the left part pastes next to nccl-tests output).

The table is a list of column specs, each with a priority: at a narrow terminal the least important columns
are dropped (nccl-tests' constant ``count``/``redop``/``root`` first) so a row never wraps.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Row = Mapping[str, Any]


def _num(v: Any, width: int, spec: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        text = "inf" if isinstance(v, float) and math.isinf(v) else "n/a"
        return f"{text:>{width}}"
    return f"{v:>{width}{spec}}"


def _time(row: Row, width: int) -> str:
    t = row["time_us"]
    return _num(t, width, ".1f" if isinstance(t, float) and t < 1e5 else ".0f")


def _ci(row: Row, width: int) -> str:
    lo, hi, t = row.get("time_ci_low_us"), row.get("time_ci_high_us"), row.get("time_us")
    try:
        pct = (float(hi) - float(lo)) / 2 / float(t) * 100  # type: ignore[arg-type]
    except (TypeError, ValueError, ZeroDivisionError):
        return f"{'n/a':>{width}}"
    mark = "!" if row.get("noisy") else ""
    return f"{_num(pct, width - 1 - len(mark), '.1f')}%{mark}"


def _gain(row: Row, width: int) -> str:
    g = row.get("gain_vs_fp32")
    if g is None or (isinstance(g, float) and math.isnan(g)):
        return f"{'':>{width}}"
    sig = row.get("gain_significant")
    mark = "*" if sig else ("~" if sig is False else "")
    return f"{g:>{width - 2}.2f}x{mark or ' '}"


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    unit: str
    width: int
    cell: Callable[[Row, int], str]
    priority: int
    """Higher stays longer when the terminal is narrow."""
    sep: int = 1
    """Spaces before the column (nccl-tests' own layout uses two before count, type, redop and root)."""


def _field(key: str, spec: str) -> Callable[[Row, int], str]:
    return lambda row, w: _num(row.get(key), w, spec)


COLUMNS: tuple[Column, ...] = (
    Column("size", "(B)", 12, _field("size_bytes", "d"), 10, sep=0),
    Column("count", "(elements)", 12, _field("count", "d"), 2, sep=2),
    Column("type", "", 8, _field("dtype", ""), 6, sep=2),
    Column("redop", "", 6, lambda row, w: f"{row.get('redop', ''):>{w}}", 1, sep=2),
    Column("root", "", 6, lambda row, w: f"{-1:>{w}}", 0, sep=2),
    Column("time", "(us)", 8, _time, 10),
    Column("algbw", "(GB/s)", 7, _field("algbw_gbps", ".2f"), 5),
    Column("busbw", "(GB/s)", 7, _field("busbw_gbps", ".2f"), 10),
    Column("#wrong", "", 6, _field("wrong", "d"), 9),
    Column("precision", "", 16, lambda row, w: f"{str(row.get('precision', ''))[:w]:>{w}}", 10),
    Column("±ci", "(95%)", 7, _ci, 8),
    Column("vs fp32", "(total)", 8, _gain, 8),
    Column("enc_us", "(us)", 8, _field("encode_us", ".1f"), 3),
    Column("dec_us", "(us)", 8, _field("decode_us", ".1f"), 3),
    Column("eff_GB/s", "(GB/s)", 9, _field("effective_gbps", ".3f"), 4),
    Column("rel_err", "", 10, lambda row, w: _num(row.get("rel_err"), w, ".2e"), 5),
)


def terminal_width() -> int:
    """Columns of the terminal (COLUMNS wins; 200 when output is not a terminal, so logs keep every column)."""
    return shutil.get_terminal_size((200, 24)).columns


def _line(cols: list[Column], cells: list[str]) -> str:
    return "".join(" " * (c.sep if i else 0) + cell for i, (c, cell) in enumerate(zip(cols, cells, strict=True)))


def columns_for(width: int) -> list[Column]:
    """The columns that fit in ``width`` characters, in table order (drop the least important first). The last
    column of the terminal stays free: a line that fills it wraps in some terminals."""
    cols = list(COLUMNS)
    while sum(c.width + c.sep for c in cols) > width - 1 and len(cols) > 1:
        cols.remove(min(cols, key=lambda c: c.priority))
    if cols:
        cols[0] = Column(cols[0].header, cols[0].unit, cols[0].width, cols[0].cell, cols[0].priority, sep=0)
    return cols


def header_lines(cols: list[Column]) -> tuple[str, str]:
    """The header and units lines (``#`` in the first character, as nccl-tests prints them)."""
    head = _line(cols, [f"{c.header:>{c.width}}" for c in cols])
    units = _line(cols, [f"{c.unit:>{c.width}}" for c in cols])
    return "#" + head[1:], "#" + units[1:]


def block_title(row: Row) -> str:
    group = ""
    if row.get("group", "world") != "world":
        group = f"  group {row['group']}: {row.get('n_groups')} x {row.get('group_size')} ranks at once"
    return (
        f"# {row['collective']}  backend {row['backend']}  {row['world_size']} ranks on {row['nodes']} node(s)"
        f"{group}  payload {row['payload']}"
        + ("  timing isolated: one op after compute per sample" if row.get("timing_mode") == "isolated" else "")
    )


LEGEND = "# ±ci: half-width of time's 95 % interval (! noisy)   vs fp32: total-time speed-up (* significant, ~ not)"


def format_row(row: Row, cols: list[Column]) -> str:
    return _line(cols, [c.cell(row, c.width) for c in cols])
