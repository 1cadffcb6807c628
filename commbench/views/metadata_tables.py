"""The report's tables of how a run was set up: its metadata, its nodes, their GPU topology, and the suite as TOML.

They read metadata.json only (`node_reports`, the resolved `suite`), never the results.
"""

from __future__ import annotations

import json
from typing import Any

from commbench.core.units import int_ranges
from commbench.views.tables import Table, fmt

__all__ = ["metadata_table", "nodes_table", "suite_text", "topology_tables"]


def metadata_table(meta: dict[str, Any]) -> Table:
    """metadata.json's fields a reader needs, in reading order (nested values as key=value pairs)."""
    keys = [
        ("date (start)", "start_time"),
        ("end", "end_time"),
        ("host", "host"),
        ("hosts", "hosts"),
        ("device", "device_name"),
        ("backend", "backend"),
        ("world size", "world_size"),
        ("nodes", "nodes"),
        ("processes per node", "nproc_per_node"),
        ("threads per rank", "threads_per_rank"),
        ("launcher", "launcher"),
        ("commbench", "commbench_version"),
        ("git commit", "git_commit"),
        ("torch", "torch_version"),
        ("NCCL", "nccl_version"),
        ("python", "python_version"),
        ("platform", "platform"),
        ("timing", "timing"),
        ("command", "argv"),
    ]
    rows = []
    for label, k in keys:
        if k not in meta:
            continue
        v = meta[k]
        if isinstance(v, list) and k == "argv":
            v = " ".join(map(str, v))
        elif isinstance(v, dict):  # key=value pairs read better than a JSON object in a cell
            v = ", ".join(f"{kk}={_toml_value(vv)}" for kk, vv in sorted(v.items()) if vv is not None)
        elif isinstance(v, list):
            v = ", ".join(map(str, v))
        rows.append([label, fmt(v) if v is not None else "n/a"])
    return Table("metadata", "Run metadata", ["field", "value"], rows)


def _ranks(ranks: list[int]) -> str:
    """0,1,2,3,6 -> "0-3, 6"."""
    return int_ranges(ranks, ", ")


def _nic(n: dict[str, Any]) -> str:
    speed = n.get("speed_mbps")
    return f"{n.get('name')} ({speed / 1000:g} Gbit/s)" if speed else str(n.get("name"))


def _bound(node: dict[str, Any]) -> str:
    """`` (cores 0 | 1)``: the cores each rank of a node was bound to, in rank order; empty when none was bound
    (every rank may run on every core) or the run did not record it."""
    cores = node.get("rank_cores") or []
    if not cores or any(c is None for c in cores) or len(set(cores)) == 1:
        return ""
    return f" (cores {' | '.join(cores)})"


def nodes_table(meta: dict[str, Any]) -> Table | None:
    """One row per node: what each node reported about itself (metadata ``node_reports``)."""
    nodes = meta.get("node_reports") or []
    if not nodes:
        return None
    rows = []
    for n in nodes:
        env = n.get("env") or {}
        rows.append(
            [
                str(n.get("host")),
                _ranks(list(n.get("ranks") or [])) + _bound(n),
                fmt(n.get("cpu")) + (f" ({n['cpu_count']} cores)" if n.get("cpu_count") else ""),
                "; ".join(n.get("gpus") or []) or "none",
                _rank_devices(n),
                ", ".join(_nic(x) for x in n.get("nics") or []),
                " ".join(f"{k}={v}" for k, v in sorted(env.items())),
            ]
        )
    return Table(
        "nodes",
        "Nodes",
        ["host", "ranks", "CPU", "GPUs", "each rank's GPU (PCI bus) and NCCL transport (--nccl-debug)",
         "NICs (speed where /sys/class/net says)", "communication environment (NCCL, TORCH_NCCL, GLOO, FI, UCX, OMPI_MCA, CUDA)"],
        rows,
    )  # fmt: skip


def _rank_devices(node: dict[str, Any]) -> str:
    """``0: 0000:1B:00.0 NVLS, P2P/CUMEM | 1: ...``: each rank's GPU by PCI bus id and the transport NCCL chose,
    where the run recorded them (``rank_gpus``, ``rank_transports``); ``-`` when it recorded neither."""
    ranks = list(node.get("ranks") or [])
    gpus = list(node.get("rank_gpus") or [None] * len(ranks))
    transports = list(node.get("rank_transports") or [None] * len(ranks))
    parts = []
    for r, g, t in zip(ranks, gpus, transports, strict=False):
        bits = [str(g.get("pci_bus_id") or g.get("uuid") or "") if isinstance(g, dict) else "", t or ""]
        if any(bits):
            parts.append(f"{r}: " + " ".join(b for b in bits if b))
    return " | ".join(parts) or "-"


def topology_tables(meta: dict[str, Any]) -> list[Table]:
    """``nvidia-smi topo -m`` of every node that has it, as a matrix (its legend dropped)."""
    out: list[Table] = []
    for n in meta.get("node_reports") or []:
        text = n.get("nvidia_topo")
        if not text:
            continue
        lines = [ln for ln in text.splitlines() if ln.strip()]
        end = next((i for i, ln in enumerate(lines) if ln.strip().startswith("Legend")), len(lines))
        cells = [[c.strip() for c in ln.split("\t")] for ln in lines[:end]]
        width = max(len(r) for r in cells)
        if len(cells) > 1 and all(len(r) == width for r in cells):
            table = Table(
                f"topo-{len(out)}", f"GPU topology of {n.get('host')} (nvidia-smi topo -m)", cells[0], cells[1:]
            )
        else:  # not the tab-separated matrix this parser knows: keep the lines
            table = Table(f"topo-{len(out)}", f"GPU topology of {n.get('host')} (nvidia-smi topo -m)", ["line"],
                          [[ln] for ln in lines[:end]])  # fmt: skip
        out.append(table)
    return out


def _toml_value(v: Any) -> str:
    # JSON's strings, numbers, booleans and arrays of them are valid TOML values
    return json.dumps(v, ensure_ascii=False)


def suite_text(suite: dict[str, Any]) -> str:
    """The resolved suite as TOML (what `commbench run FILE.toml` reads back): scalars first, then one table
    per nested section; unset (None) values are left out."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for k, v in suite.items():
        if isinstance(v, dict):
            tables.append((k, v))
        elif v is not None:
            lines.append(f"{k} = {_toml_value(v)}")
    for name, t in tables:
        lines += ["", f"[{name}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in t.items() if v is not None and not isinstance(v, dict)]
    return "\n".join(lines)
