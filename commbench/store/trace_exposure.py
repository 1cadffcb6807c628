"""How much of a step's communication the trace shows hidden behind compute, and how much exposed, from its GPU
kernel timeline; and what a faster communication precision would make of the step.

The definitions are HolisticTraceAnalysis' (``hta/analyzers/communication_analysis.py``,
``get_comm_comp_overlap``): the communication kernels' intervals merged, the computation kernels' merged, and the
overlap the time both run at once, over the communication time. Exposed communication is the communication time
that overlaps no computation. Kernel kinds: :func:`commbench.store.trace_kineto.kernel_kind`. On HTA's own test trace
(``nccl_parser_config``) and HTA's kernels, this gives HTA's figure (benchmarks/results/2026-12-03_2core-vm_gloo.md).
A trace without GPU kernels (a CPU run on gloo) has no timeline to read it from: :data:`CPU_REASON`.
"""

from __future__ import annotations

from dataclasses import dataclass

from commbench.store.trace_calls import Trace

CPU_REASON = (
    "the trace has no GPU kernel timeline (a CPU run): a gloo collective runs on gloo's own threads while the "
    "calling thread waits in it, so nothing in the trace overlaps it and the exposure cannot be read; "
    "every replayed microsecond counts as exposed only if the job computes nothing meanwhile"
)


@dataclass(frozen=True, slots=True)
class Exposure:
    step: int
    step_us: float
    """The step's span on the GPU timeline (the host's when the trace has no GPU annotation)."""
    comm_us: float
    """Merged communication-kernel time."""
    overlap_us: float
    """Communication time during which a computation kernel also runs."""

    @property
    def exposed_us(self) -> float:
        return self.comm_us - self.overlap_us

    @property
    def overlap_ratio(self) -> float:
        return self.overlap_us / self.comm_us if self.comm_us > 0 else 0.0

    def projected_step_us(self, speedup: float) -> float:
        """The step's time with its exposed communication ``speedup`` times faster (the hidden part stays hidden)."""
        return self.step_us - self.exposed_us + self.exposed_us / speedup


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping or touching (start, end) intervals merged, in order."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(xs: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in xs)


def intersection(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two merged interval lists (a two-pointer sweep)."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if hi > lo:
            total += hi - lo
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def exposure(trace: Trace, step: int) -> Exposure | None:
    """The step's exposure, or None for a trace without GPU kernels (:data:`CPU_REASON`)."""
    if not trace.kernels:
        return None
    span = trace.gpu_step_spans.get(step) or trace.step_spans.get(step)
    lo, hi = span if span is not None else (min(k[0] for k in trace.kernels), max(k[0] + k[1] for k in trace.kernels))
    inside = [(ts, ts + dur, kind) for ts, dur, _, kind in trace.kernels if lo <= ts <= hi]
    comm = merge([(a, b) for a, b, k in inside if k == "communication"])
    comp = merge([(a, b) for a, b, k in inside if k == "computation"])
    return Exposure(step, hi - lo, _length(comm), intersection(comm, comp))
