"""A one-node Slurm cluster on 127.0.0.1 for tests: munged, slurmctld and slurmd from the distribution's packages
(Debian: ``slurm-wlm``, ``munge``), every file in one directory, stopped by process id afterwards, on failure too.

Why a private cluster and not the machine's: nothing under ``/etc`` is read or written (``SLURM_CONF`` points at the
directory's ``slurm.conf``, munged gets its own key and socket), free ports are chosen, so a machine that runs a Slurm
of its own, or another test, is left alone. The node is called ``localhost`` (``slurmd -N``; ``NodeAddr=127.0.0.1``)
so the host commbench takes from ``SLURM_JOB_NODELIST`` resolves to loopback on any machine.

By hand (prints the command's output, then stops the daemons)::

    python -m tests.launchers.slurm_localhost -- srun -N 1 -n 2 python -m commbench run --no-report
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sinfo")
"""The programs a cluster needs: the two Slurm daemons, munge's, and the two clients the tests use."""

NODE = "localhost"


class SlurmUnavailable(RuntimeError):
    """Slurm cannot run here; the message says why in one line (a test skips with it)."""


def missing_programs() -> list[str]:
    """The programs of :data:`DAEMONS` not on PATH (``/usr/sbin`` counted: Debian puts the daemons there)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    return [p for p in DAEMONS if shutil.which(p, path=path) is None]


def _which(program: str) -> str:
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    found = shutil.which(program, path=path)
    if found is None:
        raise SlurmUnavailable(f"{program} is not installed (Debian: apt-get install slurm-wlm munge)")
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_conf(directory: Path, cpus: int, ctld_port: int, slurmd_port: int, munge_socket: Path) -> str:
    """A minimal ``slurm.conf`` for one node of ``cpus`` CPUs on 127.0.0.1, everything kept in ``directory``.

    ``proctrack/linuxproc`` and ``task/affinity``: no cgroups (a container rarely lets a process create them), but
    tasks bound to their CPUs as on a real cluster. ``OverSubscribe`` lets a run ask for more tasks than CPUs."""
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "root")
    return "\n".join(
        [
            "ClusterName=commbench",
            f"SlurmctldHost={NODE}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge_socket}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            f"StateSaveLocation={directory / 'state'}",
            f"SlurmdSpoolDir={directory / 'spool'}",
            f"SlurmctldPidFile={directory / 'slurmctld.pid'}",
            f"SlurmdPidFile={directory / 'slurmd.pid'}",
            f"SlurmctldLogFile={directory / 'slurmctld.log'}",
            f"SlurmdLogFile={directory / 'slurmd.log'}",
            f"PlugStackConfig={directory / 'plugstack.conf'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/affinity",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "MailProg=/bin/true",
            f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            f"PartitionName=local Nodes={NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
            "",
        ]
    )


@dataclass
class SlurmCluster:
    """A running one-node cluster: ``env`` is what a client (``srun``, ``sinfo``) needs on top of the caller's."""

    directory: Path
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)

    def log(self, name: str) -> IO[bytes]:
        """A file in the cluster's directory for a daemon's stderr, closed when the cluster stops."""
        f = open(self.directory / name, "wb")
        self.logs.append(f)
        return f

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of every daemon's log: what a failure report shows."""
        out = []
        for name in ("munged.log", "munged.out", "slurmctld.log", "slurmctld.out", "slurmd.log", "slurmd.out"):
            path = self.directory / name
            text = path.read_text(errors="replace").strip().splitlines()[-lines:] if path.is_file() else []
            if text:
                out.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(out)


def _cancel_jobs(env: dict[str, str]) -> None:
    """Cancel every job of this (private) cluster and wait up to 10 s for them to go: a job step runs under its own
    slurmstepd, which outlives slurmd, so a step left by a failed test must be ended through Slurm first."""
    scancel, squeue = shutil.which("scancel"), shutil.which("squeue")
    if scancel is None or squeue is None:
        return
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "root")
    try:
        subprocess.run([scancel, "--full", f"--user={user}"], env=env, capture_output=True, timeout=10)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            r = subprocess.run([squeue, "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=10)
            if r.returncode != 0 or not r.stdout.strip():
                return
            time.sleep(0.2)
    except subprocess.TimeoutExpired:
        pass


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each daemon we started (its own pid, newest first), SIGKILL what is still there after 10 s."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10.0
    for p in reversed(procs):
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _node_state(env: dict[str, str]) -> str:
    sinfo = _which("sinfo")
    r = subprocess.run([sinfo, "-h", "-N", "-o", "%t"], env=env, capture_output=True, text=True, timeout=10)
    return r.stdout.strip() if r.returncode == 0 else ""


@contextmanager
def slurm_localhost(
    directory: Path | None = None, cpus: int | None = None, start_timeout_s: float = 60.0
) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd (in the foreground, as our children) and wait until the node is idle;
    stop all three when the block ends, however it ends. Raises :class:`SlurmUnavailable` (one line, the daemons'
    last log lines after it) when a program is missing or the node does not come up within ``start_timeout_s``."""
    for program in DAEMONS:
        _which(program)
    own_dir = directory is None
    d = Path(tempfile.mkdtemp(prefix="commbench-slurm-")) if directory is None else directory
    d.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool", "munge"):
        (d / sub).mkdir(exist_ok=True)
    os.chmod(d, 0o755)  # munged wants the socket's directories searchable by all and writable by none but us
    os.chmod(d / "munge", 0o755)
    key = d / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
    os.chmod(key, 0o400)
    sock = d / "munge" / "munge.socket"
    (d / "plugstack.conf").write_text("")  # the distribution's plugstack.conf.d is not ours to load
    conf = d / "slurm.conf"
    conf.write_text(slurm_conf(d, cpus or os.cpu_count() or 1, _free_port(), _free_port(), sock))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(d, {"SLURM_CONF": str(conf)})
    devnull = subprocess.DEVNULL
    try:
        cluster.procs.append(
            subprocess.Popen(
                [_which("munged"), "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                 f"--log-file={d / 'munged.log'}", f"--pid-file={d / 'munge' / 'munged.pid'}",
                 f"--seed-file={d / 'munge' / 'munged.seed'}"],
                stdout=devnull, stderr=cluster.log("munged.out"), env=env,
            )
        )  # fmt: skip
        _wait(lambda: sock.exists(), cluster, "munged did not create its socket", 10.0)
        cluster.procs.append(
            subprocess.Popen([_which("slurmctld"), "-D", "-f", str(conf)], stdout=devnull,
                             stderr=cluster.log("slurmctld.out"), env=env)
        )  # fmt: skip
        cluster.procs.append(
            subprocess.Popen([_which("slurmd"), "-D", "-N", NODE, "-f", str(conf)], stdout=devnull,
                             stderr=cluster.log("slurmd.out"), env=env)
        )  # fmt: skip
        _wait(lambda: _node_state(env) == "idle", cluster, "the Slurm node did not become idle", start_timeout_s)
        yield cluster
    finally:
        if cluster.procs and cluster.procs[-1].poll() is None:
            _cancel_jobs(env)
        _stop(cluster.procs)
        for f in cluster.logs:
            f.close()
        if own_dir:
            shutil.rmtree(d, ignore_errors=True)


def _wait(ready: Callable[[], bool], cluster: SlurmCluster, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dead = [p for p in cluster.procs if p.poll() is not None]
        if dead:
            name = Path(str(dead[0].args[0])).name  # type: ignore[index]  # args is the list given to Popen
            raise SlurmUnavailable(f"{name} exited with code {dead[0].returncode} while starting\n{cluster.log_tail()}")
        if ready():
            return
        time.sleep(0.2)
    raise SlurmUnavailable(f"{what} within {timeout_s:g} s\n{cluster.log_tail()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, help="keep the cluster's files here (default: a temporary directory)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND to run with SLURM_CONF set")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command after --, e.g. -- srun -N 1 -n 2 hostname")
    try:
        with slurm_localhost(args.dir) as cluster:
            return subprocess.run(command, env={**os.environ, **cluster.env}).returncode
    except SlurmUnavailable as e:
        print(f"slurm_localhost: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
