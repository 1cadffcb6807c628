"""What a run records for a GPU user, without a GPU: the transport NCCL chose (from canned NCCL_DEBUG=INFO logs of
the kinds NCCL 2.2x writes), the environment families, per-rank GPU facts merged into node reports, and the
``--nccl-debug`` environment."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from commbench.cluster import launch
from commbench.cluster.metadata import add_transports, kept_env, merge_nodes, nccl_transport

# One node, 8 H100s: NVLink P2P through cuMem, NVLS multicast, and IB for the network (NCCL 2.21-style lines).
NVLINK_NODE = """\
gpu1:812:812 [0] NCCL INFO Bootstrap : Using ib0:10.1.0.11<0>
gpu1:812:812 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)
gpu1:812:812 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.0.11<0>
gpu1:812:812 [0] NCCL INFO Using non-device net plugin version 0
gpu1:812:812 [0] NCCL INFO Using network IB
gpu1:812:812 [0] NCCL INFO NVLS multicast support is available on dev 0
gpu1:812:812 [0] NCCL INFO Channel 00/24 :    0   1   2   3   4   5   6   7
gpu1:812:812 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu1:812:812 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu1:812:812 [0] NCCL INFO NVLS comm 0x55d0c2a0 headRank 0 nHeads 8 buffSize 4194304 memSize 2097152
gpu1:812:812 [0] NCCL INFO Connected all rings
"""

# Two nodes over TCP, ranks on one node through shared memory (no P2P between these GPUs).
SOCKET_NODES = """\
n1:77:77 [0] NCCL INFO NET/IB : No device found.
n1:77:77 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>
n1:77:77 [0] NCCL INFO Using network Socket
n1:77:77 [0] NCCL INFO NVLS multicast support is not available on dev 0
n1:77:77 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0
n1:77:77 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct
n1:77:77 [0] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [receive] via NET/Socket/0
"""

# Inter-node over IB with GPUDirect RDMA, plus legacy IPC P2P inside the node.
GDR = """\
h:1:1 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/IPC
h:1:1 [1] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0/GDRDMA
h:1:1 [1] NCCL INFO Using network IB
"""


def test_transport_from_canned_nccl_logs() -> None:
    assert nccl_transport(NVLINK_NODE) == "NVLS, P2P/CUMEM, net IB"
    # the failed IB probe and the NVLS "not available" line are not transports
    assert nccl_transport(SOCKET_NODES) == "Socket, SHM"
    assert nccl_transport(GDR) == "P2P/IPC, IB/GDRDMA"
    assert nccl_transport("") is None
    assert nccl_transport("gloo has no such log\n") is None


def test_transports_join_their_nodes_reports() -> None:
    per_rank = [
        {"host": "a", "cores": "0", "gpu": {"uuid": "GPU-0"}, "cuda_visible_devices": "0", "cpu": "X"},
        {"host": "b", "cores": "0", "gpu": {"uuid": "GPU-9"}, "cuda_visible_devices": "0", "cpu": "Y"},
        {"host": "a", "cores": "1", "gpu": {"uuid": "GPU-1"}, "cuda_visible_devices": "0"},
    ]
    nodes = merge_nodes(per_rank)
    assert [n["host"] for n in nodes] == ["a", "b"]
    a = nodes[0]
    assert a["ranks"] == [0, 2] and a["rank_cores"] == ["0", "1"] and a["cpu"] == "X"
    assert [g["uuid"] for g in a["rank_gpus"]] == ["GPU-0", "GPU-1"] and a["rank_cuda_visible_devices"] == ["0", "0"]
    meta: dict[str, Any] = {"node_reports": nodes}
    add_transports(meta, [{"transport": "NVLS, P2P/CUMEM", "log": "l0"}, {"transport": None, "log": "l1"},
                          {"transport": "P2P/CUMEM", "log": "l2"}])  # fmt: skip
    assert meta["node_reports"][0]["rank_transports"] == ["NVLS, P2P/CUMEM", "P2P/CUMEM"]
    assert meta["node_reports"][1]["rank_transports"] == [None]
    assert meta["nccl_debug"]["logs"] == ["l0", "l1", "l2"]


def test_env_families_a_gpu_user_is_asked_for() -> None:
    env = {
        "NCCL_IB_HCA": "mlx5", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "GLOO_SOCKET_IFNAME": "lo",
        "CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "FI_PROVIDER": "efa",
        "UCX_TLS": "rc", "OMPI_MCA_btl": "^openib", "CUDA_HOME": "/usr/local/cuda", "HOME": "/root",
        "CUDA_VISIBLE_DEVICES_X": "no", "XNCCL_FOO": "no",
    }  # fmt: skip
    assert list(kept_env(env)) == [
        "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_VISIBLE_DEVICES", "FI_PROVIDER", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA",
        "OMPI_MCA_btl", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "UCX_TLS",
    ]  # fmt: skip


def test_nccl_debug_env_logs_init_and_net_to_the_run_directory(tmp_path: Path) -> None:
    from commbench.cli.orchestrate import nccl_debug_path

    path = nccl_debug_path(tmp_path / "run", 3)
    assert path.parent == tmp_path / "run" / "logs" and path.name.endswith(".rank3.log")
    assert launch.nccl_debug_env(path) == {
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": str(path),
    }  # fmt: skip
    from commbench.cli import build_parser

    assert build_parser().parse_args(["run", "--nccl-debug"]).nccl_debug is True


def test_rank_gpu_facts_from_torch_and_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    props = types.SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", uuid="8f2f5b8e-0000-1111-2222-333344445555", pci_bus_id=0x1B,
        pci_device_id=0, pci_domain_id=0,
    )  # fmt: skip
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: torch's properties, MIG unknown
    facts = launch.gpu_facts(torch.device("cuda", 0), "nccl")
    assert facts == {
        "name": "NVIDIA H100 80GB HBM3", "uuid": props.uuid, "pci_bus_id": "00000000:1B:00.0", "mig_mode": None,
        "nccl_version": "2.21.5",
    }  # fmt: skip
    nv = types.ModuleType("pynvml")
    looked_up: list[str] = []

    def by_uuid(u: str) -> str:
        looked_up.append(u)
        return "h"

    nv.nvmlInit = nv.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nv.nvmlDeviceGetHandleByUUID = by_uuid  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMigMode = lambda h: (1, 1)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"  # type: ignore[attr-defined]
    nv.nvmlDeviceGetUUID = lambda h: "GPU-" + props.uuid  # type: ignore[attr-defined]
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=b"00000000:1B:00.0")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    facts = launch.gpu_facts(torch.device("cuda", 0), "gloo")
    assert looked_up == ["GPU-" + props.uuid]  # CUDA's UUID, as NVML spells it
    assert facts is not None and facts["mig_mode"] == "enabled" and facts["uuid"] == "GPU-" + props.uuid
    assert facts["nccl_version"] is None  # gloo: no NCCL was loaded for this rank
    assert launch.gpu_facts(torch.device("cpu"), "gloo") is None
