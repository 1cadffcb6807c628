"""Pricing one collective call of a layout: latency + bytes / bandwidth of the link it crosses, from the measured cost
model where it has the call, from the GPU preset otherwise, with the source named.

A call is one collective at its real size (nccl-tests' size: all_gather the total output, reduce_scatter the total
input, all_reduce the buffer, a send its bytes) on a group of ``n`` ranks spanning ``nodes`` nodes, with
``concurrent`` groups of its kind crossing each node's NICs at once.

From the GPU preset (no measurement): NCCL's ring latency per step (:mod:`commbench.planning.ring`: a ring over a
million ranks pays a million steps) plus the bus bytes over the link's bus bandwidth: NVLink's within a node; across
nodes the lesser of NVLink and the node's NICs (one per GPU) shared by the ``concurrent`` groups crossing them
(:class:`~commbench.planning.pricing.StatedLinks`), at the link efficiency
:data:`~commbench.planning.pricing.STATED_EFFICIENCY` (80 %, interval 50-100 %); the latency's interval is
:data:`~commbench.planning.ring.LATENCY_RANGE` (x0.5: the LL/LL128 protocols of small calls; x2: jitter and
stragglers at scale).

From a cost model (``commbench fit`` on the user's cluster, or an imported nccl-tests log), the call is priced by
:meth:`commbench.planning.costmodel.CostModel.predict` (measured points first, the fit beyond), with the layout
(``nodes=``, ``concurrent=``) and the fit's own 95 % interval; a call the model has no fit for (another dtype, a
send, a collective the log lacks) falls back to the preset, and the source says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from commbench.planning.compute import GPU
from commbench.planning.costmodel import CostModel
from commbench.planning.pricing import STATED_EFFICIENCY, StatedLinks, group_for, native_precision
from commbench.planning.ring import LATENCY_RANGE, bus_factor, latency_s


@dataclass(frozen=True, slots=True)
class Call:
    """One collective call as a layout issues it."""

    op: str
    """all_gather, reduce_scatter, all_reduce or send."""
    nbytes: float
    """nccl-tests size in bytes (wire dtype)."""
    n: int
    """Ranks of the group."""
    nodes: int
    """Nodes the group spans."""
    concurrent: int = 1
    """Groups of this kind crossing each node's NICs at once."""
    dtype: str = "bfloat16"
    """nccl-tests type name of the wire dtype (what the cost model is keyed by)."""


@dataclass(frozen=True, slots=True)
class CallPrice:
    """Seconds per call at the interval's fast end, the point estimate and the slow end, and what priced it."""

    low: float
    mid: float
    high: float
    source: str


class Pricer:
    """Prices calls for one GPU preset and, optionally, a cost model; caches by call."""

    def __init__(self, gpu: GPU, gpus_per_node: int, model: CostModel | None = None) -> None:
        self.gpu, self.gpus_per_node, self.model = gpu, gpus_per_node, model
        self.links = StatedLinks(gpu.nvlink_gbps, gpu.network_gbps, gpu.source)
        self._cache: dict[Call, CallPrice] = {}

    def preset(self, c: Call, why: str = "") -> CallPrice:
        """The preset's price (module docstring)."""
        if c.n < 2 and c.op != "send":
            return CallPrice(0.0, 0.0, 0.0, "none")
        bw = self.links.bandwidth(c.nodes, self.gpus_per_node, c.concurrent)
        bus = c.nbytes * bus_factor(c.op, max(c.n, 2))
        lat = latency_s(c.op, max(c.n, 2), c.nodes)
        (l_lo, l_mid, l_hi), (e_lo, e_mid, e_hi) = LATENCY_RANGE, STATED_EFFICIENCY
        link = "network" if c.nodes > 1 else "NVLink"
        src = f"{self.gpu.name} preset ({link}, NCCL ring latency)" + (f"; {why}" if why else "")
        return CallPrice(lat * l_lo + bus / (e_hi * bw), lat * l_mid + bus / (e_mid * bw),
                         lat * l_hi + bus / (e_lo * bw), src)  # fmt: skip

    def price(self, c: Call) -> CallPrice:
        """The call's price: the cost model's where it has the call, the preset's otherwise."""
        hit = self._cache.get(c)
        if hit is not None:
            return hit
        out = self._from_model(c) if self.model is not None and c.n >= 2 and c.op != "send" else None
        if out is None:
            why = "" if self.model is None else f"the cost model has no {c.op}/{c.dtype} fit for this link"
            out = self.preset(c, why)
        self._cache[c] = out
        return out

    def _from_model(self, c: Call) -> CallPrice | None:
        assert self.model is not None
        prec = native_precision(c.dtype)
        if prec is None:
            return None
        level = "world" if c.nodes > 1 else "intra"
        grp, _ = group_for(self.model, c.op, prec, level, c.nodes, max(c.n // max(c.nodes, 1), 1))
        if grp is None:
            return None
        p = self.model.predict(c.op, prec, world_size=c.n, nbytes=c.nbytes, group=grp, nodes=c.nodes,
                               concurrent=max(c.concurrent, 1))  # fmt: skip
        lo = p.total_low_s if p.total_low_s == p.total_low_s else p.total_s  # NaN: no interval known
        hi = p.total_high_s if p.total_high_s == p.total_high_s else p.total_s
        return CallPrice(lo, p.total_s, hi, f"cost model, {p.source} ({c.op}/{prec}/{grp})")


def placement(n: int, stride: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes spanned, groups sharing each node's NICs) of a group of ``n`` ranks ``stride`` apart, ranks placed
    node by node (module docstring of :mod:`commbench.planning.layout`)."""
    if n < 2 or stride * n <= gpus_per_node:
        return 1, 1
    if stride >= gpus_per_node:
        return n, gpus_per_node
    per_node = gpus_per_node // stride
    return -(-n // per_node), stride


__all__ = ["Call", "CallPrice", "Pricer", "placement"]
