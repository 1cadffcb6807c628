"""Pipeline parallelism's byte and memory formulas (training/pipeline_parallel.py) against Megatron-LM's figure
written out here (Narayanan et al. 2021: b*s*h elements forward and b*s*h backward per stage boundary per
micro-batch; every rank's sends counted, bus factor 1), and DDP's ring all-reduce 2(n-1)/n over each stage's
data-parallel group. No torch.distributed world: the formulas are pure."""

from __future__ import annotations

import pytest

from commbench.core import plugins

plugins.load(kind="policy")  # the registry in its own order first: importing a policy module alone would reorder it
from commbench.training.pipeline_parallel import BOUNDARY, PipelineParallel  # noqa: E402
from commbench.training.strategies import BF16, INTER, INTRA, Layout  # noqa: E402

M, TOKENS, H = 4, 2 * 16, 32  # micro-batches, b*s of one micro-batch, hidden size
LAYOUT = PipelineParallel.layout(tokens=TOKENS, hidden=H)


def test_layout_carries_tokens_and_hidden() -> None:
    assert LAYOUT == Layout(activations=((BOUNDARY, H),), tokens=TOKENS)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_pipeline_over_the_whole_world(n: int) -> None:
    # pp = n stages: n-1 boundaries, each carrying M*b*s*h forward and M*b*s*h backward; over n ranks.
    total = 2 * (n - 1) * M * TOKENS * H
    pp = PipelineParallel(microbatches=M)
    assert pp.comm_bytes(psi=1e6, world_size=n, layout=LAYOUT) == {"send:float": total * 4 / n}
    half = PipelineParallel(microbatches=M, act_dtype_name=BF16)
    assert half.comm_bytes(psi=1e6, world_size=n, layout=LAYOUT) == {"send:bfloat16": total * 2 / n}


def test_each_rank_sends_its_boundaries() -> None:
    from commbench.training.strategies import World

    pp = PipelineParallel(microbatches=M)
    w = World(0.0, 4, layout=LAYOUT)
    one = M * TOKENS * H * 4
    per_rank = [sum(pp.send_bytes_of_rank(r, w)[INTRA].values()) for r in range(4)]
    assert per_rank == [one, 2 * one, 2 * one, one]  # first and last stage one direction, middle both


def test_pipeline_times_data_parallel() -> None:
    # 4 ranks, pp=2, dp=2: every rank sends M*b*s*h once (one boundary per pipeline), and its stage's DDP
    # all-reduces the stage's fp32 gradients over 2 ranks: 2(2-1)/2 * 4 bytes * Psi/2 on average.
    psi = 10_000
    pp = PipelineParallel(pp=2, microbatches=M)
    got = pp.comm_bytes(psi=psi, world_size=4, layout=LAYOUT)
    assert got == {"send:float": M * TOKENS * H * 4, "all_reduce:float": 1.0 * 4 * psi / 2}
    # on two nodes (ranks 0-1, 2-3): pipelines stay inside a node, the DP groups {0, 2}, {1, 3} cross
    split = pp.comm_by_link(psi=psi, world_size=4, layout=LAYOUT, nodes=2)
    assert split[INTRA] == {"send:float": M * TOKENS * H * 4}
    assert split[INTER] == {"all_reduce:float": 4 * psi / 2}


def test_boundary_across_nodes() -> None:
    # pp=4 on two nodes: the boundary 1|2 crosses; ranks 1 and 2 each send one direction over it.
    one = M * TOKENS * H * 4
    split = PipelineParallel(microbatches=M).comm_by_link(psi=0.0, world_size=4, layout=LAYOUT, nodes=2)
    assert split[INTER] == {"send:float": 2 * one / 4}
    assert split[INTRA] == {"send:float": 4 * one / 4}


def test_without_layout_nothing_is_claimed() -> None:
    assert PipelineParallel().comm_bytes(psi=1e9, world_size=4) == {}


def test_state_bytes_split_over_stages() -> None:
    assert PipelineParallel(pp=2).state_bytes(psi=1000, world_size=8) == 16 * 1000 / 2


@pytest.mark.parametrize(
    ("pp", "n", "match"),
    [(2, 3, "pp_degree=2 does not divide world_size=3"), (0, 1, "needs at least 2 stages")],
)
def test_layouts_that_cannot_form(pp: int, n: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PipelineParallel(pp=pp).degree(n)


def test_layout_error_names_the_problem() -> None:
    from types import SimpleNamespace

    from commbench.training.pipeline_parallel import PipelineParallel as PP

    def section(**kw: object) -> SimpleNamespace:
        base: dict[str, object] = dict(model="gpt", n_layers=4, batch_size=2, pp_degree=0, microbatches=4)
        return SimpleNamespace(**{**base, **kw})

    assert PP().configure(section()).layout_error(4) is None
    assert PP().configure(section(pp_degree=2)).layout_error(4) is None  # PP x DP
    assert "pp_degree=2 does not divide world_size=3" in str(PP().configure(section(pp_degree=2)).layout_error(3))
    assert "over 4 stages needs at least 4 layers (one per stage); n_layers=2" in str(
        PP().configure(section(n_layers=2)).layout_error(4)
    )
    assert PP().configure(section(n_layers=6)).layout_error(4) is None  # uneven: balanced over the stages
    assert "1F1B needs at least as many micro-batches as stages; microbatches=2 < pp_degree=4" in str(
        PP(schedule="1f1b").configure(section(microbatches=2, batch_size=8)).layout_error(4)
    )
    assert "needs the gpt model" in str(PP().configure(section(model="mlp")).layout_error(2))
    # 2 ranks x 1 sample = 2 samples per pipeline step: not 4 micro-batches
    assert "batch of 2 samples" in str(PP().configure(section(batch_size=1)).layout_error(2))
    assert PP().layout_error(2) is None  # not configured: the degree alone


@pytest.mark.parametrize("n", [2, 4])
def test_low_precision_wires(n: int) -> None:
    # fp16 and bf16 on the wire: 2 bytes an element; fp8 e4m3 through the codec: one byte an element plus a float32
    # scale per token (each token's h features are one chunk), counted as the uint8 bytes they are.
    total = 2 * (n - 1) * M * TOKENS
    fp16 = PipelineParallel(microbatches=M, act_dtype_name="float16")
    assert fp16.comm_bytes(psi=1e6, world_size=n, layout=LAYOUT) == {"send:half": total * H * 2 / n}
    fp8 = PipelineParallel(microbatches=M, codec="fp8_e4m3")
    assert fp8.comm_bytes(psi=1e6, world_size=n, layout=LAYOUT) == {"send:uint8": total * (H + 4) / n}


def test_wire_only_policies() -> None:
    from commbench.training.policies import get_policy

    for name, schedule in (("pp_gpipe_bf16comm", "gpipe"), ("pp_1f1b_bf16comm", "1f1b")):
        p = get_policy(name)  # bf16 on the wire, fp32 compute: no autocast
        assert p.autocast_name is None and p.sharding.act_dtype_name == BF16 and p.comm_dtype == "bf16"
        assert p.reference == f"pp_{schedule}_fp32" and p.sharding.schedule == schedule
    fp16 = get_policy("pp_1f1b_fp16")
    assert fp16.autocast_name == "float16" and fp16.comm_dtype == "fp16" and fp16.reference == "pp_1f1b_fp32"
    # stages hold different parameters: found-inf must be agreed by all of them (the scaler all-reduces it)
    assert fp16.loss_scaling.scales and fp16.loss_scaling.reduces_found_inf and fp16.pitfalls() == []
    assert fp16.comm_bytes(psi=0.0, world_size=2) == {"all_reduce:float": 4.0}  # 2(n-1)/n * one float
    fp8 = get_policy("pp_1f1b_fp8comm")
    assert fp8.autocast_name is None and fp8.comm_dtype == "fp8_e4m3" and fp8.reference == "pp_1f1b_fp32"
    assert fp8.underflow.relative > 0  # a scaled format: small elements of a token are lost relative to its amax


def test_codec_wire_needs_whole_words() -> None:
    from types import SimpleNamespace

    sec = SimpleNamespace(model="gpt", n_layers=4, batch_size=2, pp_degree=0, microbatches=4, d_model=30)
    fp8 = PipelineParallel(codec="fp8_e4m3")
    assert "a token's wire of 34 bytes (d_model=30 codes + scales)" in str(fp8.config_error(sec))
    assert "valid:" in str(fp8.configure(sec).layout_error(2))
    assert fp8.config_error(SimpleNamespace(**{**vars(sec), "d_model": 32})) is None
    assert PipelineParallel().config_error(sec) is None  # a cast carries any width
