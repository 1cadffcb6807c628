"""Memory per rank: a measured peak of one training step, and the live bytes of a wrapped model.

The analytic model-state bytes ("model_state_bytes") are the policy's strategies' formula
(`Policy.state_bytes`, see `strategies.py`: ZeRO's P + G + K per parameter, partitioned per sharding).
Measured ("peak_mem_bytes", labelled by "peak_mem_kind"), on the last warm-up step (never a timed one):
  cuda_allocator: `torch.cuda.max_memory_allocated` over the step.
  cpu_heap:       growth of the C heap's in-use bytes (glibc `mallinfo2`: uordblks + hblkhd) from
                  just before the model was built (`heap_in_use()`, after a gc) to the step's peak,
                  sampled after every aten op. It counts everything the policy holds -- parameters,
                  DDP buckets, optimizer state, FSDP's unsharded parameters (storages resized outside
                  the dispatcher, which torch's MemTracker misses), activations, comm buffers.
  cpu_memtracker: fallback without glibc: torch's MemTracker (`torch.distributed._tools.mem_tracker`).
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode


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


def heap_in_use() -> int | None:
    """The C heap's in-use bytes now (glibc), or None where glibc's mallinfo2 is not available."""
    gc.collect()
    return _HEAP_IN_USE() if _HEAP_IN_USE is not None else None


def measure_step_memory(
    step: Callable[[], None], model: nn.Module, optimizer: Any, device: torch.device, heap_base: int | None
) -> tuple[int, str]:
    """Run `step` once under a memory measurement; return (peak bytes, kind label).

    `heap_base` is `heap_in_use()` taken before the model was built (CPU only).
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device)), "cuda_allocator"
    if _HEAP_IN_USE is not None and heap_base is not None:
        with _HeapPeak(_HEAP_IN_USE) as sampler:
            step()
        return int(max(0, sampler.peak - heap_base)), "cpu_heap"
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, getattr(optimizer, "optim", optimizer))
    with tracker:
        step()
    peak = tracker.get_tracker_snapshot("peak")
    return int(sum(v.get("Total", 0) for v in peak.values())), "cpu_memtracker"
