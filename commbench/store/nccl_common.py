"""What nccl-tests and rccl-tests print, as data: their collectives, data types and the parsed form of a log.

The three readers (``nccl_text`` for the tables the ``*_perf`` binaries print, ``nccl_json`` for nccl-tests' ``-J``
JSON and rccl-tests' ``-Z json|csv -x FILE`` files) produce :class:`ParsedLog`; ``nccl_import`` turns it into run
directories. The definitions here are the tools' own (nccl-tests ``src/*.cu``: ``*GetCollByteCount`` and
``*GetBw``; rccl-tests ``src/common.cu``: ``test_typenames``); the collectives' size/count relation and bus factors
live in :mod:`commbench.core.nccl_tests`, shared with commbench's own collectives, and are re-exported here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from commbench.core.nccl_tests import NCCL_COLLECTIVES, NcclTestsCollective, collective_for

__all__ = [
    "NCCL_COLLECTIVES",
    "NCCL_TYPES",
    "Block",
    "Device",
    "NcclTestsCollective",
    "ParsedLog",
    "collective_for",
    "nccl_version_string",
    "number",
    "resolution",
]


# type name as the tools print it -> (commbench precision name, bytes per element). nccl-tests writes fp8 as
# f8e4m3/f8e5m2, rccl-tests as fp8_e4m3/fp8_e5m2 (its test_typenames).
NCCL_TYPES: dict[str, tuple[str, int]] = {
    "float": ("fp32", 4),
    "half": ("fp16", 2),
    "bfloat16": ("bf16", 2),
    "double": ("fp64", 8),
    "f8e4m3": ("fp8_e4m3", 1),
    "f8e5m2": ("fp8_e5m2", 1),
    "fp8_e4m3": ("fp8_e4m3", 1),
    "fp8_e5m2": ("fp8_e5m2", 1),
    # integer types: the same name in both, the width in the name
    **{f"{sign}int{bits}": (f"{sign}int{bits}", bits // 8) for bits in (8, 32, 64) for sign in ("", "u")},
}


@dataclass(slots=True)
class Device:
    """One ``#  Rank  r Group g Pid p on host device d [bus] name`` line (or a JSON ``devices`` entry)."""

    rank: int
    host: str
    device: int
    info: str
    pid: int | None = None
    line: int | None = None


@dataclass(slots=True)
class Block:
    """One result table of a text log, one ``-J`` JSON document or one rccl-tests output file."""

    index: int
    tool: str = "nccl-tests"
    """nccl-tests or rccl-tests (rccl-tests prints ``rccl-tests: Version ...``)."""
    line: int | None = None
    """Line of the table's column header (None for JSON and CSV)."""
    binary: str | None = None
    """Binary stem named before the table (``all_reduce`` of ``all_reduce_perf``)."""
    devices: dict[int, Device] = field(default_factory=dict)
    settings: dict[str, int] = field(default_factory=dict)
    """The ``# nThread 1 nGpus 8 ...`` line (or the JSON config): nThread, nGpus, iters, warmup_iters, ..."""
    nccl_version: str | None = None
    tests_version: str | None = None
    time_source: str = "gpu"
    """gpu: the time from the stream's completion (nccl-tests' default); cpu: ``-C 1``, the host time to launch
    the ops, taken before they complete."""
    processes: int | None = None
    """JSON: the ``devices`` entries, one per process (the first rank of each)."""
    ranks: int | None = None
    """Ranks the file states outright (rccl-tests' gpus, or ranks x gpusPerRank)."""
    start_time: str | None = None
    end_time: str | None = None
    args: list[str] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    iterations: list[dict[str, Any]] = field(default_factory=list)
    """Per-iteration times (JSON ``times_us`` and ``per_process_max_times_us``), long format."""


@dataclass(slots=True)
class ParsedLog:
    """What a reader found: the blocks in file order and every line it could not read."""

    format: str
    """text, json (nccl-tests -J), rccl-json or rccl-csv."""
    blocks: list[Block]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    """``{"line": n, "reason": why}`` per data line that looked like a row and could not be read."""


def nccl_version_string(code: int) -> str:
    """NCCL_VERSION_CODE -> 'major.minor.patch' (codes >= 10000 since NCCL 2.9: X*10000+Y*100+Z)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


_NA = ("N/A", "NA", "NAN", "-")


def number(tok: str, where: str) -> float:
    """A printed number; N/A (no data check) and nan as NaN."""
    if tok.upper() in _NA:
        return math.nan
    try:
        return float(tok)
    except ValueError:
        raise ValueError(f"{where}: expected a number, got {tok!r}") from None


_DECIMALS = re.compile(r"^-?\d*\.(\d+)$")
_SCIENTIFIC = re.compile(r"^-?\d+(?:\.(\d*))?[eE]([-+]?\d+)$")


def resolution(tok: str) -> float:
    """Half a unit of the last printed digit: how far the printed number may be from the one computed
    (nccl-tests prints bandwidths with 2 decimals, fewer when they do not fit its 6 columns)."""
    m = _SCIENTIFIC.match(tok)
    if m:  # getFloatStr's last resort, %.1e: a unit of the mantissa's last digit times the power of ten
        return 0.5 * 10.0 ** (int(m.group(2)) - len(m.group(1) or ""))
    m = _DECIMALS.match(tok)
    if m:
        return 0.5 * 10.0 ** -len(m.group(1))
    if re.fullmatch(r"-?\d+", tok):
        return 0.5
    return 0.0 if math.isfinite(number(tok, "")) else math.inf
