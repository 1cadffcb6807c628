"""Counting dispatched compute ops: the CPU stand-in for kernel launches on a GPU.

Each aten op that reaches the dispatcher's Python key is one call torch makes on a tensor; on CUDA every such
op that computes launches (at least) one kernel, so their count is what a launch-bound codec pays in host
time. :class:`OpCounter` is a ``TorchDispatchMode`` that records them, leaving out what launches nothing:
views and metadata (``view``, ``as_strided``, ``slice``, ``expand``, ...) and uninitialised allocations
(``empty``, served by the caching allocator on a GPU). Collectives are counted apart (``c10d`` ops).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter", "NON_COMPUTE"]

NON_COMPUTE: frozenset[str] = frozenset(
    {
        # views and metadata
        "view",
        "_unsafe_view",
        "as_strided",
        "slice",
        "select",
        "expand",
        "unsqueeze",
        "squeeze",
        "t",
        "transpose",
        "permute",
        "alias",
        "detach",
        "view_as_real",
        "view_as_complex",
        "unfold",
        "diagonal",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "narrow",
        "_reshape_alias",
        "lift_fresh",
        "resize_",
        "set_",
        "is_same_size",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "_to_copy_meta",
        # allocation without initialisation: no kernel
        "empty",
        "empty_strided",
        "empty_like",
        "new_empty",
        "new_empty_strided",
    }
)


def _base(func: Any) -> str:
    return str(func.__name__).split(".")[0] if hasattr(func, "__name__") else str(func)


class OpCounter(TorchDispatchMode):
    """``with OpCounter() as c: ...``; then ``c.compute`` (ops that launch work, by name) and ``c.comm``
    (collective calls, by name)."""

    def __init__(self) -> None:
        super().__init__()
        self.compute: Counter[str] = Counter()
        self.comm: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = _base(func)
        ns = getattr(func, "namespace", "aten")
        if ns == "c10d" or ns == "_c10d_functional":
            self.comm[name] += 1
        elif name not in NON_COMPUTE:
            self.compute[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def n_compute(self) -> int:
        return sum(self.compute.values())

    @property
    def n_comm(self) -> int:
        return sum(self.comm.values())
