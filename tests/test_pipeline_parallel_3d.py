"""3-D TP x PP x DP (training/tp_pp_dp.py) on one spawned 8-rank gloo world, 2 x 2 x 2 on a (pp, dp, tp) mesh: every
rank's counted TP all-reduces, pipeline sends and DP all-reduce against the figures worked out here by hand
(Megatron-LM's 4 all-reduces of T h per block per micro-batch; T h per boundary per micro-batch each way; 4 bytes
per local parameter, bus factor 1 at dp = 2), gloo's own profiler events per group (which ranks each call ran on),
and the step-0 loss and gradients against the unsplit model on the same global batch (the TP shards gathered, the
fused qkv rows put back in head order)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.distutil import run_in_world
from tests.unsplit import unsplit_reference

SECTION = dict(
    model="gpt", batch_size=1, seq_len=4, d_model=16, n_layers=2, n_heads=2, vocab=16, microbatches=2,
    steps=1, warmup_steps=1, measure_memory=False, comm_timed_steps=0,
)  # fmt: skip
N, PP, DP, TP = 8, 2, 2, 2
H = SECTION["d_model"]
T = SECTION["batch_size"] * PP * TP // SECTION["microbatches"] * SECTION["seq_len"]
"""Tokens of one micro-batch: a replica's pp x tp batches split into M."""


def _local_block() -> int:
    """One block's parameters on one TP rank: LayerNorms and row-wise biases whole, the rest split in 2."""
    h = H
    return (
        2 * h
        + (3 * h * h + 3 * h) // TP
        + (h * h // TP + h)
        + 2 * h
        + (4 * h * h + 4 * h) // TP
        + (4 * h * h // TP + h)
    )


def _local_params(p: int) -> int:
    v, s = SECTION["vocab"], SECTION["seq_len"]
    return _local_block() + ((v * H + s * H) if p == 0 else (2 * H + H * v))  # embeddings / ln_f + untied head


def _qkv_order() -> list[int]:
    """Head order of the fused qkv rows at tp = 2, h = 16 (8 rows of q, k, v per rank), written out."""
    return [*range(0, 8), *range(16, 24), *range(32, 40), *range(8, 16), *range(24, 32), *range(40, 48)]


def _rank(rank: int, n: int, out: str) -> dict[str, Any]:
    import contextlib
    from pathlib import Path

    import torch
    from torch.distributed.tensor import DTensor
    from torch.profiler import ProfilerActivity, profile, schedule

    from commbench.training.comm import CommCounter
    from commbench.training.config import TrainingConfig
    from commbench.training.models import build_model, loss_fn, make_batch
    from commbench.training.policies import get_policy

    sec = TrainingConfig.coerce(SECTION)
    pol = get_policy("tp_pp_dp_fp32").configure(sec)
    sh = pol.sharding
    cpu = torch.device("cpu")
    model = build_model(sec)
    wrapped, _ = sh.wrap(model, device=cpu, lr=1e-3, world_size=n, grad_comm=pol.grad_comm)
    parts = [make_batch(sec, r, 0, cpu) for r in sh.data_ranks(rank, n)]
    x, y = torch.cat([a for a, _ in parts]), torch.cat([b for _, b in parts])
    path = Path(out) / f"rank{rank}.json"
    res: dict[str, Any] = {"layout_error_4": sh.layout_error(4)}
    counters = [CommCounter(), CommCounter()]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=0, warmup=1, active=1),
                 on_trace_ready=lambda pr: pr.export_chrome_trace(str(path))) as prof:  # fmt: skip
        for s, counter in enumerate(counters):
            with counter:
                loss = sh.pipeline_step(wrapped, x, y, loss=loss_fn, scale=1.0, autocast=contextlib.nullcontext)
            if s == 0:
                assert loss is not None
                res["loss"] = float(loss)
                grads = {}
                for name, p in model.named_parameters():
                    if p.grad is not None:
                        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                        grads[name] = g.detach().clone()
                wrapped.zero_grad(set_to_none=True)
            prof.step()
    res.update(calls=dict(counters[1].calls), counted=counters[1].snapshot(), trace=str(path))
    layout = sh.describe_activations(build_model(sec))
    from commbench.training.strategies import Layout

    res["expected"] = pol.comm_bytes(
        psi=0.0, world_size=n, layout=Layout(units=sh.describe(build_model(sec)), activations=layout, tokens=T)
    )
    res["bf16"] = _bf16(rank, n, sec, x, y)
    from commbench.training.runner import PolicySession

    sess = PolicySession(pol, sec, cpu)  # the runner's own step and statistics
    with sess.counter:
        sess.instrumented_step(0)
        run = sess.finish()
    res["session"] = dict(loss=run.steps[0].loss, grad_norm=run.steps[0].grad_norm, expected=run.comm_expected)
    # the unsplit model, same seed, on every rank's batch together
    ref, res["ref_loss"], res["ref_grad_norm"] = unsplit_reference(sec, n)
    order = torch.tensor(_qkv_order())
    errs = {}
    for name, p in ref.named_parameters():
        if name in grads:
            want = p.grad[order] if name.endswith("attn.qkv.weight") or name.endswith("attn.qkv.bias") else p.grad
            errs[name] = float((grads[name] - want).abs().max() / want.abs().max())
    res["grad_errs"] = errs
    return res


def _bf16(rank: int, n: int, sec: Any, x: Any, y: Any) -> dict[str, Any]:
    """tp_pp_dp_bf16's second step under autocast bf16: counted bytes and calls, the formula, the loss."""
    import torch

    from commbench.training.comm import CommCounter
    from commbench.training.models import build_model, loss_fn
    from commbench.training.policies import get_policy
    from commbench.training.strategies import Layout

    pol = get_policy("tp_pp_dp_bf16").configure(sec)
    sh = pol.sharding
    model = build_model(sec)
    wrapped, _ = sh.wrap(model, device=torch.device("cpu"), lr=1e-3, world_size=n, grad_comm=pol.grad_comm)
    for _step in range(2):  # the first also exchanges the stages' shapes
        counter = CommCounter()
        with counter:
            loss = sh.pipeline_step(
                wrapped, x, y, loss=loss_fn, scale=1.0, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16)
            )
        wrapped.zero_grad(set_to_none=True)
    ref = build_model(sec)
    layout = Layout(units=sh.describe(ref), activations=sh.describe_activations(ref), tokens=T)
    assert loss is not None
    return dict(counted=counter.snapshot(), calls=dict(counter.calls), loss=float(loss),
                expected=pol.comm_bytes(psi=0.0, world_size=n, layout=layout))  # fmt: skip


def _profiled_bytes(path: Any) -> dict[str, Any]:
    """(calls, bytes) of the step's TP, DP and send events in a gloo Kineto trace (fp32: 4 bytes an element). The
    trace reader cannot place these calls on a group (gloo records no process-group name, and three 2-rank groups
    hold each rank), so the kinds are told apart by operator, which here is by group."""
    import json
    import math

    def numel(e: dict[str, Any]) -> int:
        dims = e["args"]["Input Dims"][0]
        return math.prod(dims[0] if dims and isinstance(dims[0], list) else dims)

    evs = json.loads(path.read_text())["traceEvents"]
    funcol = [e for e in evs if e.get("name") == "_c10d_functional::all_reduce"]
    c10d = [e for e in evs if e.get("name") == "c10d::allreduce_"]
    sends = [e for e in evs if e.get("name") == "c10d::send"]
    tp = sum(4 * numel(e) for e in funcol)
    return dict(tp=(len(funcol), tp), dp=(len(c10d) - len(funcol), sum(4 * numel(e) for e in c10d) - tp),
                send=(len(sends), sum(4 * numel(e) for e in sends)), peers={e["args"]["Concrete Inputs"][2] for e in sends})  # fmt: skip


@pytest.mark.timeout(300)
def test_tp_pp_dp_eight_ranks(tmp_path: Any) -> None:
    from pathlib import Path

    results = run_in_world(_rank, nproc=N, timeout=280, out=str(tmp_path))
    m = SECTION["microbatches"]
    means: dict[str, float] = {}
    for rank, res in enumerate(results):
        p = rank // (DP * TP)
        tp_bytes = 4 * m * T * H * 4  # 4 all-reduces of T h fp32 per block per micro-batch, 1 block, bus 2(2-1)/2
        dp_bytes = 4 * _local_params(p)  # the stage's local gradients, bus factor 2(2-1)/2
        want = {"all_reduce:float": tp_bytes + dp_bytes, "send:float": m * T * H * 4}  # M sends one way
        assert res["counted"] == pytest.approx(want, rel=1e-15), rank
        assert res["calls"] == {"all_reduce:float": 4 * m + 1, "send:float": m}, rank
        for k, v in want.items():
            means[k] = means.get(k, 0.0) + v / N
        # gloo's own events: the TP all-reduces are DTensor's functional ones (each wraps a c10d allreduce_), the
        # DP one the only bare c10d allreduce_, the sends c10d sends to the other stage (group rank 1 - p)
        got = _profiled_bytes(Path(res["trace"]))
        assert got == dict(tp=(4 * m, tp_bytes), dp=(1, dp_bytes), send=(m, m * T * H * 4), peers={str(1 - p)}), rank
        # the unsplit model's loss (on the last stage) and gradients (every stage's parameters)
        assert len(res["grad_errs"]) == 12 + (2 if p == 0 else 3), rank  # a block's 12 tensors; tok, pos / ln_f, head
        assert max(res["grad_errs"].values()) < 1e-5, (rank, res["grad_errs"])
        assert "3-D TP x PP x DP needs a world" in res["layout_error_4"]
        # bf16: the row-wise outputs' forward all-reduces and the boundaries in bf16, the column-wise inputs'
        # gradients (the LayerNorm's fp32 output under CPU autocast) and the DP reduce in fp32
        b16 = res["bf16"]
        assert b16["counted"] == {"all_reduce:bfloat16": 2 * m * T * H * 2, "all_reduce:float": 2 * m * T * H * 4 + dp_bytes,
                                  "send:bfloat16": m * T * H * 2}, rank  # fmt: skip
        assert b16["calls"] == {"all_reduce:bfloat16": 2 * m, "all_reduce:float": 2 * m + 1, "send:bfloat16": m}, rank
    b16_mean: dict[str, float] = {}
    for res in results:
        for k, v in res["bf16"]["counted"].items():
            b16_mean[k] = b16_mean.get(k, 0.0) + v / N
    assert results[0]["bf16"]["expected"] == pytest.approx(b16_mean, rel=1e-12)
    assert results[0]["expected"] == pytest.approx(means, rel=1e-12)  # the strategy's formula: the mean over ranks
    # the replicas' losses (on the last stage, each its half of the global batch) average to the unsplit model's
    last = [res["loss"] for r, res in enumerate(results) if r // (DP * TP) == PP - 1]
    assert sum(last) / len(last) == pytest.approx(results[0]["ref_loss"], rel=1e-5)
    for res in results:  # the runner's step: its loss (mean over the last stages) and gradient norm (each tensor once)
        assert res["session"]["loss"] == pytest.approx(res["ref_loss"], rel=1e-5)
        assert res["session"]["grad_norm"] == pytest.approx(res["ref_grad_norm"], rel=1e-4)
        assert res["session"]["expected"] == pytest.approx(means, rel=1e-12)
