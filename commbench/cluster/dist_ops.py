"""torch.distributed calls by their newest name, for the world and for the collectives built on it.

torch >= 2.10 renamed the tensor-in/tensor-out collectives (``*_single``) and deprecates the old names. A call is
looked up when it is made, not once, so a wrapper installed later (``training.comm.CommCounter``) still sees it.
torch is imported by the calls, never at module level: the collective registry reads its names without torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from commbench.core.nccl_tests import REDUCE_OPS

ALL_GATHER_OPS = ("all_gather_single", "all_gather_into_tensor")
"""The all-gather into one tensor, newest name first."""


def first_of(module: Any, names: tuple[str, ...]) -> Callable[..., Any]:
    """The first of ``names`` that ``module`` has (newest name first); AttributeError naming them otherwise."""
    for name in names:
        fn = getattr(module, name, None)
        if fn is not None:
            return fn  # type: ignore[no-any-return]
    raise AttributeError(f"{module.__name__} has none of {names}")


def dist_op(*names: str) -> Callable[..., Any]:
    """The first of ``names`` that torch.distributed has (newest name first)."""
    import torch.distributed as dist

    return first_of(dist, names)


def all_gather_tensor(*args: Any, **kwargs: Any) -> Any:
    """``all_gather_into_tensor(out, inp, ...)`` under the name this torch has."""
    return dist_op(*ALL_GATHER_OPS)(*args, **kwargs)


_TORCH_NAMES = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}
TORCH_REDUCE_OPS = {op: _TORCH_NAMES[op] for op in REDUCE_OPS}
"""nccl-tests' ``-o`` names (:data:`commbench.core.nccl_tests.REDUCE_OPS`) -> torch.distributed ``ReduceOp`` members."""


def reduce_op(name: str) -> Any:
    """torch's ``ReduceOp`` for nccl-tests' op ``name`` (sum, prod, min, max, avg)."""
    import torch.distributed as dist

    if name not in TORCH_REDUCE_OPS:
        raise ValueError(f"unknown reduction op {name!r}; valid choices: {', '.join(TORCH_REDUCE_OPS)}")
    return getattr(dist.ReduceOp, TORCH_REDUCE_OPS[name])
