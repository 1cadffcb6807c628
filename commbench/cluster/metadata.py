"""Run metadata (``metadata.json``): one builder for a measured run and for an imported one.

Every run directory states what produced its numbers (DESIGN: hardware, versions, world layout, suite and
date). :func:`build_metadata` owns the keys every run directory has; ``commbench.cli.orchestrate.run_metadata``
fills them from a live world, ``commbench.store.nccl_import`` from an nccl-tests log. The schema version is
``commbench.core.records.SCHEMA_VERSION``.

Every node reports itself (``node_facts``: host name, NICs and their speeds, the communication environment
(:data:`ENV_FAMILIES`), CPU and GPU models, the NVIDIA driver, ``nvidia-smi topo -m`` where nvidia-smi exists) and
every rank its GPU (``launch.gpu_facts``: name, UUID, PCI bus id, MIG mode, its NCCL version) and its
``CUDA_VISIBLE_DEVICES``; :func:`gather_nodes` collects them from all ranks (one report per node, with the node's
ranks and, in the same order, their cores and GPUs) into the ``node_reports`` key. With ``--nccl-debug`` each
rank's transport as NCCL chose it (:func:`nccl_transport`, from its ``NCCL_DEBUG=INFO`` log) joins its node's
report at the end of the run (:func:`gather_transports`, :func:`add_transports`).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from commbench.core.records import COMMBENCH_VERSION, SCHEMA_VERSION


def git_commit() -> str | None:
    """The commit commbench runs from, or None outside a git checkout."""
    try:
        here = Path(__file__).resolve().parents[2]
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def build_metadata(
    *,
    start_time: str,
    end_time: str | None,
    host: str | None,
    hosts: list[str],
    device_name: str | None,
    backend: str,
    world_size: int | None,
    nodes: int | None,
    nproc_per_node: int | None,
    threads_per_rank: int | None,
    launcher: str,
    torch_version: str | None,
    nccl_version: str | None,
    suite: Mapping[str, Any],
    timing: Mapping[str, Any],
    argv: list[str],
    git_commit: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The metadata of a run directory: the keys every run has (the schema and commbench versions, the
    Python and platform this process runs on, plus the arguments), then ``extra`` (source-specific keys)."""
    meta: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "commbench_version": COMMBENCH_VERSION,
        "git_commit": git_commit,
        "start_time": start_time,
        "end_time": end_time,
        "host": host,
        "hosts": hosts,
        "device_name": device_name,
        "backend": backend,
        "world_size": world_size,
        "nodes": nodes,
        "nproc_per_node": nproc_per_node,
        "threads_per_rank": threads_per_rank,
        "launcher": launcher,
        "torch_version": torch_version,
        "nccl_version": nccl_version,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "suite": dict(suite),
        "timing": dict(timing),
        "argv": argv,
    }
    meta.update(extra or {})
    return meta


ENV_FAMILIES = (
    "NCCL_",
    "TORCH_NCCL_",
    "GLOO_",
    "FI_",
    "UCX_",
    "OMPI_MCA_",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_MAX_CONNECTIONS",
)
"""Environment a node report keeps: prefixes (``_``-ended) and whole names. What a GPU user is asked first: NCCL's
and torch's NCCL knobs, gloo's, libfabric's (EFA), UCX's and Open MPI's transport settings, the GPUs a process sees,
and CUDA's hardware queues (Megatron sets 1 to order communication and compute kernels)."""

_ENV_KEYS = re.compile(
    "^(" + "|".join(re.escape(f) if f.endswith("_") else re.escape(f) + "$" for f in ENV_FAMILIES) + ")"
)


def kept_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` in :data:`ENV_FAMILIES`, sorted by name."""
    return {k: v for k, v in sorted(env.items()) if _ENV_KEYS.match(k)}


SYS_NET = Path("/sys/class/net")


def nics(sys_net: Path = SYS_NET) -> list[dict[str, Any]]:
    """This host's network interfaces: name and link speed in Mbit/s from ``/sys/class/net/*/speed`` (None where
    the file is unreadable or says -1: virtual links, interfaces that are down)."""
    out: list[dict[str, Any]] = []
    try:
        names = sorted(p.name for p in sys_net.iterdir())
    except OSError:
        return out
    for name in names:
        speed: int | None = None
        try:
            v = int((sys_net / name / "speed").read_text().strip())
            speed = v if v > 0 else None
        except (OSError, ValueError):  # EINVAL on virtual or down links
            pass
        out.append({"name": name, "speed_mbps": speed})
    return out


def nvidia_topology(timeout: float = 20) -> str | None:
    """``nvidia-smi topo -m`` where nvidia-smi exists and answers, else None."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        p = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.rstrip() if p.returncode == 0 and p.stdout.strip() else None


def node_facts(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What this node says about itself (no collective: one process per node calls it)."""
    from commbench.cluster.launch import cpu_model_name

    env = os.environ if env is None else env
    gpus: list[str] = []
    try:
        import torch

        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # a broken driver must not stop the run; the report says "none"
        gpus = []
    from commbench.cluster import nvml

    return {
        "host": socket.gethostname(),
        "nics": nics(),
        "env": kept_env(env),
        "cpu": cpu_model_name(),
        "cpu_count": os.cpu_count(),
        "gpus": gpus,
        "driver_version": nvml.driver_version(),
        "nvidia_topo": nvidia_topology(),
    }


PER_RANK = {"cores": "rank_cores", "gpu": "rank_gpus", "cuda_visible_devices": "rank_cuda_visible_devices"}
"""Per-rank facts (key in a rank's item -> list in its node's report, in the order of the node's ``ranks``)."""


def merge_nodes(per_rank: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One report per host from every rank's (in rank order): the host's ranks and, in the same order, each
    rank's own facts (:data:`PER_RANK`: the cores it was bound to as a cpulist, its GPU, its CUDA_VISIBLE_DEVICES;
    None where unknown), then the facts of its first rank that carries them (``node_facts`` keys); hosts in order
    of their lowest rank."""
    out: dict[str, dict[str, Any]] = {}
    for rank, item in enumerate(per_rank):
        host = str(item.get("host"))
        node = out.setdefault(host, {"host": host, "ranks": [], **{v: [] for v in PER_RANK.values()}})
        node["ranks"].append(rank)
        for k, v in PER_RANK.items():
            node[v].append(item.get(k))
        for k, v in item.items():
            if k not in PER_RANK:
                node.setdefault(k, v)
    return list(out.values())


def gather_nodes(d: Any) -> list[dict[str, Any]]:
    """Every node's report (on every rank): a collective, call it on every rank of the world ``d``."""
    from commbench.cluster.launch import gpu_facts, node_leader, rank_cores

    mine = node_facts() if node_leader(d) else {"host": d.host}
    mine["cores"] = rank_cores()
    mine["gpu"] = gpu_facts(d.device, d.backend)
    mine["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return merge_nodes(d.gather_object(mine))


_VIA = re.compile(r"\bvia (NET/[A-Za-z0-9_]+(?:/\d+)?(?:/GDRDMA)?|P2P/[A-Za-z]+|SHM|CollNet[A-Za-z/]*)")
_NETWORK = re.compile(r"\bUsing network (\S.*?)\s*$")


def nccl_transport(log: str) -> str | None:
    """The transports NCCL chose, from its ``NCCL_DEBUG=INFO`` log (INIT, NET), as ``NVLS, P2P/CUMEM, IB`` (the
    order of first appearance; the network last); None when the log says nothing about it (gloo, or NCCL logged
    nothing yet).

    What counts: each channel's connection (``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC``, ``via SHM/direct/direct``,
    ``[send] via NET/IB/0/GDRDMA``), NVLS when NCCL says ``NVLS multicast support is available`` or builds an NVLS
    communicator (``NVLS comm 0x...``), and the network plugin NCCL uses (``Using network IB`` / ``Socket``). The
    ``NET/IB : No device found`` of a probe that failed is not a transport."""
    seen: list[str] = []
    network: str | None = None
    for line in log.splitlines():
        if "NVLS multicast support is available" in line or re.search(r"\bNVLS comm 0x", line):
            if "NVLS" not in seen:
                seen.append("NVLS")
        m = _NETWORK.search(line)
        if m:
            network = m.group(1)
        for via in _VIA.findall(line):
            name = via
            if via.startswith("NET/"):
                parts = via.split("/")  # NET, IB, 0, GDRDMA
                name = parts[1] + ("/GDRDMA" if parts[-1] == "GDRDMA" else "")
            elif via.startswith("CollNet"):
                name = "CollNet"
            if name not in seen:
                seen.append(name)
    if network is not None and not any(t.split("/")[0] == network for t in seen):
        seen.append(f"net {network}")
    return ", ".join(seen) if seen else None


def gather_transports(d: Any, log: Path) -> list[dict[str, Any]]:
    """Every rank's NCCL transport (:func:`nccl_transport` of its log ``log``) and log path, in rank order, on
    every rank: a collective. A rank whose log is missing or unreadable reports None."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    return d.gather_object({"transport": nccl_transport(text), "log": str(log)})


def add_transports(meta: dict[str, Any], transports: Sequence[Mapping[str, Any]]) -> None:
    """Put each rank's transport into its node's report (``rank_transports``, in the order of the node's ranks)
    and the log paths under ``nccl_debug``."""
    for node in meta.get("node_reports") or []:
        node["rank_transports"] = [transports[r].get("transport") for r in node.get("ranks") or []]
    meta["nccl_debug"] = {"subsystems": "INIT,NET", "logs": [t.get("log") for t in transports]}
