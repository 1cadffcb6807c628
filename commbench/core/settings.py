"""Config fields declared with their default, one-line doc and rule.

Every config table (the suite's ``[timing]``, the ``[training]`` table, a plugin's own) checks its values in one
place (:func:`check_settings`) and words a bad one the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import field, fields
from typing import Any


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def setting(
    default: Any,
    doc: str,
    *,
    accepts: Callable[[Any], bool] | None = None,
    expect: str = "",
    convert: Callable[[Any], Any] | None = None,
) -> Any:
    """A config field: ``doc`` says what it is; a value ``accepts`` rejects is reported with ``expect``, the rule
    in words; an accepted value other than None is stored as ``convert(value)``. Without ``accepts`` the owning
    class checks the value itself."""
    return field(default=default, metadata={"doc": doc, "accepts": accepts, "expect": expect, "convert": convert})


def count(default: int, doc: str, *, least: int = 1) -> Any:
    """An integer setting ``>= least``."""
    return setting(default, doc, accepts=lambda v: _is_int(v) and v >= least, expect=f"int >= {least}")


def positive(default: float | None, doc: str, *, below: float | None = None) -> Any:
    """A finite float setting ``> 0`` (and ``< below``); an int is taken as that float. A None default means the
    setting is optional: None stays valid."""
    return setting(
        default,
        doc,
        accepts=lambda v: (v is None and default is None) or (_is_number(v) and v > 0 and (below is None or v < below)),
        expect="float > 0" if below is None else f"float in (0, {below:g})",
        convert=float,
    )


def flag(default: bool, doc: str) -> Any:
    """A boolean setting (TOML true or false)."""
    return setting(default, doc, accepts=lambda v: isinstance(v, bool), expect="true or false")


def check_settings(config: Any, table: str) -> None:
    """Check every field of ``config`` declared with a rule; a bad value raises one ``ValueError`` line naming
    ``table.field``, the value, what the field is and the rule. A float setting given as an int becomes a float."""
    for f in fields(config):
        accepts = f.metadata.get("accepts")
        if accepts is None:
            continue
        v = getattr(config, f.name)
        if not accepts(v):
            expected = f"{f.metadata['doc']} ({f.metadata['expect']})"
            raise ValueError(f"{table}.{f.name}={v!r} is not valid; expected {expected}")
        if f.metadata["convert"] is not None and v is not None:
            setattr(config, f.name, f.metadata["convert"](v))

