"""The spawned world of the replay tests: each training policy's step profiled with torch.profiler on gloo (and one
with the execution-trace observer), with the bytes the policy's own counter (``training/comm.py``) saw in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SECTION = dict(
    model="gpt", batch_size=2, seq_len=8, d_model=32, n_layers=2, n_heads=4, vocab=64,
    steps=1, warmup_steps=1, measure_memory=False, comm_timed_steps=0, microbatches=2,
)  # fmt: skip
POLICIES = ("fp32", "fsdp2_bf16", "tp_fp32", "pp_gpipe_fp32")
"""DDP buckets, FSDP2, TP, PP."""
STEP = 2
"""The profiled step (ProfilerStep#2): step 0 is the profiler's wait, step 1 its warm-up. Not step 1: DDP's reducer
rebuilds its buckets in its second step and broadcasts their indices from C++ (two int32 broadcasts the trace
holds, which the policy's counter, patching torch.distributed's Python functions, does not see)."""


def profile_policies(rank: int, n: int, out: str) -> dict[str, Any]:
    """Per policy: the trace of one step (Kineto JSON) and what the policy's CommCounter counted in that step."""
    import torch
    from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

    from commbench.core import plugins
    from commbench.training.config import TrainingConfig
    from commbench.training.policies import get_policy
    from commbench.training.runner import PolicySession

    plugins.load()
    sec = TrainingConfig.coerce({**SECTION, "pp_degree": 2})
    result: dict[str, Any] = {}
    for name in POLICIES:
        sess = PolicySession(get_policy(name).configure(sec), sec, torch.device("cpu"))
        path = Path(out) / name / f"rank{rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        counted: dict[str, Any] = {}
        sched = schedule(wait=1, warmup=1, active=1, repeat=1)
        with sess.counter, profile(
            activities=[ProfilerActivity.CPU], record_shapes=True, schedule=sched,
            on_trace_ready=lambda p, path=path: p.export_chrome_trace(str(path)),
        ) as prof:  # fmt: skip
            for s in range(STEP + 1):
                sess.instrumented_step(s, numerics=False)
                if s == STEP:
                    counted = {"calls": dict(sess.counter.calls), "size_bytes": dict(sess.counter.size_bytes)}
                prof.step()
        result[name] = {"trace": str(path), **counted}
    # the execution trace of one DDP step
    sess = PolicySession(get_policy("fp32").configure(sec), sec, torch.device("cpu"))
    for s in range(STEP):
        sess.instrumented_step(s, numerics=False)
    et_path = Path(out) / "et" / f"rank{rank}.json"
    et_path.parent.mkdir(parents=True, exist_ok=True)
    et = ExecutionTraceObserver()
    et.register_callback(str(et_path))
    with sess.counter:
        et.start()
        with torch.profiler.record_function(f"ProfilerStep#{STEP}"):
            sess.instrumented_step(STEP, numerics=False)
        et.stop()
        result["et"] = {"trace": str(et_path), "calls": dict(sess.counter.calls), "size_bytes": dict(sess.counter.size_bytes)}
    et.unregister_callback()
    return result


REPLAYED = ("fp32", "fsdp2_bf16", "pp_gpipe_fp32")
"""Traces replayed in the same world (DDP, FSDP2, PP), under the trace's dtype and bf16."""


def replay_in_world(rank: int, n: int, traces: dict[str, str]) -> dict[str, Any]:
    """Each trace of :data:`REPLAYED` read and replayed on this world (a short timing budget: the numbers checked
    are calls, bytes and errors, never times)."""
    import torch

    from commbench.cluster.launch import Dist, WorldInfo
    from commbench.core.suite import SuiteConfig
    from commbench.measure.replay import ReplayCall, group_kind, replay
    from commbench.store.traces import load_traces, pick_step, step_calls, trace_groups

    d = Dist(
        info=WorldInfo(rank, n, rank, n, "127.0.0.1", 0, "local"), backend="gloo", device=torch.device("cpu"),
        host="h", hosts=("h",) * n, threads=1,
    )  # fmt: skip
    suite = SuiteConfig(collectives=["all_reduce"], precisions=["fp32", "bf16"]).with_overrides(
        timing={"budget_s": 0.05, "repeats": 2, "max_samples": 2, "min_time_s": 0.0005, "min_iters": 1, "warmup": 1}
    )
    out: dict[str, Any] = {}
    for name in REPLAYED:
        ts = load_traces([Path(traces[name]).parent])
        step = pick_step(ts[0], "last")
        calls = step_calls(ts[0], step)
        layouts = trace_groups(ts, calls, n)
        rcalls = [ReplayCall(c.collective, c.numel, c.dtype, group_kind(p, d.hosts), c.order) for c, p in zip(calls, layouts, strict=True)]
        res = replay(d, suite, rcalls, ["trace", "bf16"])
        keys = ("collective", "precision", "fp32_bytes", "wire_bytes", "calls_per_step", "rel_err", "trace_precision", "trace_dtype")
        out[name] = {
            "rows": [{k: r[k] for k in keys} for r in res.rows],
            "steps": [(s.precision, s.wire_bytes, s.rel_err_max) for s in res.steps],
            "not_replayed": res.not_replayed,
            "same_as_trace": res.same_as_trace,
        }
    return out


def world(rank: int, n: int, out: str) -> dict[str, Any]:
    """The one spawned world of the replay tests: profile every policy, then replay three of the traces."""
    import torch.distributed as dist

    profiled = profile_policies(rank, n, out)
    dist.barrier()  # every rank's trace is on disk before any rank reads them
    return {"profiled": profiled, "replayed": replay_in_world(rank, n, {k: v["trace"] for k, v in profiled.items()})}
