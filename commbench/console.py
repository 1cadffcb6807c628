"""What a run prints on rank 0: the progress bar, the nccl-tests-style table of finished points, and the
noise, crossover and training summary lines. Nothing here measures or writes files; the table's own
layout lives in `commbench.table`."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from commbench.config import format_size
from commbench.records import is_missing
from commbench.table import LEGEND, block_title, columns_for, format_row, header_lines, terminal_width

__all__ = [
    "PointPrinter", "SweepProgress", "print_crossover", "print_noise_warning", "print_skipped", "print_stragglers",
    "training_line",
]  # fmt: skip

class SweepProgress:
    """A transient rich progress bar on stderr, or nothing when quiet (or nothing to do)."""

    def __init__(self, total: int, *, enabled: bool) -> None:
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
        self._task = self._progress.add_task("sweep", total=total)

    def advance(self, description: str, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=n, description=description)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()


class PointPrinter:
    """Prints finished points as nccl-tests rows (as many columns as the terminal fits), with a block title
    and header whenever the collective changes; each row names its precision."""

    def __init__(self, width: int | None = None) -> None:
        self._block: str | None = None
        self._cols = columns_for(width or terminal_width())
        self._legend = False

    def row(self, row: Any, redop: str) -> None:
        if not self._legend:
            self._legend = True
            print(LEGEND)
        block = f"{row['collective']}|{row.get('group', 'world')}"
        if block != self._block:
            self._block = block
            print("#")
            print(block_title(row))
            for line in header_lines(self._cols):
                print(line)
        print(format_row({**row, "redop": redop}, self._cols))
        sys.stdout.flush()


def print_skipped(pairs: Iterable[tuple[str, str]], backend: str, groups: Iterable[tuple[str, str]] = ()) -> None:
    for c, p in pairs:
        print(f"# skipped {c} x {p}: not supported on backend {backend}")
    for g, why in groups:
        print(f"# skipped group {g}: {why}")


def print_noise_warning(df: Any) -> None:
    """Say how many points missed the interval target (pyperf's rule: warn instead of hiding it)."""
    if "noisy" not in df.columns:
        return
    noisy = int(df["noisy"].fillna(False).astype(bool).sum())
    if noisy:
        print(
            f"# warning: {noisy} of {len(df)} points did not reach the target interval (noisy: other load on the "
            "machine, or too little time: raise --max-time, or loosen --target-ci)"
        )


def print_crossover(cross: list[dict[str, Any]]) -> None:
    if not cross:
        return
    print("#\n# crossover: smallest fp32 tensor size from which a precision is significantly faster than fp32 (total time)")
    for row in cross:
        where = format_size(int(row["crossover_bytes"])) if row["note"] == "" else row["note"]
        g, lo, hi = (float(row.get(k, math.nan)) for k in ("gain_at_largest", "gain_at_largest_ci_low", "gain_at_largest_ci_high"))
        at_max = ""
        if not math.isnan(g):
            at_max = f"  ({g:.2f}x at the largest size" + (f", 95 % CI {lo:.2f}-{hi:.2f})" if not math.isnan(lo) else ")")
        group = row.get("group", "world")
        name = row["collective"] if group in (None, "world") else f"{row['collective']} [{group}]"
        print(f"#   {name:<15} {row['precision']:<20} {where}{at_max}")


def training_line(row: Mapping[str, Any]) -> str:
    """One policy's summary: step time, bytes per step, loss drift and its warnings."""
    def num(key: str, missing: float) -> float:
        v = row.get(key)
        return missing if v is None or is_missing(v) else float(v)

    return (
        f"# training {row.get('policy'):<24} step p50 {num('step_time_us_p50', math.nan) / 1e3:8.2f} ms"
        f"  comm/step {num('comm_bytes_per_step', 0.0):>12,.0f} B  final-loss drift {num('final_loss_drift', math.nan):.3g}"
        + (f"  WARN {row['warnings']}" if row.get("warnings") else "")
    )


def print_stragglers(found: list[dict[str, Any]]) -> None:
    """Name a rank or node the others consistently wait for (commbench.stragglers)."""
    from commbench.stragglers import describe

    for s in found:
        print(f"# straggler: {describe(s)}")
