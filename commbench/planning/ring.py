"""NCCL's ring model of one call from the GPU preset: latency per step and the bus factor (no measurement needed).

From ``src/graph/tuning.cc`` (``ncclTopoTuneModel``, the Ring / Simple protocol entries large calls use): a ring of
``n`` ranks over ``k`` nodes takes ``n-1`` steps per pass (all_gather and reduce_scatter one pass, all_reduce two),
of which ``k-1`` per pass cross the network; the latency is ``base + intra_steps * lat_intra + inter_steps *
lat_inter``. A point-to-point send is one step. The bandwidth term (bus bytes over the link's bus bandwidth) is the
caller's: :class:`commbench.planning.pricing.StatedLinks` and :class:`commbench.planning.calls.Pricer`.
"""

from __future__ import annotations

RING_BASE_S = 8.4e-6
"""NCCL ring base latency, Simple protocol (``baseLat[RING][SIMPLE]``, tuning.cc)."""
RING_STEP_INTRA_S = 3.4e-6
"""NCCL ring latency per NVLink step, Simple (``hwLat[NVLINK][RING][SIMPLE]``)."""
RING_STEP_INTER_S = 9.6e-6
"""NCCL ring latency per network step, Simple (``hwLat[NET][RING][SIMPLE]``)."""
LATENCY_RANGE = (0.5, 1.0, 2.0)
"""Latency multipliers: interval's fast end, the point estimate, the slow end."""
PASSES = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "all_to_all": 1, "broadcast": 1, "send": 0}
"""Ring passes per collective (all_to_all: n-1 pairwise steps; broadcast: a pipelined chain; a send is one step)."""


def ring_steps(op: str, n: int, nodes: int) -> tuple[int, int]:
    """(steps within nodes, steps across nodes) of one call on a ring of ``n`` ranks over ``nodes`` nodes."""
    passes = PASSES[op]
    if passes == 0:
        return (0, 1) if nodes > 1 else (1, 0)
    total, inter = passes * (n - 1), passes * (nodes - 1)
    return total - inter, inter


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus factor: all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, a send 1."""
    passes = PASSES[op]
    if op == "broadcast":
        return 1.0
    return 1.0 if passes == 0 else passes * (n - 1) / n


def latency_s(op: str, n: int, nodes: int) -> float:
    """NCCL's ring latency of one call (module docstring), point estimate."""
    intra, inter = ring_steps(op, n, nodes)
    return RING_BASE_S + intra * RING_STEP_INTRA_S + inter * RING_STEP_INTER_S



__all__ = [
    "LATENCY_RANGE", "PASSES", "RING_BASE_S", "RING_STEP_INTER_S", "RING_STEP_INTRA_S", "bus_factor", "latency_s",
    "ring_steps",
]  # fmt: skip
