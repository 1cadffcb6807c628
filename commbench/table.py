"""nccl-tests' table layout for rows as they finish, with commbench's extra columns to the right of #wrong
(so the left part pastes next to nccl-tests output)."""

from __future__ import annotations

import math
from typing import Any

HEADER = (
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "   enc_us   dec_us  eff_GB/s   rel_err"
)
UNITS = (
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       "
    "     (us)     (us)    (GB/s)          "
)


def block_title(row: dict[str, Any], redop: str) -> str:
    return (
        f"# {row['collective']}  precision {row['precision']} ({row['impl']})  backend {row['backend']}  "
        f"{row['world_size']} ranks on {row['nodes']} node(s)  payload {row['payload']}"
    )


def _f(v: float, width: int, prec: int) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return f"{'n/a':>{width}}"
    return f"{v:>{width}.{prec}f}"


def format_row(row: dict[str, Any], redop: str) -> str:
    t = row["time_us"]
    time_s = f"{t:>8.1f}" if t < 1e5 else f"{t:>8.0f}"
    rel = row["rel_err"]
    rel_s = f"{rel:>10.2e}" if math.isfinite(rel) else f"{'inf':>10}"
    return (
        f"{row['size_bytes']:>12d}  {row['count']:>12d}  {row['dtype']:>8}  {redop:>6}  {-1:>6}"
        f" {time_s} {_f(row['algbw_gbps'], 7, 2)} {_f(row['busbw_gbps'], 7, 2)} {row['wrong']:>6d}"
        f" {_f(row['encode_us'], 8, 1)} {_f(row['decode_us'], 8, 1)} {_f(row['effective_gbps'], 9, 3)} {rel_s}"
    )
