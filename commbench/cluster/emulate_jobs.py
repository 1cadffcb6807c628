"""Jobs across an emulated cluster (:class:`commbench.cluster.emulate.EmulatedCluster`): torchrun on every node as
one static-rendezvous job, ranks started as Slurm or Open MPI would start them, and the CLI
(``python -m commbench.emulate``).

:func:`launch_job` starts ``torchrun`` on every node as one job on node 0's address, with gloo bound to the node's
``eth0`` so every inter-node byte crosses the (shaped) veth links; :func:`start_ranks` starts every rank itself with
a launcher's variables (:func:`slurm_env`, :func:`mpi_env`). :class:`Job` collects each node's exit code and output,
and kills the job's process groups at its timeout.

``python -m commbench.emulate --nodes 2 --nproc-per-node 2 --rate 200mbit -- run --collectives all_reduce``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commbench.cluster.emulate import (
    DEFAULT_PREFIX,
    MASTER_PORT,
    NODE_IFNAME,
    EmulatedCluster,
    EmulationError,
    Node,
    _kill_group,
    _kill_namespace_processes,
    cleanup_stale,
)

# -- a torchrun job across the nodes -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeResult:
    node: Node
    returncode: int | None
    """``None`` when the job was killed at its timeout while this node still ran."""
    stdout: str
    stderr: str


@dataclass(frozen=True, slots=True)
class JobResult:
    nodes: tuple[NodeResult, ...]
    timed_out: bool
    argv: tuple[str, ...] = field(default=())
    """Node 0's command line (the others differ in ``--node-rank``)."""
    seconds: float = 0.0

    @property
    def returncode(self) -> int:
        """0 when every node succeeded, else the first failing node's code (124 after a timeout)."""
        if self.timed_out:
            return 124
        for r in self.nodes:
            if r.returncode:
                return r.returncode
        return 0


def torchrun_argv(
    cluster: EmulatedCluster, node: int, nproc_per_node: int, argv: Sequence[str], port: int = MASTER_PORT
) -> list[str]:
    """The ``torch.distributed.run`` command for ``node``: static rendezvous on node 0, ``-m commbench argv``."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(len(cluster.nodes)), "--nproc-per-node", str(nproc_per_node),
        "--node-rank", str(node), "--master-addr", cluster.nodes[0].address, "--master-port", str(port),
        "-m", "commbench", *argv,
    ]  # fmt: skip


def job_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every process of a job gets: gloo/NCCL bound to the node's ``eth0`` (so inter-node traffic crosses
    the veth links; ranks on one node talk over that node's own stack, unshaped, like intra-node traffic), one
    intra-op thread, unbuffered output, and this checkout on ``PYTHONPATH`` when it is a source checkout."""
    out = {
        "GLOO_SOCKET_IFNAME": NODE_IFNAME,
        "NCCL_SOCKET_IFNAME": NODE_IFNAME,
        "TP_SOCKET_IFNAME": NODE_IFNAME,
        # Every rank of every node shares this machine's cores: one intra-op thread each.
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    src = Path(__file__).resolve().parents[2]
    if (src / "pyproject.toml").is_file():  # a source checkout: the nodes run the commbench that launched them
        out["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(src), out.get("PYTHONPATH") or os.environ.get("PYTHONPATH", "")) if p
        )
    return out


class Job:
    """Processes started across the nodes (any number per node) as one job; :meth:`wait` collects a
    :class:`JobResult`. ``commands`` are ``(node index, argv, extra env)``; output goes to temporary files."""

    def __init__(
        self,
        cluster: EmulatedCluster,
        commands: Sequence[tuple[int, Sequence[str], Mapping[str, str]]],
        cwd: str | os.PathLike[str] | None = None,
        shown_argv: Sequence[str] = (),
    ) -> None:
        self.cluster = cluster
        self.shown_argv = tuple(shown_argv)
        self.start = time.monotonic()
        self._tmp = tempfile.TemporaryDirectory(prefix="cbemu-job-")
        self.procs: list[tuple[int, subprocess.Popen[Any], Any, Any]] = []
        self._result: JobResult | None = None
        try:
            for k, (node, argv, env) in enumerate(commands):
                out = open(Path(self._tmp.name) / f"{k}.out", "w+")
                err = open(Path(self._tmp.name) / f"{k}.err", "w+")
                p = cluster.popen(node, argv, job_env(env), stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd)
                self.procs.append((node, p, out, err))
        except BaseException:
            self._stop()
            self._tmp.cleanup()
            raise

    def running(self) -> bool:
        return any(p.poll() is None for _, p, _, _ in self.procs)

    def kill_node(self, node: int) -> None:
        """SIGKILL every process in ``node`` (its launcher and the ranks, in whatever session): a lost host."""
        _kill_namespace_processes(self.cluster.node(node).netns)

    def _stop(self) -> None:
        for _, p, _, _ in self.procs:
            _kill_group(p)
        for n in self.cluster.nodes:  # torchrun's workers live in their own sessions
            _kill_namespace_processes(n.netns)
        for _, p, _, _ in self.procs:
            p.wait()

    def wait(self, timeout: float = 600) -> JobResult:
        """Wait for every process (kill them all at ``timeout`` seconds from the start) and collect the result."""
        if self._result is not None:
            return self._result
        try:
            deadline = self.start + timeout
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.1)
            timed_out = self.running()
        finally:
            self._stop()
        results = []
        for n in self.cluster.nodes:
            mine = [(p, out, err) for node, p, out, err in self.procs if node == n.index]
            texts = []
            for _, out, err in mine:
                out.seek(0)
                err.seek(0)
                texts.append((out.read(), err.read()))
                out.close()
                err.close()
            codes = [p.returncode for p, _, _ in mine]
            code = next((c for c in codes if c), 0) if codes else None
            if timed_out and code is not None and code < 0:
                code = None
            results.append(NodeResult(n, code, "".join(o for o, _ in texts), "".join(e for _, e in texts)))
        self._tmp.cleanup()
        self._result = JobResult(
            nodes=tuple(results), timed_out=timed_out, argv=self.shown_argv, seconds=time.monotonic() - self.start
        )
        return self._result


def start_job(
    cluster: EmulatedCluster,
    nproc_per_node: int,
    commbench_argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    port: int = MASTER_PORT,
) -> Job:
    """Start ``python -m commbench <commbench_argv>`` as one torchrun job on every node (see :func:`launch_job`);
    ``port``: node 0's rendezvous port (a new one per job lets jobs follow each other on one cluster)."""
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    commands = [(n.index, torchrun_argv(cluster, n.index, nproc_per_node, commbench_argv, port), dict(env or {}))
                for n in cluster.nodes]  # fmt: skip
    return Job(cluster, commands, cwd, torchrun_argv(cluster, 0, nproc_per_node, commbench_argv, port))


def launch_job(
    cluster: EmulatedCluster,
    nproc_per_node: int,
    commbench_argv: Sequence[str],
    timeout: float = 600,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> JobResult:
    """Run ``python -m commbench <commbench_argv>`` as one torchrun job on every node; wait, or kill at ``timeout``.

    gloo (and NCCL's socket transport) is bound to each node's ``eth0`` (:func:`job_env`).
    """
    return start_job(cluster, nproc_per_node, commbench_argv, env, cwd).wait(timeout)


# -- Slurm and Open MPI, as their launchers set up each rank --------------------------------------------------


def slurm_env(
    cluster: EmulatedCluster, node: int, local_rank: int, nproc_per_node: int, job_id: int = 4242
) -> dict[str, str]:
    """What ``srun -N <nodes> --ntasks-per-node <nproc>`` sets for one task (block distribution)."""
    nodes = len(cluster.nodes)
    return {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_PROCID": str(node * nproc_per_node + local_rank),
        "SLURM_LOCALID": str(local_rank),
        "SLURM_NODEID": str(node),
        "SLURM_NTASKS": str(nodes * nproc_per_node),
        "SLURM_NNODES": str(nodes),
        "SLURM_NTASKS_PER_NODE": str(nproc_per_node),
        "SLURM_STEP_TASKS_PER_NODE": f"{nproc_per_node}(x{nodes})",
        "SLURM_JOB_NODELIST": f"{cluster.prefix}-node[0-{nodes - 1}]" if nodes > 1 else f"{cluster.prefix}-node0",
    }


def mpi_env(
    cluster: EmulatedCluster, node: int, local_rank: int, nproc_per_node: int, port: int = MASTER_PORT
) -> dict[str, str]:
    """What ``mpirun -np <nodes*nproc> -x MASTER_ADDR=<node 0> -x MASTER_PORT`` sets for one rank under Open MPI
    with a hostfile of ``slots=<nproc>`` per node (ranks fill a node's slots first, so a node's ranks are consecutive)."""
    return {
        "OMPI_COMM_WORLD_RANK": str(node * nproc_per_node + local_rank),
        "OMPI_COMM_WORLD_SIZE": str(len(cluster.nodes) * nproc_per_node),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(nproc_per_node),
        "OMPI_COMM_WORLD_NODE_RANK": str(node),
        "MASTER_ADDR": cluster.nodes[0].hostname,
        "MASTER_PORT": str(port),
    }


RankEnv = Callable[[EmulatedCluster, int, int, int], dict[str, str]]
"""(cluster, node, local rank, ranks per node) -> the launcher's variables for that rank (`slurm_env`, `mpi_env`)."""


def start_ranks(
    cluster: EmulatedCluster,
    nproc_per_node: int,
    commbench_argv: Sequence[str],
    rank_env: RankEnv,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Job:
    """Start ``python -m commbench <commbench_argv>`` once per rank, each in its node with the variables
    ``rank_env`` gives it: what srun or mpirun does on a real cluster (commbench discovers the world)."""
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    argv = [sys.executable, "-m", "commbench", *commbench_argv]
    commands = [(n.index, argv, {**(env or {}), **rank_env(cluster, n.index, lr, nproc_per_node)})
                for n in cluster.nodes for lr in range(nproc_per_node)]  # fmt: skip
    return Job(cluster, commands, cwd, argv)


# -- CLI -----------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m commbench.emulate",
        description="Run one commbench job across emulated hosts (network namespaces on a bridge). Needs root.",
        epilog="example: python -m commbench.emulate --nodes 2 --nproc-per-node 2 --rate 200mbit -- run --collectives all_reduce",
    )
    p.add_argument("--nodes", type=int, default=2, help="emulated hosts (default 2)")
    p.add_argument("--nproc-per-node", type=int, default=1, help="ranks per host (default 1)")
    p.add_argument(
        "--rate", default=None, help="shape every host's link to this tc rate, e.g. 200mbit, 1gbit (default: unshaped)"
    )
    p.add_argument(
        "--node-rate", action="append", default=[], metavar="I=RATE",
        help="shape node I's link to RATE instead of --rate (a slow node), e.g. 1=50mbit; repeatable",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=600, help="seconds before the whole job is killed (default 600)")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help=f"namespace name prefix (default {DEFAULT_PREFIX})")
    p.add_argument(
        "--cleanup-stale", action="store_true", help="delete namespaces left by dead owners with this prefix, then exit"
    )
    p.add_argument("commbench_argv", nargs=argparse.REMAINDER, help="-- then commbench's arguments (default: run)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cleanup_stale:
        for ns in cleanup_stale(args.prefix):
            print(f"deleted {ns}")
        return 0
    cb_argv = list(args.commbench_argv)
    if cb_argv[:1] == ["--"]:
        cb_argv = cb_argv[1:]
    cb_argv = cb_argv or ["run"]
    try:
        if args.nodes < 1 or args.nproc_per_node < 1:
            raise ValueError(f"--nodes and --nproc-per-node must be >= 1, got {args.nodes} and {args.nproc_per_node}")
        node_rates = {}
        for item in args.node_rate:
            i, sep, r = item.partition("=")
            if not sep or not i.strip().isdigit():
                raise ValueError(f"--node-rate must look like 1=50mbit (node index = tc rate), got {item!r}")
            node_rates[int(i)] = r.strip()
        cluster = EmulatedCluster(nodes=args.nodes, rate=args.rate, prefix=args.prefix, node_rates=node_rates)
    except ValueError as e:
        print(f"commbench.emulate: error: {e}", file=sys.stderr)
        return 2
    try:
        with cluster:
            print(cluster.describe(), flush=True)
            job = launch_job(cluster, args.nproc_per_node, cb_argv, timeout=args.timeout)
    except EmulationError as e:
        print(f"commbench.emulate: error: {e}", file=sys.stderr)
        return 1
    print(f"# job: {' '.join(job.argv)}  ({job.seconds:.1f} s, per node --node-rank i)", flush=True)
    sys.stdout.write(job.nodes[0].stdout)
    sys.stderr.write(job.nodes[0].stderr)
    for r in job.nodes[1:]:
        if r.returncode:
            sys.stderr.write(
                f"# node{r.node.index} ({r.node.hostname}) exited {r.returncode}; its stderr:\n{r.stderr[-4000:]}"
            )
    if job.timed_out:
        print(
            f"commbench.emulate: error: the job ran past --timeout {args.timeout:g} s and was killed", file=sys.stderr
        )
    return job.returncode


if __name__ == "__main__":
    sys.exit(main())
