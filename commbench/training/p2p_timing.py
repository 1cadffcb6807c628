"""Pipeline time measured: the point-to-point transfers of a step timed one by one, and each stage's busy and idle
time per step with the bubble fraction it makes, beside the schedule's theoretical one.

Transfers. A schedule posts its sends and receives together and waits later, so a send cannot be made synchronous
in place (gloo sends once the receiver has posted: a synchronous send could wait on a peer blocked the same way).
In timed mode the counter records each send (`CommCounter.timed_sends`: peer, shape, dtype); right after the step
`time_transfers` replays exactly those transfers, each a blocking send/receive pair in one order every rank of the
pipeline agrees on (the smallest pending transfer always has both its ranks at it: no deadlock), uncounted, with a
device sync before and after (as the collectives' timed mode). The transfer's time is the smaller of its two
ranks' durations (the first to arrive waited for the other, as the collectives' minimum over ranks). It is added
to the counter as a call of the sender alone (`CommCounter.add_timed`), so `comm_time_per_step` sums it into the
sender's time, as the sender alone counts its bytes; the gradient all-reduce under PP x DP is timed in place as
every collective. "fwd" is a send to the next stage, "bwd" to the previous one: the phase of the compute the stage ran
last before posting it (`StageClock.phase`; the schedules post a stage's sends after its forward or backward).

Bubbles. `StageClock` wraps a `PipelineStage`'s compute (`forward_one_chunk`, `backward_one_chunk`,
`backward_weight_one_chunk`): busy is their time in a step; idle is the rank's step wall time minus busy (waiting
for a neighbour's activation or gradient, the schedule's bubble, and the un-overlapped waits on its own sends).
The measured bubble fraction is idle / step, the mean over the world's ranks of each one's median over the measured
steps; under PP x DP the gradient all-reduce after the schedule is neither (it is outside the bracketed step). The
theory for equal stages (Narayanan et al. 2021, section 2.2): (p - 1) / (m + p - 1) for GPipe and 1F1B,
(p - 1) / (v m + p - 1) for interleaved 1F1B with v stages per rank.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from commbench.training.comm import CommCounter

if TYPE_CHECKING:
    import torch

FWD, BWD = "fwd", "bwd"
COMPUTE = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
"""The `PipelineStage` methods whose time is a stage's busy time."""


def bubble_theory(stages: int, microbatches: int, virtual: int = 1) -> float:
    """(p - 1) / (v m + p - 1): the idle fraction of a step of equal stages (Narayanan et al. 2021, eq. in 2.2)."""
    p, m, v = int(stages), int(microbatches), max(int(virtual), 1)
    return (p - 1) / (v * m + p - 1) if p > 0 and m > 0 else math.nan


class StageClock:
    """Busy seconds of the wrapped stages' compute, per step (`start` / `stop` bracket a schedule step)."""

    def __init__(self) -> None:
        self.busy = 0.0
        self.steps: list[tuple[float, float, bool]] = []
        """(step wall seconds, busy seconds, timed) of each schedule step."""
        self._t0 = 0.0
        self.phase = FWD
        """FWD after a forward chunk, BWD after a backward one: what a send posted now carries."""

    def wrap(self, stage: Any) -> None:
        """Time `stage`'s compute methods (on the instance: the schedule calls them through it)."""
        for name in COMPUTE:
            orig = getattr(stage, name, None)
            if orig is not None:
                setattr(stage, name, self._timed(orig, FWD if name == COMPUTE[0] else BWD))

    def _timed(self, orig: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            self.phase = phase
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                self.busy += time.perf_counter() - t0

        return run

    def start(self) -> None:
        self.busy, self._t0 = 0.0, time.perf_counter()

    def stop(self, timed: bool) -> None:
        self.steps.append((time.perf_counter() - self._t0, self.busy, timed))


def time_transfers(counter: CommCounter, group: Any, sync: Callable[[], None], device: torch.device) -> dict[str, float]:
    """Replay this step's recorded sends over the pipeline `group` (module docstring); every rank of the group
    calls it. Adds each transfer this rank sent to `counter` and returns this rank's send seconds by direction."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    mine = [(peer, shape, str(dtype).removeprefix("torch."), ph) for peer, shape, dtype, ph in counter.timed_sends]
    counter.timed_sends.clear()
    ranks = dist.get_process_group_ranks(group)
    gathered: list[Any] = [None] * len(ranks)
    with counter.paused():
        dist.all_gather_object(gathered, (rank, mine), group=group)
        plan = [(src, dst, shape, dt, ph) for src, sends in sorted(gathered) for dst, shape, dt, ph in sends]
        took: dict[int, float] = {}
        for k, (src, dst, shape, dt, _) in enumerate(plan):
            if rank not in (src, dst):
                continue
            buf = torch.zeros(shape, dtype=getattr(torch, dt), device=device)
            sync()
            t0 = time.perf_counter()
            if rank == src:
                dist.send(buf, dst)
            else:
                dist.recv(buf, src)
            sync()
            took[k] = time.perf_counter() - t0
        both: list[Any] = [None] * len(ranks)
        dist.all_gather_object(both, took, group=group)
    out = {FWD: 0.0, BWD: 0.0}
    for k, (src, _, _, _, ph) in enumerate(plan):
        if src != rank:
            continue
        secs = min(d[k] for d in both if k in d)
        counter.add_timed(secs, (rank,))
        out[ph or FWD] += secs
    return out


def profile(
    clock: StageClock, p2p: list[dict[str, float]], *, stage: int, skip: int, theory: float, counter: CommCounter
) -> dict[str, Any]:
    """The record's pipeline columns, from every rank's clock (one uncounted all_gather_object over the world):
    `skip` first untimed steps left out (warm-up). `p2p`: this rank's `time_transfers` results."""
    import torch.distributed as dist

    measured = [(wall, busy) for wall, busy, timed in clock.steps if not timed][skip:]
    own = dict(
        stage=stage,
        busy=statistics.median([b for _, b in measured]) if measured else math.nan,
        idle=statistics.median([w - b for w, b in measured]) if measured else math.nan,
        frac=statistics.median([(w - b) / w for w, b in measured if w > 0]) if measured else math.nan,
        p2p={d: statistics.median([t[d] for t in p2p]) for d in (FWD, BWD)} if p2p else {},
    )
    everyone: list[Any] = [None] * dist.get_world_size()
    with counter.paused():
        dist.all_gather_object(everyone, own)

    def by_stage(key: str) -> dict[str, float]:
        stages = sorted({int(e["stage"]) for e in everyone})
        return {str(s): statistics.fmean([e[key] for e in everyone if e["stage"] == s]) * 1e6 for s in stages}

    p2p_by: dict[str, float] = {}
    for e in everyone:
        for d, secs in e["p2p"].items():
            key = f"{e['stage']}:{d}"
            p2p_by.setdefault(key, 0.0)
            p2p_by[key] += secs * 1e6 / sum(1 for q in everyone if q["stage"] == e["stage"])
    fracs = [e["frac"] for e in everyone]
    return {
        "bubble_frac_measured": statistics.fmean(fracs) if all(math.isfinite(f) for f in fracs) else math.nan,
        "bubble_frac_theory": theory,
        "stage_busy_us": json.dumps(by_stage("busy"), sort_keys=True),
        "stage_idle_us": json.dumps(by_stage("idle"), sort_keys=True),
        "p2p_time_us": json.dumps({k: v for k, v in sorted(p2p_by.items()) if v > 0}) if p2p_by else None,
    }
