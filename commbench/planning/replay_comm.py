"""A replay result (``commbench replay``'s ``replay.csv``) as the planned layout's communication: the job's own calls,
priced from their measured times at the layout they were measured on and scaled by the ring formula to another one.

At the measured layout each call costs its measured ``time_us`` (and interval) times ``calls_per_step``: source
``replay``. At another layout a call whose group grows (the DP group when ``--dp`` grows) is priced by
``alpha * A(n) + S * beta * B(n)`` (:mod:`commbench.planning.algorithms`' ring: nccl-tests' bus factors) with
``(alpha, beta)`` fitted per (collective, precision, measured group size) to the replay's own rows: source
``replay-fit``; a call measured at one size only has no latency to fit, so its latency per step is the NCCL ring's
(:mod:`commbench.planning.ring`) and its bandwidth the rest of its measured time: source ``replay-fit+preset``.
The measured layout is the plan's TP, PP and CP with DP the replay's world over them; a group is mapped to the
layout's dimension of its size. Sizes and calls per step are kept (a DP collective's nccl-tests size is the whole
bucket or unit, the same at any DP); not modelled: a group newly crossing nodes, calls per step that change with
micro-batches per rank. A scaled price carries its row's measured relative interval, not the formula's error.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from commbench.planning.algorithms import ALGORITHMS
from commbench.planning.ring import RING_STEP_INTRA_S

PLAN_PRECISIONS = {"fp32": "fp32", "bf16": "bf16", "fp8": "fp8_e4m3"}
"""A plan precision -> the replay's precision that measured it."""
NEEDED = ("collective", "size_bytes", "group_size", "precision", "calls_per_step", "time_us", "time_ci_low_us",
          "time_ci_high_us")  # fmt: skip
COLUMNS = ("precision", "collective", "size_bytes", "dtype", "dim", "measured_group_size", "group_size",
           "calls_per_step", "time_us", "time_ci_low_us", "time_ci_high_us", "step_us", "step_ci_low_us",
           "step_ci_high_us", "source")  # fmt: skip
"""``plan_replay.csv``: one row per (plan precision, call size); ``step_us`` is ``calls_per_step * time_us``."""


class ReplayError(ValueError):
    """A replay folder the plan cannot use; the message is one line naming the problem and the choices."""


@dataclass(frozen=True, slots=True)
class Row:
    collective: str
    size_bytes: int
    dtype: str
    group_size: int
    precision: str
    calls_per_step: int
    time_us: float
    low_us: float
    high_us: float


@dataclass(frozen=True, slots=True)
class Replay:
    path: Path
    world_size: int
    rows: tuple[Row, ...]


def load_replay(path: Path) -> Replay:
    """``replay.csv`` (and the world size from ``replay.json``) of a ``commbench replay`` folder."""
    if not path.is_dir():
        raise ReplayError(f"--replay {path}: no such directory (give the folder `commbench replay` wrote, --out)")
    f = path / "replay.csv"
    if not f.is_file():
        raise ReplayError(f"--replay {path}: no replay.csv in it (a `commbench replay` folder has replay.csv, "
                          "replay_steps.csv and replay.json)")  # fmt: skip
    with open(f, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in NEEDED if c not in (reader.fieldnames or ())]
        if missing:
            raise ReplayError(f"--replay {f}: no column {', '.join(missing)} (not a `commbench replay` replay.csv)")
        try:
            rows = tuple(
                Row(r["collective"], int(r["size_bytes"]), r.get("dtype", ""), int(r["group_size"]), r["precision"],
                    int(r["calls_per_step"]), float(r["time_us"]), float(r["time_ci_low_us"]),
                    float(r["time_ci_high_us"]))
                for r in reader
            )  # fmt: skip
        except ValueError as e:
            raise ReplayError(f"--replay {f}: unreadable row ({e})") from None
    rows = tuple(r for r in rows if math.isfinite(r.time_us))
    if not rows:
        raise ReplayError(f"--replay {f}: no measured call (every row is empty or NaN); rerun `commbench replay`")
    meta = path / "replay.json"
    world = max(r.group_size for r in rows)
    if meta.is_file():
        world = int(json.loads(meta.read_text()).get("world_size") or world)
    return Replay(path, world, rows)


def measured_dims(world: int, tp: int, pp: int, cp: int) -> int:
    """The replay's DP degree with the plan's TP, PP and CP; a world they do not divide cannot be mapped."""
    other = tp * pp * cp
    if world % other:
        ok = [d for d in range(1, world + 1) if world % d == 0]
        raise ReplayError(f"--replay: its world of {world} ranks cannot be laid out as tp*pp*cp = {other} x dp; "
                          f"valid tp*pp*cp for it: {', '.join(map(str, ok))}")  # fmt: skip
    return world // other


def map_group(n: int, world: int, dims: dict[str, int], target: dict[str, int]) -> tuple[str, int]:
    """(dimension, group size at the target layout) of a measured group of ``n`` ranks."""
    names = [k for k, v in dims.items() if v == n]
    if n == dims["dp"] * dims["cp"] and dims["cp"] > 1:
        names.append("dp_cp")
    if not names and n == world:
        return "world", math.prod(target.values())
    if not names and n == 2:
        return "pp_p2p", 2  # a stage-boundary send: two ranks at any layout
    grows = {k for k in names if (target["dp"] * target["cp"] if k == "dp_cp" else target[k]) != n}
    if not names or (grows and len(names) > 1):
        choices = ", ".join(f"{k}={v}" for k, v in dims.items())
        why = "matches no dimension" if not names else f"is ambiguous ({' or '.join(names)})"
        raise ReplayError(f"--replay: a group of {n} ranks {why} of the measured layout ({choices}, world {world}); "
                          "give the plan's --tp/--pp/--cp of the replayed job")  # fmt: skip
    k = names[0]
    return k, target["dp"] * target["cp"] if k == "dp_cp" else target[k]


@dataclass(frozen=True, slots=True)
class Fit:
    alpha_s: float
    beta_s_per_byte: float
    preset_alpha: bool


def fit(rows: Sequence[Row], collective: str, n: int) -> Fit:
    """``time = alpha*A(n) + S*beta*B(n)`` over rows of one collective, precision and group size, weighted by the
    inverse variance of each row's interval; alpha and beta kept non-negative."""
    alg = ALGORITHMS["ring"]
    a, b = alg.latency_steps(collective, n), alg.bandwidth_factor(collective, n)
    xs = [float(r.size_bytes) for r in rows]
    ys = [r.time_us * 1e-6 for r in rows]
    sd = [(r.high_us - r.low_us) * 0.5e-6 / 1.96 for r in rows]  # a 95 % interval's half-width in standard errors
    ws = [1.0 / max(s * s, (1e-3 * y) ** 2, 1e-18) for s, y in zip(sd, ys, strict=True)]
    if len(set(xs)) < 2:
        alpha = min(RING_STEP_INTRA_S, ys[0] / max(a, 1.0))
        return Fit(alpha, max(ys[0] - alpha * a, 0.0) / (xs[0] * b), True)
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs, strict=True)) / sw
    my = sum(w * y for w, y in zip(ws, ys, strict=True)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True))
    slope = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys, strict=True)) / sxx
    icpt = my - slope * mx
    if slope < 0:
        slope, icpt = 0.0, my
    elif icpt < 0:
        sxy0 = sum(w * x * y for w, x, y in zip(ws, xs, ys, strict=True))
        slope, icpt = sxy0 / sum(w * x * x for w, x in zip(ws, xs, strict=True)), 0.0
    return Fit(icpt / a if a else 0.0, slope / b, False)


def price(rep: Replay, *, tp: int, pp: int, dp: int, cp: int, precisions: Sequence[str]) -> list[dict[str, object]]:
    """The job's calls priced at the layout ``tp x pp x dp x cp`` (rows of :data:`COLUMNS`), per plan precision."""
    have = sorted({r.precision for r in rep.rows})
    dims = {"dp": measured_dims(rep.world_size, tp, pp, cp), "tp": tp, "pp": pp, "cp": cp}
    target = {"dp": dp, "tp": tp, "pp": pp, "cp": cp}
    groups: dict[tuple[str, str, int], list[Row]] = defaultdict(list)
    for r in rep.rows:
        groups[(r.precision, r.collective, r.group_size)].append(r)
    out: list[dict[str, object]] = []
    for p in precisions:
        rp = PLAN_PRECISIONS.get(p, p)
        if rp not in have:
            raise ReplayError(f"--replay {rep.path}: no {rp} rows for plan precision {p}; its precisions: "
                              f"{', '.join(have)} (`commbench replay --precisions`)")  # fmt: skip
        for r in (r for r in rep.rows if r.precision == rp):
            dim, n = map_group(r.group_size, rep.world_size, dims, target)
            t, lo, hi, src = r.time_us, r.low_us, r.high_us, "replay"
            if n != r.group_size:
                f = fit(groups[(rp, r.collective, r.group_size)], r.collective, r.group_size)
                alg = ALGORITHMS["ring"]
                t = 1e6 * (f.alpha_s * alg.latency_steps(r.collective, n)
                           + r.size_bytes * f.beta_s_per_byte * alg.bandwidth_factor(r.collective, n))  # fmt: skip
                lo, hi = t * r.low_us / r.time_us, t * r.high_us / r.time_us
                src = "replay-fit+preset" if f.preset_alpha else "replay-fit"
            c = r.calls_per_step
            out.append({
                "precision": p, "collective": r.collective, "size_bytes": r.size_bytes, "dtype": r.dtype, "dim": dim,
                "measured_group_size": r.group_size, "group_size": n, "calls_per_step": c, "time_us": t,
                "time_ci_low_us": lo, "time_ci_high_us": hi, "step_us": c * t, "step_ci_low_us": c * lo,
                "step_ci_high_us": c * hi, "source": src,
            })  # fmt: skip
    return out


def summary(rows: Sequence[dict[str, object]], rep: Replay, layout: str, preset_s: dict[str, float]) -> list[str]:
    """One line per plan precision: the step's communication with its interval, where its prices come from, and the
    plan's own (``preset``: its model of the layout's calls) beside it."""
    lines = []
    for p in dict.fromkeys(str(r["precision"]) for r in rows):
        mine = [r for r in rows if r["precision"] == p]
        total = [math.fsum(float(str(r[k])) for r in mine) for k in ("step_us", "step_ci_low_us", "step_ci_high_us")]
        srcs: dict[str, int] = defaultdict(int)
        for r in mine:
            srcs[str(r["source"])] += int(r["calls_per_step"])  # type: ignore[call-overload]
        how = ", ".join(f"{n} calls {s}" for s, n in srcs.items())
        own = f"; preset: {1e6 * preset_s[p]:.1f} us/step" if math.isfinite(preset_s.get(p, math.nan)) else ""
        lines.append(f"replay communication {p} at {layout}: {total[0]:.1f} us/step [{total[1]:.1f}, {total[2]:.1f}] "
                     f"({how}; measured at world {rep.world_size}, {rep.path}){own}")  # fmt: skip
    return lines


def write_rows(path: Path, rows: Sequence[dict[str, object]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        w.writerows(rows)


__all__ = ["COLUMNS", "PLAN_PRECISIONS", "Replay", "ReplayError", "Row", "fit", "load_replay", "map_group", "price",
           "summary", "write_rows"]  # fmt: skip
