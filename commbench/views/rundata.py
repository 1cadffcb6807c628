"""Loading a run directory for the views, and the selection and ordering rules they share.

`load_run` reads every table of one run through `commbench.store.results`' loaders into a `RunData`; the
functions below (which payload speed numbers use, which columns name a series, the order collectives
and precisions are shown in) are the one definition plots, report and compare all follow. Nothing
here draws, renders or measures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from commbench.store import results as res

__all__ = [
    "COLLECTIVE_ORDER",
    "FP32_PRECISION",
    "PAYLOAD_ORDER",
    "SERIES_CANDIDATES",
    "RunData",
    "as_tuple",
    "collectives",
    "has_values",
    "human_bytes",
    "human_rate",
    "human_size",
    "human_time",
    "load_run",
    "memory_kind_text",
    "order",
    "primary_payload",
    "series_columns",
    "series_label",
    "speed_rows",
]

COLLECTIVE_ORDER = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
PAYLOAD_ORDER = ("normal", "gradient", "outliers")
# Columns that may distinguish two series at the same (collective, size); a column only enters a
# legend label when it actually varies, so ordinary runs keep short labels.
SERIES_CANDIDATES = ("precision", "impl", "placement", "redop")
FP32_PRECISION = "fp32"


@dataclass(slots=True)
class RunData:
    """Everything a view needs from one run directory (empty frames where a table is absent)."""

    run_dir: Path
    """The run directory the tables came from."""
    results: pd.DataFrame
    """One row per measured collective point (commbench.load)."""
    metadata: dict[str, Any]
    """metadata.json as a dict."""
    crossover: pd.DataFrame = field(default_factory=pd.DataFrame)
    """crossover.csv, or computed from results when the run has none."""
    training: pd.DataFrame = field(default_factory=pd.DataFrame)
    """training.csv summary, one row per policy."""
    training_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    """training_steps.csv, one row per policy x step."""


def load_run(run_dir: Path | str) -> RunData:
    """Load one run directory through commbench.store.results' public loaders.

    Raises commbench.store.results.RunDirError (a ValueError) when the directory is not a readable run.
    """
    run_dir = Path(run_dir)
    results = res.load(run_dir)
    metadata = res.load_metadata(run_dir)
    crossover = res.load_crossover(run_dir)
    if crossover.empty and has_values(results, "effective_gbps"):
        # imported or older runs carry no crossover.csv: same definition, computed here.
        crossover = pd.DataFrame(res.crossover(results), columns=list(res.CROSSOVER_COLUMNS))
    return RunData(
        run_dir,
        results,
        metadata,
        crossover,
        res.load_training(run_dir),
        res.load_training_steps(run_dir),
    )


def human_size(n: float) -> str:
    """Bytes as nccl-tests/commbench size strings: 1024-based, 8 -> '8B', 65536 -> '64K'."""
    if n is None or not math.isfinite(n):
        return ""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if float(v).is_integer() else f"{v:.3g}{unit}"
    return f"{n:.0f}B"


def human_bytes(n: float) -> str:
    """Bytes for a person: 1024-based with IEC names, 3 significant digits (65536 -> '64 KiB', 1.5e6 -> '1.43 MiB')."""
    if n is None or not math.isfinite(n):
        return ""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{_sig(n / scale)} {unit}"
    return f"{n:.0f} B"


def human_time(us: float) -> str:
    """Microseconds for a person: '453 µs', '14.7 ms', '1.20 s' (3 significant digits)."""
    if us is None or not math.isfinite(us):
        return ""
    if abs(us) >= 1e6:
        return f"{_sig(us / 1e6)} s"
    if abs(us) >= 1e3:
        return f"{_sig(us / 1e3)} ms"
    return f"{_sig(us)} µs"


def human_rate(gbps: float) -> str:
    """A bandwidth in GB/s (1e9 bytes/s, as nccl-tests) for a person: MB/s below 1 GB/s, 3 significant digits."""
    if gbps is None or not math.isfinite(gbps):
        return ""
    if abs(gbps) < 1.0:
        return f"{_sig(gbps * 1e3)} MB/s"
    return f"{_sig(gbps)} GB/s"


def _sig(v: float) -> str:
    """3 significant digits without exponent for the magnitudes the human_* helpers produce (up to 1023)."""
    if v == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(v))))
    text = f"{v:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


MEMORY_KINDS = {
    "cuda_allocator": "peak GPU memory allocated by tensors during one step (torch.cuda.max_memory_allocated)",
    "cpu_heap": "peak growth of the process's C heap from before the model was built to the peak of one step "
    "(parameters, gradients, optimizer state, communication buffers and activations)",
    "cpu_memtracker": "peak bytes of live tensors during one step (torch's MemTracker, CPU)",
    "analytic": "computed from the parameter count (ZeRO formulas), not measured",
}
"""What each training memory kind (training.csv peak_mem_kind) measured, in words for the report and plots."""


def memory_kind_text(kind: str) -> str:
    """A person's description of a peak_mem_kind value (the raw value itself when it is not a known kind)."""
    return MEMORY_KINDS.get(kind, kind)


def order(values: Iterable[Any], preferred: tuple[str, ...]) -> list[str]:
    """The distinct values as strings: the preferred ones first in their order, then the rest sorted."""
    vals = list(dict.fromkeys(str(v) for v in values))
    return [v for v in preferred if v in vals] + sorted(v for v in vals if v not in preferred)


def series_columns(df: pd.DataFrame) -> list[str]:
    """The columns whose values vary in `df` and so must enter a series label (precision always)."""
    cols = ["precision"]
    if df.empty or "precision" not in df.columns:
        return cols
    for c in SERIES_CANDIDATES[1:]:
        # only when one precision has several values (fp8 by bytes and natively, in/out-of-place),
        # not when the column merely differs between precisions.
        if c in df.columns and df.groupby("precision")[c].nunique(dropna=True).max() > 1:
            cols.append(c)
    return cols


def series_label(keys: tuple[Any, ...], cols: list[str]) -> str:
    """'fp8_e4m3 impl=native' for the values `keys` of the series columns `cols`."""
    parts = [str(keys[0])]
    parts += [f"{c}={k}" for c, k in zip(cols[1:], keys[1:], strict=True)]
    return " ".join(parts)


def primary_payload(df: pd.DataFrame) -> str | None:
    """Bandwidth does not depend on the values sent, so speed plots use one payload: normal first."""
    if "payload" not in df.columns or df["payload"].dropna().empty:
        return None
    return order(df["payload"].dropna().unique(), PAYLOAD_ORDER)[0]


def speed_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows speed numbers come from: those of the primary payload (all rows when there is none)."""
    p = primary_payload(df)
    return df if p is None else df[df["payload"].astype(str) == p]


def as_tuple(k: Any) -> tuple[Any, ...]:
    """A pandas group key as a tuple, whether it grouped by one column or several."""
    return k if isinstance(k, tuple) else (k,)


def collectives(df: pd.DataFrame) -> list[str]:
    """The collectives in `df`, in the order views show them."""
    return order(df["collective"].dropna().unique(), COLLECTIVE_ORDER) if "collective" in df else []


def has_values(df: pd.DataFrame, col: str) -> bool:
    """True when `df` has column `col` with at least one numeric value."""
    return col in df.columns and pd.to_numeric(df[col], errors="coerce").notna().any()
