"""Model presets, activation memory and compute against their published sources: Hugging Face config.json parameter
counts, Korthikanti et al. 2022 Table 2, Megatron-LM's theoretical_memory_usage.py, PaLM's FLOPs per token; and the
plan's fixes of issue 25 (layer-granular buffers by default, O(1) buckets, one-line refusals)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from commbench import cli
from commbench.planning.activations import ATTENTIONS, RECOMPUTES, activation_bytes
from commbench.planning.compute import GPUS, flops_per_token
from commbench.planning.options import bucket_counts
from commbench.planning.plan import plan
from commbench.planning.presets import MODELS, model_shape

pytestmark = pytest.mark.timeout(300)

GB = 1e9


# ------------------------------------------------------------------------------------------------ presets
@pytest.mark.parametrize(
    ("name", "published"),
    [
        # the parameter counts of the Hugging Face checkpoints (sum of numel over the safetensors)
        ("llama2-7b", 6_738_415_616),
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
    ],
)
def test_preset_parameter_counts_are_the_checkpoints(name: str, published: int) -> None:
    assert MODELS[name].params == published


def test_gpt3_is_the_papers_175b() -> None:
    # Brown et al. 2020 Table 2.1: 175.0B; Megatron's count leaves out biases and the 2048 x 12288 position table
    m = MODELS["gpt3-175b"]
    assert m.params == pytest.approx(175.0e9, rel=0.005)
    assert (m.layers, m.hidden, m.heads, m.seq) == (96, 12288, 96, 2048)


def test_preset_fields_override_one_by_one_and_partial_shapes_name_what_is_missing() -> None:
    m = model_shape("llama3-8b", seq=2048, layers=16)
    assert m is not None and (m.seq, m.layers, m.hidden) == (2048, 16, 4096) and "overridden" in m.source
    assert model_shape(None, seq=4096) is None  # a sequence alone is tokens, not a shape
    with pytest.raises(ValueError, match="needs --heads, --ffn, --vocab, --seq too"):
        model_shape(None, layers=32, hidden=4096)
    with pytest.raises(ValueError, match="unknown model preset 'llama9'; valid: llama2-7b"):
        model_shape("llama9")
    with pytest.raises(ValueError, match="heads=32 must be divisible by kv_heads=5"):
        model_shape("llama2-7b", kv_heads=5)


# ------------------------------------------------------------------------------------------------ activations
S, B, H, A, L, V = 4096, 1, 4096, 32, 32, 32000


def _act(**kw: object) -> float:
    base: dict[str, object] = dict(seq=S, micro_batch=B, hidden=H, ffn=4 * H, heads=A, layers=L, vocab=V)
    base.update(kw)
    return activation_bytes(**base).layers  # type: ignore[arg-type]


def test_the_issues_anchor_7b_at_4096_is_megatrons_34sbh() -> None:
    # Megatron-LM theoretical_memory_usage.py, compute_activation_memory: s*b*h*(18 + 4*ffn/h) per layer with SP and
    # selective recompute = 34*s*b*h at ffn = 4h; times 32 layers = 18.25 GB (the issue's "18.3 GB")
    got = _act(recompute=RECOMPUTES["selective"])
    assert got == pytest.approx(34 * S * B * H * L, rel=1e-12)
    assert round(got / GB, 1) == 18.3
    # flash attention keeps no s x s scores: no recompute keeps the same bytes
    assert _act() == pytest.approx(got, rel=1e-12)
    # eager attention without recompute: Korthikanti eq. 2, 5*a*s^2*b per layer more (the old 104 GB)
    eager = _act(attention=ATTENTIONS["eager"])
    assert eager == pytest.approx(L * S * B * H * (34 + 5 * A * S / H), rel=1e-12)
    assert round(eager / GB) == 104


@pytest.mark.parametrize("t", [2, 8])
def test_korthikanti_table_2_rows(t: int) -> None:
    sbh = S * B * H
    eager, none, sel, full = ATTENTIONS["eager"], RECOMPUTES["none"], RECOMPUTES["selective"], RECOMPUTES["full"]
    rows = {  # Korthikanti et al. 2022, Table 2, per layer
        "tp": (dict(tp=t, sequence_parallel=False, attention=eager, recompute=none), sbh * (10 + 24 / t + 5 * A * S / (H * t))),
        "tp+sp": (dict(tp=t, attention=eager, recompute=none), sbh / t * (34 + 5 * A * S / H)),
        "tp+selective": (dict(tp=t, sequence_parallel=False, attention=eager, recompute=sel), sbh * (10 + 24 / t)),
        "tp+sp+selective": (dict(tp=t, attention=eager, recompute=sel), sbh * 34 / t),
        "full, sp": (dict(tp=t, attention=eager, recompute=full), 2 * sbh / t),
        "full, no sp": (dict(tp=t, sequence_parallel=False, recompute=full), 2 * sbh),
    }  # fmt: skip
    for name, (kw, per_layer) in rows.items():
        assert _act(**kw) == pytest.approx(L * per_layer, rel=1e-12), name


def test_megatron_embedding_logits_and_pipeline_terms() -> None:
    # theoretical_memory_usage.py: embedding input 8*s*b*p and dropout s*b*h*p; on one stage the logits
    # 4*s*b*h*(1 + V/h); with p > 1 the per-layer and embedding terms times min(1, m/p); everything / t
    ffn, t = 11008, 4
    one = activation_bytes(seq=S, micro_batch=2, hidden=H, ffn=ffn, heads=A, layers=L, vocab=V, tp=t,
                           recompute=RECOMPUTES["selective"])  # fmt: skip
    sbh = S * 2 * H
    assert one.layers == pytest.approx(L * sbh * (18 + 4 * ffn / H) / t, rel=1e-12)
    assert one.embedding == pytest.approx((8 * S * 2 + sbh) / t, rel=1e-12)
    assert one.logits == pytest.approx(4 * sbh * (1 + V / H) / t, rel=1e-12)
    p, m = 4, 2
    pipe = activation_bytes(seq=S, micro_batch=2, hidden=H, ffn=ffn, heads=A, layers=L, vocab=V, tp=t, pp=p,
                            microbatches=m, recompute=RECOMPUTES["selective"])  # fmt: skip
    assert pipe.layers == pytest.approx(one.layers * m / p, rel=1e-12)
    assert pipe.embedding == pytest.approx((8 * S * 2 * p + sbh * p) * (m / p) / t, rel=1e-12)
    assert pipe.logits == 0.0


# ------------------------------------------------------------------------------------------------ compute
def test_flops_per_token_and_gpu_presets() -> None:
    # PaLM (Chowdhery et al. 2022) appendix B: 6N + 12*L*H*Q*T with H*Q = d_model, T = seq
    assert flops_per_token(7e9, 32, 4096, 4096) == 6 * 7e9 + 12 * 32 * 4096 * 4096
    h100 = GPUS["h100"]
    assert h100.peak("bfloat16") == 989e12 and h100.gpus_per_node == 8
    with pytest.raises(ValueError, match="a100 has no float8 peak"):
        GPUS["a100"].peak("float8")
    r = plan(model_preset="llama2-7b", nodes=1, gpus_per_node=8, strategies=["fsdp"], precisions=["bf16"],
             gpu="h100", mfu=0.5).iloc[0]  # fmt: skip
    m = MODELS["llama2-7b"]
    want = (6 * m.params + 12 * m.layers * m.hidden * m.seq) * m.seq * 1 / (989e12 * 0.5)
    assert r["compute_s"] == pytest.approx(want, rel=1e-12)
    assert r["mem_total_bytes"] > 0 and r["fits"] == (r["mem_total_bytes"] <= 80 * 2**30)
    # stated bandwidths price it, with an interval around the point estimate
    assert r["comm_time_low_s"] < r["comm_time_s"] < r["comm_time_high_s"] and "unmeasured" in r["comm_model"]
    assert r["step_time_low_s"] <= r["step_time_s"] <= r["step_time_high_s"]


# ------------------------------------------------------------------------------------------------ fixes
def test_layer_granular_buffers_by_default() -> None:
    # issue 25: ZeRO-3 of a 7B model on 64 ranks showed 31.9 GB of buffers (one call of the whole model)
    m = MODELS["llama2-7b"]
    r = plan(model_preset="llama2-7b", nodes=8, gpus_per_node=8, strategies=["zero3"], precisions=["bf16"]).iloc[0]
    assert r["mem_model_state_bytes"] == pytest.approx(16 * m.params / 64, rel=1e-12)  # ZeRO: (2+2+12) Psi / N
    # the largest unit (the root: both embeddings and the final norm) gathered twice (computing + prefetched) and
    # reduce-scattered once, in bf16
    largest = max(m.layer_params, 2 * m.embedding_params + m.hidden)
    assert r["mem_comm_buffers_bytes"] == pytest.approx(3 * 2 * largest, rel=1e-9)
    # Psi alone: DeepSpeed's ZeRO-3 prefetch bucket (5e7 elements), not the whole model
    q = plan(params=7.5e9, nodes=8, gpus_per_node=8, strategies=["zero3"], precisions=["bf16"]).iloc[0]
    assert q["mem_comm_buffers_bytes"] == pytest.approx(3 * 2 * 5e7, rel=1e-9)


def test_ddp_buckets_in_the_gradient_dtype_and_any_psi_at_once() -> None:
    # torch: bucket_cap_mb counts the gradients' own bytes: a 1 MiB first bucket then 25 MiB ones
    for elem in (4, 2):
        psi = 10**15
        first, cap = 2**20 // elem, 25 * 2**20 // elem
        counts = bucket_counts(psi, elem)
        assert sum(k for _, k in counts) == 1 + math.ceil((psi - first) / cap)
        assert sum(size * k for size, k in counts) == psi and counts[1][0] == cap
    r = plan(params=1e15, nodes=2, gpus_per_node=8, strategies=["ddp"], precisions=["bf16"]).iloc[0]
    assert r["comm_bytes_per_step"] == pytest.approx(2 * 15 / 16 * 2 * 1e15, rel=1e-12)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--params", "1e20"], "more than 1e+15 parameters"),
        (["--params", "7e9", "--strategies", "fsdp", "--precisions", "fp8"], "no option left to plan (fsdp/fp8: fp8"),
        (["--params", "7e9", "--seq", "4096"], "--seq alone is not used"),
        (["--layers", "32", "--hidden", "4096"], "needs --heads, --ffn, --vocab, --seq too"),
        (["--model-preset", "llama9"], "unknown model preset 'llama9'"),
        (["--model-preset", "llama2-7b", "--recompute", "some"], "unknown recompute 'some'; valid: none, selective"),
        (["--model-preset", "llama2-7b", "--gpu", "tpu"], "unknown gpu 'tpu'; valid: a100, h100"),
        (["--model-preset", "llama2-7b", "--gpus", "8,x"], "--gpus takes integers"),
        (["--model-preset", "llama2-7b", "--gpus", "12"], "12 GPUs is not a whole number of h100 nodes"),
        (["--gpus", "8"], "the search needs a model"),
    ],
)
def test_plan_refusals_are_one_line_exit_2(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["plan", *argv, "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("commbench: error: ") and "Traceback" not in err
    assert needle in err


def test_pricing_warnings_reach_console_md_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a published-style nccl-tests log (all_reduce, float, 4 ranks on 2 nodes, 1K..16M): DDP's 25 MiB buckets lie
    # beyond its largest size, so the price comes from the fitted model and says so, with its interval
    run = tmp_path / "run"
    data = Path(__file__).parent / "data" / "nccl_all_reduce_float.txt"
    assert cli.main(["import", "nccl-tests", str(data), "--out", str(run)]) == 0
    capsys.readouterr()
    out = tmp_path / "plan"
    rc = cli.main(["plan", str(run), "--params", "1e9", "--nodes", "2", "--gpus-per-node", "2", "--strategies",
                   "ddp", "--precisions", "fp32,bf16", "--compute-ms", "100", "--out", str(out)])  # fmt: skip
    # a line wider than the terminal wraps, its continuation indented: joined back here
    console = capsys.readouterr().out.replace("\n  ", " ").splitlines()
    assert rc == 0
    assert console[0].startswith("1B parameters on 2 x 2 ranks: ddp fp32") and "step " in console[0]
    warn = [x for x in console if x.startswith("# ddp/fp32: ")]
    assert warn and "all_reduce/fp32/world" in warn[0]
    # a float-only log has no bf16 rows: the console says so and names the command that measures them
    lacks = [x for x in console if x.startswith("# ddp/bf16: ")]
    assert lacks and "no model for all_reduce/bf16" in lacks[0] and "commbench run --collectives all_reduce" in lacks[0]
    for page in ("plan.md", "plan.html"):
        text = (out / page).read_text()
        assert "Warnings" in text and "all_reduce/fp32/world" in text
