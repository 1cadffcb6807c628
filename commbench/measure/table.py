"""nccl-tests' table layout for rows as they finish, with commbench's extra columns to the right of #wrong
(so the left part pastes next to nccl-tests output).

``size`` keeps nccl-tests' meaning for the user: the bytes of the user's fp32 tensor (the ``-b``/``-e`` grid, as
``count`` elements of fp32), whatever the precision moves; ``wire`` is the bytes the collective moved (results'
``size_bytes``, what algbw and busbw divide). The table is a list of column specs, each with a priority: at a narrow
terminal the least useful columns are dropped first, a column with nothing to show (the link of a group that crosses
none) is not shown at all, and nccl-tests' own columns stay while the terminal has room for them (100 columns; below
that the constant root, redop and count go, in that order, and the block title names redop and root).
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
    """Higher stays longer when the terminal is narrow; :data:`KEEP` and above: nccl-tests' own columns."""
    sep: int = 1
    """Spaces before the column (nccl-tests' own layout uses two before count and type)."""
    legend: str = ""
    """What the column means, for the legend line above the table ("" for nccl-tests' own columns)."""
    needs: str = ""
    """A column of commbench's whose cells all read "-" or nothing without this value (the link of a group that
    crosses none, the speed-up of a run without fp32): a block whose first row lacks it does not show it."""


KEEP = 100
"""Columns of this priority and above are nccl-tests' own (and the precision that tells rows apart): dropped only
when the terminal is narrower than all of them, the ones constant in a block first (root, redop: the block title
then names them), then count. The link column of a group whose link has a rate ranks between redop and count."""


def _field(key: str, spec: str) -> Callable[[Row, int], str]:
    return lambda row, w: _num(row.get(key), w, spec)


def _root(row: Row, width: int) -> str:
    root = row.get("root")
    return f"{-1 if root is None or (isinstance(root, float) and math.isnan(root)) else int(root):>{width}}"


COLUMNS: tuple[Column, ...] = (
    Column("size", "(B)", 12, _field("fp32_bytes", "d"), 1000, sep=0),
    Column("count", "(elements)", 12, _field("count", "d"), KEEP + 3, sep=2),
    Column("type", "", 8, _field("dtype", ""), 1000, sep=2),
    Column("redop", "", 6, lambda row, w: f"{row.get('redop', ''):>{w}}", KEEP + 1),
    Column("root", "", 6, _root, KEEP),
    Column("time", "(us)", 8, _time, 1000),
    Column("algbw", "(GB/s)", 7, _field("algbw_gbps", ".2f"), 1000),
    Column("busbw", "(GB/s)", 7, _field("busbw_gbps", ".2f"), 1000),
    Column("#wrong", "", 6, _field("wrong", "d"), 1000),
    Column("precision", "", 16, lambda row, w: f"{str(row.get('precision', ''))[:w]:>{w}}", 1000),
    Column("±ci", "(95%)", 7, _ci, 9, legend="±ci: half-width of time's 95 % interval (! noisy)",
           needs="time_ci_high_us"),
    Column("vs fp32", "(total)", 8, _gain, 8, legend="vs fp32: total-time speed-up (* significant, ~ not)",
           needs="gain_vs_fp32"),
    Column("wire", "(B)", 12, _field("size_bytes", "d"), 7,
           legend="wire: bytes the collective moved (algbw, busbw divide these)"),
    Column("eff_GB/s", "(GB/s)", 9, _field("effective_gbps", ".3f"), 6,
           legend="eff_GB/s: fp32 bytes over the time with encode+decode"),
    Column("rel_err", "", 10, lambda row, w: _num(row.get("rel_err"), w, ".2e"), 5,
           legend="rel_err: relative error vs float64", needs="rel_err"),
    Column("enc_us", "(us)", 8, _field("encode_us", ".1f"), 3),
    Column("dec_us", "(us)", 8, _field("decode_us", ".1f"), 2),
)  # fmt: skip
"""The table's columns in order; ``size`` is the user's fp32 tensor (nccl-tests' size), ``wire`` the bytes moved."""

SIZE_LEGEND = "size: nccl-tests' size of your tensor as fp32, in bytes (the -b/-e grid)"

PIPED_WIDTH = 132
"""Columns when output is not a terminal (a log, a pipe) and COLUMNS is unset: nccl-tests' columns and the
interval, speed-up and wire bytes; results.csv keeps every column."""


def terminal_width() -> int:
    """Columns of the terminal (COLUMNS wins; :data:`PIPED_WIDTH` when output is not a terminal)."""
    return shutil.get_terminal_size((PIPED_WIDTH, 24)).columns


def _line(cols: list[Column], cells: list[str]) -> str:
    return "".join(" " * (c.sep if i else 0) + cell for i, (c, cell) in enumerate(zip(cols, cells, strict=True)))


def _has(row: Row, key: str) -> bool:
    v = row.get(key)
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v != ""


def columns_for(width: int, extra: tuple[Column, ...] = (), row: Row | None = None) -> list[Column]:
    """The columns (and ``extra`` ones after them) that fit in ``width`` characters, in table order: those with
    nothing to show for ``row`` (a block's first row: :attr:`Column.needs`) first, then the least useful; nccl-tests'
    own only when the terminal is narrower than they are. The last column of the terminal stays free: a line that
    fills it wraps in some terminals."""
    cols = [c for c in (*COLUMNS, *extra) if row is None or not c.needs or _has(row, c.needs)]
    while sum(c.width + c.sep for c in cols) > width - 1:
        droppable = [c for c in cols if c.priority < 1000]
        if not droppable:
            break
        cols.remove(min(droppable, key=lambda c: c.priority))
    return cols


def legend(cols: list[Column]) -> str:
    """The legend of the columns shown: what size means, then each of commbench's own columns."""
    return "   ".join([SIZE_LEGEND, *(c.legend for c in cols if c.legend)])


def header_lines(cols: list[Column]) -> tuple[str, str]:
    """The header and units lines (``#`` in the first character, as nccl-tests prints them)."""
    head = _line(cols, [f"{c.header:>{c.width}}" for c in cols])
    units = _line(cols, [f"{c.unit:>{c.width}}" for c in cols])
    return "#" + head[1:], "#" + units[1:]


def block_title(row: Row, cols: list[Column] | None = None) -> str:
    """The line above a block's header; names redop and root when their columns did not fit."""
    group = ""
    if row.get("group", "world") != "world":
        group = f"  group {row['group']}: {row.get('n_groups')} x {row.get('group_size')} ranks at once"
    shown = {c.header for c in cols} if cols is not None else {"redop", "root"}
    constants = "".join(
        f"  {h} {cell(row, 0).strip() or '-'}" for h, cell in (("redop", lambda r, w: str(r.get("redop", ""))),
                                                           ("root", _root)) if h not in shown
    )  # fmt: skip
    return (
        f"# {row['collective']}  backend {row['backend']}  {row['world_size']} ranks on {row['nodes']} node(s)"
        f"{group}  payload {row['payload']}{constants}"
        + ("  timing isolated: one op after compute per sample" if row.get("timing_mode") == "isolated" else "")
    )


LEGEND = "# " + legend(list(COLUMNS))
"""The legend of every column (the console prints the one of the columns it shows: :func:`legend`)."""


def format_row(row: Row, cols: list[Column]) -> str:
    return _line(cols, [c.cell(row, c.width) for c in cols])
