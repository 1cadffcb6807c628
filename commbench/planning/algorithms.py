"""How a collective's time scales with its group, and how a group's rings load the node links: the formulas the cost
model (:mod:`commbench.planning.costmodel`) fits and predicts with.

Model
-----
Per (collective, precision, group) the communication time of one call is

    time(S, n) = alpha * A(n) + S * beta * B(n)

with ``S`` the nccl-tests size in **wire bytes** (the ``size_bytes`` column: all_reduce the buffer, all_gather the
total output, reduce_scatter the total input, all_to_all the per-rank buffer) and ``n`` the ranks of the group
(``group_size``, else ``world_size``). ``A(n)`` counts latency steps and ``B(n)`` the fraction of ``S`` each rank
sends; both come from the algorithm assumed (:data:`ALGORITHMS`):

* ``ring`` (default; NCCL's ring and gloo's ring all_reduce; the bandwidth-optimal schedule at large sizes, which is
  the regime capacity planning is about): all_reduce = reduce_scatter + all_gather, ``A = 2(n-1)``,
  ``B = 2(n-1)/n``; all_gather and reduce_scatter ``A = n-1``, ``B = (n-1)/n``; all_to_all (pairwise exchange)
  ``A = n-1``, ``B = (n-1)/n``; broadcast/reduce (pipelined chain) ``A = n-1``, ``B = 1``; sendrecv ``A = B = 1``.
  ``B(n)`` is exactly nccl-tests' busbw factor, so ``1/beta`` is the asymptotic **bus bandwidth**.
* ``tree`` (NCCL's double binary tree all_reduce, small messages at scale): ``A = 2 log2(n)``, ``B = 2`` (reduce up
  and broadcast down, each moving S, pipelined); other collectives fall back to ring.
* Two-level (multi-node) layouts are modelled by fitting the ``intra`` and ``inter`` groups separately (nccl-tests'
  NCCL_TESTS_SPLIT groups); a hierarchical collective's time is then the sum of its stages, which the planner
  composes.

Layouts: how a group maps onto the node links
---------------------------------------------
Ranks are placed node by node (torchrun's order: ranks of a node contiguous), and a node's link to the others is
full duplex and the bottleneck of any ring that crosses it (intra-node hops are much faster). Then:

* a ring over ``n`` ranks spanning several nodes crosses each node's link once per direction (ranks of a node are
  neighbours), so each node's link carries ``S * B(n)`` bytes per direction: the per-rank bus bytes. Each of the
  ``A(n)`` steps waits for its slowest edge, an inter-node hop, so the steps are priced at the link's alpha (the
  intra hops of a step run meanwhile). A ``world`` (or ``inter``) fit over several nodes therefore measures the
  **per-node link**, whatever the ranks per node: a fit on 2 and 3 nodes x 1 rank predicts a flat ring over
  2 nodes x 2 ranks with ``n = 4`` in the same formula;
* ``c`` groups of one kind running at once whose rings each cross a node's link (the ``inter`` groups, one per
  local rank: HSDP's replica groups, the sweep's ``inter`` on g ranks per node, ``c = g``) share that link: each
  gets ``1/c`` of it, ``time = alpha*A(n) + c*S*beta*B(n)``. :func:`link_sharing` counts ``c`` for a group kind on
  a layout by asking the kind's partition (:mod:`commbench.measure.groups`); a group within one node has ``c = 0`` (no
  node link in its path; concurrent intra groups on different nodes do not share anything modelled here).

A fit scales each point's bandwidth term by its ``c`` (from the point's ``nodes``, ``world_size`` and group), so
its beta is per byte on one node link; ``Fit.link_shares`` keeps the ``c`` values it saw (0: within a node).
:meth:`CostModel.predict` takes the layout of the group predicted as ``nodes=`` (nodes it spans) and
``concurrent=`` (its ``c``); the planner (:mod:`commbench.planning.pricing`) prices inter-node groups through the same
arguments. Not modelled: rings that are not node-contiguous, NCCL's tree/NVLS inter-node algorithms, a link
shared by different kinds at once, and a switch core slower than the node links.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from commbench.measure.groups import get_group_kind, node_major_hosts

if TYPE_CHECKING:
    from commbench.measure.collectives import Collective


class Algorithm:
    """How a collective's time scales with the group size: latency steps A(n) and bandwidth factor B(n)."""

    name = ""

    def latency_steps(self, collective: str, n: int) -> float:
        raise NotImplementedError

    def bandwidth_factor(self, collective: str, n: int) -> float:
        raise NotImplementedError

    def knows(self, collective: str) -> bool:
        try:
            self.latency_steps(collective, 2)
        except KeyError:
            return False
        return True


def registered(collective: str) -> Collective | None:
    """The commbench collective of that name; None for one only nccl-tests logs bring (broadcast, reduce, ...)."""
    from commbench.measure.collectives import COLLECTIVES

    return COLLECTIVES[collective] if collective in COLLECTIVES else None


class Ring(Algorithm):
    """A commbench collective's ring is its nccl-tests bus factor: ``bus_passes`` passes of n-1 steps, each rank
    sending (n-1)/n of the size per pass. Collectives only imported from nccl-tests logs take the table."""

    name = "ring"
    _IMPORTED: dict[str, tuple[Callable[[int], float], Callable[[int], float]]] = {
        # name: (latency steps, bandwidth factor); broadcast/reduce as a pipelined chain
        "broadcast": (lambda n: float(n - 1), lambda n: 1.0),
        "reduce": (lambda n: float(n - 1), lambda n: 1.0),
        "sendrecv": (lambda n: 1.0, lambda n: 1.0),
    }

    def latency_steps(self, collective: str, n: int) -> float:
        c = registered(collective)
        return c.latency_steps(n) if c is not None else self._IMPORTED[collective][0](n)

    def bandwidth_factor(self, collective: str, n: int) -> float:
        c = registered(collective)
        return c.bus_factor(n) if c is not None else self._IMPORTED[collective][1](n)


class Tree(Ring):
    """NCCL's double binary tree for the collectives that have one (``Collective.nccl_tree``: all_reduce):
    2 log2(n) steps, the size up and down once each (pipelined); the others fall back to ring."""

    name = "tree"

    def latency_steps(self, collective: str, n: int) -> float:
        c = registered(collective)
        if c is not None and c.nccl_tree:
            return 2.0 * math.log2(n)
        return super().latency_steps(collective, n)

    def bandwidth_factor(self, collective: str, n: int) -> float:
        c = registered(collective)
        if c is not None and c.nccl_tree:
            return 2.0
        return super().bandwidth_factor(collective, n)


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (Ring(), Tree())}


def encode_factor(collective: str, n: int) -> float:
    """Fraction of the fp32 nccl-tests size one rank encodes (all_gather: its own shard)."""
    c = registered(collective)
    return 1.0 / n if c is not None and c.input_per_rank else 1.0


def decode_factor(collective: str, n: int) -> float:
    """Fraction of the fp32 nccl-tests size one rank decodes (the whole output / all received chunks)."""
    return 1.0


def link_sharing(group: str, nodes: int, gpus_per_node: int) -> int:
    """Groups of kind ``group`` whose rings cross each node's link at once, on ``nodes x gpus_per_node`` ranks
    placed node by node: 1 for the world over several nodes, ``gpus_per_node`` for the ``inter`` groups, 0 for
    groups within one node (see "Layouts" in the module docstring). Asks the kind's partition, so a new group
    kind needs nothing here."""
    hosts = node_major_hosts(nodes, gpus_per_node)
    parts = get_group_kind(group).partition(hosts)
    # nodes are alike under node-by-node placement: count node 0's spanning groups
    return sum(1 for part in parts if "0" in {hosts[r] for r in part} and len({hosts[r] for r in part}) > 1)


def group_spans(group: str, nodes: int, gpus_per_node: int) -> int:
    """Nodes one group of kind ``group`` spans on ``nodes x gpus_per_node`` ranks placed node by node (rank 0's
    group; the kinds partition alike): what ``CostModel.predict(nodes=)`` takes, and how a measured curve names its
    layout."""
    hosts = node_major_hosts(nodes, gpus_per_node)
    part = next(p for p in get_group_kind(group).partition(hosts) if 0 in p)
    return len({hosts[r] for r in part})


def inter_node_share(group: str, nodes: int, gpus_per_node: int) -> float:
    """Fraction of a rank's bus bytes (averaged over the ranks) that cross node links when each group of kind
    ``group`` runs a ring in rank order on ``nodes x gpus_per_node`` ranks placed node by node: the ring's hops
    between two nodes over all its hops. A flat ring over several nodes crosses nodes on ``nodes`` of its ``N``
    hops (``1/gpus_per_node``), a group within one node on none, one rank per node on all. Asks the kind's
    partition, as :func:`link_sharing` does."""
    hosts = node_major_hosts(nodes, gpus_per_node)
    crossed = 0
    for part in get_group_kind(group).partition(hosts):
        if len(part) < 2:
            continue  # a group of one rank sends nothing
        hops = sum(hosts[a] != hosts[b] for a, b in zip(part, part[1:] + part[:1], strict=True))
        crossed += hops  # every rank sends its bus bytes over its own outgoing hop
    return crossed / len(hosts)


__all__ = [
    "ALGORITHMS", "Algorithm", "Ring", "Tree", "decode_factor", "encode_factor", "group_spans", "inter_node_share",
    "link_sharing", "registered",
]  # fmt: skip
