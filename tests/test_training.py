"""Tests for commbench.training: policies, section validation, byte/memory formulas, pitfalls, 2-rank runs.

The multi-process checks share ONE spawned 2-rank gloo world (module fixture `world`) that runs every
scenario once; the tests below read its results. References are independent of the code under test:
nccl-tests bus factors written out, parameter counts from a model built here, torch's own float8
casts, float64 arithmetic.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest
import torch
import torch.nn as nn

from commbench.training import TrainingConfig, list_policies
from commbench.training.comm import CommCounter, bus_factor
from commbench.training.models import build_model
from commbench.training.pitfalls import batchnorm_low_precision, fp16_unscaled, low_precision_grads
from commbench.training.policies import get_policy
from commbench.training.runner import fsdp_units
from commbench.training.strategies import GradScaling
from commbench.views.training_tables import bf16_vs_fp16, gain_table
from tests.distutil import run_in_world

N = 2
# Every test reading the shared world may be the one that spawns it (~35 s on 2 cores).
WORLD = pytest.mark.timeout(330)  # the "all" world runs every registered policy: generous under load

STABLE_NAMES = [
    "fp32", "amp_bf16", "amp_fp16", "amp_fp16_noscaler", "fp16_hook", "bf16_hook", "fp8_hook",
    "fsdp2_bf16_fp32reduce", "fsdp2_bf16", "fsdp2_fp16_scaler", "hsdp_fp32", "hsdp_bf16_fp32reduce", "hsdp_bf16",
    "fsdp1_bf16",
    "zero1_fp32", "zero1_bf16", "zero2_fp32", "zero2_bf16", "zero3_fp32", "zero3_bf16",
    "tp_fp32", "tp_bf16", "tp_bf16comm", "tp_sp_fp32", "tp_sp_bf16", "tp_sp_fp8", "tp_dp_fp32", "tp_dp_bf16",
    "tp_fp16", "tp_fp8comm", "tp_vocab_fp32",
    "pp_gpipe_fp32", "pp_gpipe_bf16", "pp_1f1b_fp32", "pp_1f1b_bf16",
    "pp_interleaved_fp32", "pp_interleaved_bf16", "pp_izb_fp32", "pp_zbv_fp32",
    "pp_gpipe_bf16comm", "pp_1f1b_bf16comm", "pp_1f1b_fp16", "pp_1f1b_fp8comm",
    "cp_fp32", "cp_bf16comm", "cp_bf16", "tp_pp_dp_fp32", "tp_pp_dp_bf16", "fsdp2_float8", "tp_float8",
    "tp_sp_float8",
]  # fmt: skip
TWO_D = {"tp_dp_fp32", "tp_dp_bf16"}  # TP x DP needs 4 ranks: at N = 2 a row that says why, nothing run
# two stages per rank on 2 ranks are 4 stages, more than GPT's 2 blocks: under "all" a row that says why (a named
# looped policy on this model is an error at load); they run in tests/test_pipeline_parallel*.py
LOOPED = {"pp_interleaved_fp32", "pp_interleaved_bf16", "pp_izb_fp32", "pp_zbv_fp32"}
THREE_D = {"tp_pp_dp_fp32", "tp_pp_dp_bf16"}  # 2 x 2 x 2 at least: at N = 2 a row that says why (tests/test_pipeline_parallel_3d.py)
SKIPPED = {**dict.fromkeys(TWO_D, "2-D TP x DP needs at least 4 ranks"),
           **dict.fromkeys(THREE_D, "3-D TP x PP x DP needs a world of tp_degree x pp_degree x dp with dp >= 2"),
           **dict.fromkeys(LOOPED, "pipeline parallelism over 4 stages needs at least 4 layers (one per stage)")}
if importlib.util.find_spec("torchao") is None:  # the test extra installs it; without it, the policies' skip line
    SKIPPED.update(dict.fromkeys(("fsdp2_float8", "tp_float8", "tp_sp_float8"), "float8 training needs torchao"))

GPT: dict[str, Any] = {"model": "gpt", "steps": 1, "warmup_steps": 1, "batch_size": 4, "seq_len": 16, "d_model": 32,
       "n_layers": 2, "n_heads": 4, "vocab": 64, "seed": 3,
       "paired": False, "comm_timed_steps": 0}  # fmt: skip  # rounds and timed steps: tests/test_paired_rounds.py, test_training_commtime.py
TINY_GRAD = {"model": "mlp", "policies": ["amp_fp16", "amp_fp16_noscaler"], "steps": 2, "warmup_steps": 1,
             "d_model": 32, "n_layers": 2, "vocab": 8, "loss_multiplier": 1e-7}  # fmt: skip
CONV = {"model": "convnet", "policies": ["amp_fp16", "fsdp2_bf16", "fsdp1_bf16", "zero3_bf16"], "steps": 1,
        "warmup_steps": 1, "d_model": 8, "n_layers": 2, "vocab": 10, "batch_size": 4}  # fmt: skip
BIG = {"model": "mlp", "policies": ["zero1_fp32", "zero2_fp32", "zero3_fp32"], "steps": 1, "warmup_steps": 2,
       "d_model": 640, "n_layers": 8, "batch_size": 2, "vocab": 8}  # fmt: skip

SUMMARY_COLUMNS = [
    "policy", "family", "model", "world_size", "backend", "device", "steps", "step_time_us_p50",
    "step_time_us_p95", "samples_per_s", "tokens_per_s", "peak_mem_bytes", "peak_mem_kind", "model_state_bytes",
    "comm_bytes_per_step", "comm_bytes_expected", "comm_by_op", "final_loss", "final_loss_drift",
    "max_grad_norm_drift", "skipped_steps", "nonfinite_steps", "underflow_frac", "speedup_vs_fp32",
    "mem_saved_vs_fp32", "comm_saved_vs_fp32", "warnings",
]  # fmt: skip
STEP_COLUMNS = [
    "policy", "step", "loss", "grad_norm", "step_time_us", "skipped", "nonfinite", "underflow_frac",
    "loss_drift", "grad_norm_drift",
]  # fmt: skip


# --- the shared world -----------------------------------------------------------------------------


def _counter_checks() -> dict[str, Any]:
    import torch.distributed as dist

    out: dict[str, Any] = {}
    orig = dist.all_reduce
    with CommCounter() as c:
        dist.all_reduce(torch.ones(1000))
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch >= 2.13 renamed it
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        gather(torch.empty(2 * 300, dtype=torch.bfloat16), torch.ones(300, dtype=torch.bfloat16))
        scatter(torch.empty(250, dtype=torch.float16), torch.ones(500, dtype=torch.float16))
        dist.all_to_all_single(torch.empty(64, dtype=torch.uint8), torch.ones(64, dtype=torch.uint8))
        dist.broadcast(torch.ones(10), src=0)
        with c.paused():
            dist.all_reduce(torch.ones(7))
        out["bus"] = c.snapshot()
        out["calls"] = dict(c.calls)
        out["wire_gloo"] = c.wire_bytes("gloo", N)
    out["restored"] = dist.all_reduce is orig
    return out


def _world_checks(rank: int, world_size: int) -> dict[str, Any]:
    from commbench.training import run_training as _run_training

    def run_training(*args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        summary, steps = _run_training(*args, **kwargs)  # typed records, compared below as plain rows
        return [r.as_dict() for r in summary], [r.as_dict() for r in steps]

    dev = torch.device("cpu")
    res: dict[str, Any] = {"counter": _counter_checks()}
    done: list[str] = []
    res["gpt"] = run_training(
        {**GPT, "policies": "all"}, device=dev, on_policy_done=lambda s, st: done.extend(r.policy for r in s)
    )
    res["gpt_done"] = done
    res["gpt_again"] = run_training({**GPT, "policies": ["fp32"]}, device=dev)
    res["resume"] = run_training({**GPT, "policies": ["fp32", "bf16_hook"]}, device=dev, skip={"fp32"})
    res["resume_done"] = run_training(
        {**GPT, "policies": ["fp32", "bf16_hook"]}, device=dev, skip={"fp32", "bf16_hook"}
    )
    res["tiny"] = run_training(TINY_GRAD, device=dev)
    res["conv"] = run_training(CONV, device=dev)
    res["big"] = run_training(BIG, device=dev)
    return res


@pytest.fixture(scope="module")
def world() -> list[dict[str, Any]]:
    return run_in_world(_world_checks, nproc=N, timeout=300)


def _summary(res: dict[str, Any], key: str) -> dict[str, dict[str, Any]]:
    return {r["policy"]: r for r in res[key][0]}


def _steps(res: dict[str, Any], key: str) -> pd.DataFrame:
    return pd.DataFrame(res[key][1])


# --- pure checks (no world) ----------------------------------------------------------------------


def test_policy_names_are_stable() -> None:
    assert list_policies() == STABLE_NAMES


def test_get_policy_unknown_names_choices() -> None:
    with pytest.raises(ValueError, match="unknown training policy 'fp9'.*fp32"):
        get_policy("fp9")


def test_validate_defaults_and_all() -> None:
    sec = TrainingConfig.from_dict({})
    assert sec.model == "gpt" and sec.policies == STABLE_NAMES
    assert TrainingConfig.from_dict({"policies": "fp16_hook"}).policies == ["fp16_hook"]


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        ({"modle": "gpt"}, r"unknown key training\.modle; valid keys: model"),
        ({"model": "resnet"}, r"training\.model='resnet' is not valid; valid: gpt, mlp, convnet"),
        ({"policies": ["fp32", "fp4"]}, r"unknown policy 'fp4'; valid: all, fp32"),
        ({"policies": []}, r"training\.policies=\[\] is not valid"),
        ({"steps": 0}, r"training\.steps=0 is not valid"),
        ({"warmup_steps": 0}, r"training\.warmup_steps=0 is not valid"),
        ({"batch_size": True}, r"training\.batch_size=True is not valid"),
        ({"lr": -1.0}, r"training\.lr=-1\.0 is not valid"),
        ({"loss_multiplier": float("nan")}, r"training\.loss_multiplier=nan is not valid"),
        ({"d_model": 30, "n_heads": 4}, r"d_model=30 must be divisible by training\.n_heads=4"),
        ({"measure_memory": "yes"}, r"training\.measure_memory='yes' is not valid"),
        # layouts no world can form are errors at suite load, not skips at run time (issue 35 item 4)
        ({"policies": ["tp_fp32"], "tp_degree": 3}, r"tp_fp32: n_heads=4 is not divisible by the TP degree 3; valid TP degrees: 2, 4"),
        ({"policies": ["tp_sp_fp32"], "tp_degree": 2, "seq_len": 63}, r"tp_sp_fp32: sequence parallelism needs seq_len divisible by the TP degree 2; seq_len=63"),
        ({"policies": ["pp_gpipe_fp32"], "pp_degree": 8, "n_layers": 4}, r"pp_gpipe_fp32: pipeline parallelism over 8 stages needs at least 8 layers \(one per stage\); n_layers=4"),
        ({"policies": ["pp_gpipe_fp32"], "pp_degree": 4, "n_layers": 3}, r"over 4 stages needs at least 4 layers"),
        ({"policies": ["pp_1f1b_fp32"], "pp_degree": 4, "n_layers": 4, "microbatches": 2}, r"1F1B needs at least as many micro-batches as stages; microbatches=2 < pp_degree=4"),
        ({"policies": ["pp_gpipe_fp32"], "pp_degree": 2, "microbatches": 3}, r"batch of 16 samples .* does not split into microbatches=3"),
        ({"policies": ["tp_fp32"], "model": "mlp", "vocab": 8}, r"tp_fp32: tensor parallelism needs the gpt model"),
    ],
)
def test_validate_rejects_with_one_clear_line(bad: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern) as info:
        TrainingConfig.from_dict(bad)
    assert "\n" not in str(info.value)


def test_all_policies_on_a_model_that_cannot_be_split_loads() -> None:
    # "all" asks for what applies: on the mlp the TP/PP policies skip at run time with their reason
    cfg = TrainingConfig.from_dict({"model": "mlp", "vocab": 8, "pp_degree": 2})
    assert "tp_fp32" in cfg.policies and "pp_gpipe_fp32" in cfg.policies


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_bus_factors_are_nccl_tests(n: int) -> None:
    assert bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        assert bus_factor(op, n) == pytest.approx((n - 1) / n)
    for op in ("broadcast", "reduce", "send"):
        assert bus_factor(op, n) == 1.0
    with pytest.raises(ValueError, match="unknown collective 'gathr'; valid: all_reduce"):
        bus_factor("gathr", n)


def test_counter_uninstalls_and_refuses_nesting() -> None:
    import torch.distributed as dist

    orig = dist.all_reduce
    with CommCounter():
        assert dist.all_reduce is not orig
        with pytest.raises(RuntimeError, match="already installed"), CommCounter():
            pass
    assert dist.all_reduce is orig


def analytic_model_state_bytes(policy: Any, psi: int, n: int) -> int:
    return int(policy.state_bytes(psi=psi, world_size=n))


def test_analytic_model_state_formulas() -> None:
    psi = 1000
    # By hand for n=4 (params + grads + Adam's two moments, fp32 master weights):
    assert analytic_model_state_bytes(get_policy("fp32"), psi, 4) == 4000 + 4000 + 8000
    assert analytic_model_state_bytes(get_policy("zero1_fp32"), psi, 4) == 4000 + 4000 + 2000
    assert analytic_model_state_bytes(get_policy("zero2_fp32"), psi, 4) == 12000 // 4 + 4000  # end of forward
    assert analytic_model_state_bytes(get_policy("zero2_bf16"), psi, 4) == 12000 // 4 + 2000
    assert analytic_model_state_bytes(get_policy("zero3_fp32"), psi, 4) == 16000 // 4
    assert analytic_model_state_bytes(get_policy("zero3_bf16"), psi, 16) == 16000 // 16
    # At n=2 the fp32 ladder is strict (16, 12, 10, 8 Psi); bf16 ZeRO-2's unsharded bf16 copy (2 Psi)
    # equals ZeRO-3's sharded grads (2 Psi), so they tie.
    m = {p: analytic_model_state_bytes(get_policy(p), psi, 2) for p in ("fp32", "zero1_fp32", "zero2_fp32",
                                                                        "zero3_fp32", "zero2_bf16", "zero3_bf16")}  # fmt: skip
    assert [m["fp32"], m["zero1_fp32"], m["zero2_fp32"], m["zero3_fp32"]] == [16 * psi, 12 * psi, 10 * psi, 8 * psi]
    assert m["zero2_bf16"] == m["zero3_bf16"] == 8 * psi


def test_fsdp_unit_shards_padded_per_wrapper() -> None:
    model = build_model(TrainingConfig.from_dict({"model": "mlp", "d_model": 5, "n_layers": 2, "vocab": 3}))
    # mlp: inp Linear(5,5) + 2 blocks Linear(5,5) + head Linear(5,3); n=3
    blk = 5 * 5 + 5
    root = blk + (5 * 3 + 3)
    f1 = fsdp_units(model, get_policy("zero3_fp32"), 3)
    assert [(u.shard_numel, u.gathers) for u in f1] == [(math.ceil(blk / 3), 2)] * 2 + [(math.ceil(root / 3), 1)]
    f2 = fsdp_units(model, get_policy("fsdp2_bf16"), 3)
    # FSDP2 pads dim 0 of each parameter: weight (5,5) -> 2 rows of 5, bias (5,) -> 2
    assert [u.shard_numel for u in f2] == [2 * 5 + 2, 2 * 5 + 2, (2 * 5 + 2) + (1 * 5 + 1)]
    assert all(u.param_dtype == torch.bfloat16 for u in f2)


def test_pitfall_detectors() -> None:
    noscaler, scaled, bf16 = get_policy("amp_fp16_noscaler"), get_policy("amp_fp16"), get_policy("amp_bf16")
    assert fp16_unscaled(noscaler, 0.40, 0.01, 0, 0) is not None
    assert fp16_unscaled(noscaler, 0.015, 0.01, 0, 0) is None  # within the 1 % margin of the baseline's zeros
    assert "1 non-finite" in (fp16_unscaled(noscaler, 0.0, 0.0, 1, 0) or "")
    assert fp16_unscaled(scaled, 0.9, 0.0, 3, 0) is None
    assert fp16_unscaled(bf16, 0.9, 0.0, 0, 0) is None
    assert batchnorm_low_precision([("float16", "float32")]) and batchnorm_low_precision([("float32", "bfloat16")])
    assert batchnorm_low_precision([("bfloat16", "float32"), ("float32", "float32")]) == []
    assert "bfloat16" in (low_precision_grads({(torch.float32, torch.bfloat16)}) or "")
    assert low_precision_grads({(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)}) is None
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    fsdp_fp16 = get_policy("fsdp2_fp16_scaler")
    assert "use ShardedGradScaler" in "".join(replace(fsdp_fp16, loss_scaling=GradScaling()).pitfalls())
    assert fsdp_fp16.pitfalls() == [] and isinstance(fsdp_fp16.loss_scaling.make(torch.device("cpu")), ShardedGradScaler)
    assert scaled.pitfalls() == []


def test_gain_tables_from_rows() -> None:
    df = pd.DataFrame(
        [
            {"policy": "fp32", "family": "ddp", "speedup_vs_fp32": 1.0, "comm_saved_vs_fp32": 0.0},
            {"policy": "bf16_hook", "family": "ddp", "speedup_vs_fp32": 1.2, "comm_saved_vs_fp32": 0.5},
            {"policy": "fp16_hook", "family": "ddp", "speedup_vs_fp32": 1.1, "comm_saved_vs_fp32": 0.5},
        ]
    )
    g = gain_table(df)
    assert list(g["policy"]) == ["fp32", "bf16_hook", "fp16_hook"] and "speedup_vs_fp32" in g.columns
    side = bf16_vs_fp16(df)
    assert side.to_dict("records") == [
        {"bf16_policy": "bf16_hook", "fp16_policy": "fp16_hook", "bf16_speedup_vs_fp32": 1.2,
         "fp16_speedup_vs_fp32": 1.1, "bf16_comm_saved_vs_fp32": 0.5, "fp16_comm_saved_vs_fp32": 0.5}
    ]  # fmt: skip


# --- the 2-rank runs -------------------------------------------------------------------------------


@WORLD
def test_comm_counter_sizes_are_nccl_tests(world: list[dict[str, Any]]) -> None:
    c = world[0]["counter"]
    h = (N - 1) / N
    assert c["bus"] == {
        "all_reduce:float": 2 * h * 4000,  # buffer
        "all_gather:bfloat16": h * 600 * 2,  # total output
        "reduce_scatter:half": h * 500 * 2,  # total input
        "all_to_all:uint8": h * 64,  # per-rank buffer
        "broadcast:float": 40.0,
    }
    assert c["calls"]["all_reduce:float"] == 1  # the paused all_reduce is not counted
    assert c["wire_gloo"] == pytest.approx(sum(c["bus"].values()) + h * 1000)  # gloo RS = AR of the input
    assert c["restored"]


@WORLD
def test_every_policy_runs_and_writes_rows(world: list[dict[str, Any]]) -> None:
    summary, steps = world[0]["gpt"]
    assert [r["policy"] for r in summary] == STABLE_NAMES
    assert world[0]["gpt_done"] == STABLE_NAMES  # on_policy_done once per policy, in order
    assert world[1]["gpt"] == ([], [])  # complete rows on rank 0 only
    for r in summary:
        if r["policy"] in SKIPPED:
            why = f"{r['policy']} skipped: {SKIPPED[r['policy']]}"
            assert r["steps"] == 0 and r["error"].startswith(why), r
            continue
        assert r["error"] == "", r
        assert set(SUMMARY_COLUMNS) <= set(r)
        assert r["steps"] == GPT["steps"] and r["world_size"] == N and r["backend"] == "gloo"
        assert r["step_time_us_p50"] > 0 and r["samples_per_s"] > 0
        assert r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * GPT["seq_len"])
        assert r["peak_mem_bytes"] > 0 and r["peak_mem_kind"] == "cpu_heap"
        assert math.isfinite(r["final_loss"]) and r["nonfinite_steps"] == 0
    df = pd.DataFrame(steps)
    assert set(STEP_COLUMNS) <= set(df.columns)
    per_policy = int(GPT["steps"]) + int(GPT["warmup_steps"])
    ran = [p for p in STABLE_NAMES if p not in SKIPPED]
    assert df.groupby("policy").size().to_dict() == dict.fromkeys(ran, per_policy)


def _gpt_counts() -> tuple[int, int]:
    # Independent of the code under test's bookkeeping: count parameters of a model built here.
    model = build_model(TrainingConfig.from_dict(GPT))
    psi = sum(p.numel() for p in model.parameters())
    blocks: nn.ModuleList = model.blocks  # type: ignore[assignment]
    root = psi - sum(p.numel() for b in blocks for p in b.parameters())
    assert all(p.shape[0] % N == 0 for p in model.parameters())  # no FSDP padding at these sizes
    return psi, root


@WORLD
def test_measured_comm_bytes_equal_formulas(world: list[dict[str, Any]]) -> None:
    s = {p: r for p, r in _summary(world[0], "gpt").items() if p not in SKIPPED}  # skipped at N = 2
    psi, root = _gpt_counts()
    ar, h = 2 * (N - 1) / N, (N - 1) / N
    by_op = {p: json.loads(r["comm_by_op"]) for p, r in s.items()}
    # DDP: 2(n-1)/n * Psi * bytes per element
    assert by_op["fp32"] == {"all_reduce:float": ar * psi * 4}
    assert by_op["amp_bf16"] == {"all_reduce:float": ar * psi * 4}
    assert by_op["fp16_hook"] == {"all_reduce:half": ar * psi * 2}
    assert by_op["bf16_hook"] == {"all_reduce:bfloat16": ar * psi * 2}
    # ZeRO-1 in torch: DDP all-reduce + every fp32 parameter broadcast once by its owner
    assert by_op["zero1_fp32"] == {"all_reduce:float": ar * psi * 4, "broadcast:float": psi * 4}
    # FSDP / ZeRO-3: all-gathers in the param dtype (twice per unit, once for the root) + reduce-scatter
    gathered = 2 * psi - root
    assert by_op["zero3_fp32"] == {"all_gather:float": h * gathered * 4, "reduce_scatter:float": h * psi * 4}
    assert by_op["zero3_bf16"] == {"all_gather:bfloat16": h * gathered * 2, "reduce_scatter:bfloat16": h * psi * 2}
    assert by_op["fsdp2_bf16"] == by_op["zero3_bf16"]
    assert by_op["fsdp2_bf16_fp32reduce"] == {
        "all_gather:bfloat16": h * gathered * 2,
        "reduce_scatter:float": h * psi * 4,
    }
    # HSDP on one node: FSDP2 (its replicate group is one rank and moves nothing)
    assert by_op["hsdp_bf16"] == by_op["zero3_bf16"] and by_op["hsdp_fp32"] == by_op["zero3_fp32"]
    # ZeRO-2 (SHARD_GRAD_OP): gathered once per step
    assert by_op["zero2_fp32"] == {"all_gather:float": h * psi * 4, "reduce_scatter:float": h * psi * 4}
    # fp8: 1 byte per element + one fp32 scale per chunk, all_to_all + all_gather
    chunks = math.ceil(psi / N) * N  # one DDP bucket at this size
    assert by_op["fp8_hook"] == {"all_to_all:uint8": h * chunks, "all_gather:uint8": h * chunks,
                                 "all_to_all:float": h * N * 4, "all_gather:float": h * N * 4}  # fmt: skip
    for p, r in s.items():
        assert by_op[p] == json.loads(r["comm_expected_by_op"]), p
        assert r["comm_bytes_per_step"] == pytest.approx(r["comm_bytes_expected"])
    assert s["fp16_hook"]["comm_saved_vs_fp32"] == pytest.approx(0.5)
    assert "reduce_scatter as an all_reduce" in s["zero3_fp32"]["notes"]
    assert s["zero3_fp32"]["comm_wire_bytes_per_step"] == pytest.approx(h * gathered * 4 + ar * psi * 4)


@WORLD
def test_fp32_drift_against_itself_is_exactly_zero(world: list[dict[str, Any]]) -> None:
    steps = _steps(world[0], "gpt")
    fp32 = steps[steps.policy == "fp32"]
    assert (fp32.loss_drift == 0.0).all() and (fp32.grad_norm_drift == 0.0).all()
    assert _summary(world[0], "gpt")["fp32"]["final_loss_drift"] == 0.0
    # A second, independent run of the baseline on the same data reproduces it bit for bit.
    again = _steps(world[0], "gpt_again")
    assert list(again.loss) == list(fp32.loss) and list(again.grad_norm) == list(fp32.grad_norm)


@WORLD
def test_low_precision_drift_is_bounded_by_format(world: list[dict[str, Any]]) -> None:
    # Step 0: identical weights and data, so the gradient differs from fp32 only by the format's rounding.
    steps = _steps(world[0], "gpt")
    first = steps[steps.step == 0].set_index("policy").grad_norm_drift.abs()
    assert first["fp16_hook"] < 2.0**-10 and first["bf16_hook"] < 2.0**-7
    assert 0 < first["fp8_hook"] < 2.0**-3
    assert first["zero3_fp32"] < 1e-6 and first["zero1_fp32"] == 0.0


@WORLD
def test_noscaler_detector_fires_only_without_scaler(world: list[dict[str, Any]]) -> None:
    s = _summary(world[0], "tiny")
    assert s["amp_fp16_noscaler"]["warnings"].startswith("fp16 without loss scaling")
    assert s["amp_fp16_noscaler"]["underflow_frac"] > 0.5
    assert "fp16 without loss scaling" not in s["amp_fp16"]["warnings"]
    assert s["amp_fp16"]["underflow_frac"] < 0.05
    assert s["fp32"]["warnings"] == ""


@WORLD
def test_batchnorm_pitfall_and_fp32_batchnorm_units(world: list[dict[str, Any]]) -> None:
    s = _summary(world[0], "conv")
    assert all(r["error"] == "" for r in s.values()), s
    assert "BatchNorm running in low precision (input float16" in s["amp_fp16"]["warnings"]
    # FSDP keeps BatchNorm as fp32 units under mixed precision: no BatchNorm warning, and fp32
    # traffic for its parameters in the formulas.
    for p in ("fsdp2_bf16", "fsdp1_bf16", "zero3_bf16"):
        assert "BatchNorm" not in s[p]["warnings"]
        by_op = json.loads(s[p]["comm_by_op"])
        assert by_op == json.loads(s[p]["comm_expected_by_op"]) and "all_gather:float" in by_op
    # DDP re-broadcasts BatchNorm buffers from rank 0 every forward: running mean/var + the int64 counter
    model = build_model(TrainingConfig.from_dict(CONV))
    buf = sum(b.numel() * b.element_size() for b in model.buffers() if b.dtype == torch.float32)
    assert json.loads(s["fp32"]["comm_by_op"])["broadcast:float"] == buf
    assert json.loads(s["fp32"]["comm_by_op"])["broadcast:int64"] == 8 * sum(
        isinstance(m, nn.BatchNorm2d) for m in model.modules()
    )


@WORLD
def test_model_state_memory_orders_zero_stages(world: list[dict[str, Any]]) -> None:
    s = _summary(world[0], "big")
    measured = [s[p]["peak_mem_bytes"] for p in ("zero3_fp32", "zero2_fp32", "zero1_fp32", "fp32")]
    assert measured == sorted(measured) and len(set(measured)) == 4, measured
    analytic = [s[p]["model_state_bytes"] for p in ("zero3_fp32", "zero2_fp32", "zero1_fp32", "fp32")]
    psi = s["fp32"]["params"]
    assert analytic == [8 * psi, 10 * psi, 12 * psi, 16 * psi]
    # the measured peak holds at least the model state the formula says must be live
    assert all(m >= a for m, a in zip(measured, analytic, strict=True))


@WORLD
def test_resume_skips_done_policies_but_keeps_the_baseline(world: list[dict[str, Any]]) -> None:
    summary, steps = world[0]["resume"]
    assert [r["policy"] for r in summary] == ["bf16_hook"] and set(pd.DataFrame(steps).policy) == {"bf16_hook"}
    # drift still measured against a freshly run fp32 baseline on identical data: same as in the full run
    full = _summary(world[0], "gpt")["bf16_hook"]
    assert summary[0]["final_loss_drift"] == full["final_loss_drift"]
    assert world[0]["resume_done"] == ([], [])


# --- tests/distutil.py itself ---------------------------------------------------------------------


def _fail_on_rank_1(rank: int, world_size: int) -> int:
    if rank == 1:
        raise RuntimeError("boom on purpose")
    import torch.distributed as dist

    dist.barrier()  # rank 0 waits here for a peer that never comes: the helper must not wait for it
    return rank


def _hang(rank: int, world_size: int) -> None:
    import time

    time.sleep(60)


@pytest.mark.timeout(60)
def test_run_in_world_names_the_failing_rank_and_leaves_no_process() -> None:
    import multiprocessing as mp

    from tests.distutil import WorldError

    with pytest.raises(WorldError, match=r"rank 1 failed:(.|\n)*boom on purpose"):
        run_in_world(_fail_on_rank_1, nproc=2, timeout=30)
    with pytest.raises(WorldError, match=r"ranks \[0, 1\] did not finish within 3 s"):
        run_in_world(_hang, nproc=2, timeout=3)
    assert mp.active_children() == []
