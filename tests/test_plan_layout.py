"""The fixed-layout plan and its step-time model against independent references: Megatron-LM's FLOPs formula,
the 1F1B bubble, NCCL's ring latency, the balanced pipeline split, the published ranking of ZeRO-3 against PTD-P,
and the CLI's rules (exit 2 on bad input, exit 1 when nothing fits, the columns, units and widths)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from commbench import cli
from commbench.planning.calls import Call, Pricer
from commbench.planning.compute import GPUS
from commbench.planning.layout import Parallel, layer_flops, stage_split
from commbench.planning.layout_plan import plan_layout
from commbench.planning.presets import MODELS
from commbench.planning.steptime import HEADROOM, exposure

pytestmark = pytest.mark.timeout(300)

GPT3 = MODELS["gpt3-175b"]
COLUMNS = ("tp pp dp cp vpp micro_batch global_batch strategy recompute fits mem_total_bytes mem_headroom_bytes "
           "step_time_s step_time_low_s step_time_high_s tokens_per_s tflops_per_gpu mfu bubble_frac "
           "comm_exposed_s").split()  # fmt: skip


def test_flops_are_megatrons_formula() -> None:
    # Narayanan et al. 2021, eq. 3: with full recompute 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs per step
    f = layer_flops(GPT3)
    s, h, L, V = GPT3.seq, GPT3.hidden, GPT3.layers, GPT3.vocab
    from commbench.planning.activations import ATTENTIONS, RECOMPUTES

    per_token = L * f.layer_passes(RECOMPUTES["full"], ATTENTIONS["eager"]) + 3 * f.logits
    assert per_token == pytest.approx(96 * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)), rel=1e-12)
    # flash attention's backward recomputes QK^T: half a forward of the core (4 s h) more per layer, in every mode
    for name, rec in RECOMPUTES.items():
        extra = f.layer_passes(rec, ATTENTIONS["flash"]) - f.layer_passes(rec, ATTENTIONS["eager"])
        assert extra == pytest.approx(0.5 * 4 * s * h, rel=1e-12), name
    # model FLOPs (MFU's numerator) are the three-pass form: 72 l h^2 (1 + s/(6h)) + 6 h V
    assert f.model_per_token(L) == pytest.approx(72 * L * h * h * (1 + s / (6 * h)) + 6 * h * V, rel=1e-12)


def test_balanced_split_carries_the_head_on_the_last_stage() -> None:
    m = MODELS["llama3-70b"]
    for pp in (3, 7, 12, 35, 64):
        split = stage_split(m, Parallel(pp=pp))
        assert sum(split) == m.layers and len(split) == pp and min(split) >= 1
        head = layer_flops(m).logits / layer_flops(m).layer
        loads = [*split[:-1], split[-1] + head]
        even = [m.layers // pp + (1 if i < m.layers % pp else 0) for i in range(pp)]
        assert max(loads) <= max([*even[:-1], even[-1] + head]) + 1e-9  # never worse than an even split
    assert stage_split(m, Parallel(pp=4, split=(21, 20, 20, 19))) == (21, 20, 20, 19)  # given: as given


def test_ring_latency_is_paid_per_step() -> None:
    # NCCL tuning.cc: base 8.4 us + (n-1-(k-1)) NVLink steps of 3.4 us + (k-1) network steps of 9.6 us (Ring/Simple)
    pr = Pricer(GPUS["h100"], 8)
    n, k = 2**20, 2**17
    tiny = pr.price(Call("all_gather", 1024.0, n, k, 1))
    want = 8.4e-6 + (n - k) * 3.4e-6 + (k - 1) * 9.6e-6
    assert tiny.mid == pytest.approx(want + 1024 * (n - 1) / n / (0.8 * 8 * 50e9), rel=1e-9)
    assert tiny.mid > 4.0 and tiny.low < tiny.mid < tiny.high  # a million-rank ring is not free


def test_exposure_rules() -> None:
    assert exposure("tp", 2.0, 10.0, None)[0] == 2.0  # TP: between the matmuls, exposed
    assert exposure("fsdp_fwd", 3.0, 2.0, None)[0] == pytest.approx(1.0)  # the part its layer's compute cannot hide
    assert exposure("fsdp_fwd", 1.0, 2.0, None)[0] == 0.0
    assert exposure("tp", 2.0, 10.0, 0.1)[0] == pytest.approx(1.0)  # --overlap 0.1: behind 10 % of its window


def test_step_adds_up_and_the_bubble_is_narayanans() -> None:
    df = plan_layout(model_preset="gpt3-175b", gpu="a100", tp=8, pp=12, dp=4, global_batch=384, recompute="full")
    r = df.iloc[0]
    parts = r["compute_s"] + r["imbalance_s"] + r["bubble_s"] + r["comm_exposed_s"] + r["optimizer_s"]
    assert r["step_time_s"] == pytest.approx(parts, rel=1e-12)
    m = 384 // 4
    assert r["microbatches"] == m and r["bubble_frac"] == pytest.approx(11 / m)
    assert r["step_time_low_s"] < r["step_time_s"] < r["step_time_high_s"]
    assert r["tokens_per_s"] == pytest.approx(384 * GPT3.seq / r["step_time_s"])
    # MFU is an output: model FLOPs per step over (step x GPUs x peak)
    model = layer_flops(GPT3).model_per_token(GPT3.layers) * 384 * GPT3.seq
    assert r["mfu"] == pytest.approx(model / (r["step_time_s"] * 384 * 312e12), rel=1e-9)
    v2 = plan_layout(model_preset="gpt3-175b", gpu="a100", tp=8, pp=12, dp=4, vpp=2, global_batch=384,
                     recompute="full").iloc[0]  # fmt: skip
    assert v2["bubble_frac"] == pytest.approx(11 / (2 * m)) and v2["bubble_s"] < r["bubble_s"]


def test_end_to_end_mfu_adds_nothing() -> None:
    r = plan_layout(model_preset="gpt3-175b", gpu="a100", tp=8, pp=12, dp=4, global_batch=384, mfu=0.5).iloc[0]
    model = layer_flops(GPT3).model_per_token(GPT3.layers) * 384 * GPT3.seq
    assert r["step_time_s"] == pytest.approx(model / (384 * 312e12 * 0.5), rel=1e-12)
    assert r["mfu"] == pytest.approx(0.5)


def test_zero3_falls_far_below_ptdp_at_scale() -> None:
    # Narayanan et al. 2021, section 5.2: 175B at a fixed global batch of 1536; ZeRO-3 without model parallelism
    # loses to PTD-P, by more as GPUs are added
    ratios = []
    for n in (384, 768, 1536):
        kw = {"model_preset": "gpt3-175b", "gpu": "a100", "global_batch": 1536, "recompute": "full"}
        ptdp = plan_layout(tp=8, pp=12, dp=n // 96, **kw).iloc[0]  # type: ignore[arg-type]
        zero3 = plan_layout(tp=1, pp=1, dp=n, micro_batch=1536 // n, strategies=["zero3"], **kw).iloc[0]  # type: ignore[arg-type]
        ratios.append(zero3["tokens_per_s"] / ptdp["tokens_per_s"])
    assert ratios[0] < 1.0 and ratios[0] > ratios[1] > ratios[2] and ratios[2] < 0.5


def test_device_memory_as_labelled_and_the_headroom() -> None:
    assert GPUS["h100"].memory_bytes == 80e9 and GPUS["a100"].memory_bytes == 80e9
    r = plan_layout(model_preset="llama3-8b", gpu="h100", tp=1, pp=1, dp=8, strategies=["zero3"]).iloc[0]
    assert r["mem_headroom_bytes"] == pytest.approx(80e9 * (1 - HEADROOM) - r["mem_total_bytes"])
    assert r["fits"] == (r["mem_headroom_bytes"] >= 0)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_prices_one_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    argv = ["plan", "--model-preset", "llama3-70b", "--gpu", "h100", "--tp", "8", "--pp", "4", "--dp", "4",
            "--nodes", "16", "--global-batch", "1001", "--recompute", "selective", "--sequence-parallel",
            "--strategy", "zero1", "--out", str(tmp_path)]  # fmt: skip
    rc, out, _ = run(argv, capsys)
    assert rc == 0
    text = [x for x in out.splitlines() if not x.startswith(("csv: ", "md: ", "html: "))]  # paths are not wrapped
    assert all(len(line) <= 80 for line in text)
    assert not any(re.search(r"\de\+\d", x) for x in text) and ("ms" in out or " s" in out)  # units, no exponent
    df = pd.read_csv(tmp_path / "plan.csv")
    assert set(COLUMNS) <= set(df.columns) and len(df) == 1
    assert df.iloc[0]["global_batch"] == 1000  # whole micro-batches per DP rank (250 x 4), said in one line
    assert "global batch 1001 sequences priced as 1000" in out.replace("\n  ", " ")
    assert any(c.startswith("source_") for c in df.columns)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--tp", "3"], "must divide the heads"),
        (["--pp", "200"], "more stages than the model's 80 layers"),
        (["--tp", "8", "--pp", "2", "--dp", "3", "--nodes", "2"], "is not the 16 GPUs"),
        (["--params", "-7e9", "--tp", "8"], "must be > 0"),
        (["--params", "80e9", "--tp", "8"], "disagrees with the shape"),
        (["--tp", "8,4"], "takes one value for one layout"),
    ],
)
def test_bad_layout_is_one_line_exit_2(extra: list[str], needle: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    rc, _, err = run(["plan", "--model-preset", "llama3-70b", *extra, "--out", str(tmp_path)], capsys)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_nothing_fits_says_what_would_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["plan", "--model-preset", "llama3-8b", "--gpu", "h100", "--tp", "1", "--dp", "8",
                      "--global-batch", "64", "--out", str(tmp_path)], capsys)  # fmt: skip
    # DDP keeps 16 bytes per parameter of 8B on every GPU: ZeRO-3 shards them
    assert rc == 1 and "would fit: " in err and "--strategies zero3" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "plan.csv").exists()  # written before


def test_tp_comm_overlap_hides_tp_behind_its_layer() -> None:
    kw = {"model_preset": "llama3-70b", "gpu": "h100", "tp": 8, "pp": 4, "dp": 4, "global_batch": 64,
          "sequence_parallel": True, "strategies": ["zero1"]}  # fmt: skip
    plain = plan_layout(**kw).iloc[0]  # type: ignore[arg-type]
    over = plan_layout(tp_comm_overlap=True, **kw).iloc[0]  # type: ignore[arg-type]
    assert over["comm_exposed_s"] < plain["comm_exposed_s"] and over["comm_total_s"] == plain["comm_total_s"]
    assert "pipelined with the layer's matmuls" in over["comm_exposure"]
    assert "between the matmuls" in plain["comm_exposure"]


def test_flat_plan_console_has_units_and_fits_the_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("COLUMNS", "72")
    rc, out, err = run(["plan", "--model-preset", "gpt3-175b", "--gpu", "a100", "--nodes", "2", "--strategies",
                        "zero3,fsdp", "--precisions", "bf16", "--out", str(tmp_path)], capsys)  # fmt: skip
    assert rc == 1 and "no option fits" in err  # 175B on 16 GPUs: 16 bytes per parameter / 16 > 80 GB
    text = [x for x in out.splitlines() if not x.startswith(("csv: ", "md: ", "html: "))]  # paths are not wrapped
    assert not any(re.search(r"\de\+\d", x) for x in text) and " s" in out and all(len(x) <= 72 for x in text)
    df = pd.read_csv(tmp_path / "plan.csv")
    assert {"tp", "pp", "dp", "mfu", "tflops_per_gpu", "comm_exposed_s", "mem_headroom_bytes"} <= set(df.columns)


def test_search_with_nothing_that_fits_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["plan", "--model-preset", "gpt3-175b", "--gpus", "8", "--tp", "8", "--pp", "1", "--vpp", "1",
                      "--micro-batch", "1", "--strategies", "ddp", "--precisions", "bf16", "--out", str(tmp_path)],
                     capsys)  # fmt: skip
    assert rc == 1 and "no option fits" in err and len(err.strip().splitlines()) == 1


def test_flat_plan_interval_covers_the_kernel_efficiency() -> None:
    from commbench.planning.plan import plan

    r = plan(model_preset="llama3-8b", gpu="h100", nodes=2, strategies=["fsdp"], precisions=["bf16"]).iloc[0]
    k = GPUS["h100"].kernel_efficiency[1]
    assert r["step_time_low_s"] <= r["compute_s"] * k / (k + 0.1) + r["comm_time_high_s"]
    assert r["step_time_high_s"] >= r["compute_s"] * k / (k - 0.1) * (1 - 1e-12)  # the slow end: low efficiency
    assert r["step_time_low_s"] < r["step_time_s"] < r["step_time_high_s"]
