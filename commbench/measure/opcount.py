"""Counting dispatched compute ops (the CPU stand-in for kernel launches on a GPU) and the bytes they move.

Each aten op that reaches the dispatcher's Python key is one call torch makes on a tensor; on CUDA every such
op that computes launches (at least) one kernel, so their count is what a launch-bound codec pays in host
time. :class:`OpCounter` is a ``TorchDispatchMode`` that records them, leaving out what launches nothing:
views and metadata (``view``, ``as_strided``, ``slice``, ``expand``, ...) and uninitialised allocations
(``empty``, served by the caching allocator on a GPU). Collectives are counted apart (``c10d`` ops).

:class:`ByteCounter` adds up the bytes each such op reads (its tensor arguments) and writes (its outputs): what
a memory-bound op costs on a GPU, where every op is its own pass over memory (``commbench.measure.fused.moved_bytes``
adds the fused codec's compiled graphs, which a dispatch mode does not see into).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["ByteCounter", "OpCounter", "NON_COMPUTE", "footprint"]

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


_NO_READ_OF_SELF = frozenset({"copy_", "fill_", "zero_", "copy", "fill", "zero"})
"""Ops that overwrite their first argument without reading it."""


def footprint(t: torch.Tensor) -> int:
    """Bytes of memory a tensor (a view) covers: dimensions of stride 0 (an ``expand``) count once."""
    n = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride != 0:
            n *= size
    return n * t.element_size() if t.numel() else 0


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


class ByteCounter(TorchDispatchMode):
    """``with ByteCounter() as c: ...``; then ``c.read`` and ``c.written`` (bytes, summed over the compute ops
    :class:`OpCounter` counts) and ``c.by_op`` (name -> bytes read + written). An op reads its tensor arguments
    (an ``out=`` tensor, and the destination of ``copy_``/``fill_``/``zero_``, are written, not read) and writes
    its outputs; a view counts the memory it covers (:func:`footprint`)."""

    def __init__(self) -> None:
        super().__init__()
        self.read = 0
        self.written = 0
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = _base(func)
        ns = getattr(func, "namespace", "aten")
        if name in NON_COMPUTE or ns in ("c10d", "_c10d_functional"):
            return out
        reads = _tensors(list(args[1:]) if name in _NO_READ_OF_SELF else list(args))
        reads += [t for k, v in kwargs.items() if k != "out" for t in _tensors(v)]
        r = sum(footprint(t) for t in reads)
        w = sum(footprint(t) for t in _tensors(out))
        self.read += r
        self.written += w
        self.by_op[name] += r + w
        return out
