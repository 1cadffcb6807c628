"""Group kinds like nccl-tests' NCCL_TESTS_SPLIT, written out by hand for a few cluster layouts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from commbench.measure.groups import (
    GROUP_KINDS,
    GroupKind,
    get_group_kind,
    node_major_hosts,
    nodes_of,
    register_group_kind,
    unusable,
)

TWO_BY_TWO = ["n0", "n0", "n1", "n1"]
THREE_BY_TWO = ["a", "a", "b", "b", "c", "c"]


def test_partitions_of_two_nodes_with_two_ranks() -> None:
    assert get_group_kind("world").partition(TWO_BY_TWO) == [[0, 1, 2, 3]]
    assert get_group_kind("intra").partition(TWO_BY_TWO) == [[0, 1], [2, 3]]
    assert get_group_kind("inter").partition(TWO_BY_TWO) == [[0, 2], [1, 3]]


def test_partitions_of_three_nodes() -> None:
    assert get_group_kind("intra").partition(THREE_BY_TWO) == [[0, 1], [2, 3], [4, 5]]
    assert get_group_kind("inter").partition(THREE_BY_TWO) == [[0, 2, 4], [1, 3, 5]]


def test_every_rank_is_in_exactly_one_group_of_each_kind() -> None:
    hosts = ["x", "y", "x", "y", "x", "y", "z", "z", "z"][:8]
    for kind in GROUP_KINDS.values():
        members = sorted(r for g in kind.partition(hosts) for r in g)
        assert members == list(range(len(hosts))), kind.name


def test_nodes_in_order_of_first_rank() -> None:
    assert nodes_of(["b", "a", "b", "a"]) == [[0, 2], [1, 3]]


def test_unusable_layouts_say_why() -> None:
    one_node = ["h", "h"]
    assert unusable(get_group_kind("world"), one_node) is None
    assert unusable(get_group_kind("intra"), one_node) is None
    assert "1 rank" in str(unusable(get_group_kind("inter"), one_node))
    assert "differ in size" in str(unusable(get_group_kind("intra"), ["a", "a", "a", "b", "b"]))
    # a world of one rank (one GPU, as nccl-tests runs) is measurable; a group of one rank in a larger world is not
    assert unusable(get_group_kind("world"), ["a"]) is None
    assert "1 rank" in str(unusable(get_group_kind("inter"), ["a", "b", "b"]) or unusable(get_group_kind("intra"), ["a", "b", "b"]))


def test_unknown_group_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown group 'rack'; valid choices: world, intra, inter"):
        get_group_kind("rack")


def test_node_major_hosts_place_a_nodes_ranks_together() -> None:
    assert node_major_hosts(2, 3) == ["0", "0", "0", "1", "1", "1"]
    with pytest.raises(ValueError, match="nodes and gpus_per_node must be >= 1, got 0 and 2"):
        node_major_hosts(0, 2)


def test_only_the_world_is_the_whole_world() -> None:
    # the attribute the planner asks instead of the name (a flat strategy's group; "across N nodes" in messages)
    assert [k.name for k in GROUP_KINDS.values() if k.whole_world] == ["world"]


class Pairs(GroupKind):
    """A kind from outside: ranks 0-1, 2-3, ... (one group per pair of consecutive ranks)."""

    name = "pairs"
    description = "consecutive rank pairs"

    def partition(self, hosts: Sequence[str]) -> list[list[int]]:
        return [list(range(i, min(i + 2, len(hosts)))) for i in range(0, len(hosts), 2)]


def test_a_registered_kind_is_found_and_listed() -> None:
    register_group_kind(Pairs())
    try:
        assert get_group_kind("pairs").partition(TWO_BY_TWO) == [[0, 1], [2, 3]]
        assert "pairs" in list(GROUP_KINDS)
    finally:
        GROUP_KINDS.unregister("pairs")
    with pytest.raises(ValueError, match="unknown group 'pairs'"):
        get_group_kind("pairs")
