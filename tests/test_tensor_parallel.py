"""Tensor parallelism (training/tensor_parallel.py): counted bytes against Megatron-LM's formula, written out here
independently (4 all-reduces of b*s*h per layer per micro-batch, bus factor 2(n-1)/n), and the sharded model's
step-0 loss and gradient norm against the unsharded model's on the same weights and batch."""

from __future__ import annotations

from typing import Any

import pytest

from tests.distutil import run_in_world

SECTION = dict(
    model="gpt", batch_size=2, seq_len=8, d_model=32, n_layers=2, n_heads=4, vocab=64,
    steps=1, warmup_steps=1, measure_memory=False, comm_timed_steps=0,
)  # fmt: skip


def _rank(rank: int, n: int) -> dict[str, Any]:
    import torch

    from commbench.core import plugins
    from commbench.training.config import TrainingConfig
    from commbench.training.models import build_model, loss_fn, make_batch
    from commbench.training.policies import get_policy
    from commbench.training.runner import PolicySession

    plugins.load()
    sec = TrainingConfig.coerce(SECTION)
    out: dict[str, Any] = {}
    for name in ("tp_fp32", "tp_bf16"):
        sess = PolicySession(get_policy(name), sec, torch.device("cpu"))
        with sess.counter:
            sess.instrumented_step(0)
            calls, counted = dict(sess.counter.calls), sess.counter.snapshot()
            run = sess.finish()
        out[name] = dict(calls=calls, counted=counted, expected=run.comm_expected, loss=run.steps[0].loss,
                         grad_norm=run.steps[0].grad_norm)  # fmt: skip
    # The unsharded model, same seed (same weights), on the batches of every rank together.
    model = build_model(sec)
    xs, ys = zip(*(make_batch(sec, r, 0, torch.device("cpu")) for r in range(n)), strict=True)
    loss = loss_fn(model(torch.cat(xs)), torch.cat(ys))
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    out["ref_loss"] = float(loss)
    out["ref_grad_norm"] = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
    return out


def _megatron(n: int) -> dict[str, float]:
    """Bus bytes per step: 2 forward all-reduces per layer in the activation dtype, 2 backward ones in fp32 (the
    LayerNorm before each column-wise Linear returns fp32, under CPU autocast too)."""
    b = SECTION["batch_size"] * n  # the TP group's micro-batch: the batches of the ranks it replaces
    elems = b * SECTION["seq_len"] * SECTION["d_model"]
    factor = 2 * (n - 1) / n
    per_op = 2 * SECTION["n_layers"] * elems * factor
    return {"fp32": {"all_reduce:float": 2 * per_op * 4},
            "bf16": {"all_reduce:bfloat16": per_op * 2, "all_reduce:float": per_op * 4}}  # type: ignore[return-value]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nproc", [2, 4])
def test_tp_bytes_and_loss(nproc: int) -> None:
    results = run_in_world(_rank, nproc=nproc, timeout=200)
    want = _megatron(nproc)
    layers = SECTION["n_layers"]
    for r in results:
        fp32, bf16 = r["tp_fp32"], r["tp_bf16"]
        assert fp32["counted"] == pytest.approx(want["fp32"], rel=0, abs=0)
        assert fp32["expected"] == want["fp32"]
        assert fp32["calls"] == {"all_reduce:float": 4 * layers}
        assert bf16["counted"] == want["bf16"]
        assert bf16["expected"] == want["bf16"]
        assert bf16["calls"] == {"all_reduce:bfloat16": 2 * layers, "all_reduce:float": 2 * layers}
        # the sharding (qkv split by heads included) computes the unsharded model's function
        assert fp32["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)
        assert fp32["grad_norm"] == pytest.approx(r["ref_grad_norm"], rel=1e-4)
        assert bf16["loss"] == pytest.approx(r["ref_loss"], rel=2e-2)


def test_tp_layout_errors() -> None:
    from commbench.training.config import TrainingConfig
    from commbench.training.models import build_model
    from commbench.training.tensor_parallel import check_layout

    gpt = build_model(TrainingConfig.coerce(SECTION))
    check_layout(gpt, 2)
    with pytest.raises(ValueError, match="n_heads divisible by 3; n_heads=4"):
        check_layout(gpt, 3)
    mlp = build_model(TrainingConfig.coerce({**SECTION, "model": "mlp", "vocab": 8}))
    with pytest.raises(ValueError, match="needs the gpt model"):
        check_layout(mlp, 2)


def test_tp_policies_listed() -> None:
    from commbench.training.policies import get_policy, list_policies

    assert {"tp_fp32", "tp_bf16"} <= set(list_policies())
    assert get_policy("tp_bf16").autocast_name == "bfloat16"
