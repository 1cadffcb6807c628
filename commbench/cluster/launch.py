"""World discovery and launch: join a torchrun / Slurm / MPI world, or spawn a local group and supervise it.

Only this module and :mod:`commbench.measure.timing` know about devices and synchronisation. A local run re-executes
``python -m commbench`` once per rank with torchrun's environment variables, so a spawned rank runs exactly the
code path of a rank started by torchrun. The parent supervises: the first rank to die ends the run, a rank
that stops responding is named once the others time out, and no child outlives the parent.
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from commbench.cluster.dist_ops import all_gather_tensor


@dataclass(frozen=True, slots=True)
class WorldInfo:
    """Where this process sits in the world, as the launcher said."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str
    """``local`` (spawned by commbench), ``torchrun``, ``slurm`` or ``mpi``."""


def first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list: ``node[01-04,07],gpu2`` -> ``node01``."""
    m = re.match(r"^([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise ValueError(f"cannot parse SLURM_JOB_NODELIST {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    value = env.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"environment variable {key} is not set")
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {key}={value!r} is not an integer") from None


def detect_world(env: Mapping[str, str] | None = None) -> WorldInfo | None:
    """The world this process was launched into, or ``None`` when it runs alone (then commbench spawns)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = env.get("COMMBENCH_LAUNCHER", "torchrun")
        return WorldInfo(
            rank=_int(env, "RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_rank=_int(env, "LOCAL_RANK", 0),
            local_world_size=_int(env, "LOCAL_WORLD_SIZE", 1),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int(env, "MASTER_PORT", 29500),
            launcher=launcher,
        )
    if "SLURM_PROCID" in env and _int(env, "SLURM_NTASKS", 1) > 1:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        addr = env.get("MASTER_ADDR") or (first_slurm_host(nodelist) if nodelist else None)
        if not addr:
            raise ValueError("Slurm world without SLURM_JOB_NODELIST or MASTER_ADDR: cannot find the rendezvous host")
        local_size = slurm_local_tasks(env)
        job = _int(env, "SLURM_JOB_ID", 0)
        return WorldInfo(
            rank=_int(env, "SLURM_PROCID"),
            world_size=_int(env, "SLURM_NTASKS"),
            local_rank=_int(env, "SLURM_LOCALID", 0),
            local_world_size=local_size,
            master_addr=addr,
            master_port=_int(env, "MASTER_PORT", 20000 + job % 20000),
            launcher="slurm",
        )
    for prefix in ("OMPI_COMM_WORLD_", "PMI_"):
        if f"{prefix}RANK" in env and _int(env, f"{prefix}SIZE", 1) > 1:
            world_size = _int(env, f"{prefix}SIZE")
            local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", _int(env, "MPI_LOCALNRANKS", 1))
            # MPI names no rendezvous host; when every rank is on this node it is this node (`mpirun -np 2` works
            # as it is), across nodes the user says which (mpirun starts rank 0 where its hostfile says)
            addr = env.get("MASTER_ADDR") or ("127.0.0.1" if local_size == world_size else None)
            if not addr:
                raise ValueError(
                    f"MPI world across nodes ({local_size} of {world_size} ranks on this one) but MASTER_ADDR is not "
                    "set: export MASTER_ADDR (rank 0's host), e.g. mpirun -x MASTER_ADDR=node01"
                )
            return WorldInfo(
                rank=_int(env, f"{prefix}RANK"),
                world_size=world_size,
                local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", _int(env, "MPI_LOCALRANKID", 0)),
                local_world_size=local_size,
                master_addr=addr,
                master_port=_int(env, "MASTER_PORT", _mpi_job_port(env)),
                launcher="mpi",
            )
    return None


def slurm_tasks_per_node(spec: str) -> list[int]:
    """Slurm's compressed tasks-per-node list (``SLURM_STEP_TASKS_PER_NODE``: ``2(x3),1`` is 2, 2, 2, 1), one count
    per node in node order; [] where it does not read as one."""
    out: list[int] = []
    for item in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if m is None:
            return []
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def slurm_local_tasks(env: Mapping[str, str]) -> int:
    """Tasks of this Slurm step on this node: this node's entry (``SLURM_NODEID``) of the step's tasks per node,
    which differ between nodes when the tasks do not divide evenly (``srun -n 7 -N 2``: 4 and 3); else
    ``SLURM_NTASKS_PER_NODE`` (set by ``--ntasks-per-node``, the same on every node); else 1."""
    per_node = slurm_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""))
    node = env.get("SLURM_NODEID", "")
    if per_node and node.isdigit() and int(node) < len(per_node):
        return per_node[int(node)]
    if per_node and not env.get("SLURM_NTASKS_PER_NODE"):
        return per_node[0]
    m = re.match(r"\d+", env.get("SLURM_NTASKS_PER_NODE", ""))
    return int(m.group(0)) if m else 1


def _mpi_job_port(env: Mapping[str, str]) -> int:
    """The rendezvous port of an MPI job without MASTER_PORT: derived from Open MPI's job id (the same on every
    rank of one ``mpirun``, different for two ``mpirun`` at once), as the Slurm port is from the job id; a fixed
    port (29500, torchrun's) would make two jobs on one node, or a job beside a torchrun, meet in one store.
    Other MPIs name no job id here: 29500."""
    job = env.get("OMPI_MCA_ess_base_jobid", "")
    return 20000 + int(job) % 20000 if job.isdigit() else 29500


def has_gpus() -> int:
    """GPUs this process would see, counted without creating a CUDA context (the supervisor of a local spawn
    calls it; a context there costs ~0.5 GB on GPU 0 and, under EXCLUSIVE_PROCESS, GPU 0 itself): NVML
    (:mod:`commbench.cluster.nvml`) where ``nvidia-ml-py`` is installed, else ``torch.cuda.device_count()``, which counts
    through NVML too and otherwise asks ``cudaGetDeviceCount`` (the driver starts, no context is made). A torch
    built without CUDA sees none, whatever the driver says."""
    if not torch.backends.cuda.is_built():
        return 0
    from commbench.cluster import nvml

    n = nvml.visible_count()
    return n if n is not None else torch.cuda.device_count()


def default_nproc() -> int:
    """One rank per GPU when there are two or more, else two CPU ranks."""
    n = has_gpus()
    return n if n >= 2 else 2


def resolve_backend(requested: str, local_rank: int, local_world_size: int) -> str:
    """The backend of a local spawn, decided by its supervisor: every rank it starts sees the same GPUs, so ``auto``
    is NCCL only when there are as many GPUs as ranks (rank r on ``cuda:r``)."""
    gpus = has_gpus()
    if requested == "auto":
        return "nccl" if gpus >= local_world_size and gpus > 0 else "gloo"
    if requested == "nccl" and local_rank >= gpus:
        raise ValueError(
            f"backend 'nccl' needs a GPU per rank: this node has {gpus} GPU(s) for {local_world_size} rank(s); use --backend gloo or auto"
        )
    return requested


DEFAULT_COLLECTIVE_TIMEOUT_S = (dist.constants.default_pg_nccl_timeout or _dt.timedelta(minutes=10)).total_seconds()
"""torch's own collective timeout (ProcessGroupNCCL's watchdog: 10 min), used for every backend and for the
rendezvous store. A collective that waits longer for a peer fails, and a hung rank is named then. Not shorter: a long
reference check on the CPU or a slow first NCCL init on a large job is a healthy run. A dead rank is seen by the
supervisor of a local spawn at once (:func:`spawn_local`), whatever this says."""


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


def _store_barrier(store: Any, key: str, world_size: int) -> None:
    """Every rank arrives before any leaves: O(1) store calls per rank (the last one to arrive opens the door)."""
    if int(store.add(f"{key}/arrived", 1)) == world_size:
        store.set(f"{key}/open", "1")
    store.wait([f"{key}/open"])


def agree_devices(store: Any, info: WorldInfo, requested: str, host: str, uuids: Sequence[str]) -> int | None:
    """This rank's CUDA ordinal (NCCL) or None (gloo), decided alike on every rank of the world before any
    process group exists, through the rendezvous ``store``.

    Each rank publishes the UUIDs it sees under its host; after a store barrier each rank reads its node's ranks
    (so a launcher's LOCAL_WORLD_SIZE need not be right) and :func:`plan_devices` decides. The node's outcome is
    then voted across the world, so every rank takes the same backend (a mixed nccl/gloo world would hang in its
    first collective) and a refusal on one node ends every rank with that node's one line."""
    if requested == "gloo":
        return None
    key = f"commbench/devices/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    slot = int(store.add(f"{key}/host/{host}", 1)) - 1
    store.set(f"{key}/gpu/{host}/{slot}", json.dumps([info.rank, info.local_rank, list(uuids)]))
    _store_barrier(store, f"{key}/published", info.world_size)
    n = int(store.add(f"{key}/host/{host}", 0))
    views = [
        LocalView(r, lr, tuple(u)) for r, lr, u in (json.loads(store.get(f"{key}/gpu/{host}/{i}")) for i in range(n))
    ]
    try:
        plan: dict[int, int | None] | None = plan_devices(requested, views, host)
    except ValueError as e:
        plan = None
        store.set(f"{key}/why", str(e))
        store.add(f"{key}/refused", 1)
    if plan is not None and plan[info.rank] is None:
        store.add(f"{key}/gloo", 1)
    _store_barrier(store, f"{key}/voted", info.world_size)
    if int(store.add(f"{key}/refused", 0)):
        raise ValueError(store.get(f"{key}/why").decode())
    if int(store.add(f"{key}/gloo", 0)):
        return None
    assert plan is not None  # not refused, so this node planned
    return plan[info.rank]


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


@dataclass(frozen=True, slots=True)
class Dist:
    """An initialised world as the rest of commbench sees it."""

    info: WorldInfo
    backend: str
    device: torch.device
    host: str
    hosts: tuple[str, ...]
    """Host of every rank, in rank order."""
    threads: int

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    @property
    def nodes(self) -> int:
        return len(set(self.hosts))

    @property
    def device_kind(self) -> str:
        """``cuda`` or ``cpu`` (metadata's ``device``)."""
        return str(self.device.type)

    def sync(self) -> None:
        synchronize(self.device)

    def barrier(self) -> None:
        dist.barrier(device_ids=device_ids(self.device))

    def agree_max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def gather_floats(self, values: Sequence[float]) -> list[list[float]]:
        """Every rank's list of floats (same length on every rank), in rank order, on every rank."""
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        out = torch.empty(self.world_size * len(values), dtype=torch.float64, device=self.device)
        all_gather_tensor(out, t)
        return out.view(self.world_size, len(values)).cpu().tolist()

    def gather_object(self, value: Any) -> list[Any]:
        """Every rank's picklable ``value``, in rank order, on every rank."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def device_name(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return cpu_model_name()


def node_leader(d: Dist) -> bool:
    """The lowest rank on this host: the one that speaks for the node."""
    return d.hosts.index(d.host) == d.rank


_PEER = re.compile(r"\[([0-9A-Fa-f:.]+)\]:\d+")
"""A peer as gloo names it in a failed collective: ``Connection closed by peer [169.254.1.2]:39562``."""


def _addresses(host: str) -> set[str]:
    try:
        return {str(a[4][0]) for a in socket.getaddrinfo(host, None)}
    except OSError:
        return set()


def lost_peer(exc: BaseException, d: Dist) -> str | None:
    """``lost node H (ranks a, b): <the error's first line>`` when ``exc`` (a failed collective) names a peer
    address that is one of the world's hosts, else None. A node that died closes its connections, so the
    survivors' collectives fail at once naming its address; a hung node shows as a timeout instead."""
    text = str(exc)
    peers = [m.removeprefix("::ffff:") for m in _PEER.findall(text)]
    if not peers:
        return None
    hosts = list(dict.fromkeys(d.hosts))
    for addr in peers:
        owner = next((h for h in hosts if addr in _addresses(h)), None)
        if owner is None:
            try:
                name = socket.gethostbyaddr(addr)[0]
            except OSError:
                continue
            owner = next((h for h in hosts if h.split(".")[0] == name.split(".")[0]), None)
        if owner is not None and owner != d.host:
            ranks = ", ".join(str(r) for r, h in enumerate(d.hosts) if h == owner)
            first = text.strip().splitlines()[0]
            # gloo's "[/path/pair.cc:553] Connection closed by peer [a]:p. This is typically caused by ...": the middle
            first = re.sub(r"^\[[^\]]*/[^\]]*\]\s*", "", first).split(". This is typically")[0]
            return f"lost node {owner} (ranks {ranks}): {first}"
    return None


def cpu_model_name() -> str:
    """The CPU's marketing name (``/proc/cpuinfo`` on Linux), else the architecture."""
    import platform

    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


_joined_world = False
"""Set once this process has joined a world; :func:`exit_process` reads it."""


def init_world(
    info: WorldInfo, backend: str, timeout_s: float | None = None, *, nccl_debug: Path | None = None
) -> Dist:
    """Initialise torch.distributed for ``info`` with collective timeout ``timeout_s`` (None: torch's own,
    :data:`DEFAULT_COLLECTIVE_TIMEOUT_S`).

    The rendezvous store comes first (the supervisor's listening socket in a local spawn, else torch's ``tcp://``
    rendezvous, which also serves torchrun's agent store), so the ranks agree on backend and devices through it
    (:func:`agree_devices`) before NCCL starts: a refusal is one line on every rank, not NCCL's "duplicate GPU".
    With ``nccl_debug`` (a file path), NCCL logs INIT and NET at INFO level there (:func:`nccl_debug_env`)."""
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    if info.launcher != "local" and os.environ.get(PIN_ENV) == "1" and hasattr(os, "sched_setaffinity"):
        # opt-in under torchrun / Slurm / MPI (a local spawn binds its ranks as it starts them): local rank r on
        # its block of the allowed cores, so a busy core slows exactly one rank
        cores = allowed_cores()
        blocks = core_blocks(cores, info.local_world_size)
        os.sched_setaffinity(0, blocks[info.local_rank] if blocks else {cores[info.local_rank % len(cores)]})
    os.environ.setdefault("MASTER_ADDR", info.master_addr)
    os.environ.setdefault("MASTER_PORT", str(info.master_port))
    if nccl_debug is not None:
        # NCCL reads its environment when it first starts, in this process: setting it here reaches it
        nccl_debug.parent.mkdir(parents=True, exist_ok=True)
        os.environ.update(nccl_debug_env(nccl_debug))
    global _joined_world
    _joined_world = True
    timeout = _dt.timedelta(seconds=DEFAULT_COLLECTIVE_TIMEOUT_S if timeout_s is None else timeout_s)
    store_fd = os.environ.get(STORE_FD_ENV)
    if store_fd is not None:
        # A local spawn: the supervisor bound the rendezvous socket on loopback and handed it to rank 0, so the
        # store listens on 127.0.0.1 only and no other process can take the port between choice and use.
        store = dist.TCPStore(
            info.master_addr,
            info.master_port,
            info.world_size,
            info.rank == 0,
            timeout,
            master_listen_fd=int(store_fd) if store_fd else None,
        )
    else:
        url = f"tcp://{info.master_addr}:{info.master_port}"
        store, _, _ = next(dist.rendezvous(url, rank=info.rank, world_size=info.world_size, timeout=timeout))
    host = socket.gethostname()
    uuids = gpu_uuids() if backend != "gloo" and dist.is_nccl_available() else []
    index = agree_devices(store, info, backend, host, uuids)
    if index is not None:
        backend = "nccl"
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    else:
        backend = "gloo"
        device = torch.device("cpu")
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
        device_id=device if backend == "nccl" else None,
    )
    hosts: list[str | None] = [None] * info.world_size
    dist.all_gather_object(hosts, host)
    return Dist(
        info=info,
        backend=backend,
        device=device,
        host=host,
        hosts=tuple(str(h) for h in hosts),
        threads=torch.get_num_threads(),
    )


def nccl_debug_env(path: Path) -> dict[str, str]:
    """NCCL's variables that log what it chose at init (transports, network, rings) to ``path``: INFO level, the
    INIT and NET subsystems only (COLL would log every collective)."""
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": str(path)}


def gpu_facts(device: torch.device, backend: str) -> dict[str, Any] | None:
    """This rank's GPU as its node report keeps it: name, UUID, PCI bus id and MIG mode (NVML where it answers,
    else torch's device properties; MIG mode only from NVML), and the NCCL version this rank's torch loaded (with
    backend nccl); None on CPU. A failing query leaves its field None: metadata never stops a run."""
    if device.type != "cuda":
        return None
    from commbench.cluster import nvml

    facts: dict[str, Any] = {"name": None, "uuid": None, "pci_bus_id": None, "mig_mode": None, "nccl_version": None}
    try:
        props = torch.cuda.get_device_properties(device)
        facts["name"] = props.name
        facts["uuid"] = str(props.uuid)
        if hasattr(props, "pci_bus_id"):
            domain = int(getattr(props, "pci_domain_id", 0))
            facts["pci_bus_id"] = (
                f"{domain:08X}:{int(props.pci_bus_id):02X}:{int(getattr(props, 'pci_device_id', 0)):02X}.0"
            )
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


def shutdown_world() -> None:
    if dist.is_initialized():
        # DDP/FSDP objects and futures that are only garbage by now still hold the process group; collect them
        # so that destroying it can stop its worker threads.
        gc.collect()
        try:
            dist.destroy_process_group()
        except Exception as e:  # results are on disk by now; a teardown hiccup must not turn into a failed run
            print(f"commbench: warning: process group teardown: {type(e).__name__}: {e}", file=sys.stderr)


def exit_process(code: int) -> NoReturn:
    """End ``python -m commbench`` with ``code``; a process that joined a world skips interpreter finalization.

    When anything still references a gloo process group (a DDP reducer, a pending future's callback),
    ``destroy_process_group`` cannot join its worker threads. Such a thread that drops its last Python
    reference while the interpreter finalizes is unwound by ``pthread_exit`` through C++ ``noexcept``
    code: "terminate called without an active exception", SIGABRT, and a finished run that reports a
    dead rank; ``benchmarks/stress_teardown.py`` reproduces it side by side with this path. Every result is
    on disk and the group destroyed by the time this runs, so flush the standard streams and leave with
    ``os._exit``.
    """
    if not _joined_world:
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


LOG_DIR_ENV = "COMMBENCH_LOG_DIR"
"""Set on every rank of a local spawn that keeps logs: the directory of ``rank<r>.log``."""

PIN_ENV = "COMMBENCH_PIN_RANKS"
"""Core binding of local ranks. A local spawn binds each rank to its own block of the allowed cores unless this is
``0``; under torchrun / Slurm / MPI ranks are bound only when it is ``1`` (the launcher owns placement)."""


def allowed_cores() -> list[int]:
    """The cores this process may run on (its affinity where the platform says, else all of them)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def core_blocks(cores: Sequence[int], nproc: int) -> list[set[int]] | None:
    """``nproc`` disjoint, equal blocks of consecutive ``cores`` (rank r gets the r-th; leftovers unused), or None
    when there are fewer cores than ranks: oversubscribed ranks are left to the scheduler.

    Why bind at all: left to the scheduler, two loopback ranks sometimes share a core (they ping-pong, and the
    scheduler pulls a woken task next to its waker), and a shared core copies the message within its own cache,
    faster than two cores would (figures: benchmarks/results/2026-12-01_2core-vm_gloo.md). Unbound, a run lands
    anywhere between, so two identical runs disagree; bound, a rank owns its core, as under ``mpirun --bind-to core``."""
    if nproc < 1 or len(cores) < nproc:
        return None
    per = len(cores) // nproc
    return [set(cores[r * per : (r + 1) * per]) for r in range(nproc)]


def bind(pid: int, cores: set[int]) -> bool:
    """Bind process ``pid`` (all the threads it starts later) to ``cores``; False where the system refuses (a
    sandbox), and the process then runs unbound."""
    try:
        os.sched_setaffinity(pid, cores)
    except OSError:
        return False
    return True


def describe_cores(cores: Sequence[int] | set[int]) -> str:
    """``0-3,8`` for cores {0, 1, 2, 3, 8}: the cpulist form of taskset and /sys."""
    from commbench.core.units import int_ranges

    return int_ranges(cores)


def rank_cores() -> str | None:
    """This process's cores as a cpulist (``describe_cores``), or None where the platform cannot say."""
    return describe_cores(allowed_cores()) if hasattr(os, "sched_getaffinity") else None


STORE_FD_ENV = "COMMBENCH_STORE_FD"
"""Set on every rank of a local spawn: rank 0's value is the inherited, already-listening rendezvous socket."""

LOCAL_NPROC_MAX_PER_CORE = 4
"""A local spawn refuses more than this many ranks per core (at least 16 in all): each rank is a Python process
with torch loaded (hundreds of MB), and far more ranks than cores only measures the scheduler."""


def check_local_nproc(nproc: int, cores: int | None = None) -> None:
    """Refuse a local world too large for this machine, naming the bound."""
    cores = cores or os.cpu_count() or 1
    bound = max(16, LOCAL_NPROC_MAX_PER_CORE * cores)
    if nproc > bound:
        raise ValueError(
            f"--nproc {nproc} is more local ranks than this machine can run ({cores} cores: at most {bound}, "
            f"{LOCAL_NPROC_MAX_PER_CORE} per core); use torchrun/Slurm/MPI across nodes for larger worlds"
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loopback_listener() -> socket.socket:
    """A TCP socket listening on 127.0.0.1 on a free port, inheritable by a child process."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1024)
    s.set_inheritable(True)
    return s


def set_parent_death_signal() -> None:
    """Linux: die with the parent so a killed supervisor leaves no orphan ranks."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class RankFailure(RuntimeError):
    """A spawned rank died or hung; the message names it, ``ranks`` says in one line each what every rank did."""

    def __init__(self, message: str, ranks: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.ranks = list(ranks)


def _last_line(path: Path | None) -> str:
    """The last non-empty line of a rank's log (its exception, usually), shortened."""
    if path is None or not path.is_file():
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    text = lines[-1] if lines else ""
    return text if len(text) <= 160 else text[:157] + "..."


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def local_rank_env(rank: int, nproc: int, port: int, threads: int) -> dict[str, str]:
    """torchrun's variables for local rank ``rank`` of ``nproc`` on 127.0.0.1:``port``, ``threads`` cores each."""
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "OMP_NUM_THREADS": str(threads),
        # gloo listens on the interface of this name: loopback, like the store (a user's choice wins)
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
    }


def spawn_local(
    argv: Sequence[str],
    nproc: int,
    timeout_s: float | None = None,
    grace_s: float = 5.0,
    log_dir: Path | None = None,
) -> None:
    """Run ``python -m commbench ARGV`` as ``nproc`` local ranks on 127.0.0.1 and supervise them.

    Returns when every rank exited 0; raises :class:`RankFailure` naming the culprit otherwise. Two clocks, two
    jobs: the supervisor sees a rank die (exit or signal) within its 50 ms poll, whatever the collective timeout, and
    gives the others ``grace_s`` to end on their own before it stops them; a rank that hangs alive is named when a
    peer's collective gives up after ``timeout_s`` (the ranks' collective timeout, given here only to say so; None:
    torch's own, :data:`DEFAULT_COLLECTIVE_TIMEOUT_S`). Each rank gets
    an equal share of the cores (``OMP_NUM_THREADS``), as torchrun would set it, and is bound to that share
    (:func:`core_blocks`; not with ``COMMBENCH_PIN_RANKS=0``, nor when there are more ranks than cores).

    With ``log_dir``, the stderr of ranks 1.. goes to ``log_dir/rank<r>.log`` (appended: a resumed run keeps
    its history) and every rank writes its traceback there; rank 0 keeps the console for its progress and
    one-line errors. When a rank dies the failure then reads as one line per rank, not one traceback each.
    """
    check_local_nproc(nproc)
    logs: list[Any] = []
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    listener = loopback_listener()
    port = int(listener.getsockname()[1])
    cores = allowed_cores()
    blocks = core_blocks(cores, nproc) if os.environ.get(PIN_ENV) != "0" and hasattr(os, "sched_setaffinity") else None
    threads = len(blocks[0]) if blocks else max(1, len(cores) // nproc)
    procs: list[subprocess.Popen[bytes]] = []
    ours = {"COMMBENCH_LAUNCHER": "local", "COMMBENCH_PARENT_PID": str(os.getpid())}
    try:
        for rank in range(nproc):
            env = {**os.environ, **local_rank_env(rank, nproc, port, threads), **ours}
            # every rank builds the store the same way; only rank 0 receives the listening socket ("" elsewhere)
            env[STORE_FD_ENV] = str(listener.fileno()) if rank == 0 else ""
            fds: tuple[int, ...] = (listener.fileno(),) if rank == 0 else ()
            stderr = None
            if log_dir is not None:
                env[LOG_DIR_ENV] = str(log_dir)
                if rank > 0:
                    stderr = open(log_dir / f"rank{rank}.log", "ab")
                    logs.append(stderr)
            procs.append(
                subprocess.Popen([sys.executable, "-m", "commbench", *argv], env=env, pass_fds=fds, stderr=stderr)
            )
            if blocks:
                # bound before the rank has started a thread (Popen returns once the child has exec'd), so
                # every thread it starts (gloo's, torch's) inherits the block; where the system refuses, the rank
                # runs unbound and its node report says so
                bind(procs[-1].pid, blocks[rank])
        listener.close()  # rank 0 owns it now
        try:
            _supervise(procs, timeout_s, grace_s)
        except RankFailure as e:
            raise RankFailure(str(e), _rank_lines(procs, log_dir)) from None
    finally:
        listener.close()
        _terminate(procs)
        for f in logs:
            f.close()


def _rank_lines(procs: list[subprocess.Popen[bytes]], log_dir: Path | None) -> list[str]:
    """One line per rank: how it ended and the last line of its log."""
    out = []
    for r, p in enumerate(procs):
        code = p.poll()
        state = "still running (stopped)" if code is None else ("finished" if code == 0 else _describe_exit(code))
        log = log_dir / f"rank{r}.log" if log_dir is not None else None
        last = _last_line(log)
        where = f" [{log}]" if log is not None and log.is_file() else ""
        out.append(f"rank {r}: {state}" + (f": {last}" if last else "") + where)
    return out


def _supervise(procs: list[subprocess.Popen[bytes]], timeout_s: float | None, grace_s: float) -> None:
    timeout_s = DEFAULT_COLLECTIVE_TIMEOUT_S if timeout_s is None else timeout_s
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            break
        time.sleep(0.05)
    # A rank failed. Collect what the others do within the grace period: ranks waiting on a dead peer fail
    # fast (connection reset); ranks blocked on a hung peer fail at the collective timeout.
    first_seen = time.monotonic()
    deadline = first_seen + max(grace_s, 1.0)
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    codes = [p.poll() for p in procs]
    killed = [(r, c) for r, c in enumerate(codes) if c is not None and c < 0]
    alive = [r for r, c in enumerate(codes) if c is None]
    errored = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
    if killed:
        r, c = killed[0]
        raise RankFailure(f"rank {r} {_describe_exit(c)}; stopped the other ranks")
    if alive and errored:
        names = ", ".join(str(r) for r in alive)
        raise RankFailure(
            f"rank {names} stopped responding (hung): rank {errored[0][0]} gave up after the {timeout_s:g} s collective timeout; stopped all ranks"
        )
    r, c = failed[0]
    raise RankFailure(f"rank {r} {_describe_exit(c)}; stopped the other ranks")


def _terminate(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
