"""Peak memory is the growth over a baseline taken right before a policy starts (`memory.memory_baseline`).

CUDA: the allocator's functions are replaced by a fake allocator (bytes allocated, the peak since its last reset),
so the test runs without a GPU and checks the order of the calls and that the baseline is subtracted: memory held
before the policy (a sweep's scratch) and an earlier policy's garbage (a reference cycle only `gc.collect()` frees)
must not land in the peak. CPU (glibc heap): a 64 MiB tensor held while a policy runs leaves its peak unchanged.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from commbench.training import memory
from tests.distutil import run_in_world

MiB = 2**20


class FakeAllocator:
    """What `torch.cuda` reports for one device: bytes allocated and the peak since the last reset."""

    def __init__(self) -> None:
        self.allocated = self.peak = 0
        self.calls: list[str] = []

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n: int) -> None:
        self.allocated -= n
        self.calls.append(f"free {n // MiB}")

    def install(self, mp: pytest.MonkeyPatch) -> None:
        def record(name: str, value: Any = None) -> Any:
            def fn(*args: Any, **kwargs: Any) -> Any:
                self.calls.append(name)
                return value() if callable(value) else value

            return fn

        mp.setattr(torch.cuda, "synchronize", record("synchronize"))
        mp.setattr(torch.cuda, "empty_cache", record("empty_cache"))
        mp.setattr(torch.cuda, "reset_peak_memory_stats", record("reset_peak", self._reset))
        mp.setattr(torch.cuda, "memory_allocated", record("memory_allocated", lambda: self.allocated))
        mp.setattr(torch.cuda, "max_memory_allocated", record("max_memory_allocated", lambda: self.peak))

    def _reset(self) -> None:
        self.peak = self.allocated


@pytest.fixture
def no_auto_gc() -> Iterator[None]:
    """Garbage is freed only by an explicit gc.collect() (the baseline's), not by a collection that happens to run."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_cuda_peak_is_the_growth_over_a_baseline_after_gc_and_empty_cache(
    monkeypatch: pytest.MonkeyPatch, no_auto_gc: None
) -> None:
    fake = FakeAllocator()
    fake.install(monkeypatch)
    dev = torch.device("cuda", 0)
    fake.alloc(100 * MiB)  # the sweep's scratch, still referenced
    fake.alloc(300 * MiB)  # an earlier policy's model, garbage in a reference cycle
    fake.free(300 * MiB)
    fake.alloc(300 * MiB)  # ... its peak (400 MiB) is still the allocator's, and so is the cycle:

    class Cycle:
        pass

    cycle = Cycle()
    cycle.me = cycle  # type: ignore[attr-defined]
    weakref.finalize(cycle, fake.free, 300 * MiB)
    del cycle
    fake.calls.clear()

    base = memory.memory_baseline(dev)
    assert base == memory.MemoryBaseline("cuda_allocator", 100 * MiB)
    # gc first (the cycle's memory is returned), then the allocator is settled and read
    assert fake.calls == ["free 300", "synchronize", "empty_cache", "reset_peak", "memory_allocated"]

    fake.alloc(30 * MiB)  # the policy's model, optimizer state
    fake.calls.clear()

    def step() -> None:
        fake.calls.append("step")
        fake.alloc(20 * MiB)  # activations
        fake.free(20 * MiB)

    peak, kind = memory.measure_step_memory(step, torch.nn.Linear(1, 1), None, dev, base)
    assert (peak, kind) == (50 * MiB, "cuda_allocator")  # 30 MiB held + 20 MiB transient; not 150, not 400
    assert fake.calls == ["synchronize", "reset_peak", "step", "free 20", "synchronize", "max_memory_allocated"]


def test_a_baseline_of_another_kind_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeAllocator().install(monkeypatch)
    cpu_base = memory.MemoryBaseline("cpu_heap", 0)
    with pytest.raises(ValueError, match="memory baseline of kind 'cpu_heap' cannot measure a 'cuda_allocator'"):
        memory.measure_step_memory(lambda: None, torch.nn.Linear(1, 1), None, torch.device("cuda", 0), cpu_base)


SECTION: dict[str, Any] = {"model": "gpt", "steps": 1, "warmup_steps": 1, "batch_size": 2, "seq_len": 16,
    "d_model": 128, "n_layers": 2, "n_heads": 4, "vocab": 512, "seed": 1, "comm_timed_steps": 0, "paired": False}  # fmt: skip
LEFTOVER = 64 * MiB


def _peaks(rank: int, world_size: int) -> dict[str, Any]:
    from commbench.training.config import TrainingConfig
    from commbench.training.models import build_model, param_count
    from commbench.training.policies import get_policy
    from commbench.training.runner import run_policy

    sec = TrainingConfig.from_dict(SECTION)
    dev = torch.device("cpu")
    run_policy(get_policy("fp32"), sec.replace(measure_memory=False), dev)  # one-time process caches
    peaks: dict[str, list[float]] = {"without": [], "with": []}
    kinds = set()
    for _ in range(2):
        for held in ("without", "with"):
            leftover = torch.ones(LEFTOVER // 4) if held == "with" else None  # allocated before the policy
            run = run_policy(get_policy("fp32"), sec, dev)
            peaks[held].append(run.peak_mem_bytes)
            kinds.add(run.peak_mem_kind)
            del leftover
    return {"peaks": peaks, "kinds": kinds, "psi": param_count(build_model(sec))}


@pytest.mark.timeout(120)
@pytest.mark.skipif(memory.memory_baseline(torch.device("cpu")).kind != "cpu_heap", reason="needs glibc's mallinfo2")
def test_memory_held_before_a_policy_does_not_raise_its_cpu_peak() -> None:
    (res,) = run_in_world(_peaks, nproc=1, timeout=100)
    assert res["kinds"] == {"cpu_heap"}
    without, with_ = min(res["peaks"]["without"]), min(res["peaks"]["with"])
    # the policy's own state is in the peak: fp32 parameters, gradients and AdamW's two moments, 16 bytes each
    assert without >= 16 * res["psi"]
    # the 64 MiB held throughout is not (heap noise between runs is far below it)
    assert abs(with_ - without) < LEFTOVER / 8, res["peaks"]


# --- CUDA's first-step state, and a policy's process groups (issue 34) ----------------------------------------

WORKSPACE = 32 * MiB  # cuBLAS's workspace on sm90: allocated by the process's first matmul backward, never freed


def _primed(rank: int, world_size: int) -> dict[str, Any]:
    """A CUDA-semantics meter (the allocator fake) over a real gloo run: the process's first backward allocates
    the cuBLAS workspace, which stays. Then the group table at each policy's start and end."""
    from commbench.cluster import compat
    from commbench.training import runner, session
    from commbench.training.config import TrainingConfig
    from commbench.training.policies import get_policy

    fake = FakeAllocator()
    backward = torch.autograd.backward

    def first_backward_allocates(*a: Any, **k: Any) -> Any:
        if not getattr(fake, "workspace", False):
            fake.workspace = True  # type: ignore[attr-defined]
            fake.alloc(WORKSPACE)
        return backward(*a, **k)

    class FakeCudaMeter:
        kind = "cuda_allocator"

        def baseline(self) -> int:
            return fake.allocated

        def peak(self, step: Any, model: Any, optimizer: Any) -> int:
            fake._reset()
            step()
            return fake.peak

    torch.autograd.backward = first_backward_allocates  # type: ignore[assignment]
    memory._meter = lambda device: FakeCudaMeter()  # type: ignore[assignment,return-value]
    groups: list[tuple[str, str, int]] = []
    run_policy = session.run_policy

    def tracked(policy: Any, *a: Any, **k: Any) -> Any:
        groups.append((policy.name, "start", len(compat.group_names())))
        out = run_policy(policy, *a, **k)
        groups.append((policy.name, "end", len(compat.group_names())))
        return out

    runner.run_policy = tracked  # type: ignore[assignment]
    sec = {**SECTION, "policies": ["fp32", "hsdp_fp32"], "measure_memory": True}
    summary, _ = runner.run_training(sec, device=torch.device("cpu"))
    peaks = {r.policy: r.peak_mem_bytes for r in summary}
    # the control: a process that was not primed charges the workspace to its first policy
    fake.allocated = fake.peak = 0
    fake.workspace = False  # type: ignore[attr-defined]
    unprimed = run_policy(get_policy("fp32"), TrainingConfig.coerce({**SECTION, "measure_memory": True}), torch.device("cpu"))
    return {"peaks": peaks, "unprimed": unprimed.peak_mem_bytes, "groups": groups, "after": len(compat.group_names())}


@pytest.fixture(scope="module")
def primed() -> list[dict[str, Any]]:
    return run_in_world(_primed, nproc=2, timeout=150)


@pytest.mark.timeout(170)
def test_the_fp32_baseline_does_not_carry_cudas_first_step_workspace(primed: list[dict[str, Any]]) -> None:
    res = primed[0]
    assert res["unprimed"] == WORKSPACE  # the meter sees it: without priming the fp32 peak would be 32 MiB
    assert res["peaks"]["fp32"] == 0 and res["peaks"]["hsdp_fp32"] == 0, res["peaks"]  # primed: in the baseline


@pytest.mark.timeout(170)
def test_every_group_a_policy_makes_is_destroyed_at_its_end(primed: list[dict[str, Any]]) -> None:
    for res in primed:
        g = res["groups"]
        # priming and fp32 make no group; HSDP makes its mesh's (replicate and shard dimensions)
        assert [x for x in g if x[1] == "start"] == [("fp32", "start", 1)] * 2 + [("hsdp_fp32", "start", 1)], g
        assert ("hsdp_fp32", "end", 1) not in g and max(n for p, w, n in g if p == "hsdp_fp32") > 1, g
        assert res["after"] == 1  # only the default group is left
