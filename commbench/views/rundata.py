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

from commbench.core.records import CollectivePoint
from commbench.store import results as res

__all__ = [
    "COLLECTIVE_ORDER",
    "FP32_PRECISION",
    "IMPORT_LAUNCHER",
    "PAYLOAD_ORDER",
    "SERIES_CANDIDATES",
    "RunData",
    "as_tuple",
    "collectives",
    "has_intervals",
    "has_values",
    "human_size",
    "load_run",
    "memory_kind_text",
    "numeric",
    "order",
    "primary_payload",
    "reference_precisions",
    "series_columns",
    "series_label",
    "series_name",
    "speed_rows",
    "WORLD_GROUP",
]

COLLECTIVE_ORDER = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
PAYLOAD_ORDER = ("normal", "gradient", "outliers")
# Columns that may distinguish two series at the same (collective, size); a column only enters a
# legend label when it actually varies, so ordinary runs keep short labels.
SERIES_CANDIDATES = ("precision", "impl", "placement", "redop")
FP32_PRECISION = "fp32"
"""The baseline precision every speed-up and drift is measured against (the sweep's and training's reference)."""
WORLD_GROUP: str = CollectivePoint.defaults()["group"]
"""The group kind of a point measured on all ranks: the `group` column's default (runs from before groups)."""
IMPORT_LAUNCHER = "import"
"""metadata.json's `launcher` of a run imported from nccl-tests (commbench.store.nccl_import writes it)."""


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
    by = ["collective", "precision"] if "collective" in df.columns else ["precision"]
    for c in SERIES_CANDIDATES[1:]:
        # only when one precision of one collective has several values (fp8 by bytes and natively, in/out-of-place),
        # not when the column merely differs between precisions or collectives (redop: sum, none for all_gather).
        if c in df.columns and df.groupby(by)[c].nunique(dropna=True).max() > 1:
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


def numeric(df: pd.DataFrame, col: str) -> pd.Series:
    """Column `col` as numbers (NaN for missing cells and text; all NaN when `df` has no such column)."""
    return pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series(math.nan, index=df.index)


def has_intervals(df: pd.DataFrame) -> bool:
    """True when `df` carries the 95 % interval of the speed-up over fp32 (imports and older runs do not)."""
    return has_values(df, "gain_ci_low") and has_values(df, "gain_ci_high")


def series_name(df: pd.DataFrame) -> pd.Series:
    """precision plus whichever of impl/placement/redop varies within a precision (as in the plots)."""
    cols = series_columns(df)
    name = df["precision"].astype(str)
    for c in cols[1:]:
        name = name + " " + c + "=" + df[c].astype(str)
    return name


def reference_precisions(run: RunData) -> set[str]:
    """Precisions in the results that the suite did not ask for: the sweep's own references (fp32 through the
    chunked algorithm, which splits a codec's gain into algorithm and precision). They explain gains; they are
    not candidates a user would choose."""
    suite = run.metadata.get("suite") or {}
    asked = {str(p).split(":", 1)[0] for p in suite.get("precisions") or []} | {
        str(p) for p in suite.get("precisions") or []
    }
    df = run.results
    if not asked or df.empty or "precision" not in df.columns:
        return set()
    return {str(p) for p in df["precision"].dropna().unique()} - asked - {FP32_PRECISION}
