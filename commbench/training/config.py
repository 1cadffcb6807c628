"""The `[training]` suite table as a typed config: known keys, types, ranges, defaults.

`TrainingConfig.from_dict(table)` validates a parsed TOML table at suite load (registered as the suite's
``training`` table); every problem raises one ValueError naming the key, the bad value and the valid choices (the
CLI turns it into exit code 2). The defaults are a tiny GPT that runs every policy on 2 CPU ranks in well under a
minute. Models and policies are looked up by registry kind, not imported: they are typed against this config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from commbench.core import plugins
from commbench.core.registry import REGISTRIES, Registry
from commbench.core.settings import check_settings, count, flag, positive, setting
from commbench.core.suite import SUITE_TABLES


@dataclass(kw_only=True, slots=True)
class TrainingConfig:
    """The validated `[training]` table (field order is the table's key order in metadata)."""

    model: str = setting("gpt", "model to train: gpt, mlp or convnet")
    policies: list[str] | str = setting("all", '"all" or a list of policy names; resolved to the list of names')
    steps: int = count(5, "measured steps per policy")
    warmup_steps: int = count(2, "steps before timing starts, the last one carrying the memory measurement")
    batch_size: int = count(8, "samples per rank per step")
    seq_len: int = count(32, "tokens per sample for the gpt")
    d_model: int = count(64, "width: embedding (gpt), hidden size (mlp) or channels (convnet)")
    n_layers: int = count(2, "blocks")
    n_heads: int = count(4, "attention heads for the gpt, a divisor of d_model")
    vocab: int = count(128, "vocabulary (gpt) or number of classes (mlp, convnet)", least=2)
    tp_degree: int = count(
        0,
        "tensor-parallel degree of the tp_* policies (ranks per TP group; the rest of the world is data parallel); "
        "0: the whole world for the 1-D tp_* policies, half of it for the 2-D tp_dp_* ones",
        least=0,
    )
    pp_degree: int = count(
        0,
        "pipeline-parallel degree of the pp_* policies (stages; the rest of the world is data parallel); 0: the "
        "whole world",
        least=0,
    )
    cp_degree: int = count(
        0,
        "context-parallel degree of the cp_* policies (ranks per CP group, each holding seq_len / cp_degree tokens of "
        "every sequence; the rest of the world is data parallel); 0: the whole world",
        least=0,
    )
    microbatches: int = count(4, "micro-batches per step of the pp_* policies (the per-rank batch is split into them)")
    virtual_stages: int = count(
        2, "stages per rank of the interleaved and zero-bubble pp_* schedules (v; GPipe and 1F1B run one)"
    )
    stage_layers: list[int] | None = setting(
        None,
        "blocks of each pipeline stage, first to last (pp_degree x stages per rank of them, summing to n_layers); "
        "default: balanced",
        accepts=lambda v: v is None or (isinstance(v, (list, tuple)) and bool(v) and all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in v)),
        expect="a list of ints >= 1",
        convert=list,
    )
    seed: int = count(0, "seed for weights and data", least=0)
    lr: float = positive(1e-3, "AdamW learning rate")
    loss_multiplier: float = positive(1.0, "factor applied to the loss before backward (tiny values emulate tiny gradients)")
    init_std: float | None = positive(None, "optional std for all weight matrices, default: torch's init")
    measure_memory: bool = flag(True, "measure peak memory on the last warm-up step")
    paired: bool = flag(
        True,
        "time each compared policy in rounds alternating with its reference's (training/pairing.py); false: the "
        "unpaired ratio of the two runs' medians",
    )
    round_steps: int = count(1, "measured steps per paired round (one speed-up ratio per round)")
    comm_timed_steps: int = count(
        6,
        "extra steps after the measured ones with every collective made synchronous and timed (comm_time_us); "
        "0: none",
        least=0,
    )

    def __post_init__(self) -> None:
        models = _registry("model")
        if self.model not in models:
            raise ValueError(f"training.model={self.model!r} is not valid; valid: {', '.join(models.names())}")
        check_settings(self, "training")
        every = self.policies == "all"
        self.policies = _resolve_policies(self.policies)
        if self.tp_degree == 1 or self.pp_degree == 1:
            one = "tp_degree" if self.tp_degree == 1 else "pp_degree"
            raise ValueError(f"training.{one}=1 is not valid; expected 0 (the whole world) or a degree >= 2")
        models.get(self.model).check(self)
        _check_layouts(self, every)

    @classmethod
    def from_dict(cls, table: Mapping[str, Any]) -> TrainingConfig:
        """Validate a parsed `[training]` table; unknown keys raise ValueError listing the valid ones."""
        if not isinstance(table, Mapping):
            raise ValueError(f"[training] must be a table, got {type(table).__name__}")
        keys = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(table) - set(keys))
        if unknown:
            raise ValueError(f"unknown key training.{unknown[0]}; valid keys: {', '.join(keys)}")
        return cls(**table)

    @classmethod
    def coerce(cls, value: TrainingConfig | Mapping[str, Any]) -> TrainingConfig:
        """A config as given, or validated from a table (tests and scripts pass plain dicts)."""
        if isinstance(value, TrainingConfig):
            return value
        return cls.from_dict(value)

    def to_dict(self) -> dict[str, Any]:
        """The table with every default filled in (what metadata records)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainingConfig:
        """A re-validated copy with `changes`."""
        return dataclasses.replace(self, **changes)


def _check_layouts(section: TrainingConfig, every: bool) -> None:
    """A named policy whose layout no world can run is an error at load. Under "all" a layout setting is an error
    only when every policy of its kind (tp, pp) refuses it: the others run, and those that cannot (the looped
    schedules on too few layers, or any TP/PP policy on a model that cannot be split) skip with their reason."""
    if every and section.model != "gpt":
        return
    policies = _registry("policy")
    by_kind: dict[str, list[tuple[str, str | None]]] = {}
    for name in section.policies:
        sharding = policies.get(name).sharding
        by_kind.setdefault(sharding.kind, []).append((name, sharding.config_error(section)))
    for refusals in by_kind.values():
        if not every or all(reason for _, reason in refusals):
            for name, reason in refusals:
                if reason:
                    raise ValueError(f"training.policies: {name}: {reason}")


def _registry(kind: str) -> Registry[Any]:
    """The registry of ``kind`` with its built-ins loaded."""
    plugins.load(kind=kind)
    return REGISTRIES[kind]


def _resolve_policies(value: Any) -> list[str]:
    valid = _registry("policy").names()
    if value == "all":
        return valid
    if isinstance(value, str):
        value = [value]
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f'training.policies={value!r} is not valid; expected "all" or a list of policy names')
    for name in value:
        if name not in valid:
            raise ValueError(f"training.policies: unknown policy {name!r}; valid: all, {', '.join(valid)}")
    if len(set(value)) != len(value):
        raise ValueError(f"training.policies lists a policy twice: {value!r}")
    return list(value)


SUITE_TABLES.register("training", TrainingConfig.from_dict)
