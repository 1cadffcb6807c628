"""GPU facts through NVML (``nvidia-ml-py``, imported as ``pynvml``), never through the CUDA runtime.

Why not ``torch.cuda``: the supervisor of a local spawn (the ``commbench run`` process that starts the ranks) must
not create a CUDA context. A context costs about 0.5 GB on GPU 0 for the whole run, and under the
``EXCLUSIVE_PROCESS`` compute mode it takes GPU 0 from rank 0, which then cannot start. NVML reads the driver's
view (counts, free memory, names, UUIDs, PCI bus ids, MIG mode, the driver version) without a context.

``nvidia-ml-py`` is an optional extra (``pip install 'commbench[gpu]'``): every function here answers None when
it is missing or NVML cannot start (no driver), and callers then skip what needed it, saying so. Every NVML
session is opened and closed per call, so nothing is held between calls and a fork stays safe.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

INSTALL_HINT = "pip install 'commbench[gpu]' (nvidia-ml-py)"


def _text(value: Any) -> str:
    """NVML strings are ``bytes`` in older bindings and ``str`` in newer ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@contextmanager
def _session() -> Iterator[Any]:
    """The ``pynvml`` module inside an initialised NVML session; raises ImportError / pynvml.NVMLError."""
    import pynvml

    pynvml.nvmlInit()
    try:
        yield pynvml
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # a shutdown hiccup changes nothing we read
            pass


def ask(fn: Callable[[Any], T]) -> T | None:
    """``fn(pynvml)`` in a session, or None when NVML is missing or fails (no driver, a GPU fallen off the bus)."""
    try:
        with _session() as nv:
            return fn(nv)
    except Exception:  # ImportError, pynvml.NVMLError*, OSError from the shared library: all mean "cannot say"
        return None


UUID_PREFIXES = ("GPU-", "MIG-")


def parse_visible_devices(value: str | None) -> list[int] | list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as the CUDA runtime reads it: ordinals (``0,2``) up to the first entry that is not
    one, or UUIDs and UUID prefixes (``GPU-...`` for a GPU, ``MIG-...`` for a MIG instance, mixed as the runtime
    allows) up to the first entry that is neither; None when unset (every GPU visible); empty for ``""``, ``-1`` or
    a repeated entry (the runtime then shows no GPU)."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",")]
    if items and items[0][:4] in UUID_PREFIXES:
        uuids: list[str] = []
        for item in items:
            if item[:4] not in UUID_PREFIXES or item in uuids:
                return [] if item in uuids else uuids
            uuids.append(item)
        return uuids
    ordinals: list[int] = []
    for item in items:
        digits = item[: len(item) - len(item.lstrip("0123456789"))]
        if not digits:
            break
        n = int(digits)
        if n in ordinals:
            return []
        ordinals.append(n)
    return ordinals


def _mig_handles(nv: Any, gpu: Any) -> list[Any]:
    """The MIG devices of one GPU (none where MIG is off or NVML has no MIG calls)."""
    out = []
    try:
        count = int(nv.nvmlDeviceGetMaxMigDeviceCount(gpu))
    except Exception:  # not supported: a GPU without MIG, or an old binding
        return []
    for i in range(count):
        try:
            out.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i))
        except Exception:  # NVML_ERROR_NOT_FOUND: an empty slot
            continue
    return out


def _by_uuid_prefix(nv: Any, gpus: list[Any], prefix: str) -> list[Any]:
    """The GPUs (``GPU-...``) or MIG devices (``MIG-...``) whose UUID starts with ``prefix``, as the runtime matches."""
    pool = gpus if prefix.startswith("GPU-") else [m for g in gpus for m in _mig_handles(nv, g)]
    return [h for h in pool if _text(nv.nvmlDeviceGetUUID(h)).startswith(prefix)]


def _visible_handles(nv: Any, env: Mapping[str, str]) -> list[Any]:
    """NVML handles of the devices a CUDA process started with ``env`` would see (NVML itself ignores
    ``CUDA_VISIBLE_DEVICES``): GPU handles, or MIG device handles for ``MIG-`` entries. Ordinals are taken as NVML
    indices (PCI bus order, as ``CUDA_DEVICE_ORDER=PCI_BUS_ID``); callers only count them or take the minimum over
    them, so the order does not matter, and nothing here says which GPU is ``cuda:i`` (:func:`handle_of` finds a
    GPU by its identity)."""
    total = int(nv.nvmlDeviceGetCount())
    gpus = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(total)]
    visible = parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    if visible is None:
        return gpus
    handles = []
    for v in visible:
        if isinstance(v, int):
            if v >= total:
                break  # the runtime stops at the first ordinal past the last GPU
            handles.append(gpus[v])
        else:
            match = _by_uuid_prefix(nv, gpus, v)
            if len(match) != 1:
                break  # an unknown or ambiguous prefix: counted up to here, as the runtime stops there
            handles.append(match[0])
    return handles


def handle_of(nv: Any, uuid: str | None = None, pci_bus_id: str | None = None, parent: bool = False) -> Any:
    """The NVML handle of one device by its identity, never by a CUDA ordinal (under per-task binding every rank's
    ``cuda:0`` is another GPU, and CUDA's order need not be NVML's): its UUID (``GPU-...``, a bare UUID as torch
    prints it, or ``MIG-...``), else its PCI bus id. ``parent``: for a MIG device, the GPU it is part of (where the
    links, the architecture and the PCIe link are). LookupError when neither is given."""
    if uuid:
        wanted = uuid if uuid[:4] in UUID_PREFIXES else f"GPU-{uuid}"
        h = nv.nvmlDeviceGetHandleByUUID(wanted)
        if parent and wanted.startswith("MIG-"):
            h = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h)
        return h
    if pci_bus_id:
        return nv.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
    raise LookupError("no UUID or PCI bus id NVML can look up")


def compute_processes(uuid: str | None = None) -> list[int] | None:
    """PIDs with a CUDA context on the GPU of ``uuid`` (every visible GPU when None), from NVML's process list;
    None when NVML cannot say. What shows whether a process (the supervisor) made a context."""

    def pids(nv: Any) -> list[int]:
        handles = [handle_of(nv, uuid)] if uuid else _visible_handles(nv, os.environ)
        out: list[int] = []
        for h in handles:
            for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                out.append(int(p.pid))
        return sorted(set(out))

    return ask(pids)


def visible_count(env: Mapping[str, str] | None = None) -> int | None:
    """GPUs a CUDA process started with ``env`` (default: this one's) would see, or None when NVML cannot say."""
    env = os.environ if env is None else env
    return ask(lambda nv: len(_visible_handles(nv, env)))


def min_free_bytes(env: Mapping[str, str] | None = None) -> int | None:
    """Free memory of the visible GPU that has least (every rank's tensors must fit on its own), or None."""
    env = os.environ if env is None else env

    def free(nv: Any) -> int | None:
        handles = _visible_handles(nv, env)
        return min(int(nv.nvmlDeviceGetMemoryInfo(h).free) for h in handles) if handles else None

    return ask(free)


def driver_version() -> str | None:
    """The NVIDIA driver's version (``550.54.15``), or None."""
    return ask(lambda nv: _text(nv.nvmlSystemGetDriverVersion()))


MIG_MODES = {0: "disabled", 1: "enabled"}


def device_facts(uuid: str | None = None, pci_bus_id: str | None = None) -> dict[str, Any] | None:
    """Name, UUID, PCI bus id and MIG mode of one GPU, found by its UUID (what CUDA reports) or its PCI bus id;
    None when NVML cannot say. MIG mode is None on GPUs without MIG (NVML says "not supported")."""

    def facts(nv: Any) -> dict[str, Any]:
        h = handle_of(nv, uuid, pci_bus_id, parent=True)
        try:
            current = int(nv.nvmlDeviceGetMigMode(h)[0])
            mig: str | None = MIG_MODES.get(current, str(current))
        except Exception:  # NVMLError_NotSupported on GPUs without MIG
            mig = None
        return {
            "name": _text(nv.nvmlDeviceGetName(h)),
            "uuid": _text(nv.nvmlDeviceGetUUID(h)),
            "pci_bus_id": _text(nv.nvmlDeviceGetPciInfo(h).busId),
            "mig_mode": mig,
        }

    return ask(facts)
