"""Run metadata (``metadata.json``): one builder for a measured run and for an imported one.

Every run directory states what produced its numbers (DESIGN: hardware, versions, world layout, suite and
date). :func:`build_metadata` owns the keys every run directory has; :func:`run_metadata` fills them from a
live world, ``commbench.nccl_import`` from an nccl-tests log. The schema version is ``results.SCHEMA_VERSION``.

Every node reports itself (``node_facts``: host name, NICs and their speeds, the NCCL_* / GLOO_* environment,
CPU and GPU models, ``nvidia-smi topo -m`` where nvidia-smi exists); :func:`gather_nodes` collects them from
all ranks (one report per node, with the node's ranks) into the ``node_reports`` key.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from commbench.config import SuiteConfig


def git_commit() -> str | None:
    """The commit commbench runs from, or None outside a git checkout."""
    try:
        here = Path(__file__).resolve().parent.parent
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
    from commbench import __version__
    from commbench.results import SCHEMA_VERSION

    meta: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "commbench_version": __version__,
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


def fp8_codec(device: Any) -> str:
    """The fp8 codec this process runs on ``device`` (``commbench.fp8.codec_info``)."""
    from commbench.fp8 import codec_info

    return codec_info(device)


def agree_fp8_codec(d: Any) -> str:
    """Every rank's fp8 codec (a collective call: every rank calls it); raises ValueError, one line naming the
    ranks, when they differ: the ranks would encode and decode at different speeds, so the timings would mix
    two codecs without saying so."""
    import torch.distributed as dist

    mine = fp8_codec(d.device)
    every: list[Any] = [None] * d.world_size
    dist.all_gather_object(every, mine)
    if len(set(every)) > 1:
        groups: dict[str, list[int]] = {}
        for r, c in enumerate(every):
            groups.setdefault(str(c), []).append(r)
        said = "; ".join(f"rank(s) {','.join(map(str, rs))}: {c}" for c, rs in groups.items())
        raise ValueError(
            f"ranks disagree on the fp8 codec ({said}); install the same C compiler on every node or set "
            "COMMBENCH_FP8_KERNEL=0 everywhere"
        )
    return mine


def run_metadata(
    suite: SuiteConfig, d: Any, argv: list[str], start: str, nodes: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Metadata of a run measured now on the world ``d`` (a ``launch.Dist``), from rank 0; ``nodes``: what
    :func:`gather_nodes` returned."""
    import torch

    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:
            nccl = None
    spec = suite.to_dict()
    return build_metadata(
        start_time=start,
        end_time=None,
        host=d.host,
        hosts=sorted(set(d.hosts)),
        device_name=d.device_name(),
        backend=d.backend,
        world_size=d.world_size,
        nodes=d.nodes,
        nproc_per_node=d.info.local_world_size,
        threads_per_rank=d.threads,
        launcher=d.info.launcher,
        torch_version=torch.__version__,
        nccl_version=nccl,
        suite=spec,
        timing=spec["timing"],
        argv=argv,
        git_commit=git_commit(),
        extra={
            "fp8_codec": fp8_codec(d.device),
            "device": str(d.device.type),
            "gloo_available": torch.distributed.is_gloo_available(),
            "cpu_count": os.cpu_count(),
            "node_reports": nodes or [],
        },
    )


_ENV_KEYS = re.compile(r"^(NCCL|GLOO)_")
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
    from commbench.launch import cpu_model_name

    env = os.environ if env is None else env
    gpus: list[str] = []
    try:
        import torch

        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # a broken driver must not stop the run; the report says "none"
        gpus = []
    return {
        "host": socket.gethostname(),
        "nics": nics(),
        "env": {k: v for k, v in sorted(env.items()) if _ENV_KEYS.match(k)},
        "cpu": cpu_model_name(),
        "cpu_count": os.cpu_count(),
        "gpus": gpus,
        "nvidia_topo": nvidia_topology(),
    }


def int_ranges(xs: Iterable[int], sep: str = ",") -> str:
    """Runs of consecutive integers: ``0-3,8`` for {0, 1, 2, 3, 8} (the cpulist form of taskset and /sys)."""
    runs: list[list[int]] = []
    for x in sorted(xs):
        if runs and runs[-1][1] == x - 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return sep.join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def merge_nodes(per_rank: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One report per host from every rank's (in rank order): the host's ranks and, in the same order, the cores
    each was bound to (``rank_cores``: a cpulist, None where unknown), then the facts of its first rank that
    carries them (``node_facts`` keys); hosts in order of their lowest rank."""
    out: dict[str, dict[str, Any]] = {}
    for rank, item in enumerate(per_rank):
        host = str(item.get("host"))
        node = out.setdefault(host, {"host": host, "ranks": [], "rank_cores": []})
        node["ranks"].append(rank)
        node["rank_cores"].append(item.get("cores"))
        for k, v in item.items():
            if k != "cores":
                node.setdefault(k, v)
    return list(out.values())


def gather_nodes(d: Any) -> list[dict[str, Any]]:
    """Every node's report (on every rank): a collective, call it on every rank of the world ``d``."""
    from commbench.launch import node_leader, rank_cores

    mine = node_facts() if node_leader(d) else {"host": d.host}
    mine["cores"] = rank_cores()
    return merge_nodes(d.gather_object(mine))
