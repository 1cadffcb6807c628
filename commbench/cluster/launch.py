"""World discovery and joining: a torchrun / Slurm / MPI world or a local spawn's, the backend and devices agreed
through the rendezvous store before any process group exists, the initialised world (`Dist`) and its teardown.

A local run re-executes ``python -m commbench`` once per rank with torchrun's environment variables
(:mod:`commbench.cluster.spawn`, which also supervises the ranks), so a spawned rank runs exactly the code path of a
rank started by torchrun. Which device a rank runs on and the device calls the layers above ask are in
:mod:`commbench.cluster.devices`. Their names are re-exported here: callers ask ``launch``.
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import logging
import os
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from commbench.cluster.devices import (
    LocalView,
    device_free_bytes,
    device_ids,
    gpu_facts,
    gpu_identity,
    gpu_uuids,
    on_cuda,
    plan_devices,
    release_memory,
    synchronize,
)
from commbench.cluster.dist_ops import all_gather_tensor
from commbench.cluster.failures import store_barrier
from commbench.cluster.spawn import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    LOCAL_NPROC_MAX_PER_CORE,
    LOG_DIR_ENV,
    PIN_ENV,
    STORE_FD_ENV,
    RankFailure,
    allowed_cores,
    bind,
    check_local_nproc,
    core_blocks,
    describe_cores,
    free_port,
    local_rank_env,
    loopback_listener,
    rank_cores,
    set_parent_death_signal,
    spawn_local,
)

__all__ = [  # what callers ask `launch` for, wherever it lives
    "LocalView",
    "device_free_bytes",
    "device_ids",
    "gpu_facts",
    "gpu_identity",
    "gpu_uuids",
    "on_cuda",
    "plan_devices",
    "release_memory",
    "synchronize",
    "DEFAULT_COLLECTIVE_TIMEOUT_S",
    "LOCAL_NPROC_MAX_PER_CORE",
    "LOG_DIR_ENV",
    "PIN_ENV",
    "STORE_FD_ENV",
    "RankFailure",
    "allowed_cores",
    "bind",
    "check_local_nproc",
    "core_blocks",
    "describe_cores",
    "free_port",
    "local_rank_env",
    "loopback_listener",
    "rank_cores",
    "set_parent_death_signal",
    "spawn_local",
]


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
    store_barrier(store, f"{key}/published", info.world_size)
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
    store_barrier(store, f"{key}/voted", info.world_size)
    if int(store.add(f"{key}/refused", 0)):
        raise ValueError(store.get(f"{key}/why").decode())
    if int(store.add(f"{key}/gloo", 0)):
        return None
    assert plan is not None  # not refused, so this node planned
    return plan[info.rank]


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
