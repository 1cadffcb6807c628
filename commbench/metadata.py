"""Run metadata (``metadata.json``): one builder for a measured run and for an imported one.

Every run directory states what produced its numbers (DESIGN: hardware, versions, world layout, suite and
date). :func:`build_metadata` owns the keys every run directory has; :func:`run_metadata` fills them from a
live world, ``commbench.nccl_import`` from an nccl-tests log. The schema version is ``results.SCHEMA_VERSION``.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Mapping
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


def run_metadata(suite: SuiteConfig, d: Any, argv: list[str], start: str) -> dict[str, Any]:
    """Metadata of a run measured now on the world ``d`` (a ``launch.Dist``), from rank 0."""
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
        },
    )
