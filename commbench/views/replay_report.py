"""``replay.md``: the report of a ``commbench replay`` folder, read from its files only (``replay.csv``,
``replay_steps.csv``, ``replay.json``): the findings first (what each precision would save on the step, whether
that is significant, at what error), then the exposure, the step table, the per-call table and what was not read
or not replayed."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from commbench.views.render import md_table
from commbench.views.tables import Table, fmt

STEP_TABLE = ("precision", "step_comm_us", "step_comm_ci_low_us", "step_comm_ci_high_us", "speedup", "speedup_ci_low",
              "speedup_ci_high", "speedup_significant", "bytes_per_step", "rel_err_max", "projected_step_us")  # fmt: skip
ROW_TABLE = ("collective", "size_bytes", "dtype", "group", "precision", "calls_per_step", "time_us", "time_ci_low_us",
             "time_ci_high_us", "wire_bytes", "speedup", "speedup_significant", "rel_err")  # fmt: skip


def _rows(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def findings(steps: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """One sentence per precision against the trace's own dtype; significance as the interval says (pyperf's
    rule: a ratio whose interval holds 1 is no significant difference)."""
    base = next((s for s in steps if s["precision"] == "trace"), None)
    out = []
    for s in steps:
        if s is base or base is None:
            continue
        g, lo, hi = _num(s["speedup"]), _num(s["speedup_ci_low"]), _num(s["speedup_ci_high"])
        err = _num(s["rel_err_max"])
        saved = 1 - _num(s["bytes_per_step"]) / max(_num(base["bytes_per_step"]), 1)
        if str(s["speedup_significant"]) == "True":
            verdict = f"makes the step's communication {g:.2f}x as fast [{lo:.2f}, {hi:.2f}]"
        else:
            verdict = f"makes no significant difference to the step's communication ({g:.2f}x [{lo:.2f}, {hi:.2f}])"
        text = (
            f"**{s['precision']}** {verdict}, moving {100 * saved:.0f} % fewer bytes, at a relative error of {err:.2g}"
        )
        proj = _num(s.get("projected_step_us"))
        if math.isfinite(proj):
            text += (
                f"; with its exposed communication that much faster, the trace's step would take {proj:.0f} us "
                f"[{_num(s['projected_step_ci_low_us']):.0f}, {_num(s['projected_step_ci_high_us']):.0f}] instead of "
                f"{_num(s['trace_step_us']):.0f} us"
            )
        out.append(text + ".")
    if meta.get("exposure"):
        out.append(str(meta["exposure"]))
    return out


def write_replay_report(folder: Path) -> Path:
    """Write ``folder/replay.md`` and return its path."""
    steps, rows = _rows(folder / "replay_steps.csv"), _rows(folder / "replay.csv")
    meta = json.loads((folder / "replay.json").read_text())
    lines = [f"# Replay of {meta['trace']} (step {meta['step']})", "", "### Findings", ""]
    lines += [f"- {f}" for f in findings(steps, meta)] or ["- nothing replayed"]
    lines += ["", f"Replayed on {meta['world_size']} ranks ({meta['backend']}); the trace: rank {meta['trace_rank']} of "
              f"{meta['trace_world_size']} ({meta['trace_backend']}). Times are this cluster's, per step, with 95 % intervals.", ""]  # fmt: skip
    for key, title, cols, data in (
        ("steps", "The step per precision", STEP_TABLE, steps),
        ("calls", "Per call size", ROW_TABLE, rows),
    ):
        t = Table(
            key,
            title,
            list(cols),
            [
                [
                    fmt(
                        _num(r[c])
                        if c not in ("precision", "collective", "dtype", "group", "speedup_significant")
                        else r[c]
                    )
                    for c in cols
                ]
                for r in data
            ],
        )
        lines += [md_table(t)]
    lines += ["### Not read, not replayed", ""]
    for label, key in (
        ("not replayed", "not_replayed"),
        ("unread events", "unread"),
        ("not calls", "skipped"),
        ("notes", "notes"),
    ):
        items = meta.get(key) or {}
        for what, n in items.items() if isinstance(items, dict) else ((x, "") for x in items):
            lines.append(f"- {label}: {f'{n} x ' if n != '' else ''}{what}")
    path = folder / "replay.md"
    path.write_text("\n".join(lines) + "\n")
    return path
