"""The pipeline schedules `torch.distributed.pipelining` offers, as commbench runs them: which torch class, how many
stages each rank holds and where they sit, the layers of each stage (given or balanced), the rules a schedule puts
on the micro-batches, and its theoretical bubble.

Placement: a single-stage schedule (GPipe, 1F1B) puts stage p on pipeline rank p. The looped schedules (interleaved
1F1B, Narayanan et al. 2021 section 2.2; interleaved zero bubble, Qi et al. 2023) put v stages on each rank, stage s
on rank s mod pp. ZBV (Qi et al. 2024, "V" schedule) puts two stages on each rank in a V: stage s on rank s for
s < pp, on rank 2pp - 1 - s after, so the last stage is on rank 0 with the first, and the boundary pp-1 -> pp stays
on one rank (no send). Every schedule here runs on gloo/CPU in torch 2.13 (checked with one linear per stage).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SINGLE, LOOP, VSHAPE = "single", "loop", "v"


@dataclass(frozen=True, slots=True)
class Schedule:
    """One schedule: its suite name, the `torch.distributed.pipelining` class, where its stages sit."""

    name: str
    torch_class: str
    placement: str
    """SINGLE (one stage per rank), LOOP (v per rank, stage s on rank s mod pp) or VSHAPE (two per rank)."""
    zero_bubble: bool = False
    """Splits the backward into input and weight gradients (`backward_weight_one_chunk`) to fill the bubble."""

    def per_rank(self, virtual: int) -> int:
        """Stages each rank holds (`virtual` is the suite's virtual_stages; ZBV always holds two)."""
        return {SINGLE: 1, LOOP: max(int(virtual), 1), VSHAPE: 2}[self.placement]

    def rank_of(self, stage: int, pp: int) -> int:
        """The pipeline rank (0..pp-1) holding global stage `stage`."""
        if self.placement == VSHAPE:
            return stage if stage < pp else 2 * pp - 1 - stage
        return stage % pp

    def theory(self, pp: int, microbatches: int, virtual: int) -> float:
        """The idle fraction for equal stages, (p - 1) / (v m + p - 1) (Narayanan et al. 2021, section 2.2; v = 1
        for GPipe and 1F1B); NaN for the zero-bubble schedules (their bubble depends on the ratio of the input- and
        weight-gradient times, which no closed form here knows)."""
        if self.zero_bubble:
            return math.nan
        p, m, v = int(pp), int(microbatches), self.per_rank(virtual)
        return (p - 1) / (v * m + p - 1) if p > 0 and m > 0 else math.nan

    def microbatch_error(self, pp: int, m: int) -> str | None:
        """Why `m` micro-batches cannot run on `pp` ranks, or None."""
        if self.name == ONE_F_ONE_B and m < pp:
            return f"1F1B needs at least as many micro-batches as stages; microbatches={m} < pp_degree={pp}"
        if self.placement == LOOP:
            rounds = max(1, m // pp)  # torch's flexible interleaving: m // pp rounds, each of m / rounds micro-batches
            if m % rounds:
                return (
                    f"{self.name} runs max(1, microbatches // pp_degree) = {rounds} rounds, which must divide "
                    f"microbatches={m}; valid: fewer than {pp}, a multiple of {pp}, or any m that m // {pp} divides"
                )
        return None


GPIPE, ONE_F_ONE_B, INTERLEAVED, INTERLEAVED_ZB, ZBV = "gpipe", "1f1b", "interleaved_1f1b", "interleaved_zb", "zbv"
SCHEDULES: dict[str, Schedule] = {
    s.name: s
    for s in (
        Schedule(GPIPE, "ScheduleGPipe", SINGLE),
        Schedule(ONE_F_ONE_B, "Schedule1F1B", SINGLE),
        Schedule(INTERLEAVED, "ScheduleInterleaved1F1B", LOOP),
        Schedule(INTERLEAVED_ZB, "ScheduleInterleavedZeroBubble", LOOP, zero_bubble=True),
        Schedule(ZBV, "ScheduleZBVZeroBubble", VSHAPE, zero_bubble=True),
    )
}
"""Schedule name -> how commbench runs it."""


def balanced(layers: int, stages: int) -> tuple[int, ...]:
    """`layers` blocks over `stages` stages, equal where they divide; the remainder one each to the middle stages
    (the first holds the embeddings and the last the head: they are heavier already)."""
    q, r = divmod(int(layers), int(stages))
    middle = sorted(range(stages), key=lambda s: (abs(2 * s - (stages - 1)), s))[:r]
    return tuple(q + (s in middle) for s in range(stages))


def split_error(layers: int, stages: int, given: tuple[int, ...]) -> str | None:
    """Why `layers` blocks cannot be split into `stages` stages (as `given`, when given), or None."""
    if layers and stages > layers:
        return f"pipeline parallelism over {stages} stages needs at least {stages} layers (one per stage); n_layers={layers}"
    if given and len(given) != stages:
        return f"stage_layers has {len(given)} entries; the pipeline has {stages} stages (pp_degree x stages per rank)"
    if given and layers and sum(given) != layers:
        return f"stage_layers={list(given)} sums to {sum(given)}; n_layers={layers}"
    return None
