"""Typed records: one dataclass per table, the single source of its columns, dtypes and documentation.

A table's row type subclasses :class:`Record` and declares each column with :func:`col`, whose docstring
becomes the column's documentation. Column order, pandas dtypes and the parquet schema derive from the
fields, so adding a column is one line here (plus whatever fills it):

    @dataclass(kw_only=True, slots=True)
    class MyRow(Record):
        TABLE: ClassVar[str] = "my_table"
        latency_us: float = col("per-op latency, microseconds")

Records are written by ``results.RunWriter`` and read back by ``results.load_table``; views only see the
DataFrames. This module imports neither torch nor pandas at import time.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import MISSING, dataclass
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin

R = TypeVar("R", bound="Record")

_PANDAS_DTYPES: dict[Any, str] = {int: "Int64", float: "float64", str: "string", bool: "boolean"}


def col(doc: str, default: Any = MISSING) -> Any:
    """A column: ``doc`` is its one-line documentation (with the unit when the name does not carry it)."""
    if default is MISSING:
        return dataclasses.field(metadata={"doc": doc})
    return dataclasses.field(default=default, metadata={"doc": doc})


def _base_type(tp: Any) -> Any:
    """``int`` for ``int``, ``int | None`` and ``Optional[int]``."""
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else object
    return tp


@dataclass(kw_only=True, slots=True)
class Record:
    """Base of every table row. Subclasses set ``TABLE`` and declare columns with :func:`col`."""

    TABLE: ClassVar[str] = ""
    """The table's name in a run directory (``<TABLE>.csv``, ``<TABLE>.parquet``, ``<TABLE>.jsonl``)."""

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """Column order of the table."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def column_types(cls) -> dict[str, Any]:
        """Python type of each column (``int``, ``float``, ``str``, ``bool``)."""
        hints = typing.get_type_hints(cls)
        return {f.name: _base_type(hints[f.name]) for f in dataclasses.fields(cls)}

    @classmethod
    def dtypes(cls) -> dict[str, str]:
        """pandas dtype of each column (nullable integer and string dtypes, so a missing value stays missing)."""
        return {k: _PANDAS_DTYPES.get(t, "object") for k, t in cls.column_types().items()}

    @classmethod
    def docs(cls) -> dict[str, str]:
        """One line of documentation per column."""
        return {f.name: str(f.metadata.get("doc", "")) for f in dataclasses.fields(cls)}

    @classmethod
    def from_row(cls: type[R], row: dict[str, Any]) -> R:
        """Build a record from a mapping (extra keys are ignored, missing columns take their defaults)."""
        names = set(cls.columns())
        return cls(**{k: v for k, v in row.items() if k in names})

    def as_dict(self) -> dict[str, Any]:
        """The row as a plain dict in column order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def frame_dtypes(record: type[Record], present: list[str]) -> dict[str, str]:
    """dtypes to apply to the columns of ``record`` that are ``present`` in a frame."""
    dt = record.dtypes()
    return {c: dt[c] for c in present if c in dt}


def is_missing(v: Any) -> bool:
    """True for ``None`` and NaN (how a missing value reads back from CSV or parquet)."""
    return v is None or (isinstance(v, float) and math.isnan(v))
