"""Measured communication time per training step (`comm_time_us`): the per-call min-over-ranks / per-step sum
rule against hand-computed values; the order of a timed call (device sync, clock start, the op, its wait, sync,
clock stop) with a fake op, sync and clock; and a small 2-rank gloo run (column present, positive, inside its
interval; timing the collectives leaves the counted bytes unchanged; the session's injected sync is the one the
timed calls use). No timed assertions: only signs and orderings."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from commbench.training.comm import CommCounter, comm_time_per_step
from tests.distutil import run_in_world

TINY: dict[str, Any] = {"model": "gpt", "steps": 2, "warmup_steps": 1, "batch_size": 2, "seq_len": 8, "d_model": 16,
        "n_layers": 2, "n_heads": 2, "vocab": 32, "seed": 1, "measure_memory": False, "comm_timed_steps": 3,
        "paired": False}  # fmt: skip
# One policy per way the gradient travels: DDP's Python all_reduce hook, the async codec hook (all_to_all +
# all_gather launched from callbacks), FSDP2's per-unit all_gather / reduce_scatter.
POLICIES = ["fp32", "fp8_hook", "fsdp2_bf16"]


def test_min_over_ranks_per_call_summed_per_step() -> None:
    # per_rank[rank][step][call]; rank 0 arrived first at call 0 of step 0 (waited 4 units), rank 1 at call 1.
    per_rank = [
        [[5.0, 1.0], [2.0, 2.0, 9.0]],
        [[1.0, 3.0], [7.0, 0.5, 1.0]],
    ]
    # step 0: min(5, 1) + min(1, 3) = 2; step 1: min(2, 7) + min(2, 0.5) + min(9, 1) = 3.5
    assert comm_time_per_step(per_rank) == [2.0, 3.5]
    assert comm_time_per_step([[[1.5, 2.5]]]) == [4.0]  # one rank: its own durations
    assert comm_time_per_step([[[], []], [[], []]]) == [0.0, 0.0]  # steps without collectives


def test_ranks_that_timed_different_calls_are_refused() -> None:
    with pytest.raises(ValueError, match="step 1: ranks timed different numbers of collectives"):
        comm_time_per_step([[[1.0], [1.0, 2.0]], [[1.0], [1.0]]])
    with pytest.raises(ValueError, match="different numbers of steps"):
        comm_time_per_step([[[1.0]], []])


def test_timed_call_starts_its_clock_after_a_device_sync_and_stops_it_after_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed as dist

    events: list[str] = []

    class Work:  # what a collective returns: on NCCL complete on the host at enqueue, waited for by wait()
        def wait(self) -> bool:
            events.append("wait")
            return True

    def all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False) -> Work:
        events.append("op")
        return Work()

    ticks = iter([10.0, 10.25])

    def clock() -> float:
        events.append("clock")
        return next(ticks)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)  # a 2-rank group, without a process group
    with CommCounter() as c, c.timed(sync=lambda: events.append("sync"), clock=clock):
        dist.all_reduce(torch.ones(4))
    # the compute queued before the call is waited for before the clock starts: it is not communication
    assert events == ["sync", "clock", "op", "wait", "sync", "clock"]
    assert c.durations == [0.25]
    assert c.snapshot() == {"all_reduce:float": 16 * 2 * (2 - 1) / 2}  # 16 bytes x nccl-tests 2(n-1)/n
    events.clear()
    with CommCounter() as c:  # untimed: no sync, no clock
        dist.all_reduce(torch.ones(4))
    assert events == ["op"] and c.durations == []


def _checks(rank: int, world_size: int) -> dict[str, Any]:
    from commbench.training import run_training
    from commbench.training.config import TrainingConfig
    from commbench.training.policies import get_policy
    from commbench.training.runner import PolicySession

    dev = torch.device("cpu")
    out: dict[str, Any] = {"bytes": {}, "syncs": {}}
    sec = TrainingConfig.from_dict(TINY)
    for name in POLICIES:
        syncs: list[int] = []
        sess = PolicySession(get_policy(name), sec, dev, sync=lambda syncs=syncs: syncs.append(1))
        with sess.counter as c:
            sess.bare_step(0)  # first step: lazy state (optimizer, FSDP) outside the comparison
            c.reset()
            sess.bare_step(1)
            plain, plain_calls = c.snapshot(), sum(c.calls.values())
            before = len(syncs)
            sess.timed_comm_step(2)
            timed, timed_calls = c.snapshot(), sum(c.calls.values())
            durations = list(c.durations)
        out["bytes"][name] = (plain, plain_calls, timed, timed_calls, durations)
        out["syncs"][name] = (before, len(syncs) - before)
    summary, _ = run_training({**TINY, "policies": POLICIES}, device=dev)
    out["summary"] = [r.as_dict() for r in summary]
    return out


@pytest.fixture(scope="module")
def world() -> list[dict[str, Any]]:
    return run_in_world(_checks, nproc=2, timeout=150)


@pytest.mark.timeout(180)
def test_timed_mode_counts_the_same_bytes_and_times_every_call(world: list[dict[str, Any]]) -> None:
    for res in world:
        for name, (plain, plain_calls, timed, timed_calls, durations) in res["bytes"].items():
            assert plain and timed == plain, name
            assert timed_calls == plain_calls > 0, name
            # every counted call (one "op:dtype" each for these policies) has one positive duration
            assert len(durations) == timed_calls, name
            assert all(d > 0 for d in durations), name
            # the session's sync (here a counter) is the timed calls' device sync: once before and once after each
            before, during = res["syncs"][name]
            assert (before, during) == (0, 2 * timed_calls), name


@pytest.mark.timeout(180)
def test_comm_time_column_is_positive_inside_its_interval(world: list[dict[str, Any]]) -> None:
    rows = {r["policy"]: r for r in world[0]["summary"]}
    assert set(rows) == set(POLICIES)
    for name, r in rows.items():
        assert not r["error"], (name, r["error"])
        v, lo, hi = r["comm_time_us"], r["comm_time_ci_low_us"], r["comm_time_ci_high_us"]
        assert math.isfinite(v) and v > 0, name
        assert 0 < lo <= v <= hi, name
        assert "timed comm steps counted other bytes" not in r["notes"], name
        assert "comm_time_us not measured" not in r["notes"], name
