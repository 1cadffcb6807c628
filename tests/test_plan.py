"""The capacity plan against independent references: the ZeRO paper's memory figures, hand-written ring byte
formulas, Korthikanti et al.'s activation formula, synthetic cost models with known alpha and beta, and an
nccl-tests log's own times. Bad input: one line, exit code 2."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

import commbench
from commbench import cli
from commbench.planning import fitting
from commbench.planning.plan import plan
from commbench.planning.pricing import native_precision
from commbench.planning.steptime import HEADROOM
from tests.cli_util import commbench as run_cli
from tests.test_costmodel import ALPHA, BETA, link_points, synth

DATA = Path(__file__).parent / "data"
GB = 1e9


def row(df: pd.DataFrame, strategy: str, precision: str) -> pd.Series:
    r = df[(df["strategy"] == strategy) & (df["precision"] == precision)]
    assert len(r) == 1, (strategy, precision, df[["strategy", "precision"]])
    return r.iloc[0]


# ------------------------------------------------------------------------------------------------ memory
def test_zero_paper_figure_1() -> None:
    # Rajbhandari et al. 2020, Figure 1: Psi = 7.5B, N_d = 64, K = 12 (mixed-precision Adam):
    # baseline (2+2+K)Psi = 120 GB; P_os 2Psi+2Psi+K*Psi/N = 31.4 GB; P_os+g 2Psi+(2+K)Psi/N = 16.6 GB;
    # P_os+g+p (2+2+K)Psi/N = 1.9 GB.
    psi, n = 7.5e9, 64
    df = plan(params=psi, nodes=8, gpus_per_node=8, strategies=["ddp", "zero1", "zero2", "zero3", "fsdp"],
              precisions=["bf16"], optimizer="adam")  # fmt: skip
    exact = {
        "ddp": (2 + 2 + 12) * psi,
        "zero1": 2 * psi + 2 * psi + 12 * psi / n,
        "zero2": 2 * psi + (2 + 12) * psi / n,
        "zero3": (2 + 2 + 12) * psi / n,
        "fsdp": (2 + 2 + 12) * psi / n,
    }
    paper_gb = {"ddp": 120.0, "zero1": 31.4, "zero2": 16.6, "zero3": 1.9, "fsdp": 1.9}
    for s, want in exact.items():
        got = row(df, s, "bf16")["mem_model_state_bytes"]
        assert got == pytest.approx(want, rel=1e-12), s
        assert round(got / GB, 1) == paper_gb[s], s


def test_memory_components_add_up_and_split_master_from_moments() -> None:
    psi, n = 1.2e9, 16
    df = plan(params=psi, nodes=2, gpus_per_node=8, precisions=["fp32", "bf16"], optimizer="adam")
    parts = ["mem_params_bytes", "mem_grads_bytes", "mem_master_bytes", "mem_optim_bytes"]
    for _, r in df.iterrows():
        assert sum(r[p] for p in parts) == pytest.approx(r["mem_model_state_bytes"], rel=1e-12), r["strategy"]
    z1 = row(df, "zero1", "bf16")
    assert z1["mem_params_bytes"] == pytest.approx(2 * psi)
    assert z1["mem_grads_bytes"] == pytest.approx(2 * psi)
    assert z1["mem_master_bytes"] == pytest.approx(4 * psi / n)
    assert z1["mem_optim_bytes"] == pytest.approx(8 * psi / n)
    # ZeRO-2 peaks at the end of forward: sharded P + master + moments, plus the unsharded bf16 working copy.
    z2 = row(df, "zero2", "bf16")
    assert z2["mem_params_bytes"] == pytest.approx(2 * psi / n + 2 * psi)
    assert z2["mem_grads_bytes"] == pytest.approx(0.0)
    assert row(df, "ddp", "fp32")["mem_master_bytes"] == 0.0
    # HSDP shards within the node only (8 ranks), whatever the number of nodes.
    assert row(df, "hsdp", "bf16")["mem_model_state_bytes"] == pytest.approx(16 * psi / 8)


def test_sgd_keeps_one_momentum_buffer() -> None:
    psi = 1e9
    df = plan(params=psi, nodes=1, gpus_per_node=4, strategies=["ddp", "zero3"], precisions=["fp32", "bf16"],
              optimizer="sgd")  # fmt: skip
    assert row(df, "ddp", "fp32")["mem_model_state_bytes"] == pytest.approx((4 + 4 + 4) * psi)
    assert row(df, "zero3", "bf16")["mem_model_state_bytes"] == pytest.approx((2 + 2 + 4 + 4) * psi / 4)


def test_activations_follow_korthikanti_and_device_memory_decides_fits() -> None:
    s, b, h, a, layers, vocab = 2048, 2, 4096, 32, 32, 50304
    df = plan(nodes=1, gpus_per_node=8, strategies=["zero3"], precisions=["fp32", "bf16"],
              layers=layers, hidden=h, heads=a, ffn=4 * h, vocab=vocab, seq=s, micro_batch=b, attention="eager",
              device_memory=80 * 2**30)  # fmt: skip
    # Korthikanti et al. 2022 eq. 2 (16-bit activations, eager attention, no recompute): s*b*h*(34 + 5*a*s/h) per
    # layer; Megatron-LM theoretical_memory_usage.py adds the embedding input (8*s*b) and dropout (s*b*h) and, on
    # one pipeline stage, the fp32 logits 4*s*b*h*(1 + V/h)
    per_layer = 34 * s * b * h + 5 * a * s * s * b
    embedding, logits = 8 * s * b + s * b * h, 4 * s * b * h * (1 + vocab / h)
    bf = row(df, "zero3", "bf16")
    assert bf["mem_activations_bytes"] == pytest.approx(layers * per_layer + embedding + logits, rel=1e-12)
    # fp32 compute: the 2-byte constants doubled, token ids and fp32 logits unchanged
    fp32 = layers * 2 * per_layer + 8 * s * b + 2 * s * b * h + logits
    assert row(df, "zero3", "fp32")["mem_activations_bytes"] == pytest.approx(fp32, rel=1e-12)
    total = bf["mem_model_state_bytes"] + bf["mem_comm_buffers_bytes"] + bf["mem_activations_bytes"]
    assert bf["mem_total_bytes"] == pytest.approx(total)
    assert bf["fits"] == (total <= 80 * 2**30 * (1 - HEADROOM))  # the documented headroom kept free
    # Psi and one FSDP unit per layer by Megatron's count (a given shape is gated, RMSNorm, untied, MHA: per layer
    # 2h(3/2 ffn + 1) + 4h^2) plus the root (final norm + two embeddings, here the largest); the buffers are one
    # call of the largest unit: its gathered bf16 parameters twice (computing + prefetched) and its bf16 gradient
    # reduce-scatter input
    layer, root = 2 * h * (1.5 * 4 * h + 1) + 4 * h * h, h + 2 * h * vocab
    assert bf["params"] == layers * layer + root
    largest = max(layer, root)
    assert bf["mem_comm_buffers_bytes"] == pytest.approx(2 * 2 * largest + 2 * largest, rel=1e-6)
    no_shape = plan(params=7e9, nodes=1, gpus_per_node=8, strategies=["zero3"], precisions=["bf16"])
    assert math.isnan(no_shape.iloc[0]["mem_activations_bytes"]) and no_shape.iloc[0]["fits"] is None


# ------------------------------------------------------------------------------------------------ bytes
def test_bytes_per_step_are_the_ring_formulas_split_intra_inter() -> None:
    nodes, g = 4, 8
    n = nodes * g
    psi = float(n * 2**20)  # a multiple of every group size: no padding
    df = plan(params=psi, nodes=nodes, gpus_per_node=g, precisions=["fp32", "bf16"])
    ar, ag = 2 * (n - 1) / n, (n - 1) / n  # nccl-tests bus factors
    assert row(df, "ddp", "fp32")["comm_bytes_per_step"] == pytest.approx(ar * 4 * psi, rel=1e-12)
    assert row(df, "ddp", "bf16")["comm_bytes_per_step"] == pytest.approx(ar * 2 * psi, rel=1e-12)
    # ZeRO-3 without --layers: one resharded unit, gathered for forward and backward, reduce-scattered once.
    assert row(df, "zero3", "bf16")["comm_bytes_per_step"] == pytest.approx(3 * ag * 2 * psi, rel=1e-12)
    # ZeRO-1 as the ZeRO paper / DeepSpeed (Rajbhandari et al. 2020, section 7.2.1: P_os moves 2 Psi, DDP's
    # volume): gradients reduce-scattered, parameters all-gathered, each (n-1)/n of Psi in its dtype
    assert row(df, "zero1", "fp32")["comm_bytes_per_step"] == pytest.approx(2 * ag * 4 * psi, rel=1e-12)
    assert row(df, "zero1", "bf16")["comm_bytes_per_step"] == pytest.approx(ar * 2 * psi, rel=1e-12)
    # torch's ZeroRedundancyOptimizer, its own strategy: DDP's all-reduce plus each owner's fp32 parameter
    # broadcast (bus factor 1)
    assert row(df, "zero1_torch", "fp32")["comm_bytes_per_step"] == pytest.approx(ar * 4 * psi + 4 * psi, rel=1e-12)
    # flat ring over nodes: 1/g of every rank's bytes cross nodes
    d = row(df, "ddp", "fp32")
    assert d["comm_bytes_inter"] == pytest.approx(d["comm_bytes_per_step"] / g)
    assert d["comm_bytes_intra"] + d["comm_bytes_inter"] == pytest.approx(d["comm_bytes_per_step"])
    # HSDP: FSDP among the node's g ranks (intra), all_reduce of the 1/g gradient shard across nodes (inter)
    h = row(df, "hsdp", "bf16")
    assert h["comm_bytes_intra"] == pytest.approx(3 * (g - 1) / g * 2 * psi, rel=1e-12)
    assert h["comm_bytes_inter"] == pytest.approx(2 * (nodes - 1) / nodes * 2 * psi / g, rel=1e-12)
    by_op = json.loads(h["comm_by_op"])
    assert set(by_op) == {"intra/all_gather:bfloat16", "intra/reduce_scatter:bfloat16", "inter/all_reduce:bfloat16"}
    one = plan(params=psi, nodes=1, gpus_per_node=g, strategies=["ddp"], precisions=["fp32"]).iloc[0]
    assert one["comm_bytes_inter"] == 0.0


def test_fp8_is_the_codec_hook_on_ddp_and_absent_on_fsdp() -> None:
    n, psi = 8, float(2**26)
    df = plan(params=psi, nodes=1, gpus_per_node=n, precisions=["fp8"])
    assert set(df["strategy"]) == {"ddp", "zero1_torch"}
    assert set(df.attrs["skipped"]) == {"zero1/fp8", "zero2/fp8", "zero3/fp8", "fsdp/fp8", "hsdp/fp8"}
    # one e4m3 byte per element through all_to_all and all_gather ((n-1)/n each) plus the per-chunk fp32 scales
    codes = 2 * (n - 1) / n * psi
    assert row(df, "ddp", "fp8")["comm_bytes_per_step"] == pytest.approx(codes, rel=1e-4)
    assert row(df, "ddp", "fp8")["comm_bytes_per_step"] > codes


# ------------------------------------------------------------------------------------------------ time
def _ring_all_reduce(n: int, size: float) -> float:
    return ALPHA * 2 * (n - 1) + size * BETA * 2 * (n - 1) / n


def test_comm_time_exposed_and_step_from_a_known_model() -> None:
    model = fitting.fit(synth("all_reduce", ci_rel=None, sizes=[2**k for k in range(16, 28, 2)]))
    n = 8
    psi = (2**20 + 25 * 2**20) / 4  # exactly DDP's two default buckets: 1 MiB and 25 MiB of fp32
    compute_ms = 10.0
    df = plan(params=psi, nodes=1, gpus_per_node=n, strategies=["ddp", "zero3"], precisions=["fp32", "bf16"],
              compute_ms=compute_ms, overlap=0.5, model=model, seq=1024, micro_batch=2)  # fmt: skip
    d = row(df, "ddp", "fp32")
    want = _ring_all_reduce(n, 2**20) + _ring_all_reduce(n, 25 * 2**20)  # per bucket: alpha-beta ring
    assert d["comm_time_s"] == pytest.approx(want, rel=1e-6)
    assert d["comm_time_low_s"] <= d["comm_time_s"] <= d["comm_time_high_s"]
    exposed = max(0.0, want - 0.5 * compute_ms / 1e3)
    assert d["comm_exposed_s"] == pytest.approx(exposed, rel=1e-6)
    assert d["step_time_s"] == pytest.approx(compute_ms / 1e3 + exposed, rel=1e-6)
    assert d["tokens_per_s"] == pytest.approx(n * 1024 * 2 / d["step_time_s"], rel=1e-9)
    assert not d["comm_extrapolated"]
    # what the model lacks is said, never invented
    for s, p, lacks in (("ddp", "bf16", "all_reduce/bf16"), ("zero3", "fp32", "all_gather/fp32")):
        r = row(df, s, p)
        assert math.isnan(r["comm_time_s"]) and math.isnan(r["step_time_s"])
        assert f"no model for {lacks}" in r["comm_model"]
    assert list(df["strategy"] + "/" + df["precision"])[0] == "ddp/fp32"  # the only timed option ranks first
    # across nodes a single-node world fit does not price the flat ring
    multi = plan(params=psi, nodes=2, gpus_per_node=4, strategies=["ddp"], precisions=["fp32"], model=model).iloc[0]
    assert math.isnan(multi["comm_time_s"]) and "across 2 nodes" in multi["comm_model"]


def test_inter_node_groups_priced_by_the_link_rule() -> None:
    # the node link measured with one rank per node (2 and 3 nodes): BETA per byte of the link
    bf16 = {"precision": "bf16", "fp32_bytes": lambda d: 2 * d["size_bytes"]}
    link = fitting.fit([link_points([2, 3], 1, "world", 1).assign(**bf16), link_points([2, 3], 1, "inter", 1).assign(**bf16),
                   *(synth(c, "bf16", ci_rel=None, worlds=[2, 4, 8]).assign(group="intra")
                     for c in ("all_gather", "reduce_scatter"))])  # fmt: skip
    nodes, g = 4, 8
    n = nodes * g
    psi = float(n * 2**20)
    df = plan(params=psi, nodes=nodes, gpus_per_node=g, strategies=["ddp", "hsdp"], precisions=["bf16"], model=link)
    # HSDP: intra FSDP over one resharded unit (all_gather in forward and again in backward: 2 calls of the unit,
    # reduce_scatter: 1 call) and g replica groups of `nodes` ranks all-reducing at once: each gets 1/g of the
    # node link
    h = row(df, "hsdp", "bf16")
    intra = ALPHA * (g - 1) * (2 + 1) + BETA * h["comm_bytes_intra"]
    inter = ALPHA * 2 * (nodes - 1) + g * BETA * h["comm_bytes_inter"]
    assert h["comm_time_s"] == pytest.approx(intra + inter, rel=1e-9)
    # DDP across nodes: the flat ring over all n ranks is bound by the same link (its bytes per rank cross each
    # node's link once per direction), with the n-rank ring's latency steps; priced by the world fit
    d = row(df, "ddp", "bf16")
    assert not math.isnan(d["comm_time_s"])
    # DDP's buckets hold bf16 gradients: a 1 MiB first bucket (2**19 elements), then 25 MiB ones (25 * 2**19)
    buckets = 1 + math.ceil((psi - 2**19) / (25 * 2**19))
    assert d["comm_time_s"] == pytest.approx(buckets * ALPHA * 2 * (n - 1) + BETA * d["comm_bytes_per_step"], rel=1e-9)


def test_a_dtype_is_priced_by_the_precision_that_runs_natively_in_it() -> None:
    # asked of the precision registry: the precision whose user tensor and wire are both that dtype
    assert native_precision("float") == "fp32"
    assert native_precision("bfloat16") == "bf16"
    assert native_precision("half") == "fp16"
    assert native_precision("uint8") is None  # fp8 codes travel as uint8, but from an fp32 tensor: a codec


def test_tflops_and_mfu_give_six_psi_flops_per_token() -> None:
    psi, s, b = 1e9, 2048, 4
    r = plan(params=psi, nodes=1, gpus_per_node=8, strategies=["ddp"], precisions=["bf16"], tflops=989.0, mfu=0.4,
             seq=s, micro_batch=b).iloc[0]  # fmt: skip
    assert r["compute_s"] == pytest.approx(6 * psi * s * b / (989e12 * 0.4), rel=1e-12)
    assert math.isnan(r["step_time_s"])  # no model: no step time


def test_package_exports_fit_and_plan() -> None:
    df = commbench.plan(params=1e6, nodes=1, gpus_per_node=2, strategies=["ddp"], precisions=["fp32"])
    assert df.iloc[0]["comm_bytes_per_step"] == pytest.approx(4e6)  # 2(n-1)/n = 1 at n = 2
    assert commbench.fit is fitting.fit


# ------------------------------------------------------------------------------------------------ CLI
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--params", "7e9", "--strategies", "ddp,zero4"], "unknown strategy 'zero4'; valid: ddp, zero1"),
        (["--params", "7e9", "--precisions", "fp4"], "unknown precision 'fp4'; valid: fp32, bf16, fp8"),
        (["--params", "7e9", "--optimizer", "lion"], "unknown optimizer 'lion'; valid: adam, sgd"),
        (["--params", "-5"], "must be > 0"),
        (["--params", "seven"], "expected a number"),
        (["--params", "7e9", "--tflops", "900"], "tflops needs a kernel efficiency or an MFU"),
        (["--params", "7e9", "--compute-ms", "5", "--tflops", "900", "--mfu", "0.4"], "either compute_ms or tflops"),
        (["--params", "7e9", "--mfu", "1.5", "--tflops", "900", "--seq", "8", "--micro-batch", "1"], "mfu must be in"),
        (["--params", "7e9", "--model", "nope.json"], "cost model 'nope.json' does not exist"),
        (["--params", "7e9", "--device-memory", "80Q"], "--device-memory"),
        (["--params", "7e9", "--overlap", "2"], "overlap must be in [0, 1]"),
        (["--nodes", "2"], "--params"),
    ],
)
def test_plan_bad_input_is_one_line_exit_2(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["plan", *argv, "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("commbench: error: ") and "Traceback" not in err
    assert needle in err


def test_fit_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["fit", str(tmp_path / "missing"), "--out", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing" in err


def test_import_fit_plan_end_to_end(tmp_path: Path) -> None:
    # nccl-tests log: all_reduce, float, 4 ranks on 2 nodes, 1K..16M.
    run = tmp_path / "run"
    assert run_cli("import", "nccl-tests", str(DATA / "nccl_all_reduce_float.txt"), "--out", str(run),
                   cwd=tmp_path).returncode == 0  # fmt: skip
    r = run_cli("fit", str(run), "--out", str(tmp_path / "m.json"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "all_reduce" in r.stdout and (tmp_path / "m.json").is_file()
    psi = 4 * 2**20 / 4  # 4 MiB of fp32 gradients: DDP buckets of 1 MiB and 3 MiB
    out = tmp_path / "plan"
    r = run_cli("plan", "--model", str(tmp_path / "m.json"), "--params", str(psi), "--nodes", "2",
                "--gpus-per-node", "2", "--strategies", "ddp,zero3", "--precisions", "fp32,bf16",
                "--device-memory", "80G", "--compute-ms", "1", "--out", str(out), cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out / "plan.csv")
    need = ["strategy", "precision", "world_size", "mem_params_bytes", "mem_grads_bytes", "mem_optim_bytes",
            "mem_total_bytes", "comm_bytes_per_step", "comm_time_s", "step_time_s"]  # fmt: skip
    assert set(need) <= set(df.columns)
    d = df[(df["strategy"] == "ddp") & (df["precision"] == "fp32")].iloc[0]
    # the log's own times at the bucket sizes (1 MiB measured; 3 MiB between its 1 MiB and 4 MiB rows, linearly)
    t_log = 51.21e-6 + (51.21e-6 + (129.86e-6 - 51.21e-6) * (3 - 1) / (4 - 1))
    assert d["comm_time_s"] == pytest.approx(t_log, rel=0.15)
    lacks = df[(df["strategy"] == "ddp") & (df["precision"] == "bf16")].iloc[0]
    assert "no model for all_reduce/bf16 across 2 nodes" in lacks["comm_model"] and math.isnan(lacks["comm_time_s"])
    html = (out / "plan.html").read_text()
    assert html.count("data:image/png;base64,") == 2
    assert "Activations: not counted" in (out / "plan.md").read_text()
