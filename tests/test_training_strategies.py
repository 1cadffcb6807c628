"""Tests for the training strategy objects: formulas against independent references, and a toy policy.

References: nccl-tests bus factors written out (all_reduce 2(n-1)/n, all_gather / reduce_scatter (n-1)/n);
ZeRO (Rajbhandari et al. 2020), Figure 1: Psi = 7.5e9, N_d = 64, mixed-precision Adam (2 + 2 + K bytes per
parameter, K = 12) -> 120 GB baseline, 31.4 GB P_os, 16.6 GB P_os+g, 1.9 GB P_os+g+p.

The toy policy ("add a policy" recipe): a new GradComm kind, defined and registered from this file alone,
runs 2 steps on a 2-rank gloo world; its measured bytes must equal its own formula and an independent
count. No `from __future__ import annotations` here: DDP checks a hook's annotations against the real
classes.
"""

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist

from commbench.core.records import TrainingStep, TrainingSummary
from commbench.training import TrainingConfig
from commbench.training.models import build_model
from commbench.training.policies import Policy, get_policy, list_policies, register_policy, unregister_policy
from commbench.training.strategies import (
    ALL_REDUCE,
    DDP,
    FSDP1,
    CastHook,
    CodecHook,
    GradComm,
    ModelState,
    ZeRO1,
)
from tests.distutil import run_in_world

N = 2


# --- formulas, without any torch module -----------------------------------------------------------


@pytest.mark.parametrize(("psi", "n"), [(1000, 2), (123_457, 3), (70e9, 512)])
def test_ddp_bytes_are_two_n_minus_one_over_n_psi_bytes(psi: float, n: int) -> None:
    ring = 2 * (n - 1) / n
    assert DDP().comm_bytes(psi=psi, world_size=n) == {"all_reduce:float": pytest.approx(ring * psi * 4)}
    fp16 = DDP().comm_bytes(psi=psi, world_size=n, grad_comm=CastHook("float16"))
    assert fp16 == {"all_reduce:half": pytest.approx(ring * psi * 2)}
    # fp8 codec: 1 byte per element (+ one fp32 scale per chunk, + padding), all_to_all + all_gather
    fp8 = DDP().comm_bytes(psi=psi, world_size=n, grad_comm=CodecHook("fp8_e4m3"))
    assert sum(v for k, v in fp8.items() if k.endswith(":uint8")) == pytest.approx(ring * psi, rel=1e-3)
    assert DDP().comm_bytes(psi=psi, world_size=1) == {}


def test_capacity_planner_question_70b_on_512_ranks() -> None:
    psi, n = 70e9, 512
    h = (n - 1) / n
    zero3 = get_policy("zero3_bf16").comm_bytes(psi=psi, world_size=n)
    # gathered for forward and again for backward, reduce-scattered once, all in bf16
    assert zero3 == {
        "all_gather:bfloat16": pytest.approx(2 * h * psi * 2, rel=1e-9),
        "reduce_scatter:bfloat16": pytest.approx(h * psi * 2, rel=1e-9),
    }
    zero2 = get_policy("zero2_fp32").comm_bytes(psi=psi, world_size=n)
    assert zero2 == {"all_gather:float": pytest.approx(h * psi * 4), "reduce_scatter:float": pytest.approx(h * psi * 4)}
    # ZeRO-1 in torch: the DDP all-reduce plus every fp32 parameter broadcast once by its owner
    assert get_policy("zero1_fp32").comm_bytes(psi=psi, world_size=n) == {
        "all_reduce:float": pytest.approx(2 * h * psi * 4),
        "broadcast:float": pytest.approx(psi * 4),
    }
    assert get_policy("fp32").state_bytes(psi=psi, world_size=n) == pytest.approx(16 * psi)
    assert get_policy("zero3_fp32").state_bytes(psi=psi, world_size=n) == pytest.approx(16 * psi / n)


def test_zero_paper_figure_1_memory() -> None:
    psi, nd, k = 7.5e9, 64, 12
    mixed_adam = ModelState(param_bytes=2, grad_bytes=2, optimizer_bytes=k)
    gb = 1e9
    stages = {
        "baseline": (DDP(), (2 + 2 + k) * psi, 120.0),
        "P_os": (ZeRO1(), 2 * psi + 2 * psi + k * psi / nd, 31.4),
        # ZeRO-2 keeps the (bf16) parameters whole; torch's SHARD_GRAD_OP keeps them from forward to backward
        "P_os+g": (FSDP1(reshard_after_forward=False, param_dtype_name="bfloat16"), 2 * psi + (2 + k) * psi / nd, 16.6),
        "P_os+g+p": (FSDP1(), (2 + 2 + k) * psi / nd, 1.9),
    }
    for name, (sharding, formula, paper_gb) in stages.items():
        got = sharding.state_bytes(psi=psi, world_size=nd, state=mixed_adam)
        assert got == pytest.approx(formula), name
        assert got / gb == pytest.approx(paper_gb, abs=0.05), name


# --- typed config and records -----------------------------------------------------------------------


def test_training_config_is_typed_and_round_trips() -> None:
    cfg = TrainingConfig.from_dict({"model": "gpt", "d_model": 16, "vocab": 4, "lr": 1})  # every policy runs a gpt
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and cfg.policies == list_policies()
    assert TrainingConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"training\.steps=-1"):
        cfg.replace(steps=-1)
    with pytest.raises(ValueError, match=r"\[training\] must be a table"):
        TrainingConfig.from_dict(["gpt"])  # type: ignore[arg-type]


def test_training_records_keep_the_csv_columns() -> None:
    assert TrainingSummary.TABLE == "training" and TrainingStep.TABLE == "training_steps"
    assert TrainingSummary.columns() == (
        "policy", "family", "parallelism", "reference_policy", "description", "comm_dtype", "model", "params", "world_size", "backend", "device",
        "steps", "warmup_steps", "step_time_us_p50", "step_time_us_p95", "step_time_us_ci_low",
        "step_time_us_ci_high", "samples_per_s", "tokens_per_s",
        "peak_mem_bytes", "peak_mem_kind", "model_state_bytes", "model_state_kind", "comm_bytes_per_step",
        "comm_bytes_expected", "comm_wire_bytes_per_step", "nodes", "comm_bytes_intra_per_step",
        "comm_bytes_inter_per_step", "comm_bytes_inter_expected", "comm_inter_by_op", "comm_by_op", "comm_expected_by_op",
        "comm_time_us", "comm_time_ci_low_us", "comm_time_ci_high_us",
        "p2p_time_us", "bubble_frac_measured", "bubble_frac_theory", "stage_busy_us", "stage_idle_us", "final_loss",
        "final_loss_drift", "max_grad_norm_drift", "skipped_steps", "nonfinite_steps", "underflow_frac",
        "speedup_vs_fp32", "speedup_ci_low", "speedup_ci_high", "speedup_significant",
        "speedup_vs_reference", "speedup_ref_ci_low", "speedup_ref_ci_high", "speedup_ref_rounds", "speedup_ref_basis",
        "speedup_ref_times_us", "mem_saved_vs_fp32", "comm_saved_vs_fp32", "warnings", "notes", "error",
    )  # fmt: skip
    assert TrainingStep.columns() == (
        "policy", "step", "warmup", "loss", "grad_norm", "step_time_us", "skipped", "nonfinite", "underflow_frac",
        "loss_drift", "grad_norm_drift", "comm_bytes",
    )  # fmt: skip
    for rec in (TrainingSummary, TrainingStep):
        assert all(doc and "\n" not in doc for doc in rec.docs().values())


def test_a_sharded_policy_refuses_a_ddp_hook() -> None:
    with pytest.raises(ValueError, match="takes no gradient hook"):
        Policy(name="bad", family="fsdp1", description="", sharding=FSDP1(), grad_comm=CastHook("bfloat16"))
    assert Policy(name="ok", family="fsdp1", description="", sharding=FSDP1(), grad_comm=ALL_REDUCE)


# --- the toy policy: a new GradComm kind, registered from this file -------------------------------------


def _gather(out: torch.Tensor, inp: torch.Tensor) -> None:
    # looked up per call so a CommCounter installed later sees it (torch 2.13 renamed the function)
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp)


def gather_half_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """All-gather every rank's fp16 bucket, average in fp32 locally."""
    n = dist.get_world_size()
    buffer = bucket.buffer()
    out = torch.empty(n * buffer.numel(), dtype=torch.float16)
    _gather(out, buffer.to(torch.float16))
    buffer.copy_(out.view(n, -1).float().mean(dim=0))
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buffer)
    return fut


@dataclass(frozen=True, slots=True)
class GatherHalf(GradComm):
    """Toy gradient communication: all_gather of the fp16 buckets."""

    wire: str = "fp16"

    def hook(self) -> Any:
        return gather_half_hook

    def comm_bytes(self, *, psi: float, world_size: int, bucket_numels: Sequence[int] = ()) -> dict[str, float]:
        n = world_size
        return {"all_gather:half": sum((n - 1) / n * n * numel * 2 for numel in bucket_numels)}


TOY = Policy(name="toy_gather_fp16", family="ddp", description="DDP, fp16 all_gather toy hook", grad_comm=GatherHalf())
TOY_SECTION = {"model": "mlp", "policies": [TOY.name], "d_model": 16, "n_layers": 1, "vocab": 4, "steps": 2,
               "warmup_steps": 1, "measure_memory": False}  # fmt: skip


@pytest.fixture
def toy_registered() -> Iterator[Policy]:
    register_policy(TOY)
    try:
        yield TOY
    finally:
        unregister_policy(TOY.name)


def _run_toy(rank: int, world_size: int) -> list[dict[str, Any]]:
    from commbench.training import run_training

    register_policy(TOY)  # a fresh rank process: the registry holds only the built-in policies
    summary, _ = run_training(TOY_SECTION, device=torch.device("cpu"))
    return [r.as_dict() for r in summary]


def test_toy_policy_is_listed_and_validated(toy_registered: Policy) -> None:
    assert list_policies()[-1] == TOY.name and get_policy(TOY.name) is TOY
    assert TrainingConfig.from_dict(TOY_SECTION).policies == [TOY.name]
    with pytest.raises(ValueError, match="already registered"):
        register_policy(TOY)


@pytest.mark.timeout(120)
def test_toy_policy_runs_and_its_bytes_match_its_formula() -> None:
    rows = {r["policy"]: r for r in run_in_world(_run_toy, nproc=N, timeout=100)[0]}
    toy = rows[TOY.name]
    assert toy["error"] == "" and toy["comm_dtype"] == "fp16" and math.isfinite(toy["final_loss"])
    measured = json.loads(toy["comm_by_op"])
    assert measured == json.loads(toy["comm_expected_by_op"])
    # independent count: every rank receives (n-1) fp16 copies of all Psi gradients
    model = build_model(TrainingConfig.from_dict({**TOY_SECTION, "policies": "all"}))
    psi = sum(p.numel() for p in model.parameters())
    assert measured == {"all_gather:half": pytest.approx((N - 1) * psi * 2)}
    # the fp16 all-gather carries half the fp32 all-reduce's bytes at n = 2
    assert toy["comm_saved_vs_fp32"] == pytest.approx(0.5)


# --- underflow thresholds: attributes of the strategy objects, for any registered codec ----------------


E5M2 = Policy(name="toy_e5m2_hook", family="ddp", description="DDP, fp8 e5m2 codec hook", grad_comm=CodecHook("fp8_e5m2"))


def test_underflow_thresholds_come_from_the_strategy_objects() -> None:
    # half the smallest subnormal relative to the format's maximum (the scale maps the amax onto it)
    assert get_policy("fp8_hook").underflow.relative == 2.0**-10 / 448
    assert E5M2.underflow.relative == 2.0**-17 / 57344 and E5M2.underflow.absolute == 0.0
    assert get_policy("fp16_hook").underflow.absolute == 2.0**-25
    assert get_policy("amp_bf16").underflow.absolute == 2.0**-134
    assert (get_policy("fp32").underflow.absolute, get_policy("fp32").underflow.relative) == (0.0, 0.0)
    assert get_policy("amp_fp16_noscaler").loss_scaling_format == "fp16"
    assert get_policy("bf16_hook").loss_scaling_format is None and E5M2.loss_scaling_format is None
    # a hook without its own threshold: the torch dtype its wire names, else exact zeros only
    assert TOY.underflow.absolute == 2.0**-25
    unknown = GatherHalf(wire="int4")
    assert (unknown.underflow.absolute, unknown.underflow.relative) == (0.0, 0.0)


def test_a_hook_that_cannot_run_fails_at_registration() -> None:
    bad = Policy(name="toy_bad_codec", family="ddp", description="", grad_comm=CodecHook("int3"))
    with pytest.raises(ValueError, match="training policy 'toy_bad_codec': unknown codec 'int3'.*fp8_e4m3"):
        register_policy(bad)
    assert bad.name not in list_policies()


def _run_e5m2(rank: int, world_size: int) -> list[dict[str, Any]]:
    from commbench.training import run_training

    register_policy(E5M2)
    summary, _ = run_training({**TOY_SECTION, "policies": [E5M2.name]}, device=torch.device("cpu"))
    return [r.as_dict() for r in summary]


@pytest.mark.timeout(120)
def test_fp8_e5m2_codec_hook_runs() -> None:
    rows = {r["policy"]: r for r in run_in_world(_run_e5m2, nproc=N, timeout=100)[0]}
    row = rows[E5M2.name]
    assert row["error"] == "" and row["comm_dtype"] == "fp8_e5m2" and math.isfinite(row["final_loss"])
    assert 0.0 <= row["underflow_frac"] < 1.0
    assert json.loads(row["comm_by_op"]) == pytest.approx(json.loads(row["comm_expected_by_op"]))
