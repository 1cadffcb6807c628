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
from commbench.table import HEADER, UNITS, block_title, format_row

__all__ = ["PointPrinter", "SweepProgress", "print_crossover", "print_noise_warning", "print_skipped", "training_line"]

# pyperf's rule: a coefficient of variation of 10 % or more makes a timing untrustworthy.
NOISY_CV = 0.10


class SweepProgress:
    """A transient rich progress bar on stderr, or nothing when quiet (or nothing to do)."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self._progress: Any = None
        self._task: Any = None
        if not enabled or total == 0:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(stderr=True), transient=True,
        )  # fmt: skip
        self._progress.start()
        self._task = self._progress.add_task("sweep", total=total)

    def advance(self, description: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=description)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()


class PointPrinter:
    """Prints finished points as nccl-tests rows, with a block title and header whenever the
    (collective, precision) block changes."""

    def __init__(self) -> None:
        self._block: tuple[str, str] | None = None

    def row(self, row: Any, redop: str) -> None:
        block = (row["collective"], row["precision"])
        if block != self._block:
            self._block = block
            print("#")
            print(block_title(row, redop))
            print(HEADER)
            print(UNITS)
        print(format_row(row, redop))
        sys.stdout.flush()


def print_skipped(pairs: Iterable[tuple[str, str]], backend: str) -> None:
    for c, p in pairs:
        print(f"# skipped {c} x {p}: not supported on backend {backend}")


def print_noise_warning(cvs: Iterable[float]) -> None:
    values = list(cvs)
    noisy = sum(1 for v in values if v >= NOISY_CV)
    if noisy:  # pyperf's rule: say so instead of hiding it
        print(
            f"# warning: {noisy} of {len(values)} points have a coefficient of variation >= 10 %: timings are noisy "
            "(other load on the machine, or too few samples: raise --min-time / --repeats)"
        )


def print_crossover(cross: list[dict[str, Any]]) -> None:
    if not cross:
        return
    print("#\n# crossover: smallest fp32 tensor size from which a precision beats fp32 on effective bandwidth")
    for row in cross:
        where = format_size(int(row["crossover_bytes"])) if row["note"] == "" else row["note"]
        print(f"#   {row['collective']:<15} {row['precision']:<20} {where}")


def training_line(row: Mapping[str, Any]) -> str:
    """One policy's summary: step time, bytes per step, loss drift and its warnings."""
    def num(key: str, missing: float) -> float:
        v = row.get(key)
        return missing if is_missing(v) else float(v)

    return (
        f"# training {row.get('policy'):<24} step p50 {num('step_time_us_p50', math.nan) / 1e3:8.2f} ms"
        f"  comm/step {num('comm_bytes_per_step', 0.0):>12,.0f} B  final-loss drift {num('final_loss_drift', math.nan):.3g}"
        + (f"  WARN {row['warnings']}" if row.get("warnings") else "")
    )
