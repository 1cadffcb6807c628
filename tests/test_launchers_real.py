"""The launchers for real: ``mpirun -np 2`` (Open MPI) and ``srun -N 1 -n 2`` (Slurm, a private one-node cluster
on 127.0.0.1 that the test starts and stops) start ``python -m commbench run``; the rows, the ranks and the
launcher in metadata must be what those launchers made. Elsewhere the environment variables are set by hand
(test_definitions, test_nodes); here the launchers set them. Each test skips, naming the reason, where its
launcher is not installed or cannot start (Debian: ``apt-get install openmpi-bin slurm-wlm munge``; ``.ci/run``
installs them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from commbench.cluster.launch import detect_world
from tests.cli_util import FAST
from tests.launchers.slurm_localhost import SlurmCluster, SlurmUnavailable, slurm_localhost

SIZES = (4096, 65536)
"""The fp32 sizes of the tiny suite: -b 4K -e 64K -f 16."""

SUITE = ["run", "--collectives", "all_reduce", "--precisions", "fp32", "-b", "4K", "-e", "64K", "-f", "16", *FAST]

_LAUNCHER_ENV = re.compile(
    r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|SLURM_.*|OMPI_.*|PMI_.*|PMIX_.*|COMMBENCH_.*)$"
)


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any launcher's variables (a test suite run inside an allocation or
    under torchrun must not leak its world into the one the launcher makes), gloo on loopback."""
    env = {k: v for k, v in os.environ.items() if not _LAUNCHER_ENV.match(k)}
    env["GLOO_SOCKET_IFNAME"] = "lo"  # traffic on 127.0.0.1 only, whatever the host name resolves to
    return {**env, **extra}


def _start(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """Start a launcher in a session of its own, its output kept."""
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip


def _finish(p: subprocess.Popen[str], timeout: float = 240) -> str:
    """Wait for a launcher and return its output; on timeout SIGTERM it (mpirun and srun end their ranks then),
    SIGKILL its process group after 10 s, and fail with what it printed. A non-zero exit fails the test too."""
    name = Path(str(p.args[0] if isinstance(p.args, list) else p.args)).name
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        pytest.fail(f"{name} did not finish within {timeout:g} s:\n{out[-3000:]}")
    assert p.returncode == 0, f"{name} exited with {p.returncode}:\n{out[-3000:]}"
    return out


def _check_run(out: Path, launcher: str, host: str) -> dict[str, Any]:
    """The run directory a 2-rank launcher run left: every row, rank and metadata field the launcher decides."""
    rows = pd.read_csv(out / "results.csv")
    assert sorted(zip(rows["collective"], rows["precision"], rows["size_bytes"], strict=True)) == [
        ("all_reduce", "fp32", s) for s in SIZES
    ]
    assert set(rows["world_size"]) == {2} and set(rows["nodes"]) == {1} and set(rows["backend"]) == {"gloo"}
    assert set(rows["wrong"]) == {0}
    # nccl-tests' definitions: algbw = size / time; all_reduce busbw = algbw * 2(n-1)/n, n = 2
    assert rows["algbw_gbps"].to_numpy() == pytest.approx(
        (rows["size_bytes"] / (rows["time_us"] * 1e3)).to_numpy(), rel=1e-9
    )
    assert rows["busbw_gbps"].to_numpy() == pytest.approx((rows["algbw_gbps"] * 2 * (2 - 1) / 2).to_numpy(), rel=1e-9)
    # every point timed on both ranks the launcher started, on this one host
    ranks = pd.read_csv(out / "ranks.csv")
    for size in SIZES:
        point = ranks[ranks["fp32_bytes"] == size]
        assert sorted(point["rank"]) == [0, 1] and set(point["host"]) == {host}
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["launcher"] == launcher
    assert (meta["world_size"], meta["nodes"], meta["nproc_per_node"], meta["hosts"]) == (2, 1, 2, [host])
    (node,) = meta["node_reports"]
    assert node["ranks"] == [0, 1] and node["host"] == host
    # the environment reached each rank through the launcher: the node report keeps GLOO_* as the ranks saw it
    assert node["env"].get("GLOO_SOCKET_IFNAME") == "lo"
    return meta


def test_mpi_world_on_one_node_needs_no_master_addr() -> None:
    """What real ``mpirun -np 2`` sets (Open MPI 4.1: OMPI_COMM_WORLD_*, one job id for all ranks) is enough on one
    node: the rendezvous is 127.0.0.1 and its port comes from the job id, so two jobs at once do not share a store;
    across nodes MASTER_ADDR stays required, in one line."""

    def rank(r: int, jobid: str, size: int = 2, local: int = 2) -> dict[str, str]:
        return {
            "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": str(size), "OMPI_COMM_WORLD_LOCAL_RANK": str(r % local),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(local), "OMPI_MCA_ess_base_jobid": jobid,
        }  # fmt: skip

    a0, a1 = detect_world(rank(0, "2002059265")), detect_world(rank(1, "2002059265"))
    b0 = detect_world(rank(0, "1997930497"))
    assert a0 is not None and a1 is not None and b0 is not None
    assert (a0.master_addr, a0.launcher, a0.world_size, a1.rank, a1.local_rank) == ("127.0.0.1", "mpi", 2, 1, 1)
    assert a0.master_port == a1.master_port  # one store for the job
    assert a0.master_port != b0.master_port  # ... and another for the next mpirun
    assert all(1024 < w.master_port < 65536 and w.master_port != 29500 for w in (a0, b0))
    given = detect_world({**rank(0, "2002059265"), "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"})
    assert given is not None and (given.master_addr, given.master_port) == ("10.0.0.1", 1234)
    with pytest.raises(ValueError, match=r"^MPI world across nodes \(2 of 4 ranks on this one\).*MASTER_ADDR"):
        detect_world(rank(0, "2002059265", size=4, local=2))


@pytest.mark.timeout(300)
def test_mpirun_starts_commbench(tmp_path: Path) -> None:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: apt-get install openmpi-bin)")
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    if "Open MPI" not in version:
        pytest.skip(f"mpirun is not Open MPI's ({version.strip().splitlines()[:1]}); this test speaks Open MPI's flags")
    # as root Open MPI refuses to start without being told; --oversubscribe: a 1-core machine still runs 2 ranks
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    # Two jobs at once, as two users of one node would start them, with no MASTER_ADDR and no MASTER_PORT: on one
    # node mpirun's own variables are enough, and each job meets in a store of its own (one fixed port: the second
    # job's rank 0 fails with EADDRINUSE). Each mpirun keeps its session directory apart: two mpirun started in the
    # same instant race to create the shared one (Open MPI 4.1: "orte_session_dir failed").
    jobs = []
    for job in ("a", "b"):
        (tmp_path / job).mkdir()
        cmd = [mpirun, *root, "--oversubscribe", "-np", "2", "-x", "GLOO_SOCKET_IFNAME",
               sys.executable, "-m", "commbench", *SUITE, "--out", str(tmp_path / job / "run")]  # fmt: skip
        jobs.append(_start(cmd, _clean_env(OMPI_MCA_orte_tmpdir_base=str(tmp_path / job)), tmp_path))
    for p in jobs:
        _finish(p)
    ids = set()
    for job in ("a", "b"):
        meta = _check_run(tmp_path / job / "run", "mpi", socket.gethostname())
        assert meta["argv"][:4] == ["python", "-m", "commbench", "run"]
        # Open MPI's own variables reached the node report (it keeps OMPI_MCA_*): the world was mpirun's
        ids.add(meta["node_reports"][0]["env"]["OMPI_MCA_ess_base_jobid"])
    assert len(ids) == 2


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A private one-node Slurm on 127.0.0.1 for this module, stopped (its jobs cancelled first) however the tests
    end."""
    try:
        with slurm_localhost(tmp_path_factory.mktemp("slurm"), cpus=os.cpu_count() or 1) as cluster:
            yield cluster
    except SlurmUnavailable as e:
        pytest.skip(f"Slurm cannot run here: {e}")


@pytest.mark.timeout(300)
def test_srun_starts_commbench(slurm: SlurmCluster, tmp_path: Path) -> None:
    srun = shutil.which("srun")
    assert srun is not None  # the fixture skipped otherwise
    out = tmp_path / "run"
    cores = os.cpu_count() or 1
    # a core per task (task/affinity binds each to its own); -O (overcommit) only where there is one core for two
    over = ["-O"] if cores < 2 else []
    cmd = [srun, "-N", "1", "-n", "2", *over, "--time", "5",
           sys.executable, "-m", "commbench", *SUITE, "--out", str(out)]  # fmt: skip
    try:
        _finish(_start(cmd, _clean_env(**slurm.env), tmp_path))
    except AssertionError as e:
        raise AssertionError(f"{e}\n{slurm.log_tail()}") from None
    # the node is called localhost in slurm.conf (the rendezvous host commbench takes from SLURM_JOB_NODELIST); the
    # host each rank reports is the machine's own name
    meta = _check_run(out, "slurm", socket.gethostname())
    assert meta["argv"][:4] == ["python", "-m", "commbench", "run"]
    if cores >= 2:
        # Slurm placed each task on a core of its own; metadata keeps the cores each rank ran on and its threads
        node = meta["node_reports"][0]
        assert len(node["rank_cores"]) == 2 and node["rank_cores"][0] != node["rank_cores"][1]
        assert meta["threads_per_rank"] == 1
