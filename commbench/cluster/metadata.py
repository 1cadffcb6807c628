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

import json
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


def shaped_rates(run: Any = subprocess.run) -> dict[str, float]:
    """Interface -> the rate, Mbit/s, a root ``tbf`` qdisc shapes its egress to (``tc -j qdisc show``; an emulated
    link's rate, :mod:`commbench.cluster.emulate`); empty where tc is missing or shapes nothing."""
    exe = shutil.which("tc")
    if exe is None:
        return {}
    try:
        p = run([exe, "-j", "qdisc", "show"], capture_output=True, text=True, timeout=10)
        items = json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else []
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    out: dict[str, float] = {}
    for q in items if isinstance(items, list) else []:
        rate = (q.get("options") or {}).get("rate") if isinstance(q, dict) else None
        if q.get("kind") == "tbf" and q.get("root") and isinstance(rate, (int, float)) and rate > 0:
            out[str(q.get("dev"))] = float(rate) * 8 / 1e6  # tc's JSON gives bytes per second
    return out


def nics(sys_net: Path = SYS_NET, shaped: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """This host's network interfaces: name, link speed in Mbit/s from ``/sys/class/net/*/speed`` (None where
    the file is unreadable or says -1: interfaces that are down, some virtual ones), ``virtual`` (no device behind
    it: loopback, veth, bridges), ``up`` (operstate), and ``shaped_mbps``, the ``tbf`` rate its egress is shaped
    to (``shaped``, default :func:`shaped_rates`)."""
    out: list[dict[str, Any]] = []
    try:
        names = sorted(p.name for p in sys_net.iterdir())
    except OSError:
        return out
    shaped = shaped_rates() if shaped is None else shaped
    for name in names:
        speed: int | None = None
        try:
            v = int((sys_net / name / "speed").read_text().strip())
            speed = v if v > 0 else None
        except (OSError, ValueError):  # EINVAL on virtual or down links
            pass
        try:
            up = (sys_net / name / "operstate").read_text().strip() in ("up", "unknown")
        except OSError:
            up = True
        virtual = name == "lo" or "/devices/virtual/" in str((sys_net / name).resolve()) or not (sys_net / name / "device").exists()
        out.append({"name": name, "speed_mbps": speed, "virtual": virtual, "up": up, "shaped_mbps": shaped.get(name)})
    return out


IFNAME_ENV = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}
"""The variable naming the interfaces a backend sends through (NCCL's syntax: ``eth``, a prefix; ``=eth0``,
exactly; ``^docker``, all but those)."""
SPREADS = {"gloo": False, "nccl": True}
"""Whether a backend drives all of a node's fastest NICs at once (NCCL: one ring per NIC) or one (gloo)."""


def _named(name: str, spec: str) -> bool:
    items = [s.strip() for s in spec.lstrip("^").split(",") if s.strip()]
    hit = any(name == s[1:] if s.startswith("=") else name.startswith(s) for s in items)
    return not hit if spec.startswith("^") else hit


def mbps_text(mbps: float) -> str:
    """A line rate as people write it: ``400 Gb/s``, ``200 Mb/s``."""
    return f"{mbps / 1000:g} Gb/s" if mbps >= 1000 else f"{mbps:g} Mb/s"


def node_link(node_nics: Sequence[Mapping[str, Any]], env: Mapping[str, str], backend: str) -> dict[str, Any]:
    """The network link a node's inter-node traffic leaves by: ``gbps`` (GB/s, 1e9 bytes: the sum of the line
    rates of the NICs used), ``label`` (``8 × 400 Gb/s (ib0-ib7)``, ``1 × 200 Mb/s tbf (eth0)``) and ``nics``.

    The NICs: those named by the backend's :data:`IFNAME_ENV` variable, else the node's physical (or shaped) NICs
    that are up; of those the fastest ones, all of them where the backend spreads over NICs (:data:`SPREADS`), one
    otherwise. A NIC's rate is its line rate, or the ``tbf`` rate where that is lower. ``gbps`` None when no NIC
    has a known rate."""
    spec = env.get(IFNAME_ENV.get(backend, ""), "")
    rated = []
    for n in node_nics:
        name, speed, shaped = str(n.get("name")), n.get("speed_mbps"), n.get("shaped_mbps")
        rates = [float(r) for r in (speed, shaped) if isinstance(r, (int, float)) and r > 0]
        if not rates or name == "lo" or not n.get("up", True):
            continue
        if spec and not _named(name, spec):
            continue
        if not spec and n.get("virtual") and not shaped:
            continue  # bridges, veths, docker0: not where a node's traffic leaves
        rated.append((name, min(rates), isinstance(shaped, (int, float)) and 0 < shaped <= min(rates)))
    if not rated:
        named = [str(n.get("name")) for n in node_nics if spec and _named(str(n.get("name")), spec)]
        why = f"no NIC named by {IFNAME_ENV[backend]}={spec} has a known rate" if spec else "no NIC with a known rate"
        if named == ["lo"]:
            why = f"loopback only ({IFNAME_ENV[backend]}={spec}): no link between nodes"
        return {"gbps": None, "label": why, "nics": []}
    top = max(r for _, r, _ in rated)
    used = [x for x in rated if x[1] == top]
    used = used if SPREADS.get(backend, False) else used[:1]
    names = ", ".join(n for n, _, _ in used)
    tbf = " tbf" if any(s for _, _, s in used) else ""
    return {"gbps": len(used) * top * 1e6 / 8 / 1e9, "label": f"{len(used)} × {mbps_text(top)}{tbf} ({names})",
            "nics": [n for n, _, _ in used]}  # fmt: skip


NVLINK_GBPS = {"pascal": 20.0, "volta": 25.0, "ampere": 25.0, "hopper": 25.0, "blackwell": 50.0}
"""GB/s per NVLink link and direction by GPU architecture (NVIDIA's data sheets: P100 160 GB/s over 4 links,
V100 300 GB/s over 6, A100 600 GB/s over 12, H100 900 GB/s over 18, B200 1.8 TB/s over 18, all counted in
both directions)."""
NVML_ARCH = {"pascal": 4, "volta": 5, "ampere": 7, "hopper": 9, "blackwell": 10}
"""``nvmlDeviceArchitecture_t`` codes (nvml.h), for a pynvml too old to name the newer ones."""
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
"""GB/s per lane and direction by PCIe generation (2.5/5 GT/s with 8b/10b; 8/16/32 GT/s with 128b/130b; 64 GT/s
PAM4 with FLIT: 242/256 of 8 GB/s)."""


def gpu_link_gbps(arch: str | None, nvlinks: int, pcie_gen: int | None, pcie_width: int | None) -> tuple[float | None, str]:
    """The link a GPU's intra-node traffic crosses, GB/s per direction, and its label: its active NVLinks
    (``18 × NVLink hopper``) where it has any, else its PCIe link (``PCIe gen4 x16``); None where unknown."""
    if nvlinks > 0 and arch in NVLINK_GBPS:
        return nvlinks * NVLINK_GBPS[arch], f"{nvlinks} × NVLink ({arch}, {NVLINK_GBPS[arch]:g} GB/s each)"
    if pcie_gen in PCIE_GBPS_PER_LANE and pcie_width:
        return PCIE_GBPS_PER_LANE[pcie_gen] * pcie_width, f"PCIe gen{pcie_gen} x{pcie_width}"
    return None, "GPU link unknown (no NVML)"


def gpu_link(uuid: str | None, pci_bus_id: str | None = None) -> tuple[float | None, str]:
    """:func:`gpu_link_gbps` of the GPU with ``uuid`` (or ``pci_bus_id``; a MIG device's parent GPU) as NVML reports
    it (architecture, NVLinks whose state is active, PCIe generation the GPU supports and the width it trained at);
    (None, why) where NVML cannot say. By identity, never by CUDA ordinal: under per-task binding every rank's
    ``cuda:0`` is another GPU (:func:`commbench.cluster.nvml.handle_of`)."""
    from commbench.cluster import nvml

    def link(nv: Any) -> tuple[float | None, str]:
        try:
            return _link_of(nv, nvml.handle_of(nv, uuid, pci_bus_id, parent=True))
        except Exception as e:
            return None, f"GPU link unknown ({type(e).__name__})"

    found = nvml.ask(link)
    return found if found is not None else (None, "GPU link unknown (no NVML)")


def _link_of(nv: Any, h: Any) -> tuple[float | None, str]:
    """The link of the GPU of NVML handle ``h``."""
    arch_code = nv.nvmlDeviceGetArchitecture(h)
    arch = next((k for k, code in NVML_ARCH.items() if getattr(nv, f"NVML_DEVICE_ARCH_{k.upper()}", code) == arch_code), None)
    links = 0
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            links += int(nv.nvmlDeviceGetNvLinkState(h, link) == getattr(nv, "NVML_FEATURE_ENABLED", 1))
        except Exception:  # not supported, or past the GPU's last link
            break
    gen = width = None
    try:
        gen = int(nv.nvmlDeviceGetMaxPcieLinkGeneration(h))
        width = int(nv.nvmlDeviceGetCurrPcieLinkWidth(h))
    except Exception:
        pass
    return gpu_link_gbps(arch, links, gen, width)


ONE_RANK = "none: a group of one rank sends nothing over a link"
NO_LINK = "none: the group's ranks share one host without a GPU link (shared memory / loopback)"
"""``link`` of a point whose traffic crosses no link that has a rate (gloo ranks on one host)."""


def rank_link_facts(backend: str, gpu_index: int | None) -> dict[str, Any]:
    """What one rank reports for ``link_util``: its node's inter-node link (:func:`node_link`) and, on a GPU, the
    GPU's own intra-node link (:func:`gpu_link`), looked up by the UUID and PCI bus id of this rank's ``cuda:gpu_index``
    (:func:`commbench.cluster.launch.gpu_identity`); cheap (``/sys``, one ``tc`` call, NVML), so every rank asks."""
    from commbench.cluster.launch import gpu_identity

    intra = gpu_link(*gpu_identity(gpu_index)) if gpu_index is not None else (None, NO_LINK)
    return {"inter": node_link(nics(), os.environ, backend), "intra": list(intra)}


def group_link(facts: Sequence[Mapping[str, Any]], hosts: Sequence[str], parts: Sequence[Sequence[int]],
               members: Sequence[int]) -> dict[str, Any]:  # fmt: skip
    """The link a group's busbw is measured against: ``gbps`` (GB/s, None where there is none or it is
    unknown), ``label`` and ``host`` (the node whose link limits it, "" within a node).

    ``facts``: every rank's :func:`rank_link_facts`; ``hosts``: every rank's host; ``parts``: every group of the
    kind (they run at once); ``members``: this group's ranks. A group over several nodes is limited by the
    slowest node's link divided among the kind's groups that cross that node's link at once (one for the world,
    one per local rank for ``inter``): its ring leaves every node once per group, as NCCL's rings leave by one
    NIC each, so the world's busbw can reach the node's summed NIC rate (nccl #812: 192 GB/s on 8 × 200 Gb/s).
    A group within one node is limited by its slowest GPU's NVLink or PCIe link; on CPU it has none. A group of one
    rank has none either: nothing leaves the GPU, and busbw is 0 by nccl-tests' factors (a 1-GPU run read as
    "reaches 0.00 of PCIe gen5 x16")."""
    if len(members) < 2:
        return {"gbps": None, "label": ONE_RANK, "host": ""}
    on = sorted({hosts[r] for r in members})
    if len(on) > 1:
        avail: list[tuple[float, str, str]] = []
        for h in on:
            first = next(r for r, x in enumerate(hosts) if x == h)
            link = facts[first].get("inter") or {}
            share = sum(1 for p in parts if len({hosts[r] for r in p}) > 1 and any(hosts[r] == h for r in p))
            if link.get("gbps") is None:
                return {"gbps": None, "label": f"inter-node, {h}: {link.get('label', 'unknown')}", "host": h}
            shared = f" shared by {share} groups" if share > 1 else ""
            avail.append((float(link["gbps"]) / max(share, 1), f"{link['label']}{shared}", h))
        rate, label, host = min(avail)
        slow = f"; slowest of {len(on)} nodes (fastest {max(avail)[0]:.4g} GB/s)" if max(avail)[0] > rate else ""
        return {"gbps": rate, "label": f"inter-node: {label} on {host}{slow}", "host": host}
    gpus = [tuple(facts[r].get("intra") or (None, NO_LINK)) for r in members]
    known = [(float(g), str(t)) for g, t in gpus if g is not None]
    if not known:
        return {"gbps": None, "label": str(gpus[0][1]) if gpus else NO_LINK, "host": ""}
    rate, label = min(known)
    return {"gbps": rate, "label": f"intra-node: {label}", "host": ""}


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
    if "nics" in mine:  # the NICs this backend's inter-node traffic leaves by (link_util's denominator)
        mine["link"] = node_link(mine["nics"], os.environ, d.backend)
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
