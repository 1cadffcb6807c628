"""Local ranks forked from the supervisor, where that is safe: each rank then starts with torch and commbench already
imported (copy-on-write pages of the supervisor's), instead of importing them again in a fresh interpreter.

A fresh ``python -m commbench`` costs every rank the import of torch (figures:
benchmarks/results/2026-12-03_2core-vm_gloo.md). A forked rank runs the same entry point
(the CLI's ``main``, handed down by the command that spawns: this layer does not import the CLI, with the rank's
argv and environment) in the state a fresh interpreter would have:
the environment replaced, ``sys.argv`` set, signal handlers and ``atexit`` callbacks reset, stdio flushed before
the fork so nothing printed is printed twice, the rank's stderr on its log, the fds of other ranks closed.

Forking is what torch's own DataLoader workers do on Linux, and it is safe on the same conditions, checked by
:func:`fork_refusal`: no CUDA context in the supervisor (CUDA cannot be used in a child forked after its
initialisation), no NVML handle (the supervisor of an NCCL spawn reads free memory through it), and no Python thread
but the main one (a lock held by another thread at the fork stays held in the child). The native threads that exist
after ``import torch`` (OpenBLAS's server, through numpy) shut down and restart across a fork by their own
``pthread_atfork`` handlers. Where any condition fails, or with ``COMMBENCH_SPAWN=exec``, ranks are started as fresh
interpreters (:mod:`commbench.cluster.spawn`), the behaviour of torchrun.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

SPAWN_ENV = "COMMBENCH_SPAWN"
"""How a local spawn starts its ranks: ``fork`` (the default; where :func:`fork_refusal` finds it unsafe, ``exec``)
or ``exec`` (a fresh ``python -m commbench`` per rank, as torchrun starts its workers)."""


def fork_refusal() -> str | None:
    """Why ranks cannot be forked from this process now, or None when they can."""
    mode = os.environ.get(SPAWN_ENV, "fork")
    if mode not in ("fork", "exec"):
        raise ValueError(f"{SPAWN_ENV}={mode!r}: valid values are fork, exec")
    if mode == "exec":
        return f"{SPAWN_ENV}=exec"
    if sys.platform != "linux" or not hasattr(os, "fork"):
        return f"no fork on {sys.platform}"
    if threading.active_count() > 1:
        return f"{threading.active_count()} Python threads in the supervisor"
    if "pynvml" in sys.modules:
        return "NVML is loaded in the supervisor"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in the supervisor"
    return None


class ForkedRank:
    """A forked rank, with the part of :class:`subprocess.Popen` that supervision uses (``returncode`` as Popen's:
    the exit code, or minus the signal that killed it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost, it ended
                self.returncode = 1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_rank(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    stderr: IO[bytes] | None,
    keep_fds: Sequence[int],
    close: Sequence[Any],
    cores: set[int] | None,
    bind: Callable[[int, set[int]], bool],
    entry: Callable[[list[str]], int],
) -> ForkedRank:
    """Fork one rank running ``entry(argv)`` (the CLI's main) under ``env``; the child never returns from here. ``close``: objects with ``close()`` (the
    other ranks' logs, the listener where it is not kept) the rank must not hold; ``keep_fds``: fds it inherits."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # a buffer copied into the child would be written twice
    with warnings.catch_warnings():
        # Python >= 3.12 warns on any native thread; OpenBLAS's handles the fork itself (module docstring)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return ForkedRank(pid)
    code = 1
    try:
        atexit._clear()  # the supervisor's exit work is not the rank's
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for obj in close:
            fd = getattr(obj, "fileno", lambda: -1)()
            if fd not in keep_fds:
                obj.close()
            elif hasattr(obj, "detach"):
                obj.detach()  # the rank owns the fd now (a socket object closing it at exit would close the store's)
        if stderr is not None:
            os.dup2(stderr.fileno(), 2)
            stderr.close()
        if cores:
            bind(0, cores)  # before the rank starts a thread: every thread it starts inherits the block
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [sys.argv[0], *argv]
        code = entry(list(argv))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # what an interpreter prints for an uncaught exception, and its exit code
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


__all__ = ["SPAWN_ENV", "ForkedRank", "fork_refusal", "fork_rank"]
