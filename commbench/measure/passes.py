"""What a group of points carries from pass to pass, and its journal form.

The sweep spreads each group's rounds over ``timing.passes`` visits of the grid (:mod:`commbench.measure.sweep`).
After every pass, rank 0 journals what that pass added (:func:`pass_entry`: the new rounds of every contender, with
the group's checks and calibrated k), so an interrupted run keeps every pass it completed, and ``--resume`` rebuilds
the state from the journal (:func:`restore`) and measures only the passes still missing. An entry holds the
pass's own rounds only, so the journal grows with the samples, not with their square.

Also here: the compact console line each pass prints per group, with every point's current estimate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from commbench.core import stats
from commbench.measure.check import Check
from commbench.measure.timing import Rounds

__all__ = ["PARTIAL_STATE", "GroupState", "group_key", "pass_entry", "pass_line", "restore"]

PARTIAL_STATE = "commbench_partial_state"
"""Attribute of an exception that stopped a pass after some rounds were exchanged: the group's :class:`GroupState`
with them (its ``passes`` not counting the stopped pass), for the journal (``complete`` false)."""

KEY_FIELDS = ("collective", "group", "fp32_bytes", "payload")
"""What names a group in the journal (its precisions are listed in each entry)."""


@dataclass(slots=True)
class GroupState:
    """What one group carries from pass to pass: its checks (payload dropped) and every round so far."""

    checks: list[Check]
    rounds: Rounds
    wire_bytes: list[int]
    has_codec: list[bool]
    live: list[int]
    """Positions in ``group.points`` that run (one contender each, in order): the others were skipped on every
    rank (their precision raised :class:`~commbench.measure.precision.Unsupported`)."""
    passes: int = 0
    """Passes whose rounds ``rounds`` holds."""


def group_key(collective: str, kind: str, fp32_bytes: int, payload: str) -> tuple[Any, ...]:
    return (collective, kind, int(fp32_bytes), payload)


def pass_entry(
    key: tuple[Any, ...], names: Sequence[str], state: GroupState, prior: Rounds | None, pass_index: int, passes: int,
    *, complete: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """The journal row of pass ``pass_index`` of the group ``key``: the rounds ``state`` holds beyond ``prior``
    (the state before this pass), the contenders' names, k, checks, wire bytes; ``complete`` false for a pass a
    stop cut short (its exchanged rounds count, and --resume runs the rest of that pass)."""
    r = state.rounds
    first = prior.rounds if prior is not None else 0
    return {
        **dict(zip(KEY_FIELDS, key, strict=True)),
        "pass": pass_index,
        "complete": complete,
        "passes": passes,
        "precisions": list(names),
        "iters": [list(c) for c in r.iters],
        "rounds": r.rounds - first,
        "samples": [[[list(rank[first:]) for rank in phase] for phase in c] for c in r.samples],
        "waits": [list(w[first:]) for w in r.waits],
        "elapsed_s": r.elapsed_s - (prior.elapsed_s if prior is not None else 0.0),
        "converged": r.converged,
        "across_ranks": r.across_ranks,
        "checks": [asdict(c) for c in state.checks],
        "wire_bytes": list(state.wire_bytes),
        "has_codec": list(state.has_codec),
    }


def _key_of(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return group_key(str(row["collective"]), str(row["group"]), int(row["fp32_bytes"]), str(row["payload"]))


def restore(rows: Sequence[Mapping[str, Any]], precisions_of: Mapping[tuple[Any, ...], Sequence[str]]) -> dict[tuple[Any, ...], GroupState]:
    """The state of every journaled group of ``precisions_of`` (group key -> the names of ``group.points``, in
    order) after its journaled passes, which must run 0, 1, ... in order; a group whose entries do not fit (other
    precisions, a gap in the passes, other phases) is left out, so its passes are measured again."""
    by_key: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        key = _key_of(row)
        if key in precisions_of:
            by_key.setdefault(key, []).append(row)
    out: dict[tuple[Any, ...], GroupState] = {}
    for key, entries in by_key.items():
        state = _replay(entries, list(precisions_of[key]))
        if state is not None:
            out[key] = state
    return out


def _replay(entries: Sequence[Mapping[str, Any]], names: list[str]) -> GroupState | None:
    state: GroupState | None = None
    for e in sorted(entries, key=lambda e: int(e["pass"])):
        expect = state.passes if state is not None else 0
        if int(e["pass"]) < expect:  # a pass journaled twice (a run resumed before its journal was read): the first
            continue  # (a pass cut short leaves ``expect`` at its own index: the rest of it follows)
        if int(e["pass"]) > expect:  # a gap: the passes after it are measured again
            break
        precs = [str(p) for p in e["precisions"]]
        if not set(precs) <= set(names) or (state is not None and precs != [names[c] for c in state.live]):
            return None
        iters = tuple(tuple(int(k) for k in c) for c in e["iters"])
        samples = e["samples"]
        waits = e["waits"]
        if state is None:
            acc = [[[list(map(float, rank)) for rank in phase] for phase in c] for c in samples]
            all_waits = [list(map(float, w)) for w in waits]
            rounds, elapsed = int(e["rounds"]), float(e["elapsed_s"])
        else:
            prev = state.rounds
            if prev.iters != iters or len(prev.waits) != len(waits):
                return None
            acc = [[[[*old, *map(float, new)] for old, new in zip(po, pn, strict=True)]
                    for po, pn in zip(co, cn, strict=True)] for co, cn in zip(prev.samples, samples, strict=True)]  # fmt: skip
            all_waits = [[*old, *map(float, new)] for old, new in zip(prev.waits, waits, strict=True)]
            rounds, elapsed = prev.rounds + int(e["rounds"]), prev.elapsed_s + float(e["elapsed_s"])
        r = Rounds(
            iters=iters, samples=tuple(tuple(tuple(tuple(x) for x in phase) for phase in c) for c in acc),
            waits=tuple(tuple(w) for w in all_waits), rounds=rounds, converged=bool(e["converged"]),
            elapsed_s=elapsed, across_ranks=str(e["across_ranks"]),
        )  # fmt: skip
        state = GroupState(
            checks=[Check(**c) for c in e["checks"]], rounds=r, wire_bytes=[int(b) for b in e["wire_bytes"]],
            has_codec=[bool(h) for h in e["has_codec"]], live=[names.index(p) for p in precs],
            passes=int(e["pass"]) + (1 if e.get("complete", True) else 0),
        )  # fmt: skip
    return state


def pass_line(where: str, pass_index: int, passes: int, points: Sequence[Mapping[str, Any]]) -> str:
    """``pass 1/3 all_reduce 4K [world]: fp32 41.2 us ±3%, bf16 30.1 us ±5% (1.37x)``: every point of a group
    after one pass: its time per op with the half-width of its interval and, against fp32, its gain."""
    parts = []
    for p in points:
        t = float(p["time_us"])
        e = stats.Estimate(t, float(p["time_ci_low_us"]), float(p["time_ci_high_us"]), 0)
        hw = e.rel_half_width
        ci = f" ±{hw:.0%}" if math.isfinite(hw) else ""
        gain = float(p.get("gain_vs_fp32", math.nan))
        g = f" ({gain:.2f}x)" if math.isfinite(gain) and p["precision"] != "fp32" else ""
        parts.append(f"{p['precision']} {t:.4g} us{ci}{g}")
    return f"pass {pass_index + 1}/{passes} {where}: " + ", ".join(parts)
