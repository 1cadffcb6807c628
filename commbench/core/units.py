"""Sizes in nccl-tests' syntax and small human-readable forms of numbers.

Sizes use nccl-tests syntax: an integer number of bytes with an optional binary suffix K, M or G
(1K = 1024 bytes). The sweep grid is over the *fp32 size of the user's tensor* (``fp32_bytes``): every
precision at one grid point moves the same number of elements, so precisions compare on the same tensor;
the reported ``size_bytes`` is what crossed the wire.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# nccl-tests' K/M/G are 1024-based; KB and KiB are accepted as other spellings of the same unit (never 1000),
# so `-b 1MB` means what a nccl-tests user means by `-b 1M`.
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(?:([KMG])(?:i?B)?|B)?\s*$", re.IGNORECASE)
SIZE_HELP = "bytes, or K/KB/KiB, M/MB/MiB, G/GB/GiB: all 1024-based like nccl-tests' K/M/G (1M = 1MB = 1MiB = 1048576)"
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text: str | int) -> int:
    """Parse ``8``, ``8B``, ``64K``, ``1MB``, ``4GiB`` into bytes (> 0): every unit is 1024-based, as nccl-tests."""
    if isinstance(text, bool):
        raise ValueError(f"malformed size {text!r}: expected bytes like 8, 64K, 1M, 4G")
    if isinstance(text, int):
        if text <= 0:
            raise ValueError(f"size must be positive, got {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"malformed size {text!r}: expected {SIZE_HELP}, e.g. 8, 64K, 1MB, 4GiB")
    value = int(m.group(1)) * _UNITS[(m.group(2) or "").upper()]
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return value


def format_size(nbytes: int) -> str:
    """Inverse of :func:`parse_size` for exact multiples, else plain bytes (``1536`` -> ``1536``)."""
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)


def size_grid(min_bytes: int, max_bytes: int, factor: int = 2, step: int = 0) -> list[int]:
    """nccl-tests' grid: multiply by ``factor`` (``-f``) or, when ``step`` > 0, add ``step`` (``-i``)."""
    if min_bytes > max_bytes:
        raise ValueError(f"minimum size {format_size(min_bytes)} is larger than maximum size {format_size(max_bytes)}")
    if step <= 0 and factor < 2:
        raise ValueError(f"size factor must be an integer >= 2, got {factor}")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s = s + step if step > 0 else s * factor
    return sizes



def int_ranges(xs: Iterable[int], sep: str = ",") -> str:
    """Runs of consecutive integers: ``0-3,8`` for {0, 1, 2, 3, 8} (the cpulist form of taskset and /sys)."""
    runs: list[list[int]] = []
    for x in sorted(xs):
        if runs and runs[-1][1] == x - 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return sep.join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
