"""Devices: which CUDA device each rank of a node runs on (by GPU UUID, agreed within the node), the device calls the
layers above ask (``on_cuda``, ``synchronize``, ``device_ids``), a rank's GPU facts and identity for the metadata and
for NVML lookups, and releasing memory between phases.

Only this package and :mod:`commbench.measure.timing` know about devices and synchronisation.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


def gpu_uuids() -> list[str]:
    """UUIDs of the GPUs this rank sees, in its CUDA order (``cuda:0`` first): torch's device properties (the CUDA
    runtime starts in the rank; the rank uses its GPU anyway)."""
    if not torch.backends.cuda.is_built():
        return []
    n = torch.cuda.device_count()
    return [str(torch.cuda.get_device_properties(i).uuid) for i in range(n)]


@dataclass(frozen=True, slots=True)
class LocalView:
    """What one rank of a node sees: its global and local rank and the UUIDs of its visible GPUs in CUDA order."""

    rank: int
    local_rank: int
    uuids: tuple[str, ...]


def plan_devices(requested: str, views: Sequence[LocalView], host: str = "this node") -> dict[int, int | None]:
    """The CUDA ordinal of every rank of one node, by global rank, or None for all of them (gloo).

    Local rank r runs on ``cuda:(r % visible)``: with every GPU visible to every rank that is ``cuda:r``; with
    per-task binding (``srun --gpus-per-task=1``, one ``CUDA_VISIBLE_DEVICES`` per rank) each rank sees one GPU and
    runs on its ``cuda:0``. The UUIDs say whether the chosen GPUs are distinct. ``auto`` is NCCL when every rank
    has a GPU of its own, else gloo; ``nccl`` refuses, in one line naming the ranks, a rank without a GPU or two
    ranks on one GPU. ``views`` is the node's every rank (the same list on each, so each decides alike)."""
    if requested == "gloo":
        return {v.rank: None for v in views}
    views = sorted(views, key=lambda v: v.rank)
    # the launcher's local ranks where they number the node's ranks 0..n-1, else their order by global rank
    numbered = sorted(v.local_rank for v in views) == list(range(len(views)))
    index = {v.rank: (v.local_rank if numbered else i) for i, v in enumerate(views)}
    blind = [v.rank for v in views if not v.uuids]
    if blind:
        if requested == "nccl":
            raise ValueError(
                f"backend 'nccl' needs a GPU per rank: rank(s) {_rank_list(blind)} on {host} see no GPU "
                "(check CUDA_VISIBLE_DEVICES and the launcher's GPU binding); use --backend gloo or auto"
            )
        return {v.rank: None for v in views}
    chosen = {v.rank: index[v.rank] % len(v.uuids) for v in views}
    owners: dict[str, list[int]] = {}
    for v in views:
        owners.setdefault(v.uuids[chosen[v.rank]], []).append(v.rank)
    shared = [(u, rs) for u, rs in owners.items() if len(rs) > 1]
    if shared:
        if requested == "auto":
            return {v.rank: None for v in views}
        uuid, ranks = shared[0]
        raise ValueError(
            f"ranks {_rank_list(ranks)} on {host} would share GPU {uuid}: give each rank its own GPU "
            "(as many GPUs as ranks per node, srun --gpus-per-task=1, or one CUDA_VISIBLE_DEVICES per rank), "
            "or use --backend gloo"
        )
    return dict(chosen)


def _rank_list(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks[:-1])) + (" and " if len(ranks) > 1 else "") + str(ranks[-1])


def on_cuda(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA GPU: the one device question the layers above this module ask."""
    return device.type == "cuda"


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a GPU's current stream); nothing to wait for on CPU."""
    if on_cuda(device):
        torch.cuda.synchronize(device)


def device_ids(device: torch.device) -> list[int] | None:
    """What torch's ``device_ids`` arguments (``dist.barrier``, DDP) want for ``device``: ``[its index]`` on a GPU
    (the current device when it has none), None on CPU."""
    if not on_cuda(device):
        return None
    return [device.index if device.index is not None else torch.cuda.current_device()]


def gpu_facts(device: torch.device, backend: str) -> dict[str, Any] | None:
    """This rank's GPU as its node report keeps it: name, UUID, PCI bus id and MIG mode (NVML where it answers,
    else torch's device properties; MIG mode only from NVML), and the NCCL version this rank's torch loaded (with
    backend nccl); None on CPU. A failing query leaves its field None: metadata never stops a run."""
    if device.type != "cuda":
        return None
    from commbench.cluster import nvml

    facts: dict[str, Any] = {"name": None, "uuid": None, "pci_bus_id": None, "mig_mode": None, "nccl_version": None}
    index = device.index if device.index is not None else torch.cuda.current_device()
    facts["uuid"], facts["pci_bus_id"] = gpu_identity(index)
    try:
        facts["name"] = torch.cuda.get_device_properties(index).name
    except Exception:  # a broken driver: the report says unknown
        pass
    found = nvml.device_facts(uuid=facts["uuid"], pci_bus_id=facts["pci_bus_id"])
    if found:
        facts.update({k: v for k, v in found.items() if v is not None or k == "mig_mode"})
    if backend == "nccl":
        try:
            facts["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:
            pass
    return facts


def gpu_identity(index: int) -> tuple[str | None, str | None]:
    """(UUID, PCI bus id) of this rank's ``cuda:index`` from torch's device properties (the rank has its CUDA
    context anyway): what NVML looks a GPU up by (:func:`commbench.cluster.nvml.handle_of`), never the ordinal,
    which under per-task binding is 0 on every rank. (None, None) where CUDA cannot say."""
    try:
        props = torch.cuda.get_device_properties(index)
    except Exception:  # a broken driver: the link is then unknown, not wrong
        return None, None
    uuid = str(props.uuid) if getattr(props, "uuid", None) is not None else None
    pci = None
    if hasattr(props, "pci_bus_id"):
        domain = int(getattr(props, "pci_domain_id", 0))
        pci = f"{domain:08X}:{int(props.pci_bus_id):02X}:{int(getattr(props, 'pci_device_id', 0)):02X}.0"
    return uuid, pci


def device_free_bytes(device: torch.device) -> int | None:
    """Free memory of this rank's own ``device`` (a rank only: it creates the CUDA context the rank needs anyway),
    None on CPU (host memory is the check's own business)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.mem_get_info(device)[0])


def release_memory(device: torch.device) -> None:
    """Drop what garbage still holds and give the caching allocator's free blocks back to the device, so the next
    phase (training after the sweep) starts from what is live; on CPU only the collection."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
