"""The suite's tables come from a registry: ``[training]`` is the parser commbench.training.config registers, a
plugin's table is validated the same way and kept apart, and a suite without one records the keys it always had."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from commbench.core.suite import SUITE_TABLES, suite_from_dict

SUITE_DICT_KEYS = [
    "name", "collectives", "precisions", "min_bytes", "max_bytes", "factor", "payload", "check", "seed", "groups",
    "root", "op", "timing", "training",
]  # fmt: skip
"""The keys of metadata.json's ``suite``: schema 1's, with ``root`` and ``op`` (nccl-tests' -r and -o, issue 33)."""


@dataclass(frozen=True)
class Toy:
    level: int

    @classmethod
    def parse(cls, table: Mapping[str, Any]) -> Toy:
        if set(table) - {"level"} or not isinstance(table.get("level", 1), int):
            raise ValueError(f"bad [toy] table {dict(table)!r}; valid keys: level (an integer)")
        return cls(int(table.get("level", 1)))

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level}


@pytest.fixture
def toy_table() -> Iterator[None]:
    SUITE_TABLES.register("toy", Toy.parse)
    try:
        yield
    finally:
        SUITE_TABLES.unregister("toy")


def test_training_is_a_registered_table_and_the_suite_keys_are_unchanged() -> None:
    s = suite_from_dict({"training": {"model": "mlp", "d_model": 16, "vocab": 4, "policies": ["fp32"]}})
    assert type(s.training).__name__ == "TrainingConfig" and s.training.to_dict()["model"] == "mlp"
    assert s.collectives == [] and s.tables == {}
    d = s.to_dict()
    assert list(d) == SUITE_DICT_KEYS and d["training"]["policies"] == ["fp32"]
    assert list(suite_from_dict({}).to_dict()) == SUITE_DICT_KEYS and suite_from_dict({}).training is None
    with pytest.raises(ValueError, match=r"^unknown suite key\(s\) colectives; valid keys: check, .*timing, training; did you mean 'collectives'\?$"):
        suite_from_dict({"colectives": ["all_reduce"]})
    with pytest.raises(ValueError, match="suite key 'training' must be a table"):
        suite_from_dict({"training": "gpt"})


def test_a_plugin_table_is_validated_and_kept_apart(toy_table: None) -> None:
    s = suite_from_dict({"toy": {"level": 3}})
    assert s.tables == {"toy": Toy(3)} and s.training is None
    assert s.to_dict()["tables"] == {"toy": {"level": 3}}
    with pytest.raises(ValueError, match=r"bad \[toy\] table"):
        suite_from_dict({"toy": {"lvl": 3}})
    with pytest.raises(ValueError, match=r"valid keys: check, .*, timing, toy, training; did you mean 'toy'\?$"):
        suite_from_dict({"tyo": {}})
