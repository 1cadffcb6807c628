"""What a run prints on rank 0: the progress bar, the nccl-tests-style table of finished points, and the
noise, crossover and training summary lines. Nothing here measures or writes files; the table's own
layout lives in `commbench.measure.table`."""

from __future__ import annotations

import math
import sys
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from commbench.core.records import crossover_phrase, is_missing
from commbench.core.units import format_size, human_bytes
from commbench.measure.table import (
    KEEP,
    Column,
    block_title,
    columns_for,
    format_row,
    header_lines,
    legend,
    terminal_width,
)

__all__ = [
    "PointPrinter",
    "SweepProgress",
    "comment",
    "print_crossover",
    "print_noise_warning",
    "print_resume",
    "print_skipped",
    "print_stragglers",
    "print_unavailable",
    "report_progress",
    "training_line",
]


def comment(text: str, width: int | None = None, indent: str = "") -> list[str]:
    """`text` as '# ' lines that fit the terminal (a long sentence wraps instead of running off the edge)."""
    w = max(40, (width or terminal_width()) - 1)
    return textwrap.wrap(
        text, w, initial_indent="# " + indent, subsequent_indent="# " + indent + "  ", break_on_hyphens=False
    ) or ["#"]

class SweepProgress:
    """A transient rich progress bar on stderr, or nothing when quiet (or nothing to do)."""

    def __init__(self, total: int, *, enabled: bool, label: str = "sweep") -> None:
        self._progress: Any = None
        self._task: Any = None
        if not enabled or total == 0:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=Console(stderr=True), transient=True,
        )  # fmt: skip
        self._progress.start()
        self._task = self._progress.add_task(label, total=total)

    def advance(self, description: str, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=n, description=description)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _link_util(row: Any, width: int) -> str:
    u = row.get("link_util")
    return f"{'-':>{width}}" if u is None or is_missing(u) else f"{float(u):>{width}.2f}"


LINK_COLUMN = Column(
    "link", "(util)", 6, _link_util, KEEP + 2, sep=3, legend="link: busbw as a fraction of the link the group crosses",
    needs="link_gbps",
)
"""busbw as a fraction of the link the group crosses (``link_util``), right of the other columns; shown only for a
block whose link has a rate (elsewhere the block's ``# link:`` line says why there is none)."""


def link_line(row: Mapping[str, Any]) -> str | None:
    """The block's link in one sentence: what ``link_util`` divides by, or why there is nothing to divide by."""
    link = str(row.get("link") or "")
    if not link or is_missing(row.get("link")):
        return None
    rate = row.get("link_gbps")
    if rate is None or is_missing(rate):
        return f"link: {link}; link_util n/a"
    return f"link: {link}; link = busbw / {float(rate):.4g} GB/s"


def precision_legend(names: Iterable[str]) -> str:
    """One sentence naming what each precision shown is (``fp32_chunked`` is fp32 through the codecs' algorithm);
    a name the registry does not know (an imported run's) is left out."""
    from commbench.measure.precision import get_precision

    parts = []
    for name in dict.fromkeys(names):
        try:
            parts.append(f"{name} = {get_precision(name).description}")
        except ValueError:
            continue
    return "precisions: " + "; ".join(parts) if parts else ""


class PointPrinter:
    """Prints finished points as nccl-tests rows (as many columns as the terminal fits, the least useful dropped
    first) with, whenever the collective or group changes, a block title, the block's link, the legend of the
    columns and precisions shown and a header; each row names its precision. :meth:`rows` takes one size's points
    at once, so the legend names every precision of the block before its first row; :meth:`row` one point (a
    precision first seen inside a block gets its legend line there)."""

    def __init__(self, width: int | None = None) -> None:
        self._block: str | None = None
        self._width = width or terminal_width()
        self._cols: list[Column] = []
        self._explained: set[str] = set()

    def _say(self, text: str) -> None:
        for line in comment(text, self._width):
            print(line)

    def _explain(self, names: Iterable[str]) -> None:
        new = [n for n in dict.fromkeys(names) if n not in self._explained]
        self._explained.update(new)
        text = precision_legend(new)
        if text:
            self._say(text)

    def rows(self, rows: Iterable[Mapping[str, Any]], redop: str) -> None:
        """Print one size's points of one block (every precision, in order)."""
        rows = list(rows)
        if not rows:
            return
        first = rows[0]
        block = f"{first['collective']}|{first.get('group', 'world')}"
        if block != self._block:
            self._block = block
            self._cols = columns_for(self._width, (LINK_COLUMN,), first)
            print("#")
            self._say(block_title({**first, "redop": redop}, self._cols).removeprefix("# "))
            link = link_line(first)
            if link:
                self._say(link)
            self._say(legend(self._cols))
            self._explain(str(r.get("precision", "")) for r in rows)
            for line in header_lines(self._cols):
                print(line)
        else:
            self._explain(str(r.get("precision", "")) for r in rows)
        for r in rows:
            print(format_row({**r, "redop": redop}, self._cols))
        sys.stdout.flush()

    def row(self, row: Mapping[str, Any], redop: str) -> None:
        """Print one point (see :meth:`rows`)."""
        self.rows([row], redop)


def print_skipped(pairs: Iterable[tuple[str, str]], backend: str, groups: Iterable[tuple[str, str]] = ()) -> None:
    for c, p in pairs:
        print(f"# skipped {c} x {p}: not supported on backend {backend}")
    for g, why in groups:
        print(f"# skipped group {g}: {why}")


def print_unavailable(entry: Mapping[str, str]) -> None:
    """A precision refused at run time (its probe failed on some rank): skipped everywhere, said once."""
    group = entry.get("group", "world")
    where = entry["collective"] if group in ("world", "") else f"{entry['collective']} [{group}]"
    for line in comment(f"skipped {where} x {entry['precision']}: {entry['reason']}"):
        print(line, flush=True)


def print_noise_warning(df: Any) -> None:
    """Say how many points missed the interval target (pyperf's rule: warn instead of hiding it)."""
    if "noisy" not in df.columns:
        return
    noisy = int(df["noisy"].fillna(False).astype(bool).sum())
    if noisy:
        for line in comment(
            f"warning: {noisy} of {len(df)} points did not reach the target interval (noisy: other load on the "
            "machine, or too little time: raise --max-time, or loosen --target-ci)"
        ):
            print(line)


def print_resume(run_dir: Any, done: int, left: int) -> None:
    """A resumed run says what it keeps and what it still measures."""
    print(f"# resuming {run_dir}: {done} point(s) already measured, {left} left")


def print_crossover(cross: list[dict[str, Any]]) -> None:
    if not cross:
        return
    print("#")
    for line in comment(
        "crossover: smallest fp32 tensor size from which a precision is significantly faster than fp32 (total "
        "time) at every larger size, and where below it the crossover lies; speed-up at the largest size with its "
        "95 % interval"
    ):
        print(line)
    for row in cross:
        where = crossover_phrase(row, lambda b: format_size(int(b)))
        g, lo, hi = (float(row.get(k, math.nan)) for k in ("gain_at_largest", "gain_at_largest_ci_low", "gain_at_largest_ci_high"))
        at_max = ""
        if not math.isnan(g):
            at_max = f"{g:.2f}x" + (f" [{lo:.2f}-{hi:.2f}]" if not math.isnan(lo) else "")
        group = row.get("group", "world")
        name = row["collective"] if group in (None, "world") else f"{row['collective']} [{group}]"
        print(f"#   {name:<15} {row['precision']:<16} {at_max:<20} {where}")


def report_progress(what: str) -> None:
    """One line per step of writing the report (figures take seconds each): the run is not stuck."""
    print(f"# report: {what}", flush=True)


def _ms(us: float) -> str:
    ms = us / 1e3
    return "n/a" if math.isnan(us) else f"{ms:.1f}" if abs(ms) < 100 else f"{ms:.0f}"


def _mib(b: float) -> str:
    return "n/a" if math.isnan(b) else human_bytes(b)


def training_line(row: Mapping[str, Any]) -> str:
    """One policy's summary in <= 100 columns: step time in ms with its 95 % interval, the speed-up over fp32
    (* significant, ~ not), peak memory and bytes per step in MiB, loss drift; then its warnings, and its notes
    when it is significantly slower than fp32 (a reason of this machine, such as CPU autocast)."""

    def num(key: str) -> float:
        v = row.get(key)
        return math.nan if v is None or is_missing(v) else float(v)

    t, lo, hi = num("step_time_us_p50"), num("step_time_us_ci_low"), num("step_time_us_ci_high")
    ci = f" [{_ms(lo)}-{_ms(hi)}]" if not (math.isnan(lo) or math.isnan(hi)) else ""
    s, sig = num("speedup_vs_fp32"), row.get("speedup_significant")
    mark = "*" if sig is True else ("~" if sig is False else "")
    speed = "" if math.isnan(s) else f" {s:.2f}x{mark}"
    drift = num("final_loss_drift")
    # header once per run is the orchestrator's: "step time [95 % CI], speed-up vs fp32, peak memory, bytes/step"
    lines = [
        f"# training {str(row.get('policy')):<12} {_ms(t):>6} ms{ci}{speed} mem {_mib(num('peak_mem_bytes'))}"
        f" comm {_mib(num('comm_bytes_per_step'))}/step drift {drift:.2g}"
    ]
    if row.get("warnings"):
        lines += comment(f"WARN {row['warnings']}", indent="  ")
    if sig is True and s < 1 and row.get("notes"):
        lines += comment(f"slower here; notes: {row['notes']}", indent="  ")
    return "\n".join(lines)


def print_stragglers(found: list[dict[str, Any]]) -> None:
    """Name a rank or node the others consistently wait for (commbench.measure.stragglers)."""
    from commbench.measure.stragglers import describe

    for s in found:
        for line in comment(f"straggler: {describe(s)}"):
            print(line)
