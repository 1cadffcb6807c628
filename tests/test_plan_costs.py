"""Costs of the step-time model that published runs showed were missing, each against an independent formula: FP8
GEMMs at the FP8 peak with Transformer Engine's casts (MLPerf's GPT-3), the parameter gather overlapped with the next
forward (Megatron-Core's --overlap-param-gather), all-gather context parallelism exposed (Llama 3, section 3.3.2),
eager attention's score traffic (runs before FlashAttention) and flash attention's recompute of QK^T."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from commbench import cli
from commbench.planning.calls import Call, Pricer
from commbench.planning.compute import GPUS
from commbench.planning.layout_plan import plan_layout
from commbench.planning.presets import MODELS

pytestmark = pytest.mark.timeout(120)

GPT3 = MODELS["gpt3-175b"]


def test_fp8_gemms_run_the_projections_and_mlp_at_the_fp8_peak() -> None:
    kw = {"model_preset": "gpt3-175b", "gpu": "h100", "tp": 8, "pp": 8, "dp": 2, "global_batch": 64,
          "kernel_efficiency": 0.6}  # fmt: skip
    bf16 = plan_layout(**kw).iloc[0]  # type: ignore[arg-type]
    fp8 = plan_layout(fp8_gemms=True, **kw).iloc[0]  # type: ignore[arg-type]
    # Megatron's count per token and layer forward, GeLU MLP of 4h, kv = heads: 24 h^2 of GEMMs + 4 s h of core;
    # three passes without recompute. Only the 24 h^2 part moves, from 989 to 1979 TFLOP/s (H100 datasheet, dense)
    h = GPT3.hidden
    tokens_per_gpu = GPT3.seq / 8  # micro-batch 1 over TP 8
    mbs, layers_per_stage = 64 // 2, GPT3.layers / 8
    gemm = 3 * 24 * h * h * tokens_per_gpu
    want = mbs * layers_per_stage * gemm * (1 / (989e12 * 0.6) - 1 / (1979e12 * 0.6))
    # and Transformer Engine casts each FP8 layer's input (forward) and output gradient (backward) with its transpose,
    # 2 + 1 + 1 bytes per element, at 80 % of 3.35 TB/s: inputs QKV h, projection h/8, fc1 h, fc2 4h/8 per token of
    # the whole sequence; gradients QKV 3h/8, projection h, fc1 4h/8, fc2 h
    casts = 4 * GPT3.seq * ((2 * h + h / 8 + 4 * h / 8) + (3 * h / 8 + 2 * h + 4 * h / 8))
    want -= mbs * layers_per_stage * casts / (0.8 * 3350e9)
    assert bf16["compute_s"] - fp8["compute_s"] == pytest.approx(want, rel=1e-9)
    assert fp8["step_time_s"] < bf16["step_time_s"]
    assert fp8["mfu"] == pytest.approx(bf16["mfu"] * bf16["step_time_s"] / fp8["step_time_s"])  # bf16 peak's MFU
    with pytest.raises(ValueError, match="a100 has no float8 peak"):
        plan_layout(fp8_gemms=True, **{**kw, "gpu": "a100"})  # type: ignore[arg-type]


def test_overlapped_parameter_gather_hides_behind_the_next_forward() -> None:
    # Megatron-Core's --overlap-param-gather: ZeRO-1's all-gather after the step runs bucket by bucket during the
    # next first forward of the stage; exposed: what exceeds that forward, at least the first bucket
    kw = {"model_preset": "gpt3-175b", "gpu": "h100", "tp": 8, "pp": 6, "dp": 48, "global_batch": 1152,
          "strategies": ["zero1"], "sequence_parallel": True, "kernel_efficiency": 0.6}  # fmt: skip
    after = plan_layout(**kw).iloc[0]  # type: ignore[arg-type]
    during = plan_layout(overlap_param_gather=True, **kw).iloc[0]  # type: ignore[arg-type]
    # the stage's parameters over TP, bf16, in Megatron's buckets of max(40M, 1M x DP) = 48M; the DP group spans
    # 48 nodes (TP 8 fills each), 8 groups share each node's NICs
    # (16 layers a stage; the last also holds the tied output layer and the final norm)
    elems = (16 * GPT3.layer_params + GPT3.hidden * GPT3.vocab + 2 * GPT3.hidden) / 8
    bucket = Pricer(GPUS["h100"], 8).price(Call("all_gather", 48e6 * 2, 48, 48, 8)).mid
    total = math.ceil(elems / 48e6) * bucket
    forward = 16 * (24 * GPT3.hidden**2 + 4 * GPT3.seq * GPT3.hidden) * GPT3.seq / 8 / (989e12 * 0.6)
    assert total - bucket > forward  # here the forward is the shorter: all of it is a window
    hidden = after["comm_exposed_s"] - during["comm_exposed_s"]
    assert hidden == pytest.approx(forward, rel=1e-6)
    assert "exposed: after the optimizer step" in after["comm_exposure"]
    assert "during the next first forward (--overlap-param-gather)" in during["comm_exposure"]


def test_fp8_weights_are_gathered_and_held_at_one_byte() -> None:
    # Megatron-Core's --fp8-param-gather (NeMo's fp8_params): Transformer Engine's FP8 weights, so the distributed
    # optimizer's parameter all-gather after the step moves one byte per parameter, and the weights take one byte
    kw = {"model_preset": "llama3-8b", "gpu": "h100", "tp": 1, "pp": 1, "dp": 8, "global_batch": 32,
          "strategies": ["zero1"], "fp8_gemms": True, "kernel_efficiency": 0.6}  # fmt: skip
    bf16 = plan_layout(**kw).iloc[0]  # type: ignore[arg-type]
    fp8 = plan_layout(fp8_param_gather=True, **kw).iloc[0]  # type: ignore[arg-type]
    psi = MODELS["llama3-8b"].params
    # Megatron's buckets of max(40M, 1M x DP) parameters over the node's 8 GPUs; the gather is exposed (after the
    # optimizer step, no --overlap-param-gather)
    pr = Pricer(GPUS["h100"], 8)
    calls = math.ceil(psi / 40e6)
    gather = [calls * pr.price(Call("all_gather", 40e6 * b, 8, 1, 1, d)).mid for b, d in ((2, "bfloat16"),
                                                                                         (1, "f8e4m3"))]  # fmt: skip
    assert bf16["comm_exposed_s"] - fp8["comm_exposed_s"] == pytest.approx(gather[0] - gather[1], rel=1e-9)
    assert gather[1] < gather[0]
    # ZeRO-1 keeps every weight on every rank: one byte less each (the fp32 master and moments are sharded alike)
    assert bf16["mem_model_state_bytes"] - fp8["mem_model_state_bytes"] == pytest.approx(psi, rel=1e-9)
    with pytest.raises(ValueError, match="--fp8-param-gather needs --fp8-gemms"):
        plan_layout(fp8_param_gather=True, **{**kw, "fp8_gemms": False})  # type: ignore[arg-type]


def test_all_gather_context_parallelism_is_exposed() -> None:
    kw = {"model_preset": "llama3-70b", "gpu": "h100", "tp": 8, "cp": 4, "pp": 1, "dp": 1, "global_batch": 4,
          "seq": 32768, "sequence_parallel": True, "kernel_efficiency": 0.6}  # fmt: skip
    ring = plan_layout(**kw).iloc[0]  # type: ignore[arg-type]
    ag = plan_layout(cp_comm="all_gather", **kw).iloc[0]  # type: ignore[arg-type]
    m = MODELS["llama3-70b"]
    # per layer and micro-batch: K and V of all cp ranks gathered (kv heads / TP of them, bf16), their gradients
    # reduce-scattered in backward; the CP group spans 4 nodes (TP 8 fills each), 8 groups share each node's NICs
    kv = 32768 * 2 * 128 * m.kv_heads * 2 / 8
    pr = Pricer(GPUS["h100"], 8)
    per_layer = pr.price(Call("all_gather", kv, 4, 4, 8)).mid + pr.price(Call("reduce_scatter", kv, 4, 4, 8)).mid
    cp_ring = ring["comm_exposed_s"] - (ag["comm_exposed_s"] - 4 * m.layers * per_layer)
    assert cp_ring == pytest.approx(0.0, abs=1e-9)  # the ring's K/V hide behind the attention core
    assert "Llama 3" in ag["comm_exposure"] and "hidden behind the layer's attention core" in ring["comm_exposure"]
    with pytest.raises(ValueError, match="unknown cp_comm 'tree'; valid: ring, all_gather"):
        plan_layout(cp_comm="tree", **kw)  # type: ignore[arg-type]


def test_eager_attention_pays_for_the_scores() -> None:
    kw = {"model_preset": "gpt3-175b", "gpu": "a100", "tp": 8, "pp": 12, "dp": 1, "global_batch": 12,
          "recompute": "full", "kernel_efficiency": 0.6}  # fmt: skip
    flash = plan_layout(**kw).iloc[0]  # type: ignore[arg-type]
    eager = plan_layout(attention="eager", **kw).iloc[0]  # type: ignore[arg-type]
    # Korthikanti et al. 2022, eq. 1: the scores, their softmax and dropout mask and output are 5 a s^2 b bytes per
    # layer (over TP), written and read once per pass (4 passes with full recompute) at 80 % of 2039 GB/s
    a, s, h = GPT3.heads, GPT3.seq, GPT3.hidden
    per_layer = 5 * a * s * s / 8 * 2 * 4
    want = 12 * GPT3.layers / 12 * per_layer / (0.8 * 2039e9)
    # flash attention's backward recomputes QK^T: half a forward of the core (4 s h per token) more per layer, on the
    # s / 8 tokens of one micro-batch each rank holds, at 60 % of the A100's 312 TFLOP/s
    flash_extra = 12 * GPT3.layers / 12 * 0.5 * 4 * s * h * (s / 8) / (0.6 * 312e12)
    assert eager["compute_s"] - flash["compute_s"] == pytest.approx(want - flash_extra, rel=1e-9)


def test_cli_refuses_fp8_gemms_without_fp8_tensor_cores(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = cli.main(["plan", "--model-preset", "gpt3-175b", "--gpu", "a100", "--tp", "8", "--pp", "12", "--dp", "1",
                   "--global-batch", "12", "--fp8-gemms", "--out", str(tmp_path / "p")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "no float8 peak" in err[0]
    rc = cli.main(["plan", "--model-preset", "gpt3-175b", "--tp", "8", "--pp", "12", "--dp", "1", "--global-batch",
                   "12", "--fp8-param-gather", "--out", str(tmp_path / "q")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--fp8-param-gather needs --fp8-gemms" in err[0], err
    assert not (tmp_path / "q").exists()


def test_the_loss_over_the_vocabulary_is_memory_bound_on_the_last_stage() -> None:
    kw = {"model_preset": "llama3-8b", "gpu": "h100", "tp": 1, "pp": 1, "dp": 8, "global_batch": 32,
          "kernel_efficiency": 0.6}  # fmt: skip
    base = plan_layout(**kw).iloc[0]  # type: ignore[arg-type]
    big = plan_layout(**{**kw, "vocab": 2 * 128256}).iloc[0]  # type: ignore[arg-type]
    m = MODELS["llama3-8b"]
    # doubling V adds the logits' GEMMs (2 h V per token forward, three passes) and Megatron's fp32 cross-entropy:
    # cast 6, max 4, subtract 8, exp 8, sum 4, normalise 8, backward scale 8 and cast 6 bytes per logit, at 80 % of
    # the H100's 3.35 TB/s; 4 micro-batches of 8192 tokens
    tokens = 4 * m.seq
    want = tokens * 128256 * (3 * 2 * m.hidden / (989e12 * 0.6) + 52 / (0.8 * 3350e9))
    assert big["compute_s"] - base["compute_s"] == pytest.approx(want, rel=1e-9)
