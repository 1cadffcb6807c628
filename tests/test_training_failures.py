"""A training policy that fails on one rank only is named on every rank and skipped on all of them.

One 2-rank gloo world runs seven policies; rank 1 alone fails five of them, each at a different place:
  bf16_hook     out of memory while building the model (before DDP's first collective)
  fp16_hook     out of memory in the forward of the first (warm-up) step, before DDP's backward all-reduce
  fp8_hook      an error inside a measured step's backward, after DDP launched the reduction of earlier buckets:
                rank 0 is then inside DDP's reduction, waiting for rank 1's last bucket
  pp_gpipe_fp32 an error in the second micro-batch's forward of the last stage, inside the pipeline schedule:
                rank 0 (stage 0) is then inside the schedule's sends and receives
  amp_bf16      an error after a measured step's collectives (the gradient statistics), outside its clock
Without the failure board (the store side channel), rank 0 would stay in DDP's or the schedule's collectives until
the collective timeout; the world here runs with a 60 s timeout, and the whole test takes far less, so a hang fails
it. References are the injected errors themselves and the policy order; the policies after the failures must still
produce complete rows (the fresh process group works).
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import torch

from commbench.training.runner import PolicyFailed
from tests.distutil import run_in_world

SECTION: dict[str, Any] = {"model": "gpt", "steps": 2, "warmup_steps": 1, "batch_size": 2, "seq_len": 8,
    "d_model": 16, "n_layers": 2, "n_heads": 2, "vocab": 32, "seed": 1, "measure_memory": False,
    "comm_timed_steps": 1,
    "microbatches": 2, "paired": False,  # one session per policy: the failures are what is tested here
    "policies": ["fp32", "bf16_hook", "fp16_hook", "fp8_hook", "pp_gpipe_fp32", "amp_bf16", "zero1_fp32"]}  # fmt: skip
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"  # the first words of torch's CUDA OOM message
FORWARD_OOM = "CUDA out of memory (injected in the forward)"
STATS_ERROR = "injected after the step's collectives"
BACKWARD_ERROR = "CUDA out of memory (injected in the backward, during DDP's reduction)"
SCHEDULE_ERROR = "injected in the last stage's second micro-batch"


def _world(rank: int, world_size: int) -> dict[str, Any]:
    import commbench.training.nets as nets
    import commbench.training.runner as runner
    import commbench.training.session as session

    current: list[str] = []
    events: list[tuple[str, str]] = []  # (policy, what happened) on this rank, in order
    run_policy, build_model = runner.run_policy, session.build_model
    instrumented, finish = session.PolicySession.instrumented_step, session.PolicySession.finish
    stage_forward = nets.GPTStage.forward
    calls = {"stage": 0}

    def failing_stage(self: Any, x: torch.Tensor) -> torch.Tensor:
        if rank == 1 and current[-1] == "pp_gpipe_fp32":
            calls["stage"] += 1
            if calls["stage"] == 2:
                raise RuntimeError(SCHEDULE_ERROR)
        return stage_forward(self, x)

    def tracked_run_policy(policy: Any, *args: Any, **kwargs: Any) -> Any:
        current.append(policy.name)
        return run_policy(policy, *args, **kwargs)

    def failing_build(section: Any) -> Any:
        name = current[-1]
        events.append((name, "build"))
        if rank == 1 and name == "bf16_hook":
            raise torch.OutOfMemoryError(OOM)
        model = build_model(section)
        if rank == 1 and name == "fp16_hook":
            inner = model.forward

            def forward(*a: Any, **k: Any) -> Any:
                if not any(e == (name, "forward") for e in events):
                    events.append((name, "forward"))
                    raise RuntimeError(FORWARD_OOM)
                return inner(*a, **k)

            model.forward = forward  # DDP calls module(...) -> this instance's forward
        if rank == 1 and name == "fp8_hook":
            first = next(model.parameters())  # the embedding: its gradient is the last of the backward

            def raise_in_backward(grad: torch.Tensor) -> torch.Tensor:
                if sum(1 for e in events if e == (name, "backward")) == 1:  # the first measured step's backward
                    raise torch.OutOfMemoryError(BACKWARD_ERROR)
                events.append((name, "backward"))
                return grad

            first.register_hook(raise_in_backward)
        return model

    def failing_step(self: Any, s: int, **kwargs: Any) -> None:
        instrumented(self, s, **kwargs)
        if rank == 1 and self.policy.name == "amp_bf16" and s == 2:  # a measured step, its collectives done
            raise ValueError(STATS_ERROR)

    def tracked_finish(self: Any) -> Any:
        events.append((self.policy.name, "finish"))
        return finish(self)

    runner.run_policy = tracked_run_policy  # type: ignore[assignment]
    session.build_model = failing_build  # type: ignore[assignment]
    session.PolicySession.instrumented_step = failing_step  # type: ignore[method-assign]
    session.PolicySession.finish = tracked_finish  # type: ignore[method-assign]
    nets.GPTStage.forward = failing_stage  # type: ignore[method-assign]
    done: list[str] = []
    t0 = time.monotonic()
    summary, steps = runner.run_training(
        SECTION, device=torch.device("cpu"), poll_s=0.2, on_policy_done=lambda s, st: done.extend(r.policy for r in s)
    )
    return {
        "summary": [r.as_dict() for r in summary],
        "steps": [r.as_dict() for r in steps],
        "events": events,
        "done": done,
        "seconds": time.monotonic() - t0,
    }


@pytest.fixture(scope="module")
def world() -> list[dict[str, Any]]:
    return run_in_world(_world, nproc=2, timeout=60)


@pytest.mark.timeout(120)
def test_failed_policies_are_skipped_with_the_rank_and_error_named(world: list[dict[str, Any]]) -> None:
    rows = {r["policy"]: r for r in world[0]["summary"]}
    assert list(rows) == SECTION["policies"] == world[0]["done"]
    expected = {
        "bf16_hook": f"rank 1: OutOfMemoryError: {OOM} (building the model)",
        "fp16_hook": f"rank 1: RuntimeError: {FORWARD_OOM} (step 0)",
        "fp8_hook": f"rank 1: OutOfMemoryError: {BACKWARD_ERROR} (step 1)",
        "pp_gpipe_fp32": f"rank 1: RuntimeError: {SCHEDULE_ERROR} [in: RuntimeError: [Stage 1] failed to run forward",
        "amp_bf16": f"rank 1: ValueError: {STATS_ERROR} (step 2)",
    }
    for name, error in expected.items():
        r = rows[name]
        assert r["error"].startswith(error), name
        assert r["error"].endswith(" (step 0)") if name == "pp_gpipe_fp32" else r["error"] == error, name
        assert r["warnings"] == f"policy skipped on every rank: {r['error']}", name
        assert r["steps"] == 0 and math.isnan(r["step_time_us_p50"]), name
    steps_of = {r["policy"] for r in world[0]["steps"]}
    assert steps_of == {"fp32", "zero1_fp32"}  # a skipped policy leaves no step rows


@pytest.mark.timeout(120)
def test_every_rank_abandons_the_failed_policy_and_runs_the_next(world: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(world):
        # every policy was built on every rank (rank 1's failing build counts), in order; only the good ones finished
        builds = [p for p, what in res["events"] if what == "build"]
        assert builds == SECTION["policies"], rank
        finished = [p for p, what in res["events"] if what == "finish"]
        assert finished == ["fp32", "zero1_fp32"], rank

    assert world[1]["summary"] == [] and world[1]["steps"] == []  # records live on rank 0


@pytest.mark.timeout(120)
def test_the_process_group_still_works_after_the_failures(world: list[dict[str, Any]]) -> None:
    rows = {r["policy"]: r for r in world[0]["summary"]}
    last = rows["zero1_fp32"]
    assert last["error"] == "" and last["warnings"] == "", last
    assert last["steps"] == SECTION["steps"]
    # zero1_fp32 trains the fp32 baseline's model on the same data with the same optimizer: same losses
    assert math.isfinite(last["final_loss"]) and abs(last["final_loss_drift"]) < 1e-4
    assert last["comm_bytes_per_step"] > 0 and math.isfinite(last["comm_time_us"])


def test_failures_are_named_by_rank_ranges_and_grouped_by_error() -> None:
    err = PolicyFailed([(0, "E: a (step 1)"), (1, "E: a (step 1)"), (2, "E: a (step 1)"), (5, "F: b (step 1)")])
    assert str(err) == "ranks 0-2: E: a (step 1); rank 5: F: b (step 1)"
    assert err.failures[3] == (5, "F: b (step 1)")
    many = PolicyFailed([(r, f"OutOfMemoryError: {r} GiB free") for r in range(6)])
    assert str(many) == (
        "rank 0: OutOfMemoryError: 0 GiB free; rank 1: OutOfMemoryError: 1 GiB free; "
        "rank 2: OutOfMemoryError: 2 GiB free; 3 more ranks with other errors"
    )
    assert str(PolicyFailed([(0, "x"), (2, "x"), (3, "x")])) == "ranks 0, 2-3: x"
