"""fsdp2_float8 (training/float8.py): torchao's float8 Linears under FSDP2 with float8 all-gathers. The converted
layers, the counted bytes of a 2-rank gloo world against FSDP2's all-gather / reduce-scatter per unit written out
here from the model's dimensions and against torch.profiler's own events, the drift from the fp32 baseline, and the
one-line skips where torchao or a float8-capable GPU is missing."""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest

from tests.distutil import run_in_world
from tests.profiled import HIDDEN, profiled_policy, rows_without_torchao, traced_calls

SECTION = dict(
    model="gpt", batch_size=2, seq_len=8, d_model=32, n_layers=2, n_heads=4, vocab=64,
    steps=2, warmup_steps=1, measure_memory=False, comm_timed_steps=0, paired=False,
)  # fmt: skip


def _expected(n: int) -> dict[str, float]:
    """Bus bytes per step of fsdp2_float8 on the GPT of SECTION, n ranks (n divides every dimension: no padding).
    A block's four Linear weights (qkv 3h x h, proj h x h, fc 4h x h, out h x 4h: 12 h^2) are gathered at one byte
    per element with its fp32 biases and LayerNorms (3h + h + 4h + h + 2 x 2h) in one uint8 buffer, twice (resharded
    after forward); the root (embeddings, final LayerNorm, the head, all fp32) once; every gradient reduce-scattered
    in fp32; the amaxes of the 4 L float8 weights all-reduced in fp32 once."""
    h, layers, vocab, seq = SECTION["d_model"], SECTION["n_layers"], SECTION["vocab"], SECTION["seq_len"]
    f8, hp, root = 12 * h * h, 13 * h, 2 * vocab * h + seq * h + 2 * h
    half = (n - 1) / n
    return {
        "all_gather:uint8": layers * 2 * half * (f8 + 4 * hp),
        "all_gather:float": half * 4 * root,
        "reduce_scatter:float": half * 4 * (layers * (f8 + hp) + root),
        "all_reduce:float": 2 * half * 4 * 4 * layers,
    }


def _rank(rank: int, n: int, trace_dir: str) -> dict[str, Any]:
    from pathlib import Path

    import torch

    from commbench.core import plugins
    from commbench.training import runner
    from commbench.training.config import TrainingConfig
    from commbench.training.float8 import FSDP2Float8

    plugins.load()
    sec = TrainingConfig.coerce(SECTION)
    out: dict[str, Any] = {}
    for name in ("fp32", "fsdp2_float8"):
        out[name] = profiled_policy(name, sec, Path(trace_dir) / name / f"rank{rank}.json")

    class RankBound(FSDP2Float8):
        """Refuses on rank 1 only: every rank must skip with rank 1's reason."""

        def environment_error(self, device: torch.device) -> str | None:
            return "rank 1 has no float8 GPU" if rank == 1 else None

    out["agreed"] = runner._agreed_environment_error(RankBound(), torch.device("cpu"), n)
    # a rank without torchao: the run skips each float8 policy with one line, the baseline runs
    out["rows"] = rows_without_torchao(runner, SECTION, ["fsdp2_float8"])
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    pytest.importorskip("torchao.float8")
    return run_in_world(_rank, nproc=2, timeout=150, trace_dir=str(tmp_path_factory.mktemp("float8")))


@pytest.mark.timeout(180)
def test_counted_bytes_equal_the_formula_and_the_profiler(world: list[dict[str, Any]]) -> None:
    want = _expected(2)
    for rank, r in enumerate(world):
        got = r["fsdp2_float8"]
        assert "Float8Linear" in got["layers"], rank
        assert got["expected"] == pytest.approx(want, rel=1e-12), rank
        for step, (_, _, comm) in enumerate(got["steps"]):  # the scales precomputed at wrap: step 0 moves the same
            assert comm == pytest.approx(want, rel=1e-12), (rank, step)
        calls, sizes, trace = traced_calls(got["trace"])
        assert calls == got["calls"] and sizes == got["sizes"], rank
        bus = {"all_gather": 1 / 2, "reduce_scatter": 1 / 2, "all_reduce": 1.0}  # nccl-tests' factors at n = 2
        assert {k: v * bus[k.split(":")[0]] for k, v in sizes.items()} == want, rank
        # one uint8 gather per block and pass, the root's in fp32, one amax all-reduce
        assert calls == {"all_gather:uint8": 4, "all_gather:float": 1, "reduce_scatter:float": 3, "all_reduce:float": 1}
        assert trace.world_size == 2 and trace.backend == "gloo" and all(c.group == (0, 1) for c in trace.calls)


@pytest.mark.timeout(180)
def test_drift_from_fp32_is_small_but_not_zero(world: list[dict[str, Any]]) -> None:
    """Float8 matmuls change the numbers a little (e4m3 has 3 mantissa bits): a per-step loss within 1 % of the
    fp32 baseline's and a gradient norm within 10 %, but not the same numbers (the conversion took)."""
    for r in world:
        for (loss, gn, _), (ref_loss, ref_gn, _) in zip(r["fsdp2_float8"]["steps"], r["fp32"]["steps"], strict=True):
            assert math.isfinite(loss) and math.isfinite(gn)
            assert loss == pytest.approx(ref_loss, rel=1e-2) and gn == pytest.approx(ref_gn, rel=1e-1)
            assert loss != ref_loss


@pytest.mark.timeout(180)
def test_a_missing_torchao_skips_with_one_line_and_fails_the_run(world: list[dict[str, Any]]) -> None:
    from commbench.cli.orchestrate import model_parallel_skipped
    from commbench.training.float8 import INSTALL_HINT

    rows = world[0]["rows"]
    assert [r["policy"] for r in rows] == ["fp32", "fsdp2_float8"] and not rows[0]["error"]
    assert rows[1]["error"] == f"fsdp2_float8 skipped: {INSTALL_HINT}" and rows[1]["steps"] == 0
    assert "fsdp2_float8" in model_parallel_skipped(rows) and "\n" not in model_parallel_skipped(rows)
    assert world[1]["rows"] == []  # rows are rank 0's
    assert world[0]["agreed"] == world[1]["agreed"] == "rank 1 has no float8 GPU"


def test_conversion_swaps_the_linears_float8_can_run() -> None:
    pytest.importorskip("torchao.float8")
    import torch.nn as nn

    from commbench.training.config import TrainingConfig
    from commbench.training.float8 import FSDP2Float8, torchao_float8
    from commbench.training.models import build_model

    f8, sharding = torchao_float8(), FSDP2Float8()
    gpt = build_model(TrainingConfig.coerce(SECTION))
    odd = nn.Sequential(nn.Linear(32, 48), nn.Linear(48, 40))  # 40 is not a multiple of 16
    for model, kept in ((gpt, {"head"}), (odd, {"1"})):
        units = zip(sharding.describe(model), _unit_params(model), strict=True)
        flags = {id(p): f for u, ps in units for p, f in zip(ps, u.float8, strict=True)}
        f8.convert_to_float8_training(model, module_filter_fn=sharding.converts)
        for fqn, m in model.named_modules():
            if isinstance(m, nn.Linear):
                converted = type(m).__name__ == "Float8Linear"
                assert converted == (fqn not in kept), fqn
                assert flags[id(m.weight)] == converted and (m.bias is None or not flags[id(m.bias)]), fqn
    assert sum(type(m).__name__ == "Float8Linear" for m in gpt.modules()) == 4 * SECTION["n_layers"]


def _unit_params(model: Any) -> list[list[Any]]:
    """The parameters of each unit `describe` returns, in its order (no BatchNorm here): each block's, the root's."""
    from commbench.training.strategies import blocks

    groups = [list(b.parameters()) for b in blocks(model)]
    inner = {id(p) for g in groups for p in g}
    return [*groups, [p for p in model.parameters() if id(p) not in inner]]


def test_skip_lines_without_torchao_and_on_gpus_older_than_sm89(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from commbench.training.float8 import INSTALL_HINT, FSDP2Float8

    sharding = FSDP2Float8()
    with monkeypatch.context() as m:
        for name in HIDDEN:
            m.setitem(sys.modules, name, None)
        assert sharding.environment_error(torch.device("cpu")) == INSTALL_HINT
        assert sharding.environment_error(torch.device("cuda", 0)) == INSTALL_HINT
    pytest.importorskip("torchao.float8")
    assert sharding.environment_error(torch.device("cpu")) is None  # CPU runs torch's own _scaled_mm
    asked: list[Any] = []
    for cc, ok in (((8, 6), False), ((8, 0), False), ((8, 9), True), ((9, 0), True), ((10, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None, cc=cc: asked.append(d) or cc)
        line = sharding.environment_error(torch.device("cuda", 1))
        assert (line is None) == ok, cc
        if not ok:
            assert line is not None and "\n" not in line
            assert f"is {cc[0]}.{cc[1]}" in line and ">= 8.9" in line and "cuda:1" in line
    assert asked and all(d == torch.device("cuda", 1) for d in asked)  # the rank's own device, not device 0


def test_a_skipped_float8_policy_counts_as_requested_but_not_run() -> None:
    from commbench.cli.orchestrate import model_parallel_skipped
    from commbench.training.records import skip_error, skipped_before_running

    ok = {"policy": "fp32", "parallelism": "dp", "error": ""}
    skipped = {"policy": "fsdp2_float8", "parallelism": "dp", "error": skip_error("fsdp2_float8", "no GPU")}
    failed = {"policy": "fp8_hook", "parallelism": "dp", "error": "rank 1 failed"}
    assert skipped_before_running(skipped) and not skipped_before_running(failed) and not skipped_before_running(ok)
    assert "fsdp2_float8" in model_parallel_skipped([ok, skipped])
    assert model_parallel_skipped([ok, failed]) == ""  # a data-parallel policy that failed is its row's, as before
    assert model_parallel_skipped([ok, skipped, {"policy": "tp_fp32", "parallelism": "tp", "error": ""}]) == ""


def test_formula_without_a_model_and_the_underflow_it_declares() -> None:
    """From Psi alone (the planner's question): one resharded unit of float8 weights, gathered twice at one byte per
    element, reduce-scattered in fp32; the gradients' e5m2 cast (amax to 57344, half the 2**-16 subnormal step)."""
    from commbench.core import plugins
    from commbench.training.policies import BASELINE, get_policy
    from commbench.training.runner import reference_of

    plugins.load()
    p = get_policy("fsdp2_float8")
    psi, n = 1 << 20, 4
    assert p.comm_bytes(psi=psi, world_size=n) == pytest.approx(
        {
            "all_gather:f8e4m3": 2 * psi * 3 / 4,
            "reduce_scatter:float": 4 * psi * 3 / 4,
            "all_reduce:float": 2 * 3 / 4 * 4,
        }
    )
    assert p.comm_bytes(psi=psi, world_size=1) == {}
    assert p.underflow.relative == 2.0**-17 / 57344 and p.underflow.absolute == 0.0
    assert reference_of(p) == BASELINE and p.family == "fsdp2" and p.sharding.parallelism == "dp"
