"""torch.profiler's own record of one training step: the reference a policy's counted collectives are compared with
(the calls and nccl-tests sizes per op and dtype of gloo's `record_param_comms` events, read by commbench's own
trace reader)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

NCCL_NAMES = {"float32": "float", "float64": "double", "bfloat16": "bfloat16", "float16": "half", "uint8": "uint8"}
"""The trace's dtype names as the counter's keys spell them (nccl-tests' names)."""


def profiled_step(step: Callable[[], None], path: Path, index: int = 0) -> str:
    """Run `step` under torch.profiler as `ProfilerStep#index`; its Chrome trace written to `path` (returned)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    path.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with torch.profiler.record_function(f"ProfilerStep#{index}"):
            step()
    prof.export_chrome_trace(str(path))
    return str(path)


def traced_calls(path: str, index: int = 0) -> tuple[dict[str, int], dict[str, int], Any]:
    """(calls, nccl-tests size bytes) by "op:dtype" of the trace's step `index`, and the trace itself."""
    from commbench.store.traces import read_trace, step_calls

    trace = read_trace(Path(path))
    calls: dict[str, int] = defaultdict(int)
    sizes: dict[str, int] = defaultdict(int)
    for c in step_calls(trace, index):
        key = f"{c.collective}:{NCCL_NAMES.get(c.dtype, c.dtype)}"
        calls[key] += 1
        sizes[key] += c.size_bytes
    return dict(calls), dict(sizes), trace


HIDDEN = ("torchao", "torchao.float8")
"""What a rank without torchao cannot import (None in `sys.modules`: the import raises ModuleNotFoundError)."""


def rows_without_torchao(runner: Any, section: dict[str, Any], policies: list[str]) -> list[dict[str, Any]]:
    """The rows of a 1-step CPU run of ``policies`` (``runner.run_training``) while torchao cannot be imported."""
    import sys

    import torch

    saved = {m: sys.modules.get(m) for m in HIDDEN}
    sys.modules.update(dict.fromkeys(HIDDEN))
    try:
        rows, _ = runner.run_training({**section, "steps": 1, "policies": policies}, device=torch.device("cpu"))
    finally:
        sys.modules.update(saved)
    return [r.as_dict() for r in rows]


def profiled_policy(name: str, sec: Any, trace: Path) -> dict[str, Any]:
    """Policy ``name``'s warm-up and steps on CPU (``sec``: a TrainingConfig), its first step profiled into ``trace``:
    the trace's path, the counter's calls and sizes of that step, the expected bytes, (loss, grad norm, bytes) per
    step and the model's module types."""
    import torch

    from commbench.training.policies import get_policy
    from commbench.training.runner import PolicySession

    sess = PolicySession(get_policy(name).configure(sec), sec, torch.device("cpu"))
    with sess.counter:
        path = profiled_step(lambda: sess.instrumented_step(0), trace)
        calls, sizes = dict(sess.counter.calls), dict(sess.counter.size_bytes)
        for s in range(1, int(sec.warmup_steps) + int(sec.steps)):
            sess.instrumented_step(s)
        run = sess.finish()
    return dict(trace=path, calls=calls, sizes=sizes, expected=run.comm_expected,
                steps=[(r.loss, r.grad_norm, r.comm) for r in run.steps],
                layers=sorted({type(m).__name__ for m in sess.w.model.modules()}))  # fmt: skip
