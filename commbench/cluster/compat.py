"""torch APIs that moved or changed between the releases commbench supports, each behind one function with a fallback.

The floor in ``pyproject.toml`` is the oldest torch the test suite ran on (``benchmarks/torch_versions.sh`` runs the
fast subset on another one). What differs, and where it is looked up here, when it is called:

- the functional collectives' tensor-in/tensor-out names: ``funcol.all_gather_single`` /
  ``reduce_scatter_single`` (torch >= 2.10) were ``all_gather_tensor`` / ``reduce_scatter_tensor`` before;
- FSDP2's ``fully_shard`` and ``MixedPrecisionPolicy``: ``torch.distributed.fsdp`` (>= 2.6), earlier
  ``torch.distributed._composable.fsdp``;
- ``torch.distributed.pipelining``'s schedule classes (``ScheduleInterleaved1F1B``, the zero-bubble ones came
  later than ``ScheduleGPipe`` / ``Schedule1F1B``): asked by name, ``None`` where this torch lacks one;
- the process-group table, the default store and its timeout, and aborting every group (private in every release:
  ``distributed_c10d._world``, ``_get_default_store``, ``_abort_process_group``), which the failure side channel
  (:mod:`commbench.cluster.failures`) and the per-policy group teardown of training need;
- DTensor's sharding-propagation caches, which outlive the groups their meshes name (``clear_dtensor_caches``).

torch is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from typing import Any

from commbench.cluster.dist_ops import first_of


def funcol_op(*names: str) -> Callable[..., Any]:
    """The first of ``names`` that ``torch.distributed._functional_collectives`` has (newest name first)."""
    from torch.distributed import _functional_collectives as funcol

    return first_of(funcol, names)


def all_gather_single(t: Any, gather_dim: int, group: Any) -> Any:
    """``funcol.all_gather_single`` (``all_gather_tensor`` before torch 2.10): ``t`` gathered along ``gather_dim``."""
    return funcol_op("all_gather_single", "all_gather_tensor")(t, gather_dim, group)


def reduce_scatter_single(t: Any, op: str, scatter_dim: int, group: Any) -> Any:
    """``funcol.reduce_scatter_single`` (``reduce_scatter_tensor`` before torch 2.10)."""
    return funcol_op("reduce_scatter_single", "reduce_scatter_tensor")(t, op, scatter_dim, group)


def fsdp2() -> tuple[Callable[..., Any], type]:
    """FSDP2's ``(fully_shard, MixedPrecisionPolicy)`` from where this torch keeps them."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import (  # type: ignore[no-redef]
            MixedPrecisionPolicy,
            fully_shard,
        )
    return fully_shard, MixedPrecisionPolicy


def pipeline_schedule(name: str) -> type | None:
    """The ``torch.distributed.pipelining`` schedule class ``name`` (``ScheduleGPipe``, ``Schedule1F1B``, ...), or
    None where this torch has no such schedule."""
    from torch.distributed import pipelining

    cls = getattr(pipelining, name, None)
    return cls if isinstance(cls, type) else None


# --- the process-group table (private in every torch) ------------------------------------------------------


def _named_groups() -> dict[Any, str]:
    from torch.distributed import distributed_c10d as c10d

    return dict(getattr(getattr(c10d, "_world", None), "pg_names", {}) or {})


def group_names() -> set[str]:
    """The names of every process group this process holds (the default one included). Names, not the groups: a
    set of groups would keep them alive, and a gloo group closes its connections only when freed."""
    return set(_named_groups().values())


def destroy_groups_since(before: set[str]) -> int:
    """Destroy every group made since :func:`group_names` returned ``before`` (never the default group); how many.
    Groups a policy made (an HSDP or TP mesh, a pipeline's groups) hold NCCL communicators outside the caching
    allocator."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return 0
    default = dist.group.WORLD
    new = [g for g, name in _named_groups().items() if name not in before and g is not default]
    clear_dtensor_caches()
    for g in new:
        dist.destroy_process_group(g)
    return len(new)


def clear_dtensor_caches() -> None:
    """Forget DTensor's sharding-propagation caches (the Python ``lru_cache`` and the C++ fast path's).

    They map an op's input specs to its output specs, and a spec holds its ``DeviceMesh``, which compares and hashes
    by ranks, layout, device type and dim names, not by its process groups: a later mesh over the same ranks (the
    next policy's, after this one's groups are destroyed) hits the entry and its DTensors come out on the earlier
    mesh, whose groups no longer resolve ("Could not resolve the process group registered under the name 3"), or,
    after a fresh default group restarted the numbering, resolve to other groups. Megatron-LM clears it where its
    groups are destroyed (NVIDIA/Megatron-LM#7029). Called unconditionally: after a fresh default group nothing may
    be left to destroy, and the names the cache holds may be reused."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor has no such cache
        return
    python_cache = getattr(DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding, "cache_clear", None)
    if python_cache is not None:
        python_cache()
    import torch

    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)  # the C++ fast path, where this torch has one
    if native is not None:
        native()


def default_store() -> Any:
    """The store the default process group was made with."""
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()


def clone_store(store: Any) -> Any:
    """A second client of ``store`` for another thread (``Store.clone``, torch >= 2.5), else ``store`` itself."""
    clone = getattr(store, "clone", None)
    if clone is None:
        return store
    try:
        return clone()
    except RuntimeError:  # a store kind that cannot clone (HashStore is shared in-process anyway)
        return store


def store_ports(store: Any) -> set[int]:
    """The TCP port of the TCPStore under ``store`` (through its prefix stores; ``PrefixStore.underlying_store``),
    or none for a store of another kind."""
    for _ in range(16):
        port = getattr(store, "port", None)
        if isinstance(port, int):
            return {port}
        store = getattr(store, "underlying_store", None)
        if store is None:
            break
    return set()


def default_timeout(device: Any) -> _dt.timedelta:
    """The collective timeout of the default process group (its backend's options), torch's default otherwise."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    try:
        return c10d._get_default_group()._get_backend(device).options._timeout  # type: ignore[no-any-return]
    except (AttributeError, RuntimeError, ValueError):
        return c10d._get_default_timeout(dist.get_backend())  # type: ignore[arg-type]


def abort_world() -> None:
    """Abort every process group of this process (``_abort_process_group``; where missing, destroy them): a
    pending NCCL collective returns with an error, and gloo closes its connections, so a peer blocked on this rank
    fails at once ("Connection closed by peer"). Afterwards no group is initialised."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        return
    abort = getattr(c10d, "_abort_process_group", None)
    try:
        if abort is not None:
            abort()
            return
    except (RuntimeError, ValueError):
        pass
    if dist.is_initialized():
        dist.destroy_process_group()
