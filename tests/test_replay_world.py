"""Replay against real traces: the project's own training policies (DDP buckets, a cast hook, FSDP2, TP, PP) profiled
with torch.profiler on gloo in one spawned 2-rank world, then three of the traces replayed in that world.

The reference is each policy's own byte counter (``training/comm.py``, which patches torch.distributed's Python
functions): the calls per step and the nccl-tests bytes the trace yields must equal what the counter saw in the
same step, exactly; the replay's bf16 wire bytes are the formula's (elements x 2).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from commbench.store.trace_calls import DTYPE_SIZES
from commbench.store.traces import describe, load_traces, pick_step, placement, read_trace, step_calls
from tests.distutil import run_in_world
from tests.replay_world import POLICIES, REPLAYED, STEP, world

NCCL_NAMES = {"float32": "float", "bfloat16": "bfloat16", "float16": "half"}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("traces")
    return run_in_world(world, nproc=2, timeout=400, out=str(out))


def _by_op(calls: list[Any]) -> tuple[dict[str, int], dict[str, int]]:
    """Calls and nccl-tests bytes per "op:type", as the policy's counter keys them (receives: the sender counts)."""
    n: dict[str, int] = defaultdict(int)
    b: dict[str, int] = defaultdict(int)
    for c in calls:
        if c.collective == "recv":
            continue
        key = f"{c.collective}:{NCCL_NAMES.get(c.dtype, c.dtype)}"
        n[key] += 1
        b[key] += c.size_bytes
    return dict(n), dict(b)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", [*POLICIES, "et"])
def test_trace_calls_equal_the_policy_counter(results: list[dict[str, Any]], name: str) -> None:
    for rank, res in enumerate(results):
        got = res["profiled"][name]
        trace = read_trace(Path(got["trace"]))
        assert trace.steps == [STEP]
        assert not trace.unread, describe(trace.unread)
        calls, size = _by_op(step_calls(trace, STEP))
        assert calls == got["calls"], (rank, name)
        assert size == got["size_bytes"], (rank, name)
        if trace.format == "kineto":
            assert trace.world_size == 2 and trace.backend == "gloo" and trace.rank == rank
            assert all(c.group == (0, 1) for c in trace.calls)


@pytest.mark.timeout(420)
def test_pipeline_trace_has_both_directions(results: list[dict[str, Any]]) -> None:
    """Rank 0 of a 2-stage GPipe sends activations and receives gradients; its peer is rank 1."""
    ts = load_traces([Path(results[0]["profiled"]["pp_gpipe_fp32"]["trace"]).parent])
    calls = step_calls(ts[0], pick_step(ts[0], "last"))
    assert {c.collective for c in calls} == {"send", "recv"}
    assert all(c.peer == 1 for c in calls)
    # both ranks' traces name their host (Kineto's host_name): the group ran inside one node
    assert placement(ts, (0, 1)) == "intra" and placement(ts[:1], (0, 1)) == "unknown"
    assert [c.collective for c in step_calls(ts[1], STEP)].count("send") == results[1]["profiled"]["pp_gpipe_fp32"]["calls"]["send:float"]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("name", REPLAYED)
def test_replay_reproduces_the_step(results: list[dict[str, Any]], name: str) -> None:
    counted = [r["profiled"][name] for r in results]
    for res in results:  # every rank returns the same result
        rep = res["replayed"][name]
        assert not rep["not_replayed"]
        own = [r for r in rep["rows"] if r["trace_precision"]]
        calls: dict[str, int] = defaultdict(int)
        size: dict[str, int] = defaultdict(int)
        for r in own:
            elems = r["fp32_bytes"] // 4
            calls[r["collective"]] += r["calls_per_step"]
            size[r["collective"]] += r["calls_per_step"] * elems * DTYPE_SIZES[r["trace_dtype"]]
            # the trace's dtype replayed as itself: the wire carries exactly the trace's bytes
            assert r["wire_bytes"] == elems * DTYPE_SIZES[r["trace_dtype"]]
        if name.startswith("pp_"):
            # every send or receive of rank 0 is one stage-boundary transfer: the sends of both ranks together
            sends = sum(c["calls"]["send:float"] for c in counted)
            assert dict(calls) == {"pp_sendrecv": sends}
            assert size["pp_sendrecv"] == sum(c["size_bytes"]["send:float"] for c in counted)
        else:
            assert {f"{k}:{NCCL_NAMES[own[0]['trace_dtype']]}": v for k, v in calls.items()} == counted[0]["calls"]
            assert {f"{k}:{NCCL_NAMES[own[0]['trace_dtype']]}": v for k, v in size.items()} == counted[0]["size_bytes"]
        steps = {p: (wire, err) for p, wire, err in rep["steps"]}
        assert steps["trace"][0] == sum(size.values())
        for r in rep["rows"]:
            if r["precision"] == "bf16":
                assert r["wire_bytes"] == r["fp32_bytes"] // 4 * 2  # bf16: two bytes an element
                # bf16 keeps 8 significant bits: its error is real and below 2^-7 (rounding the inputs and the sum)
                assert 0 < r["rel_err"] < 2**-7
            elif r["precision"] == "fp32":
                assert r["rel_err"] < 1e-6
        if all(r["trace_dtype"] == "bfloat16" for r in own):  # bf16 is the trace's own: not measured twice
            assert rep["same_as_trace"] == ["bf16"] and "bf16" not in steps
        else:
            assert steps["bf16"][0] == sum(r["wire_bytes"] * r["calls_per_step"] for r in rep["rows"] if r["precision"] == "bf16")
