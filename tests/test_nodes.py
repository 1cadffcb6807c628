"""Clusters of nodes: HSDP and the intra/inter-node split of training bytes, every node's report, the loss of a
node mid-run, and the README's launchers (torchrun, srun, mpirun) on emulated hosts.

References are written out here: nccl-tests bus factors (all_reduce 2(n-1)/n, all_gather / reduce_scatter
(n-1)/n) and, for the measured runs, Psi itself: with every parameter's dim 0 even, HSDP on 2 nodes x 2 ranks
all-reduces each rank's half of the gradients across the 2 nodes once per step, 2(2-1)/2 * Psi/2 elements,
and DDP all-reduces all of them over the 4 ranks, 2(4-1)/4 * Psi elements.
The emulated tests need root, `ip` and `tc` (skipped with the reason otherwise) and share one cluster.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import commbench
from commbench.cluster.emulate import EmulatedCluster, missing_requirements
from commbench.cluster.emulate_jobs import mpi_env, slurm_env, start_job, start_ranks
from commbench.cluster.launch import detect_world, lost_peer
from commbench.cluster.metadata import merge_nodes, nics
from commbench.training.policies import get_policy
from commbench.training.runner import Nodes
from commbench.training.strategies import DDP, FSDP2, HSDP, INTER, INTRA
from commbench.views.metadata_tables import nodes_table, topology_tables
from commbench.views.report import build_tables
from commbench.views.rundata import load_run
from tests.cli_util import FAST
from tests.distutil import run_in_world

WHY = missing_requirements()
needs_root = pytest.mark.skipif(WHY is not None, reason=f"emulated hosts unavailable: {WHY}")
BF16 = "bfloat16"

# --- formulas -------------------------------------------------------------------------------------------------


def test_hsdp_bytes_split_between_the_node_and_the_network() -> None:
    psi, n, nodes = 1000, 4, 2
    g, r = n // nodes, nodes  # shard within a node of g ranks, replicate over r nodes
    shard = math.ceil(psi / g)
    split = HSDP().comm_by_link(psi=psi, world_size=n, nodes=nodes)
    assert split[INTRA] == {
        # forward and backward gathers of the shards, one reduce-scatter of the gradients, inside the node
        "all_gather:float": pytest.approx(2 * (g - 1) / g * g * shard * 4),
        "reduce_scatter:float": pytest.approx((g - 1) / g * g * shard * 4),
    }
    assert split[INTER] == {"all_reduce:float": pytest.approx(2 * (r - 1) / r * shard * 4)}
    bf16 = HSDP(param_dtype_name=BF16, reduce_dtype_name=BF16).comm_by_link(psi=psi, world_size=n, nodes=nodes)
    assert bf16[INTER] == {"all_reduce:bfloat16": pytest.approx(2 * (r - 1) / r * shard * 2)}
    # the capacity planner's question: 70B, 64 nodes x 8 GPUs, bf16 gradients across the network per GPU
    big = get_policy("hsdp_bf16").comm_by_link(psi=70e9, world_size=512, nodes=64)
    assert sum(big[INTER].values()) == pytest.approx(2 * 63 / 64 * 70e9 / 8 * 2, rel=1e-9)
    assert HSDP().state_bytes(psi=psi, world_size=n, nodes=nodes) == pytest.approx(16 * psi / g)


def test_hsdp_on_one_node_is_fsdp2_and_ddp_crosses_nodes_whole() -> None:
    psi = 12_345
    one = HSDP().comm_by_link(psi=psi, world_size=2, nodes=1)
    assert one[INTER] == {} and one[INTRA] == pytest.approx(FSDP2().comm_bytes(psi=psi, world_size=2))
    assert HSDP().state_bytes(psi=psi, world_size=2) == FSDP2().state_bytes(psi=psi, world_size=2)
    # DDP's all-reduce spans the world: on 2 nodes all of it crosses the network, on one none of it
    ring = 2 * 3 / 4 * psi * 4
    assert DDP().comm_by_link(psi=psi, world_size=4, nodes=2) == {INTRA: {}, INTER: {"all_reduce:float": ring}}
    assert DDP().comm_by_link(psi=psi, world_size=4, nodes=1) == {INTRA: {"all_reduce:float": ring}, INTER: {}}
    with pytest.raises(ValueError, match="same number of ranks on every node"):
        HSDP().comm_bytes(psi=psi, world_size=5, nodes=2)


def test_node_layout_from_host_names() -> None:
    assert Nodes.from_hosts(["a", "a", "b", "b"]).node_major and Nodes.from_hosts(["a", "a", "b", "b"]).count == 2
    assert not Nodes.from_hosts(["a", "b", "a", "b"]).node_major  # round-robin ranks: no node mesh rows
    assert not Nodes.from_hosts(["a", "a", "a", "b"]).node_major


# --- node reports, the report's table, naming a lost node -----------------------------------------------------


def test_nics_read_speeds_where_readable(tmp_path: Path) -> None:
    # a fake /sys/class/net: eth0 has a device behind it (a physical NIC), lo and veth1 do not; veth1 is down
    for name, speed, state in (("eth0", "100000", "up"), ("lo", None, "unknown"), ("veth1", "-1", "down")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "operstate").write_text(state + "\n")
        if speed is not None:
            (tmp_path / name / "speed").write_text(speed + "\n")
    (tmp_path / "eth0" / "device").mkdir()
    assert nics(tmp_path, shaped={"veth1": 200.0}) == [
        {"name": "eth0", "speed_mbps": 100000, "virtual": False, "up": True, "shaped_mbps": None},
        {"name": "lo", "speed_mbps": None, "virtual": True, "up": True, "shaped_mbps": None},
        {"name": "veth1", "speed_mbps": None, "virtual": True, "up": False, "shaped_mbps": 200.0},
    ]
    assert nics(tmp_path / "missing") == []


def test_node_reports_merge_and_show_in_the_report() -> None:
    topo = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-55\nGPU1\tNV18\t X \t0-55\n\nLegend:\n  X    = Self\n"
    per_rank = [
        {"host": "a", "cpu": "Xeon", "cpu_count": 8, "gpus": ["H100", "H100"], "env": {"NCCL_IB_HCA": "mlx5"},
         "nics": [{"name": "ib0", "speed_mbps": 400000}], "nvidia_topo": topo},
        {"host": "a"},
        {"host": "b", "cpu": "Xeon", "gpus": [], "env": {}, "nics": [], "nvidia_topo": None, "cores": "0-3"},
        {"host": "b", "cores": "4-7"},
        {"host": "a"},
    ]  # fmt: skip
    merged = merge_nodes(per_rank)
    assert [(m["host"], m["ranks"]) for m in merged] == [("a", [0, 1, 4]), ("b", [2, 3])]
    # each rank's cores, in the node's rank order; a node whose ranks did not say keeps None for them
    assert [m["rank_cores"] for m in merged] == [[None, None, None], ["0-3", "4-7"]]
    assert "cores" not in merged[1]
    table = nodes_table({"node_reports": merged})
    assert table is not None
    rows = {r[0]: dict(zip(table.columns, r, strict=True)) for r in table.rows}
    assert rows["a"]["ranks"] == "0-1, 4" and rows["b"]["GPUs"] == "none"
    assert rows["b"]["ranks"] == "2-3 (cores 0-3 | 4-7)"
    assert "ib0 (400 Gbit/s)" in rows["a"]["NICs (speed where /sys/class/net says)"]
    env = "communication environment (NCCL, TORCH_NCCL, GLOO, FI, UCX, OMPI_MCA, CUDA)"
    assert rows["a"][env] == "NCCL_IB_HCA=mlx5"
    per_rank_col = "each rank's GPU (PCI bus) and NCCL transport (--nccl-debug)"
    assert rows["a"][per_rank_col] == "-"  # a run that recorded neither
    merged[0]["rank_gpus"] = [{"pci_bus_id": "00000000:1B:00.0"}, None, {"uuid": "GPU-4"}]
    merged[0]["rank_transports"] = ["NVLS, P2P/CUMEM", None, "P2P/CUMEM"]
    table = nodes_table({"node_reports": merged})
    assert table is not None
    row = dict(zip(table.columns, table.rows[0], strict=True))
    assert row[per_rank_col] == "0: 00000000:1B:00.0 NVLS, P2P/CUMEM | 4: GPU-4 P2P/CUMEM"
    (t,) = topology_tables({"node_reports": merged})
    assert t.columns == ["", "GPU0", "GPU1", "CPU Affinity"] and t.rows[0] == ["GPU0", "X", "NV18", "0-55"]
    assert nodes_table({}) is None


def test_a_failed_collective_names_the_lost_node_and_its_ranks() -> None:
    d = SimpleNamespace(host="me-nowhere.invalid", hosts=("me-nowhere.invalid",) * 2 + ("localhost",) * 2)
    err = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:39562. "
        "This is typically caused by a remote worker crashing."
    )
    assert lost_peer(err, d) == "lost node localhost (ranks 2, 3): Connection closed by peer [127.0.0.1]:39562"  # type: ignore[arg-type]
    assert lost_peer(RuntimeError("Timed out waiting 20000ms for recv"), d) is None  # type: ignore[arg-type]


# --- HSDP on a local gloo world ---------------------------------------------------------------------------------

SECTION = {"model": "gpt", "d_model": 16, "n_layers": 1, "n_heads": 2, "vocab": 8, "seq_len": 4, "batch_size": 2,
           "steps": 1, "warmup_steps": 1, "measure_memory": False, "paired": False,
           "comm_timed_steps": 0}  # fmt: skip


def _train(rank: int, world_size: int, policies: list[str], hosts: list[str]) -> list[dict[str, Any]]:
    from commbench.training import run_training

    summary, _ = run_training({**SECTION, "policies": policies}, device=torch.device("cpu"), hosts=hosts)
    return [r.as_dict() for r in summary]


def _check_bytes(rows: dict[str, dict[str, Any]], inter_per_psi: dict[str, float]) -> None:
    for name, k in inter_per_psi.items():
        r = rows[name]
        assert r["error"] == "" and math.isfinite(r["final_loss"]), (name, r["error"])
        assert r["comm_bytes_inter_per_step"] == pytest.approx(k * r["params"]), name
        assert r["comm_bytes_inter_per_step"] == pytest.approx(r["comm_bytes_inter_expected"]), name
        assert r["comm_bytes_intra_per_step"] + r["comm_bytes_inter_per_step"] == pytest.approx(
            r["comm_bytes_per_step"]
        )


@pytest.mark.timeout(150)
def test_hsdp_on_one_node_degenerates_to_fsdp2() -> None:
    rows = {r["policy"]: r for r in run_in_world(_train, nproc=2, timeout=140, policies=["hsdp_fp32"], hosts=["h", "h"])[0]}  # fmt: skip
    _check_bytes(rows, {"fp32": 0.0, "hsdp_fp32": 0.0})
    hsdp = rows["hsdp_fp32"]
    assert hsdp["nodes"] == 1
    # 2 ranks, one node: the reduce-scatter is FSDP2's, (2-1)/2 * 2 * Psi/2 fp32 elements = 2 Psi bytes
    assert json.loads(hsdp["comm_by_op"])["reduce_scatter:float"] == pytest.approx(2 * hsdp["params"])


@pytest.mark.timeout(200)
def test_hsdp_on_two_named_nodes_splits_its_bytes() -> None:
    # Four local ranks told they sit on two hosts: the split follows the process groups, not the wire.
    got = run_in_world(_train, nproc=4, timeout=190, policies=["hsdp_fp32", "hsdp_bf16"], hosts=["a", "a", "b", "b"])
    rows = {r["policy"]: r for r in got[0]}
    # per rank and step, in bytes per parameter: DDP 2(4-1)/4 * 4; HSDP 2(2-1)/2 * 1/2 * 4 (fp32) or * 2 (bf16)
    _check_bytes(rows, {"fp32": 6.0, "hsdp_fp32": 2.0, "hsdp_bf16": 1.0})


# --- emulated hosts ---------------------------------------------------------------------------------------------

NODES, PER_NODE = 2, 2
SWEEP = ["run", "--collectives", "all_reduce", "--precisions", "fp32", "-b", "1K", "-e", "4K", "-f", "2", *FAST]


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmulatedCluster]:
    if WHY is not None:
        pytest.skip(f"emulated hosts unavailable: {WHY}")
    with EmulatedCluster(nodes=NODES, rate="1gbit", prefix="cbnodes") as c:
        yield c


_ports = iter(range(29600, 29700))


def _fail(job: Any) -> str:
    return "\n".join(f"--- node{r.node.index} ({r.returncode})\n{r.stderr[-3000:]}" for r in job.nodes)


@needs_root
@pytest.mark.timeout(300)
def test_training_across_two_emulated_nodes(cluster: EmulatedCluster, tmp_path: Path) -> None:
    suite = tmp_path / "train.toml"
    section = {**SECTION, "policies": ["hsdp_fp32", "hsdp_bf16"]}
    suite.write_text('name = "nodes"\n[training]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in section.items()))
    out = tmp_path / "run"
    job = start_job(cluster, PER_NODE, ["run", str(suite), "--out", str(out), "--quiet", "--no-report"],
                    port=next(_ports)).wait(280)  # fmt: skip
    assert job.returncode == 0, _fail(job)
    rows = {r["policy"]: r for r in load_run(out).training.to_dict("records")}
    assert {r["nodes"] for r in rows.values()} == {NODES}
    # bf16 gradients cross the slow link at half the fp32 bytes; DDP sends 3x HSDP's fp32 bytes across it
    _check_bytes(rows, {"fp32": 6.0, "hsdp_fp32": 2.0, "hsdp_bf16": 1.0})
    # every node reported itself, with its ranks and the job's GLOO_* environment
    meta = json.loads((out / "metadata.json").read_text())
    reports = {n["host"]: n for n in meta["node_reports"]}
    assert {h: reports[h]["ranks"] for h in reports} == {"cbnodes-node0": [0, 1], "cbnodes-node1": [2, 3]}
    for n in reports.values():
        assert n["env"]["GLOO_SOCKET_IFNAME"] == "eth0" and "eth0" in [x["name"] for x in n["nics"]]
        assert n["cpu"] and (n["nvidia_topo"] is None or shutil.which("nvidia-smi") is not None)
    tables = {t.key: t for t in build_tables(load_run(out))["metadata"]}
    assert [r[:2] for r in tables["nodes"].rows] == [["cbnodes-node0", "0-1"], ["cbnodes-node1", "2-3"]]


@needs_root
@pytest.mark.timeout(400)
def test_losing_a_node_ends_the_run_naming_it_then_resume_completes(cluster: EmulatedCluster, tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["run", "--collectives", "all_reduce,all_gather", "--precisions", "fp32,bf16", "-b", "1K", "-e", "256K",
            "-f", "4", "--timeout", "30", *FAST]  # fmt: skip
    job = start_job(cluster, PER_NODE, [*argv, "--out", str(out)], port=next(_ports))
    journal = out / "rows.jsonl"
    while job.running() and not (journal.exists() and journal.read_text().count("\n") >= 2):
        time.sleep(0.1)
    assert job.running(), "the run finished before a node could be lost: " + _fail(job.wait(1))
    job.kill_node(1)
    # ends on the surviving node well inside the 30 s collective timeout (the wait is only a bound)
    res = job.wait(time.monotonic() - job.start + 120)
    assert not res.timed_out and res.nodes[0].returncode not in (0, None) and res.nodes[1].returncode == -9
    err = res.nodes[0].stderr
    assert "lost node cbnodes-node1 (ranks 2, 3)" in err and f"--resume {out}" in err, err[-3000:]
    kept = len(commbench.load(out))
    assert kept >= 2
    resumed = start_job(cluster, PER_NODE, [*argv, "--resume", str(out)], port=next(_ports)).wait(300)
    assert resumed.returncode == 0, _fail(resumed)
    df = commbench.load(out)
    sizes = 5  # 1K .. 256K, factor 4
    assert len(df) == 2 * 2 * sizes and not df.duplicated(["collective", "precision", "size_bytes"]).any()


@needs_root
@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", ["slurm", "mpi"])
def test_srun_and_mpirun_environments_on_every_node(cluster: EmulatedCluster, tmp_path: Path, launcher: str) -> None:
    port = next(_ports)
    rank_env = {
        # srun derives the rendezvous port from the job id (launch.detect_world): pick the id that gives `port`
        "slurm": lambda c, node, lr, per: slurm_env(c, node, lr, per, job_id=port - 20000),
        "mpi": lambda c, node, lr, per: mpi_env(c, node, lr, per, port=port),
    }[launcher]
    # what commbench sees on node 1's second rank, as the README's recipe would start it
    info = detect_world(rank_env(cluster, 1, 1, PER_NODE))
    assert info is not None and (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 1, 2)
    assert info.master_addr == cluster.nodes[0].hostname and info.master_port == port and info.launcher == launcher
    out = tmp_path / "run"
    job = start_ranks(cluster, PER_NODE, [*SWEEP, "--out", str(out)], rank_env).wait(280)
    assert job.returncode == 0, _fail(job)
    meta = json.loads((out / "metadata.json").read_text())
    assert (meta["launcher"], meta["nodes"], meta["world_size"], meta["nproc_per_node"]) == (launcher, 2, 4, 2)
    assert [n["ranks"] for n in meta["node_reports"]] == [[0, 1], [2, 3]]
    df = commbench.load(out)
    assert len(df) == 3 and set(df["nodes"]) == {2} and (df["wrong"] == 0).all()
