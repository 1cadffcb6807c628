"""Group kinds like nccl-tests' NCCL_TESTS_SPLIT, written out by hand for a few cluster layouts."""

from __future__ import annotations

import pytest

from commbench.measure.groups import GROUP_KINDS, get_group_kind, nodes_of, unusable

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
