"""Sizes in nccl-tests' syntax and small human-readable forms of numbers.

Sizes use nccl-tests syntax: an integer number of bytes with an optional binary suffix K, M or G
(1K = 1024 bytes). The sweep grid is over the *fp32 size of the user's tensor* (``fp32_bytes``): every
precision at one grid point moves the same number of elements, so precisions compare on the same tensor;
the reported ``size_bytes`` is what crossed the wire.
"""

from __future__ import annotations

import math
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
