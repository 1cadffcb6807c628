"""Memory per rank: a measured peak of one training step, and the live bytes of a wrapped model.

The analytic model-state bytes ("model_state_bytes") are the policy's strategies' formula
(`Policy.state_bytes`, see `strategies.py`: ZeRO's P + G + K per parameter, partitioned per sharding).
Measured ("peak_mem_bytes", labelled by "peak_mem_kind"), on the last warm-up step (never a timed one), as the
growth over a baseline (`memory_baseline()`) taken right before the policy builds its model, after `gc.collect()`
(on CUDA also `empty_cache()` and `reset_peak_memory_stats()`): what the sweep or earlier policies still hold
is in the baseline, so it does not land in every policy's peak.
  cuda_allocator: `torch.cuda.max_memory_allocated` over the step (peak statistics reset just before it)
                  minus `memory_allocated` at the baseline.
  cpu_heap:       growth of the C heap's in-use bytes (glibc `mallinfo2`: uordblks + hblkhd) from
                  the baseline to the step's peak, sampled after every aten op. It counts everything the policy
                  holds -- parameters, DDP buckets, optimizer state, FSDP's unsharded parameters (storages
                  resized outside the dispatcher, which torch's MemTracker misses), activations, comm buffers.
  cpu_memtracker: fallback without glibc: torch's MemTracker (`torch.distributed._tools.mem_tracker`), which
                  counts only the tensors of the model and optimizer it tracks, so it needs no baseline.
The device-specific calls live in one place, the meters `_meter()` picks (`_CudaAllocator`, `_CpuHeap`,
`_CpuMemTracker`).
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from commbench.cluster import launch


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if hasattr(t, "_local_tensor") else t  # DTensor (FSDP2) -> its shard


def live_state_bytes(model: nn.Module, optimizer: Any) -> int:
    """Bytes of distinct live storages behind parameters, gradients and optimizer state on this rank."""
    seen: set[int] = set()
    total = 0

    def add(t: torch.Tensor | None) -> None:
        nonlocal total
        if not isinstance(t, torch.Tensor):
            return
        t = _local(t)
        st = t.untyped_storage()
        if st.data_ptr() in seen or st.nbytes() == 0:
            return
        seen.add(st.data_ptr())
        total += st.nbytes()

    for p in model.parameters():
        add(p)
        add(p.grad)
    opt = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard's optimizer here
    for state in opt.state.values():
        for v in state.values():
            add(v)
    return total


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _load_mallinfo2() -> Callable[[], int] | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):  # not glibc >= 2.33 (macOS, musl): no heap statistics
        return None
    fn.restype = _MallInfo2

    def in_use() -> int:
        m = fn()
        return int(m.uordblks + m.hblkhd)  # bytes in use in malloc'd chunks + in mmap'd chunks

    return in_use


_HEAP_IN_USE = _load_mallinfo2()


class _HeapPeak(TorchDispatchMode):
    """Samples the heap's in-use bytes after every aten op; keeps the maximum."""

    def __init__(self, in_use: Callable[[], int]) -> None:
        super().__init__()
        self.in_use = in_use
        self.peak = in_use()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self.in_use())
        return out


@dataclass(frozen=True, slots=True)
class MemoryBaseline:
    """Bytes in use on a rank's device right before a policy starts, after releasing what can be released."""

    kind: str
    """The `peak_mem_kind` a measurement against this baseline reports."""
    in_use: int
    """Bytes in use at the baseline (0 for a meter that counts only what it tracks)."""


class _CudaAllocator:
    """The CUDA caching allocator's statistics for one device."""

    kind = "cuda_allocator"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def baseline(self) -> int:
        # Blocks freed while another stream still used them (record_stream: NCCL, FSDP) return to the allocator
        # once that stream's events complete: after the synchronize, empty_cache can release them.
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        return int(torch.cuda.memory_allocated(self.device))

    def peak(self, step: Callable[[], None], model: nn.Module, optimizer: Any) -> int:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)  # the step's own peak, not the build's
        step()
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device))


class _CpuHeap:
    """glibc's heap statistics, sampled after every aten op of the step."""

    kind = "cpu_heap"

    def __init__(self, in_use: Callable[[], int]) -> None:
        self.in_use = in_use

    def baseline(self) -> int:
        return self.in_use()

    def peak(self, step: Callable[[], None], model: nn.Module, optimizer: Any) -> int:
        with _HeapPeak(self.in_use) as sampler:
            step()
        return sampler.peak


class _CpuMemTracker:
    """torch's MemTracker: counts only the model's and optimizer's tensors, so its baseline is zero."""

    kind = "cpu_memtracker"

    def baseline(self) -> int:
        return 0

    def peak(self, step: Callable[[], None], model: nn.Module, optimizer: Any) -> int:
        from torch.distributed._tools.mem_tracker import MemTracker

        tracker = MemTracker()
        tracker.track_external(model, getattr(optimizer, "optim", optimizer))
        with tracker:
            step()
        snap = tracker.get_tracker_snapshot("peak")
        return int(sum(v.get("Total", 0) for v in snap.values()))


def _meter(device: torch.device) -> _CudaAllocator | _CpuHeap | _CpuMemTracker:
    """The one place that decides, by device, how memory is measured."""
    if launch.on_cuda(device):
        return _CudaAllocator(device)
    if _HEAP_IN_USE is not None:
        return _CpuHeap(_HEAP_IN_USE)
    return _CpuMemTracker()


def memory_baseline(device: torch.device) -> MemoryBaseline:
    """Release what the process no longer needs (garbage cycles such as a dropped DDP model, the CUDA allocator's
    cached blocks) and read what is still in use: the zero of the next policy's peak."""
    gc.collect()
    meter = _meter(device)
    return MemoryBaseline(meter.kind, meter.baseline())


def measure_step_memory(
    step: Callable[[], None], model: nn.Module, optimizer: Any, device: torch.device, baseline: MemoryBaseline
) -> tuple[int, str]:
    """Run `step` once under a memory measurement; return (peak bytes over `baseline`, kind label).

    `baseline` is `memory_baseline(device)`, taken before the policy built its model.
    """
    meter = _meter(device)
    if meter.kind != baseline.kind:
        raise ValueError(f"memory baseline of kind {baseline.kind!r} cannot measure a {meter.kind!r} peak on {device}")
    return int(max(0, meter.peak(step, model, optimizer) - baseline.in_use)), meter.kind
