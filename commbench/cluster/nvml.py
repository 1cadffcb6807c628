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


def _ask(fn: Callable[[Any], T]) -> T | None:
    """``fn(pynvml)`` in a session, or None when NVML is missing or fails (no driver, a GPU fallen off the bus)."""
    try:
        with _session() as nv:
            return fn(nv)
    except Exception:  # ImportError, pynvml.NVMLError*, OSError from the shared library: all mean "cannot say"
        return None


def parse_visible_devices(value: str | None) -> list[int] | list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as the CUDA runtime reads it: ordinals (``0,2``) up to the first entry that is not
    one, or UUID prefixes (``GPU-...``, ``MIG-...``); None when unset (every GPU visible); empty for ``""``, ``-1``
    or a repeated entry (the runtime then shows no GPU)."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",")]
    if items and items[0][:4] in ("GPU-", "MIG-"):
        prefix = items[0][:4]
        uuids: list[str] = []
        for item in items:
            if not item.startswith(prefix) or item in uuids:
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


def _visible_handles(nv: Any, env: Mapping[str, str]) -> list[Any]:
    """NVML handles of the GPUs a CUDA process started with ``env`` would see (NVML itself ignores
    ``CUDA_VISIBLE_DEVICES``). Ordinals are taken as NVML indices (PCI bus order, as ``CUDA_DEVICE_ORDER=PCI_BUS_ID``);
    callers only count them or take the minimum over them, so the order does not matter."""
    total = int(nv.nvmlDeviceGetCount())
    visible = parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    if visible is None:
        return [nv.nvmlDeviceGetHandleByIndex(i) for i in range(total)]
    handles = []
    for v in visible:
        if isinstance(v, int):
            if v >= total:
                break  # the runtime stops at the first ordinal past the last GPU
            handles.append(nv.nvmlDeviceGetHandleByIndex(v))
        else:
            match = [
                nv.nvmlDeviceGetHandleByIndex(i)
                for i in range(total)
                if _text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))).startswith(v)
            ]
            if len(match) != 1:
                break  # a MIG instance or an unknown prefix: counted up to here, as the runtime stops there
            handles.append(match[0])
    return handles


def visible_count(env: Mapping[str, str] | None = None) -> int | None:
    """GPUs a CUDA process started with ``env`` (default: this one's) would see, or None when NVML cannot say."""
    env = os.environ if env is None else env
    return _ask(lambda nv: len(_visible_handles(nv, env)))


def min_free_bytes(env: Mapping[str, str] | None = None) -> int | None:
    """Free memory of the visible GPU that has least (every rank's tensors must fit on its own), or None."""
    env = os.environ if env is None else env

    def free(nv: Any) -> int | None:
        handles = _visible_handles(nv, env)
        return min(int(nv.nvmlDeviceGetMemoryInfo(h).free) for h in handles) if handles else None

    return _ask(free)


def driver_version() -> str | None:
    """The NVIDIA driver's version (``550.54.15``), or None."""
    return _ask(lambda nv: _text(nv.nvmlSystemGetDriverVersion()))


MIG_MODES = {0: "disabled", 1: "enabled"}


def device_facts(uuid: str | None = None, pci_bus_id: str | None = None) -> dict[str, Any] | None:
    """Name, UUID, PCI bus id and MIG mode of one GPU, found by its UUID (what CUDA reports) or its PCI bus id;
    None when NVML cannot say. MIG mode is None on GPUs without MIG (NVML says "not supported")."""

    def facts(nv: Any) -> dict[str, Any]:
        if uuid is not None and not uuid.startswith("MIG-"):
            h = nv.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        elif pci_bus_id is not None:
            h = nv.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        else:
            raise LookupError("no UUID or PCI bus id NVML can look up")
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

    return _ask(facts)
