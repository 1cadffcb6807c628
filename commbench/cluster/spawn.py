"""A local spawn and its supervision: ``python -m commbench`` once per rank with torchrun's variables on loopback
(forked from the supervisor where that is safe, :mod:`commbench.cluster.forked`, else a fresh interpreter), each
rank bound to its block of cores, the rendezvous socket handed to rank 0, and a supervisor that ends the run when the
first rank dies, names a rank that stopped responding once the others time out, and leaves no child behind.
"""

from __future__ import annotations

import datetime as _dt
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from commbench.cluster import forked

DEFAULT_COLLECTIVE_TIMEOUT_S = (dist.constants.default_pg_nccl_timeout or _dt.timedelta(minutes=10)).total_seconds()
"""torch's own collective timeout (ProcessGroupNCCL's watchdog: 10 min), used for every backend and for the
rendezvous store. A collective that waits longer for a peer fails, and a hung rank is named then. Not shorter: a long
reference check on the CPU or a slow first NCCL init on a large job is a healthy run. A dead rank is seen by the
supervisor of a local spawn at once (:func:`spawn_local`), whatever this says."""


LOG_DIR_ENV = "COMMBENCH_LOG_DIR"
"""Set on every rank of a local spawn that keeps logs: the directory of ``rank<r>.log``."""

PIN_ENV = "COMMBENCH_PIN_RANKS"
"""Core binding of local ranks. A local spawn binds each rank to its own block of the allowed cores unless this is
``0``; under torchrun / Slurm / MPI ranks are bound only when it is ``1`` (the launcher owns placement)."""


def allowed_cores() -> list[int]:
    """The cores this process may run on (its affinity where the platform says, else all of them)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def core_blocks(cores: Sequence[int], nproc: int) -> list[set[int]] | None:
    """``nproc`` disjoint, equal blocks of consecutive ``cores`` (rank r gets the r-th; leftovers unused), or None
    when there are fewer cores than ranks: oversubscribed ranks are left to the scheduler.

    Why bind at all: left to the scheduler, two loopback ranks sometimes share a core (they ping-pong, and the
    scheduler pulls a woken task next to its waker), and a shared core copies the message within its own cache,
    faster than two cores would (figures: benchmarks/results/2026-12-01_2core-vm_gloo.md). Unbound, a run lands
    anywhere between, so two identical runs disagree; bound, a rank owns its core, as under ``mpirun --bind-to core``."""
    if nproc < 1 or len(cores) < nproc:
        return None
    per = len(cores) // nproc
    return [set(cores[r * per : (r + 1) * per]) for r in range(nproc)]


def bind(pid: int, cores: set[int]) -> bool:
    """Bind process ``pid`` (all the threads it starts later) to ``cores``; False where the system refuses (a
    sandbox), and the process then runs unbound."""
    try:
        os.sched_setaffinity(pid, cores)
    except OSError:
        return False
    return True


def describe_cores(cores: Sequence[int] | set[int]) -> str:
    """``0-3,8`` for cores {0, 1, 2, 3, 8}: the cpulist form of taskset and /sys."""
    from commbench.core.units import int_ranges

    return int_ranges(cores)


def rank_cores() -> str | None:
    """This process's cores as a cpulist (``describe_cores``), or None where the platform cannot say."""
    return describe_cores(allowed_cores()) if hasattr(os, "sched_getaffinity") else None


STORE_FD_ENV = "COMMBENCH_STORE_FD"
"""Set on every rank of a local spawn: rank 0's value is the inherited, already-listening rendezvous socket."""

LOCAL_NPROC_MAX_PER_CORE = 4
"""A local spawn refuses more than this many ranks per core (at least 16 in all): each rank is a Python process
with torch loaded (hundreds of MB), and far more ranks than cores only measures the scheduler."""


def check_local_nproc(nproc: int, cores: int | None = None) -> None:
    """Refuse a local world too large for this machine, naming the bound."""
    cores = cores or os.cpu_count() or 1
    bound = max(16, LOCAL_NPROC_MAX_PER_CORE * cores)
    if nproc > bound:
        raise ValueError(
            f"--nproc {nproc} is more local ranks than this machine can run ({cores} cores: at most {bound}, "
            f"{LOCAL_NPROC_MAX_PER_CORE} per core); use torchrun/Slurm/MPI across nodes for larger worlds"
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loopback_listener() -> socket.socket:
    """A TCP socket listening on 127.0.0.1 on a free port, inheritable by a child process."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1024)
    s.set_inheritable(True)
    return s


def set_parent_death_signal() -> None:
    """Linux: die with the parent so a killed supervisor leaves no orphan ranks."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class RankFailure(RuntimeError):
    """A spawned rank died or hung; the message names it, ``ranks`` says in one line each what every rank did."""

    def __init__(self, message: str, ranks: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.ranks = list(ranks)


def _last_line(path: Path | None) -> str:
    """The last non-empty line of a rank's log (its exception, usually), shortened."""
    if path is None or not path.is_file():
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    text = lines[-1] if lines else ""
    return text if len(text) <= 160 else text[:157] + "..."


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def local_rank_env(rank: int, nproc: int, port: int, threads: int) -> dict[str, str]:
    """torchrun's variables for local rank ``rank`` of ``nproc`` on 127.0.0.1:``port``, ``threads`` cores each."""
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "OMP_NUM_THREADS": str(threads),
        # gloo listens on the interface of this name: loopback, like the store (a user's choice wins)
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
    }


def spawn_local(
    argv: Sequence[str],
    nproc: int,
    timeout_s: float | None = None,
    grace_s: float = 5.0,
    log_dir: Path | None = None,
    entry: Callable[[list[str]], int] | None = None,
) -> None:
    """Run ``python -m commbench ARGV`` as ``nproc`` local ranks on 127.0.0.1 and supervise them.

    Returns when every rank exited 0; raises :class:`RankFailure` naming the culprit otherwise. Two clocks, two
    jobs: the supervisor sees a rank die (exit or signal) within its 50 ms poll, whatever the collective timeout, and
    gives the others ``grace_s`` to end on their own before it stops them; a rank that hangs alive is named when a
    peer's collective gives up after ``timeout_s`` (the ranks' collective timeout, given here only to say so; None:
    torch's own, :data:`DEFAULT_COLLECTIVE_TIMEOUT_S`). Each rank gets
    an equal share of the cores (``OMP_NUM_THREADS``), as torchrun would set it, and is bound to that share
    (:func:`core_blocks`; not with ``COMMBENCH_PIN_RANKS=0``, nor when there are more ranks than cores).

    With ``log_dir``, the stderr of ranks 1.. goes to ``log_dir/rank<r>.log`` (appended: a resumed run keeps
    its history) and every rank writes its traceback there; rank 0 keeps the console for its progress and
    one-line errors. When a rank dies the failure then reads as one line per rank, not one traceback each.

    ``entry``: the CLI's ``main``; given, ranks are forked into it where that is safe (:mod:`commbench.cluster.forked`),
    else (or without it) each rank is a fresh ``python -m commbench``.
    """
    check_local_nproc(nproc)
    logs: list[Any] = []
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    listener = loopback_listener()
    port = int(listener.getsockname()[1])
    cores = allowed_cores()
    blocks = core_blocks(cores, nproc) if os.environ.get(PIN_ENV) != "0" and hasattr(os, "sched_setaffinity") else None
    threads = len(blocks[0]) if blocks else max(1, len(cores) // nproc)
    procs: list[Any] = []  # subprocess.Popen, or forked.ForkedRank with the same poll/wait/terminate/kill
    ours = {"COMMBENCH_LAUNCHER": "local", "COMMBENCH_PARENT_PID": str(os.getpid())}
    refusal = forked.fork_refusal() if entry is not None else "no entry point given to fork into"
    try:
        for rank in range(nproc):
            env = {**os.environ, **local_rank_env(rank, nproc, port, threads), **ours}
            # every rank builds the store the same way; only rank 0 receives the listening socket ("" elsewhere)
            env[STORE_FD_ENV] = str(listener.fileno()) if rank == 0 else ""
            fds: tuple[int, ...] = (listener.fileno(),) if rank == 0 else ()
            stderr = None
            if log_dir is not None:
                env[LOG_DIR_ENV] = str(log_dir)
                if rank > 0:
                    stderr = open(log_dir / f"rank{rank}.log", "ab")
            if refusal is None and entry is not None:
                block = blocks[rank] if blocks else None
                procs.append(forked.fork_rank(argv, env, stderr=stderr, keep_fds=fds, close=[listener, *logs],
                                              cores=block, bind=bind, entry=entry))  # fmt: skip
            else:
                procs.append(
                    subprocess.Popen([sys.executable, "-m", "commbench", *argv], env=env, pass_fds=fds, stderr=stderr)
                )
            if stderr is not None:
                logs.append(stderr)
            if blocks and refusal is not None:
                # bound before the rank has started a thread (Popen returns once the child has exec'd), so
                # every thread it starts (gloo's, torch's) inherits the block; where the system refuses, the rank
                # runs unbound and its node report says so
                bind(procs[-1].pid, blocks[rank])
        listener.close()  # rank 0 owns it now
        try:
            _supervise(procs, timeout_s, grace_s)
        except RankFailure as e:
            raise RankFailure(str(e), _rank_lines(procs, log_dir)) from None
    finally:
        listener.close()
        _terminate(procs)
        for f in logs:
            f.close()


def _rank_lines(procs: Sequence[Any], log_dir: Path | None) -> list[str]:
    """One line per rank: how it ended and the last line of its log."""
    out = []
    for r, p in enumerate(procs):
        code = p.poll()
        state = "still running (stopped)" if code is None else ("finished" if code == 0 else _describe_exit(code))
        log = log_dir / f"rank{r}.log" if log_dir is not None else None
        last = _last_line(log)
        where = f" [{log}]" if log is not None and log.is_file() else ""
        out.append(f"rank {r}: {state}" + (f": {last}" if last else "") + where)
    return out


def _supervise(procs: Sequence[Any], timeout_s: float | None, grace_s: float) -> None:
    timeout_s = DEFAULT_COLLECTIVE_TIMEOUT_S if timeout_s is None else timeout_s
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            break
        time.sleep(0.05)
    # A rank failed. Collect what the others do within the grace period: ranks waiting on a dead peer fail
    # fast (connection reset); ranks blocked on a hung peer fail at the collective timeout.
    first_seen = time.monotonic()
    deadline = first_seen + max(grace_s, 1.0)
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    codes = [p.poll() for p in procs]
    killed = [(r, c) for r, c in enumerate(codes) if c is not None and c < 0]
    alive = [r for r, c in enumerate(codes) if c is None]
    errored = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
    if killed:
        r, c = killed[0]
        raise RankFailure(f"rank {r} {_describe_exit(c)}; stopped the other ranks")
    if alive and errored:
        names = ", ".join(str(r) for r in alive)
        raise RankFailure(
            f"rank {names} stopped responding (hung): rank {errored[0][0]} gave up after the {timeout_s:g} s collective timeout; stopped all ranks"
        )
    r, c = failed[0]
    raise RankFailure(f"rank {r} {_describe_exit(c)}; stopped the other ranks")


def _terminate(procs: Sequence[Any]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
