"""tp_float8 and tp_sp_float8 (training/float8.py): torchao's float8 Linears under tensor parallelism with
torchao's float8 styles. In one 2-rank gloo world: the plan of styles, the counted bytes against the collectives
written out here from the model's dimensions and against torch.profiler's own events, the drift from the fp32 TP
policy of the same layout, and the one-line skip where torchao is missing."""

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
PAIRS = (("tp_float8", "tp_fp32"), ("tp_sp_float8", "tp_sp_fp32"))
"""Each float8 policy and its reference."""


def _expected(n: int, sp: bool) -> dict[str, float]:
    """Bus bytes per step of one TP group of n ranks (the whole world). The group computes every rank's batch
    together: b*s*h = E elements per activation of each of the 4 Linears of a block (qkv, fc take h features in; proj,
    out give h out). Reductions fp32, as tp_fp32 / tp_sp_fp32; under SP the two column-wise inputs (forward, e4m3)
    and the two row-wise output gradients (backward, e5m2) all-gathered at one byte per element, the region's entry
    and exit one fp32 all-gather of E each, the 2 LayerNorms' weight and bias gradients (h each) all-reduced fp32.
    Amaxes, one float64 each: per Linear its weight shard twice (forward cast, backward recast), its Shard(-1)
    activation once (row-wise input, column-wise output gradient), under SP its sequence-sharded one once."""
    h, layers = SECTION["d_model"], SECTION["n_layers"]
    e = n * SECTION["batch_size"] * SECTION["seq_len"] * h
    ar, half = 2 * (n - 1) / n, (n - 1) / n
    amaxes = layers * 4 * (4 if sp else 3)
    if not sp:
        return {"all_reduce:float": layers * 4 * ar * e * 4, "all_reduce:double": ar * 8 * amaxes}
    return {
        "all_gather:uint8": layers * 4 * half * e,
        "reduce_scatter:float": layers * 4 * half * e * 4,
        "all_gather:float": 2 * half * e * 4,
        "all_reduce:float": layers * 4 * ar * h * 4,
        "all_reduce:double": ar * 8 * amaxes,
    }


def _rank(rank: int, n: int, trace_dir: str) -> dict[str, Any]:
    from pathlib import Path

    from commbench.core import plugins
    from commbench.training import runner
    from commbench.training.config import TrainingConfig

    plugins.load()
    sec = TrainingConfig.coerce(SECTION)
    out: dict[str, Any] = {}
    for name in [p for pair in PAIRS for p in pair]:
        before = runner.compat.group_names()
        out[name] = profiled_policy(name, sec, Path(trace_dir) / name / f"rank{rank}.json")
        runner._destroy_groups_since(before)
    # a rank without torchao: the run skips each float8 policy with one line, the baseline runs
    out["rows"] = rows_without_torchao(runner, SECTION, [p for p, _ in PAIRS])
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    pytest.importorskip("torchao.float8")
    return run_in_world(_rank, nproc=2, timeout=150, trace_dir=str(tmp_path_factory.mktemp("float8_tp")))


@pytest.mark.timeout(180)
def test_counted_bytes_equal_the_formula_and_the_profiler(world: list[dict[str, Any]]) -> None:
    bus = {"all_gather": 1 / 2, "reduce_scatter": 1 / 2, "all_reduce": 1.0}  # nccl-tests' factors at n = 2
    calls_of = {  # per step: 4 Linears per block, 2 blocks
        "tp_float8": {"all_reduce:float": 8, "all_reduce:double": 24},
        "tp_sp_float8": {"all_gather:uint8": 8, "reduce_scatter:float": 8, "all_gather:float": 2,
                         "all_reduce:float": 8, "all_reduce:double": 32},
    }  # fmt: skip
    for name, _ in PAIRS:
        want = _expected(2, sp="_sp_" in name)
        for rank, r in enumerate(world):
            got = r[name]
            assert "Float8Linear" in got["layers"], (name, rank)
            assert got["expected"] == pytest.approx(want, rel=1e-12), (name, rank)
            for step, (_, _, comm) in enumerate(got["steps"]):
                assert comm == pytest.approx(want, rel=1e-12), (name, rank, step)
            calls, sizes, trace = traced_calls(got["trace"])  # the profiler's events, read by commbench's reader
            assert calls == got["calls"] == calls_of[name] and sizes == got["sizes"], (name, rank)
            assert {k: v * bus[k.split(":")[0]] for k, v in sizes.items()} == want, (name, rank)
            assert trace.world_size == 2 and trace.backend == "gloo" and all(c.group == (0, 1) for c in trace.calls)


@pytest.mark.timeout(180)
def test_drift_from_the_fp32_tp_policy_is_small_but_not_zero(world: list[dict[str, Any]]) -> None:
    """Float8 matmuls against the fp32 TP policy of the same layout on the same data: every step's loss within 1 %
    and gradient norm within 10 %, but not the same numbers (the conversion took)."""
    for r in world:
        for name, ref in PAIRS:
            for (loss, gn, _), (ref_loss, ref_gn, _) in zip(r[name]["steps"], r[ref]["steps"], strict=True):
                assert math.isfinite(loss) and math.isfinite(gn)
                assert loss == pytest.approx(ref_loss, rel=1e-2) and gn == pytest.approx(ref_gn, rel=1e-1), name
                assert loss != ref_loss, name


@pytest.mark.timeout(180)
def test_a_missing_torchao_skips_with_one_line(world: list[dict[str, Any]]) -> None:
    from commbench.cli.orchestrate import model_parallel_skipped
    from commbench.training.float8 import INSTALL_HINT

    rows = world[0]["rows"]
    assert [r["policy"] for r in rows] == ["fp32", *(p for p, _ in PAIRS)] and not rows[0]["error"]
    for row in rows[1:]:
        assert row["error"] == f"{row['policy']} skipped: {INSTALL_HINT}" and row["steps"] == 0
    said = model_parallel_skipped(rows)
    assert all(p in said for p, _ in PAIRS) and "\n" not in said
    assert world[1]["rows"] == []


def test_the_plan_is_torchaos_float8_styles() -> None:
    """torchtitan's recipe on the GPT block: float8 column-/row-wise styles on the four Linears; under SP the norms
    sequence parallel, the attention's input cast and gathered once by PrepareFloat8ModuleInput (so its qkv takes a
    replicated float8 input), fc's by its own style, the row-wise outputs reduce-scattered along the sequence."""
    pytest.importorskip("torchao.float8")
    from torch.distributed.tensor import Replicate, Shard

    from commbench.training.float8 import TensorParallelFloat8

    for sp in (False, True):
        sharding = TensorParallelFloat8(sequence_parallel=sp)
        plan = {k: (type(v).__name__, v) for k, v in sharding._block_plan(sharding._styles()).items()}
        names = {k: n for k, (n, _) in plan.items()}
        linears = {"attn.qkv": "Float8ColwiseParallel", "attn.proj": "Float8RowwiseParallel",
                   "fc": "Float8ColwiseParallel", "out": "Float8RowwiseParallel"}  # fmt: skip
        if not sp:
            assert names == linears
            assert all(v.output_layouts in ((Replicate(),), (Shard(-1),)) for _, v in plan.values())
            continue
        assert names == {**linears, "ln1": "SequenceParallel", "ln2": "SequenceParallel",
                         "attn": "PrepareFloat8ModuleInput"}  # fmt: skip
        prep = plan["attn"][1]
        assert prep.input_layouts == (Shard(1),) and prep.desired_input_layouts == (Replicate(),)
        assert plan["attn.qkv"][1].input_layouts == (Replicate(),) and plan["fc"][1].input_layouts == (Shard(1),)
        assert plan["attn.proj"][1].output_layouts == plan["out"][1].output_layouts == (Shard(1),)


def test_formula_at_four_ranks_the_layout_check_and_the_declared_reference() -> None:
    """The planner's question at n = 4 (h = 64, 256 tokens, one block), written out: without SP 4 fp32 all-reduces
    and 12 float64 amax all-reduces; with SP 4 uint8 all-gathers, 4 fp32 reduce-scatters, the region's 2 fp32
    all-gathers, the norms' 4h fp32 and 16 amaxes. A width whose shards are not multiples of 16 is one line."""
    from commbench.core import plugins
    from commbench.training.config import TrainingConfig
    from commbench.training.float8 import FSDP2Float8
    from commbench.training.policies import get_policy
    from commbench.training.runner import reference_of
    from commbench.training.strategies import Layout
    from commbench.training.tensor_parallel import COLWISE, NORM_GRAD, ROWWISE, SEQ_GATHER, SEQ_SPLIT

    plugins.load()
    h, tokens, n = 64, 256, 4
    e, ar, part = tokens * h, 2 * 3 / 4, 3 / 4
    linears = ((COLWISE, h), (ROWWISE, h), (COLWISE, h), (ROWWISE, h))
    plain = Layout(activations=linears, tokens=tokens)
    sp = Layout(activations=(*linears, *((NORM_GRAD, h),) * 4, (SEQ_SPLIT, h), (SEQ_GATHER, h)), tokens=tokens)
    assert get_policy("tp_float8").comm_bytes(psi=1.0, world_size=n, layout=plain) == pytest.approx(
        {"all_reduce:float": 4 * ar * e * 4, "all_reduce:double": 12 * ar * 8}
    )
    assert get_policy("tp_sp_float8").comm_bytes(psi=1.0, world_size=n, layout=sp) == pytest.approx({
        "all_gather:uint8": 4 * part * e, "reduce_scatter:float": 4 * part * e * 4,
        "all_gather:float": 2 * part * e * 4, "all_reduce:float": ar * 4 * h * 4, "all_reduce:double": 16 * ar * 8,
    })  # fmt: skip
    for name, ref in PAIRS:
        p = get_policy(name)
        assert reference_of(p) == ref and p.sharding.parallelism == "tp" == get_policy(ref).sharding.parallelism
        assert p.underflow == FSDP2Float8().grad_underflows()[-1]  # the e5m2 gradients, as fsdp2_float8's
        sec = TrainingConfig.coerce({**SECTION, "d_model": 32, "n_heads": 4})
        line = p.configure(sec).sharding.layout_error(4)
        assert (
            line == "float8 tensor parallelism needs d_model divisible by 16 x the TP degree 4 (each shard's "
            "features a multiple of 16); d_model=32"
        )
        assert p.configure(sec).sharding.layout_error(2) is None


def test_skips_as_fsdp2_float8(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same one line as fsdp2_float8 where float8 cannot run: torchao missing, a CUDA GPU below sm_89."""
    import torch

    from commbench.training.float8 import INSTALL_HINT, FSDP2Float8, TensorParallelFloat8

    tp, fsdp = TensorParallelFloat8(sequence_parallel=True), FSDP2Float8()
    with monkeypatch.context() as m:
        for name in HIDDEN:
            m.setitem(sys.modules, name, None)
        assert tp.environment_error(torch.device("cpu")) == INSTALL_HINT == tp.environment_error(torch.device("cuda"))
    pytest.importorskip("torchao.float8")
    assert tp.environment_error(torch.device("cpu")) is None  # runs on CPU: gloo gathers the float8 codes as bytes
    for cc in ((8, 6), (8, 9), (9, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None, cc=cc: cc)
        dev = torch.device("cuda", 0)
        assert tp.environment_error(dev) == fsdp.environment_error(dev) and (tp.environment_error(dev) is None) == (
            cc >= (8, 9)
        )
