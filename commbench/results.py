"""Record schema, run directory, incremental atomic writes, metadata, and loading runs into pandas.

A run directory holds ``rows.jsonl`` (append-only journal: one JSON object per finished point, the source of
truth for ``--resume``), the tidy tables rewritten atomically after every point (``results.csv``,
``results.parquet``; ``training.csv``/``training_steps.csv`` for training sections; ``crossover.csv``), and
``metadata.json``. A crash loses at most the point in flight; a torn last journal line is ignored.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

SCHEMA_VERSION = 1

COLUMNS: tuple[str, ...] = (
    "collective", "precision", "impl", "backend", "device", "world_size", "nodes", "payload", "dtype",
    "size_bytes", "count", "fp32_bytes", "wire_bytes",
    "time_us", "time_us_max", "p50_us", "p95_us", "cv", "rank_spread", "iters", "samples",
    "algbw_gbps", "busbw_gbps", "encode_us", "comm_us", "decode_us", "total_us", "effective_gbps",
    "wrong", "tolerance", "rel_err", "max_abs_err", "timestamp",
)  # fmt: skip
"""Column order of ``results.csv``; one row per (collective, precision, payload, size) point."""

POINT_KEY: tuple[str, ...] = ("collective", "precision", "payload", "fp32_bytes")
"""Columns that identify a point (``--resume`` skips rows already present under this key)."""

CROSSOVER_COLUMNS = ("collective", "payload", "precision", "crossover_bytes", "note")

_TABLES = {
    "results": ("rows.jsonl", "results.csv", "results.parquet"),
    "training": ("training.jsonl", "training.csv", None),
    "training_steps": ("training_steps.jsonl", "training_steps.csv", None),
}


class RunDirError(ValueError):
    """A run directory is missing, unreadable, or from an incompatible schema."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same directory and rename: readers never see a partial file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def read_journal(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines journal; a torn final line (crash mid-write) is dropped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows.append({k: (float(v) if v in ("inf", "-inf") else (math.nan if v is None else v)) for k, v in row.items()})
    return rows


def _frame(rows: list[dict[str, Any]], columns: Iterable[str] | None) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    if columns is not None:
        cols = list(columns)
        for c in cols:
            if c not in df.columns:
                df[c] = math.nan
        df = df[cols + [c for c in df.columns if c not in cols]]
    return df


class RunWriter:
    """Rank 0's writer for one run directory."""

    def __init__(self, run_dir: Path, *, resume: bool = False) -> None:
        self.dir = run_dir
        self.rows: dict[str, list[dict[str, Any]]] = {k: [] for k in _TABLES}
        if resume:
            if not (run_dir / "metadata.json").is_file():
                raise RunDirError(f"cannot resume {run_dir}: not a commbench run directory (no metadata.json)")
            for table, (journal, _, _) in _TABLES.items():
                self.rows[table] = read_journal(run_dir / journal)
        else:
            check_new_run_dir(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)

    def done_keys(self) -> set[tuple[Any, ...]]:
        return {tuple(r[k] for k in POINT_KEY) for r in self.rows["results"]}

    def done_policies(self) -> set[str]:
        return {str(r["policy"]) for r in self.rows["training"]}

    def write_metadata(self, meta: dict[str, Any]) -> None:
        atomic_write_text(self.dir / "metadata.json", json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")

    def add(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Journal ``rows`` (append + fsync) and rewrite that table's CSV/parquet atomically."""
        if not rows:
            return
        journal, csv_name, parquet_name = _TABLES[table]
        with open(self.dir / journal, "a") as f:
            for row in rows:
                f.write(json.dumps({k: _jsonable(v) for k, v in row.items()}, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.rows[table].extend(rows)
        df = _frame(self.rows[table], COLUMNS if table == "results" else None)
        atomic_write_text(self.dir / csv_name, df.to_csv(index=False))
        if parquet_name:
            import io

            buf = io.BytesIO()
            df.to_parquet(buf, index=False)
            atomic_write_bytes(self.dir / parquet_name, buf.getvalue())

    def write_crossover(self, rows: list[dict[str, Any]]) -> None:
        df = _frame(rows, CROSSOVER_COLUMNS)
        atomic_write_text(self.dir / "crossover.csv", df.to_csv(index=False))


def check_new_run_dir(run_dir: Path) -> None:
    """Refuse to write into an existing non-empty directory or an unwritable place (nothing is touched)."""
    if run_dir.exists():
        if not run_dir.is_dir():
            raise RunDirError(f"output path {run_dir} exists and is not a directory")
        if any(run_dir.iterdir()):
            raise RunDirError(f"output directory {run_dir} is not empty; choose a new --out or use --resume {run_dir}")
    parent = run_dir
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise RunDirError(f"output directory {run_dir} cannot be created: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunDirError(f"output directory {run_dir} is not writable (no write permission on {parent})")


def _require_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    p = Path(run_dir)
    if not p.is_dir():
        raise RunDirError(f"run directory {str(p)!r} does not exist")
    if not (p / "metadata.json").is_file():
        raise RunDirError(f"{str(p)!r} is not a commbench run directory (no metadata.json)")
    return p


def load_metadata(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The run's ``metadata.json``; refuses a schema newer than this commbench understands."""
    p = _require_run_dir(run_dir)
    try:
        meta = json.loads((p / "metadata.json").read_text())
    except (json.JSONDecodeError, OSError) as e:
        raise RunDirError(f"cannot read {p / 'metadata.json'}: {e}") from None
    version = meta.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise RunDirError(
            f"{p} has results schema version {version!r}; this commbench reads versions up to {SCHEMA_VERSION}: upgrade commbench"
        )
    return dict(meta)


def _load_table(run_dir: str | os.PathLike[str], table: str, columns: Iterable[str] | None) -> pd.DataFrame:
    p = _require_run_dir(run_dir)
    load_metadata(p)
    journal, csv_name, parquet_name = _TABLES[table]
    if parquet_name and (p / parquet_name).is_file():
        df = pd.read_parquet(p / parquet_name)
    elif (p / csv_name).is_file():
        df = pd.read_csv(p / csv_name)
    else:
        df = _frame(read_journal(p / journal), None)
    if columns is not None:
        df = _frame(df.to_dict("records"), columns) if len(df) else pd.DataFrame(columns=list(columns))
    return df


def load(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """The tidy collective results of a run directory (one row per point; empty frame if none)."""
    return _load_table(run_dir, "results", COLUMNS)


def load_training(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Training summary (one row per policy); empty frame if the run had no training section."""
    df = _load_table(run_dir, "training", None)
    if "warnings" in df.columns:  # an empty string reads back from CSV as NaN
        df["warnings"] = [w if isinstance(w, str) else "" for w in df["warnings"]]
    return df


def load_training_steps(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    return _load_table(run_dir, "training_steps", None)


def load_crossover(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    p = _require_run_dir(run_dir)
    if not (p / "crossover.csv").is_file():
        return pd.DataFrame(columns=list(CROSSOVER_COLUMNS))
    return pd.read_csv(p / "crossover.csv")


def crossover(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Per collective, payload and precision: the smallest fp32 size from which the precision's effective
    bandwidth beats fp32 at that size and at every larger size measured (else "never in range")."""
    out: list[dict[str, Any]] = []
    if df.empty:
        return out
    for (coll, payload), g in df.groupby(["collective", "payload"], sort=False):
        base = g[g["precision"] == "fp32"].set_index("fp32_bytes")["effective_gbps"]
        if base.empty:
            continue
        for prec, gp in g[g["precision"] != "fp32"].groupby("precision", sort=False):
            eff = gp.set_index("fp32_bytes")["effective_gbps"]
            sizes = sorted(set(eff.index) & set(base.index))
            wins = [bool(eff[s] > base[s]) for s in sizes]
            cross: float = math.nan
            for i, s in enumerate(sizes):
                if all(wins[i:]):
                    cross = float(s)
                    break
            out.append(
                {
                    "collective": coll,
                    "payload": payload,
                    "precision": prec,
                    "crossover_bytes": cross,
                    "note": "" if not math.isnan(cross) else "never in range",
                }
            )
    return out
