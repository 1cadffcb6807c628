"""Context parallelism on a spawned 2-rank gloo world (training/context_parallel.py, ring_attention.py): ring
attention over gloo in float64 against full causal attention computed on each rank (outputs and gradients), every
policy's counted sends and all-reduce against the figure written out here (per layer (cp-1) [K; V] exchanges forward,
(cp-1) [K; V; dK; dV] and one [dK; dV] backward; 2(n-1)/n 4 Psi for the gradients), gloo's own profiler events for
those sends, and the step-0 loss and gradient norm against the unsplit model on the same global batch."""

from __future__ import annotations

from typing import Any

import pytest

from tests.distutil import run_in_world
from tests.unsplit import unsplit_reference

SECTION = dict(
    model="gpt", batch_size=2, seq_len=8, d_model=16, n_layers=2, n_heads=2, vocab=32,
    steps=1, warmup_steps=1, measure_memory=False, comm_timed_steps=0,
)  # fmt: skip
POLICIES = {"cp_fp32": ("float", 4), "cp_bf16comm": ("bfloat16", 2), "cp_bf16": ("bfloat16", 2)}
PROFILED = "cp_bf16comm"


def _ring_float64(rank: int, n: int) -> dict[str, Any]:
    """Ring attention over the gloo group against SDPA is_causal=True on the whole sequence, float64."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from commbench.training.comm import CommCounter
    from commbench.training.ring_attention import GroupRing, ring_attention

    g = torch.Generator().manual_seed(11)
    b, h, s, d = 2, 2, 6, 4
    q, k, v, go = (torch.randn(b, h, s, d, dtype=torch.float64, generator=g) for _ in range(4))
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*refs, is_causal=True)
    (ref * go).sum().backward()
    c = s // n
    sl = slice(rank * c, (rank + 1) * c)
    mine = [t[:, :, sl].clone().requires_grad_() for t in (q, k, v)]
    counter = CommCounter()
    with counter:
        out = ring_attention(*mine, GroupRing(dist.group.WORLD, tuple(range(n)), rank), torch.float64)
        (out * go[:, :, sl]).sum().backward()
    err = max(
        float((a - r[:, :, sl]).abs().max())
        for a, r in ((out, ref), *zip((m.grad for m in mine), (r.grad for r in refs), strict=True))
    )
    return dict(err=err, calls=dict(counter.calls), bytes=counter.snapshot(), block=b * h * c * d * 8)


def _profiled(rank: int, out: str) -> dict[str, Any]:
    from pathlib import Path

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from commbench.training.config import TrainingConfig
    from commbench.training.policies import get_policy
    from commbench.training.runner import PolicySession

    sec = TrainingConfig.coerce(SECTION)
    sess = PolicySession(get_policy(PROFILED).configure(sec), sec, torch.device("cpu"))
    path = Path(out) / f"rank{rank}.json"
    got: dict[str, Any] = {}
    with sess.counter, profile(
        activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(wait=0, warmup=1, active=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:  # fmt: skip
        for st in range(2):
            sess.instrumented_step(st, numerics=False)
            if st == 1:
                got = dict(trace=str(path), calls=dict(sess.counter.calls), size=dict(sess.counter.size_bytes))
            prof.step()
    return got


def _rank(rank: int, n: int, out: str) -> dict[str, Any]:
    import torch

    from commbench.training.config import TrainingConfig
    from commbench.training.policies import get_policy
    from commbench.training.runner import PolicySession

    res: dict[str, Any] = {"ring": _ring_float64(rank, n), "profiled": _profiled(rank, out)}
    sec = TrainingConfig.coerce(SECTION)
    for name in POLICIES:
        sess = PolicySession(get_policy(name).configure(sec), sec, torch.device("cpu"))
        with sess.counter:
            sess.instrumented_step(0)
            calls, counted = dict(sess.counter.calls), sess.counter.snapshot()
            run = sess.finish()
        res[name] = dict(calls=calls, counted=counted, expected=run.comm_expected, loss=run.steps[0].loss,
                         grad_norm=run.steps[0].grad_norm, parallelism=sess.policy.sharding.parallelism)  # fmt: skip
    model, res["ref_loss"], res["ref_grad_norm"] = unsplit_reference(sec, n)
    res["psi"] = sum(p.numel() for p in model.parameters())
    res["skip"] = (
        get_policy("cp_fp32").configure(TrainingConfig.coerce({**SECTION, "seq_len": 7})).sharding.layout_error(n)
    )
    return res


def _check_profiled(results: list[dict[str, Any]]) -> None:
    """gloo's own send events in the profiled step: as many as counted, each [K; V] or [K; V; dK; dV] or [dK; dV]
    block stack in bf16, to the other rank, the bytes the counter counted."""
    from pathlib import Path

    from commbench.store.traces import read_trace, step_calls

    n, L, h = 2, SECTION["n_layers"], SECTION["d_model"]
    block = SECTION["batch_size"] * n * SECTION["seq_len"] // n * h * 2  # one K block, bf16
    for rank, res in enumerate(results):
        got = res["profiled"]
        sends = [c for c in step_calls(read_trace(Path(got["trace"])), 1) if c.collective == "send"]
        assert len(sends) == got["calls"]["send:bfloat16"] == 3 * L, rank  # per layer 1 forward, 2 backward
        assert {c.peer for c in sends} == {1 - rank} and {c.dtype for c in sends} == {"bfloat16"}, rank
        assert sorted(c.size_bytes for c in sends) == sorted([2 * block] * 2 * L + [4 * block] * L), rank
        assert sum(c.size_bytes for c in sends) == got["size"]["send:bfloat16"], rank


@pytest.mark.timeout(240)
def test_cp_two_ranks(tmp_path: Any) -> None:
    n = 2
    results = run_in_world(_rank, nproc=n, timeout=220, out=str(tmp_path))
    L, h, s, b = SECTION["n_layers"], SECTION["d_model"], SECTION["seq_len"], SECTION["batch_size"] * n
    for r, res in enumerate(results):
        ring = res["ring"]
        assert ring["err"] < 1e-12, r  # outputs, dQ, dK, dV of the chunk: full causal attention's
        assert ring["calls"] == {"send:double": 3}  # one [K; V] forward, one [K; V; dK; dV] and one [dK; dV] back
        assert ring["bytes"] == {"send:double": (2 + 4 + 2) * ring["block"]}
        for name, (dt, size) in POLICIES.items():
            got = res[name]
            n_block = b * (s // n) * h  # one K block of this rank's chunk of the group's batch
            want = {f"send:{dt}": L * (2 * (n - 1) + 4 * (n - 1) + 2) * n_block * size,
                    "all_reduce:float": 2 * (n - 1) / n * 4 * res["psi"]}  # fmt: skip
            assert got["counted"] == pytest.approx(want, rel=1e-15), name
            assert got["expected"] == pytest.approx(want, rel=1e-15), name
            assert got["calls"] == {f"send:{dt}": 3 * L, "all_reduce:float": 1}, name
            assert got["parallelism"] == "cp"
            tol = 1e-5 if name == "cp_fp32" else 3e-2
            assert got["loss"] == pytest.approx(res["ref_loss"], rel=tol), name
            assert got["grad_norm"] == pytest.approx(res["ref_grad_norm"], rel=1e-4 if tol < 1e-3 else 5e-2), name
        assert (
            res["skip"]
            == "context parallelism: seq_len=7 does not split into cp_degree=2 chunks; valid: a multiple of 2"
        )
    _check_profiled(results)


def test_cp_impossible_layouts_fail_at_load() -> None:
    from commbench.training.config import TrainingConfig

    with pytest.raises(ValueError, match=r"cp_fp32: context parallelism: seq_len=9 does not split into cp_degree=2"):
        TrainingConfig.coerce({**SECTION, "seq_len": 9, "cp_degree": 2, "policies": ["cp_fp32"]})
    with pytest.raises(ValueError, match=r"cp_bf16: context parallelism needs the gpt model"):
        TrainingConfig.coerce({"model": "mlp", "vocab": 8, "policies": ["cp_bf16"]})
    sh = TrainingConfig.coerce({**SECTION, "cp_degree": 4, "policies": ["cp_fp32"]})
    assert sh.cp_degree == 4  # divides seq_len=8: loads; a 2-rank world then skips it with one line
    from commbench.training.policies import get_policy

    assert get_policy("cp_fp32").sharding.__class__(cp=4).layout_error(2) == (
        "context parallelism: cp_degree=4 does not divide world_size=2; valid: a divisor of 2 (>= 2), or 0 for the whole world"
    )
