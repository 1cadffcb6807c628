"""Paired, interleaved rounds: a policy's measured steps alternate, round by round, with its reference's in the same
processes, and the speed-up against the reference comes from the paired rounds.

A policy compared against a full-precision reference (`records.reference_of`: its own `Policy.reference`, else the
fp32 DDP baseline) is timed against a *partner*: a second session of the reference policy, built in the same
processes right after the policy's warm-up (so after its memory measurement, which the partner therefore does not
enter) and warmed up by one untimed step. The measured steps then run in rounds of `round_steps` steps: the
partner's round, then the policy's, then the policy's next round first (A B B A ..., so neither side always runs
right after the other's allocations). Both sides' steps are aligned and timed alike (max over ranks); step `i` of
both sides trains on the same data. The partner adds no row: its times give one ratio per round, the policy's round
median over the partner's, and the speed-up is the median of those ratios with its order-statistic interval
(`stats.rounds_ratio_ci`): load that drifts more slowly than a round lands on both sides of each ratio, as the
collectives' interleaved passes do (`measure/sweep.py`). Below `stats.MIN_SAMPLES_95` rounds no 95 % interval
exists and none is claimed (`stats.claimable`): the row says "n too small" and how many steps would do.

Why a partner, not the reference's own run: the reference's recorded run (its drift rows, memory) stays what it
was, and its model, built and measured alone, keeps its memory honest; building the partner after the policy's
memory step keeps the policy's too. The cost is one more model in memory while the rounds run (the reference's:
no more than the policy's own for a low-precision twin); where two do not fit, `paired = false` in the suite falls
back to the unpaired ratio of the two runs' medians (and its "n too small" rule). Every process group the partner
makes is the policy's epoch's and is destroyed with it (`runner`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from commbench.core import stats


class _Session(Protocol):
    """What pairing needs of a `session.PolicySession` (typed here so this module does not import it)."""

    device: torch.device
    counter: Any
    _times: list[float]

    def align(self) -> None: ...

    def bare_step(self, s: int) -> None: ...

    def instrumented_step(self, s: int, *, measure_memory: bool = False, numerics: bool = True) -> None: ...

    def agreed(self, phase: str, fn: Callable[[], Any]) -> Any: ...


@dataclass(frozen=True)
class Paired:
    """What the paired rounds measured: the policy's step time over its reference's."""

    reference: str
    """The partner's policy name."""
    ratio: stats.Estimate
    """Policy time over reference time: median of the per-round ratios of medians, n = complete rounds."""
    round_steps: int
    reference_times_us: tuple[float, ...] = ()
    """The partner's step times (max over ranks), in step order: with the policy's own they give `ratio` again."""


def _aligned(sess: _Session, step: Callable[[], None]) -> None:
    sess.align()
    step()


def run_rounds(sess: _Session, partner: _Session | None, first: int, steps: int, round_steps: int) -> None:
    """Steps `first .. first + steps - 1` of `sess` (its measured steps), alternating rounds of `round_steps` with
    `partner`'s steps of the same indices (module docstring); without a partner, `sess`'s steps alone."""
    k = max(1, round_steps)
    for r, start in enumerate(range(first, first + steps, k)):
        block = range(start, min(start + k, first + steps))
        sides = [(partner, False), (sess, True)] if r % 2 == 0 else [(sess, True), (partner, False)]
        for side, own in sides:
            if side is None:
                continue
            for s in block:
                step = functools.partial(side.instrumented_step, s, numerics=own)
                name = f"step {s}" if own else f"reference step {s}"
                sess.agreed(name, functools.partial(_aligned, side, step))


def warm_partner(sess: _Session, partner: _Session, s: int) -> None:
    """One untimed step of the partner (its first step allocates what later steps reuse), aligned."""
    sess.agreed("reference warm-up step", functools.partial(_aligned, partner, functools.partial(partner.bare_step, s)))


def reduced_times(sess: _Session, partner: _Session) -> list[float]:
    """The partner's step times, each the max over ranks (a step lasts as long as its slowest rank): one uncounted
    collective."""
    times = torch.tensor(
        [t if math.isfinite(t) else 0.0 for t in partner._times], dtype=torch.float64, device=sess.device
    )
    with sess.counter.paused():
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return [float(t) for t in times.tolist()]


def paired(reference: str, own_times: list[float], ref_times: list[float], round_steps: int) -> Paired:
    """The paired-rounds ratio of the policy's measured step times over the partner's (same steps, same rounds)."""
    ratio = stats.rounds_ratio_ci(own_times, ref_times, round_steps)
    return Paired(reference, ratio, max(1, round_steps), tuple(ref_times))
