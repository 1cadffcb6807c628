"""Run directory: incremental atomic writes of any record table, and loading runs into pandas.

A run directory holds, per table (``results``, ``training``, ``training_steps``: any
:class:`~commbench.core.records.Record` type's ``TABLE``), an append-only journal (one JSON object per row, the
source of truth for ``--resume``; ``rows.jsonl`` for results, ``<table>.jsonl`` otherwise) and the tidy
``<table>.csv`` and ``<table>.parquet``, rewritten atomically from it at most every :data:`TABLE_EVERY_S` during a
run and whole at its end (:meth:`RunWriter.flush`); ``crossover.csv``; and ``metadata.json`` (see
:mod:`commbench.cluster.metadata`). A crash loses at most the point in flight: a table older than its journal (the
writer killed between two rewrites) is read from the journal (:func:`load_table`); a torn last journal line is
ignored. Columns and dtypes come from the record types (:mod:`commbench.core.records`).

A table whose record type has a ``KEY`` (the results) holds one row per key: the journal keeps every row written
(a point's provisional rows after each pass, then its final one), the tables and :attr:`RunWriter.rows` the latest.
Journal-only tables (:meth:`RunWriter.append_journal`: the sweep's per-pass samples) have no CSV.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from commbench.core.records import SCHEMA_VERSION, CollectivePoint, Crossover, Record, frame_dtypes, record_for_table

R = TypeVar("R", bound=Record)

# Aliases kept for modules that imported them before the records existed.
COLUMNS: tuple[str, ...] = CollectivePoint.columns()
"""Column order of ``results.csv``; one row per (collective, precision, payload, size) point."""
POINT_KEY: tuple[str, ...] = CollectivePoint.KEY
"""Columns that identify a point (``--resume`` skips rows already present under this key)."""
CROSSOVER_COLUMNS: tuple[str, ...] = Crossover.columns()

_JOURNALS = {"results": "rows.jsonl"}
"""Journal names that differ from ``<table>.jsonl`` (the results journal kept its schema-1 name)."""


PASSES_TABLE = "passes"
"""The sweep's journal of every group's passes (``passes.jsonl``, :mod:`commbench.measure.passes`): journal only,
its rows hold nested samples; --resume measures only the passes it lacks."""
JOURNAL_ONLY = (PASSES_TABLE,)
"""Tables that have a journal and no CSV or parquet."""

TABLE_EVERY_S = 2.0
"""Seconds between two rewrites of a table during a run (the journal takes every row at once). Rewriting the whole
CSV and parquet after every point cost a sweep 18-31 ms a point between its points, growing with the rows, every
rank waiting for rank 0 (``benchmarks/bench_run_writer.py``; figures in benchmarks/results/)."""

LOGS_DIR = "logs"
"""Sub-directory of a run directory holding each locally spawned rank's log (``rank<r>.log``)."""


def journal_name(table: str) -> str:
    return _JOURNALS.get(table, f"{table}.jsonl")


class RunDirError(ValueError):
    """A run directory is missing, unreadable, or from an incompatible schema."""


def _umask() -> int:
    # os.umask can only be read by setting it; set it straight back (no thread here creates files meanwhile)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same directory and rename: readers never see a partial file.

    The file gets the mode a plain ``open()`` would give it (0666 less the umask): ``mkstemp`` creates 0600,
    which would hide the data from colleagues who can read the report next to it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
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


def _warn(msg: str) -> None:
    import sys

    print(f"commbench: warning: {msg}", file=sys.stderr)


def read_journal(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines journal; a torn final line (crash mid-write) is dropped with a warning."""
    if not path.exists():
        return []
    rows = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError:
            where = "its torn last line (a crash mid-write)" if i == len(lines) - 1 else f"unreadable line {i + 1}"
            _warn(f"{path}: dropped {where}")
            continue
        rows.append({k: (float(v) if v in ("inf", "-inf") else (math.nan if v is None else v)) for k, v in row.items()})
    return rows


def _cast(df: pd.DataFrame, record: type[Record]) -> pd.DataFrame:
    """Apply the record's dtypes where the data allows it: a column an older or foreign run left with gaps
    (an int column holding NaN) keeps the dtype pandas gave it rather than failing the load."""
    for c, dt in frame_dtypes(record, list(df.columns)).items():
        try:
            df[c] = df[c].astype(dt)
        except (TypeError, ValueError):
            pass
    return df


def _ordered(df: pd.DataFrame, record: type[Record]) -> pd.DataFrame:
    """The record's columns first, in order (missing ones as NaN), then any extras."""
    cols = list(record.columns())
    for c in cols:
        if c not in df.columns:
            df[c] = math.nan
    return df[cols + [c for c in df.columns if c not in cols]]


def _frame(rows: list[dict[str, Any]], record: type[Record] | None) -> pd.DataFrame:
    """Rows as a frame, ordered and typed by ``record`` when given."""
    df = pd.DataFrame(rows)
    return _cast(_ordered(df, record), record) if record is not None else df


def records_frame(records: Sequence[Record]) -> pd.DataFrame:
    """Records of one type as a frame with that type's column order and dtypes (for writers without a
    journal: the nccl-tests import, test fixtures)."""
    kinds = {type(r) for r in records}
    if len(kinds) > 1:
        raise TypeError(f"rows of one record type expected, got {sorted(k.__name__ for k in kinds)}")
    if not kinds:
        return pd.DataFrame()
    return _frame([r.as_dict() for r in records], kinds.pop())


def write_table(run_dir: Path, table: str, df: pd.DataFrame) -> None:
    """``<table>.csv`` and ``<table>.parquet``, each replaced atomically."""
    atomic_write_text(run_dir / f"{table}.csv", df.to_csv(index=False))
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(run_dir / f"{table}.parquet", buf.getvalue())


def latest_per_key(rows: list[dict[str, Any]], record: type[Record] | None) -> list[dict[str, Any]]:
    """The last row of each ``record.KEY`` in first-seen order (all rows when the record has no key): a point's
    final row replaces its provisional ones."""
    key = getattr(record, "KEY", None)
    if not key:
        return rows
    defaults = record.defaults() if record is not None else {}
    last: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        k = tuple(r.get(c, defaults.get(c)) for c in key)
        last.pop(k, None)  # re-inserted: a point's row keeps its place among the rows finished after it
        last[k] = r
    return list(last.values())


class _Tables(dict[str, list[dict[str, Any]]]):
    """Rows per table name; on --resume a table not touched yet reads its journal on first access."""

    def __init__(self, run_dir: Path, resume: bool) -> None:
        super().__init__()
        self._dir, self._resume = run_dir, resume

    def __missing__(self, table: str) -> list[dict[str, Any]]:
        rows = read_journal(self._dir / journal_name(table)) if self._resume else []
        rows = latest_per_key(rows, record_for_table(table))
        self[table] = rows
        return rows


def repair_journal(path: Path) -> bool:
    """Cut a torn last line (no final newline: a crash mid-write) off a journal, so the next append starts a
    line of its own instead of gluing a row onto the fragment. True when something was cut."""
    if not path.is_file():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    keep = data.rfind(b"\n") + 1
    try:
        whole = isinstance(json.loads(data[keep:]), dict)
    except ValueError:
        whole = False
    if whole:  # the crash fell between a complete row and its newline: keep the row
        with open(path, "ab") as f:
            f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())
        return False
    with open(path, "r+b") as f:
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    _warn(f"{path}: dropped its torn last line ({len(data) - keep} bytes written by a crash mid-write)")
    return True


def _journal_tables(run_dir: Path) -> list[str]:
    """Tables that have a journal in ``run_dir``."""
    names = {v: k for k, v in _JOURNALS.items()}
    return sorted(names.get(p.name, p.stem) for p in run_dir.glob("*.jsonl"))


class RunWriter:
    """Rank 0's writer for one run directory: any table of any :class:`Record` type."""

    def __init__(self, run_dir: Path, *, resume: bool = False) -> None:
        self.dir = run_dir
        if resume:
            load_metadata(run_dir)  # a clear one-line error for a missing, foreign or unreadable directory
        else:
            check_new_run_dir(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
        self.rows: dict[str, list[dict[str, Any]]] = _Tables(run_dir, resume)
        """Rows written so far per table, as dicts (journal rows of a resumed run included)."""
        self._types: dict[str, type[Record]] = {}
        self._written: dict[str, float] = {}  # table -> monotonic time of its last rewrite
        self._stale: set[str] = set()  # tables whose journal holds rows their CSV and parquet do not
        if resume:
            # The journal is the truth; the tables may lag it by the row in flight when the run stopped (or
            # hold a torn row's predecessor only): rewrite every table from its journal before adding to it.
            for table in _journal_tables(run_dir):
                repair_journal(run_dir / journal_name(table))
                if table in JOURNAL_ONLY:
                    continue
                rows = self.rows[table]
                if rows:
                    write_table(run_dir, table, _frame(rows, record_for_table(table)))

    def records(self, record: type[R]) -> list[R]:
        """Rows of ``record``'s table written so far, as records (a resumed run's journal rows included)."""
        return [record.from_row(r) for r in self.rows[record.TABLE]]

    def done_keys(self) -> set[tuple[Any, ...]]:
        """Keys of the finished points (a provisional row, ``partial``, is not finished: --resume completes it)."""
        # rows journaled before a key column existed take its default (e.g. group "world")
        defaults = CollectivePoint.defaults()
        return {
            tuple(r.get(k, defaults.get(k)) for k in POINT_KEY)
            for r in self.rows[CollectivePoint.TABLE]
            if r.get("partial") is not True
        }

    def journal(self, table: str) -> list[dict[str, Any]]:
        """Every row of ``table``'s journal as written (a journal-only table's too; nothing kept in memory)."""
        return read_journal(self.dir / journal_name(table))

    def append_journal(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append ``rows`` to ``table``'s journal and fsync, nothing else: for rows too large to rewrite as a
        table after every add (nested lists are written as JSON, NaN included)."""
        if rows:
            self._append(table, [json.dumps(dict(r), default=str) for r in rows])

    def _append(self, table: str, lines: Sequence[str]) -> None:
        with open(self.dir / journal_name(table), "a") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())

    def done_policies(self) -> set[str]:
        return {str(r["policy"]) for r in self.rows["training"]}

    def write_metadata(self, meta: dict[str, Any]) -> None:
        atomic_write_text(self.dir / "metadata.json", json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")

    def add(self, records: Sequence[Record]) -> None:
        """Journal ``records`` (append + fsync); their table's CSV and parquet follow (atomically, at most every
        :data:`TABLE_EVERY_S`, and at :meth:`flush`).

        The table is ``type(record).TABLE``; columns and dtypes come from the record type."""
        if not records:
            return
        kinds = {type(r) for r in records}
        if len(kinds) != 1:
            raise TypeError(f"one add() takes rows of one record type, got {sorted(k.__name__ for k in kinds)}")
        record = kinds.pop()
        self._types[record.TABLE] = record
        self.add_rows(record.TABLE, [r.as_dict() for r in records])

    def add_rows(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """As :meth:`add`, for rows given as mappings; typed by the record class registered for ``table``, if
        any (:func:`commbench.core.records.record_for_table`), else as pandas infers."""
        if not rows:
            return
        self._append(table, [json.dumps({k: _jsonable(v) for k, v in row.items()}, default=str) for row in rows])
        rtype = self._types.get(table) or record_for_table(table)
        self.rows[table] = latest_per_key([*self.rows[table], *(dict(r) for r in rows)], rtype)
        self._stale.add(table)
        if time.monotonic() - self._written.get(table, -math.inf) >= TABLE_EVERY_S:
            self._rewrite(table)

    def flush(self) -> None:
        """Rewrite every table whose journal is ahead of it (the end of a run, or its stop: idempotent)."""
        for table in sorted(self._stale):
            self._rewrite(table)

    def _rewrite(self, table: str) -> None:
        write_table(self.dir, table, _frame(self.rows[table], self._types.get(table) or record_for_table(table)))
        self._written[table] = time.monotonic()
        self._stale.discard(table)

    def write_crossover(self, rows: Sequence[Crossover | Mapping[str, Any]]) -> None:
        """``crossover.csv``, rewritten whole (it is derived from the results, not journaled)."""
        dicts = [r.as_dict() if isinstance(r, Record) else dict(r) for r in rows]
        atomic_write_text(self.dir / "crossover.csv", _frame(dicts, Crossover).to_csv(index=False))


def check_new_run_dir(run_dir: Path) -> None:
    """Refuse to write into an existing non-empty directory or an unwritable place (nothing is touched)."""
    if run_dir.exists():
        if not run_dir.is_dir():
            raise RunDirError(f"output path {run_dir} exists and is not a directory")
        # the launcher may have opened the rank logs already: a directory holding only them is still new
        if any(p.name != LOGS_DIR for p in run_dir.iterdir()):
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
    except (json.JSONDecodeError, OSError, UnicodeDecodeError) as e:
        raise RunDirError(f"cannot read {p / 'metadata.json'}: {e}") from None
    if not isinstance(meta, dict):
        raise RunDirError(f"{p / 'metadata.json'} is not a commbench metadata file (a JSON object expected, got {type(meta).__name__})")
    version = meta.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise RunDirError(
            f"{p} has results schema version {version!r}; this commbench reads versions up to {SCHEMA_VERSION}: upgrade commbench"
        )
    return dict(meta)


def load_table(run_dir: str | os.PathLike[str], record: type[Record] | str) -> pd.DataFrame:
    """One table of a run directory as a frame (empty if the run has none).

    ``record`` is the table's row type (its columns come first, in order, with its dtypes; extra columns
    follow) or a table name (typed by the record registered for it, if any). Reads the parquet file, else the
    CSV, else the journal, so schema-1 directories (no parquet for training tables) load too; the journal also
    when it was written after the table (a run stopped between two rewrites, :data:`TABLE_EVERY_S`)."""
    p = _require_run_dir(run_dir)
    load_metadata(p)
    table = record if isinstance(record, str) else record.TABLE
    rtype = record_for_table(record) if isinstance(record, str) else record
    journal = p / journal_name(table)
    tables = [t for t in (p / f"{table}.parquet", p / f"{table}.csv") if t.is_file()]
    if not tables or (journal.is_file() and journal.stat().st_mtime_ns >= tables[0].stat().st_mtime_ns):
        df = pd.DataFrame(latest_per_key(read_journal(journal), rtype))
    elif tables[0].suffix == ".parquet":
        df = pd.read_parquet(tables[0])
    else:
        df = pd.read_csv(tables[0])
    if rtype is None:
        return df
    if not len(df):
        return pd.DataFrame(columns=list(rtype.columns()))
    # The table's dtypes whatever the source, so CSV, parquet and journal load alike; a column the data
    # cannot take (an import's world size left unknown) keeps its own.
    return _cast(_ordered(df, rtype), rtype)


def load(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """The tidy collective results of a run directory (one row per point; empty frame if none)."""
    return load_table(run_dir, CollectivePoint)


def load_training(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Training summary (one row per policy); empty frame if the run had no training section."""
    df = load_table(run_dir, "training")
    if "warnings" in df.columns:  # an empty string reads back from CSV as NaN
        df["warnings"] = [w if isinstance(w, str) else "" for w in df["warnings"]]
    return df


def load_training_steps(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    return load_table(run_dir, "training_steps")


def load_crossover(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    p = _require_run_dir(run_dir)
    if not (p / "crossover.csv").is_file():
        return pd.DataFrame(columns=list(CROSSOVER_COLUMNS))
    df = pd.read_csv(p / "crossover.csv")
    # older runs lack later columns: fill their defaults, in the record's column order
    defaults = Crossover.defaults()
    for c in CROSSOVER_COLUMNS:
        if c not in df.columns:
            df[c] = defaults.get(c, math.nan)
    for c in ("crossover_bytes", "crossover_low_bytes"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("Int64")
    df["significant"] = df["significant"].map(lambda v: v is True or str(v) == "True")
    return df[list(CROSSOVER_COLUMNS)]


def crossover(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Per collective, payload and precision: the smallest fp32 size from which the precision is significantly
    faster than fp32 at that size and at every larger size measured, and where below it the crossover lies.

    A size counts as a win only when its paired speed-up interval (``gain_ci_low``) lies above 1, as a loss only
    when it lies below 1. The crossover lies between the largest loss below the first size of the final stretch of
    wins and that size; it is *significant* (located to one step of the sweep) when that loss is the size just below, or
    the win starts at the smallest size. Near the crossover the two precisions are about equally fast, so the size
    at which the first significant win appears moves between identical runs; a located crossover does not. Runs
    written before intervals existed (no ``gain_vs_fp32``) fall back to comparing effective bandwidth, without
    significance.
    """
    out: list[dict[str, Any]] = []
    if df.empty:
        return out
    has_ci = "gain_ci_low" in df.columns and df["gain_ci_low"].notna().any()
    if "group" not in df.columns:
        df = df.assign(group="world")
    df = df.assign(group=df["group"].fillna("world"))
    for (coll, payload, group), g in df.groupby(["collective", "payload", "group"], sort=False):
        base = g[g["precision"] == "fp32"].set_index("fp32_bytes")["effective_gbps"]
        if base.empty:
            continue
        for prec, gp in g[g["precision"] != "fp32"].groupby("precision", sort=False):
            gp = gp.set_index("fp32_bytes").sort_index()
            sizes = [s for s in gp.index if s in base.index]
            if not sizes:
                continue
            if has_ci:
                wins = [bool(gp.at[s, "gain_ci_low"] > 1.0) for s in sizes]
                losses = [bool(gp.at[s, "gain_ci_high"] < 1.0) for s in sizes]
                last = gp.loc[sizes[-1]]
                gain = (float(last["gain_vs_fp32"]), float(last["gain_ci_low"]), float(last["gain_ci_high"]))
            else:
                wins = [bool(gp.at[s, "effective_gbps"] > base[s]) for s in sizes]
                losses = [False] * len(sizes)  # without intervals nothing is significant
                ratio = float(gp.at[sizes[-1], "effective_gbps"] / base[sizes[-1]])
                gain = (ratio, math.nan, math.nan)
            first = next((i for i in range(len(sizes)) if all(wins[i:])), None)
            cross = low = None
            located = False
            if first is not None:
                cross = int(sizes[first])
                below = [i for i in range(first) if losses[i]]
                low = int(sizes[below[-1]]) if below else None
                located = has_ci and (first == 0 or bool(below and below[-1] == first - 1))
            note = "" if cross is not None else ("never in range" if losses[-1] or not has_ci else "not significant")
            out.append(
                Crossover(
                    collective=coll, payload=payload, group=group, precision=prec, crossover_bytes=cross, note=note,
                    crossover_low_bytes=low, significant=located, gain_at_largest=gain[0],
                    gain_at_largest_ci_low=gain[1], gain_at_largest_ci_high=gain[2],
                ).as_dict()
            )  # fmt: skip
    return out
