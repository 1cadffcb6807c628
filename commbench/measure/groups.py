"""Communicator groups like nccl-tests' ``NCCL_TESTS_SPLIT``: the whole world, one group per node, or one group
per local-rank index across nodes.

``intra`` is what NVLink (or shared memory) carries on a GPU cluster, ``inter`` what the network carries. Every
group of a kind runs its collectives at the same time (as nccl-tests' split communicators do), so ``inter``
loads every node's links at once; bandwidth is reported per group. A kind is an object in the registry
:data:`GROUP_KINDS`: adding one (e.g. one group per socket) is one class registered with :func:`register_group_kind`,
here or in a plugin; the cost model and the planner ask its partition, never its name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from commbench.core.registry import Registry


class GroupKind(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    whole_world: ClassVar[bool] = False
    """Every rank in one group on any layout (the default process group): what the planner prices a flat
    strategy's collectives in and names "across N nodes" in its messages."""

    @abstractmethod
    def partition(self, hosts: Sequence[str]) -> list[list[int]]:
        """The groups as lists of global ranks, given every rank's host (in rank order)."""


def node_major_hosts(nodes: int, gpus_per_node: int) -> list[str]:
    """Every rank's host (``"0"``, ``"1"``, ...) when ``nodes x gpus_per_node`` ranks are placed node by node, the
    ranks of a node contiguous (torchrun's, srun's and mpirun's by-node order)."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"nodes and gpus_per_node must be >= 1, got {nodes} and {gpus_per_node}")
    return [str(i) for i in range(nodes) for _ in range(gpus_per_node)]


def nodes_of(hosts: Sequence[str]) -> list[list[int]]:
    """Ranks per node, nodes in order of their first rank."""
    by_host: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    return list(by_host.values())


class World(GroupKind):
    name = "world"
    description = "every rank in one group"
    whole_world = True

    def partition(self, hosts: Sequence[str]) -> list[list[int]]:
        return [list(range(len(hosts)))]


class Intra(GroupKind):
    name = "intra"
    description = "one group per node (intra-node links)"

    def partition(self, hosts: Sequence[str]) -> list[list[int]]:
        return nodes_of(hosts)


class Inter(GroupKind):
    name = "inter"
    description = "one group per local-rank index across nodes (the network between nodes)"

    def partition(self, hosts: Sequence[str]) -> list[list[int]]:
        nodes = nodes_of(hosts)
        width = max(len(n) for n in nodes)
        return [[n[i] for n in nodes if i < len(n)] for i in range(width)]


GROUP_KINDS: Registry[GroupKind] = Registry("group")
"""Group kind name (a suite's ``groups``, the results' ``group`` column) -> kind."""


def register_group_kind(kind: GroupKind, *, replace: bool = False) -> GroupKind:
    """Add a group kind (a plugin's, or the built-ins below) under its name."""
    return GROUP_KINDS.register(kind.name, kind, replace=replace)


def get_group_kind(name: str) -> GroupKind:
    """The kind called ``name``; ValueError naming the valid choices."""
    return GROUP_KINDS.get(name)


for _kind in (World(), Intra(), Inter()):
    register_group_kind(_kind)


def unusable(kind: GroupKind, hosts: Sequence[str]) -> str | None:
    """Why this world cannot run ``kind`` (groups of one rank in a larger world, or of unequal sizes), or None."""
    parts = kind.partition(hosts)
    sizes = {len(p) for p in parts}
    # A world of one rank is a valid world (nccl-tests runs on one GPU; busbw is 0 there): a single GPU's NCCL
    # check needs it, since NCCL refuses two ranks on one device. Any other group of one rank measures nothing.
    if min(sizes) < 2 and not (len(hosts) == 1 and len(parts) == 1):
        return f"its groups would have {min(sizes)} rank (needs >= 2: more nodes, or more ranks per node)"
    if len(sizes) > 1:
        return f"its groups would differ in size ({', '.join(str(s) for s in sorted(sizes))} ranks)"
    return None


@dataclass(frozen=True, slots=True)
class SubGroup:
    """This rank's group of one kind."""

    kind: GroupKind
    pg: Any
    """The torch process group (None for the whole world: the default group)."""
    ranks: tuple[int, ...]
    """Global ranks of the members, in group-rank order."""
    n_groups: int

    @property
    def rank(self) -> int:
        import torch.distributed as dist

        return self.ranks.index(dist.get_rank())

    @property
    def size(self) -> int:
        return len(self.ranks)


def build(kind: GroupKind, hosts: Sequence[str], backend: str) -> SubGroup:
    """Create the process groups of ``kind`` (every rank calls this, in the same order) and return this rank's.

    The world is the default group. Other kinds call ``dist.new_group`` for every group (torch requires every
    rank to take part in creating each group, members or not).
    """
    import torch.distributed as dist

    parts = kind.partition(hosts)
    me = dist.get_rank()
    if parts == [list(range(len(hosts)))]:
        return SubGroup(kind, None, tuple(parts[0]), 1)
    mine: Any = None
    ranks: tuple[int, ...] = ()
    for p in parts:
        pg = dist.new_group(ranks=p, backend=backend)
        if me in p:
            mine, ranks = pg, tuple(p)
    return SubGroup(kind, mine, ranks, len(parts))
