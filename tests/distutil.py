"""Test helper that owns spawning a small local gloo world and collecting each rank's result.

`run_in_world(fn, nproc=2, timeout=120, **kwargs)` starts `nproc` processes, each joins a gloo group on
127.0.0.1 with a free port, uses one intra-op thread (two ranks on two cores would otherwise oversubscribe),
runs `fn(rank, world_size, **kwargs)` and sends back its return value.

The ranks are forked from multiprocessing's fork server, which imports torch (and torch.distributed) once per
test process (`PRELOAD`): a rank then starts in milliseconds instead of paying ~2.5 CPU-s of imports, and the
server is single-threaded, so forking it is safe (unlike forking pytest's own process). A rank still sees the
caller's current environment (copied into it before `fn` runs) and imports everything else fresh.
A failing rank or the timeout raises `WorldError` naming the rank; every child is terminated and
joined before returning or raising, so no process outlives the call.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any


class WorldError(RuntimeError):
    """A rank of a spawned test world failed, died, or the world ran past its timeout."""


def free_port() -> int:
    """Return a TCP port that was free on 127.0.0.1 a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PRELOAD = ["torch", "torch.distributed"]
"""What the fork server imports once; never commbench itself (a test may change its files or plugins)."""


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    timeout: float,
    results: Any,
    kwargs: dict[str, Any],
    environ: dict[str, str],
) -> None:
    # The fork server's environment is the one of the moment it started: the caller's, now, replaces it.
    os.environ.clear()
    os.environ.update(environ)
    # Imported here so the parent process pays nothing for torch until it spawns.
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=max(timeout, 1.0)),
        )
        results.put((rank, True, fn(rank, world_size, **kwargs)))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent with its traceback
        # Reported before the group is torn down: the peers fail only after that, so the root cause
        # reaches the parent first.
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            import gc

            gc.collect()  # release DDP/FSDP garbage that still holds the group, so destroying it joins gloo's threads
            dist.destroy_process_group()


def _also_failed(results: Any, first: int, wait: float = 1.0) -> str:
    """Other ranks that failed within `wait` seconds of the first (usually as a consequence of it)."""
    others: list[int] = []
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            rank, ok, _ = results.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            break
        if not ok and rank != first:
            others.append(rank)
    return f"\n(ranks that failed after it: {sorted(others)})" if others else ""


def run_in_world(fn: Callable[..., Any], nproc: int = 2, timeout: float = 120, **kwargs: Any) -> list[Any]:
    """Run `fn(rank, world_size, **kwargs)` on `nproc` spawned gloo ranks; return the values in rank order.

    `fn` must be a picklable module-level function and its return value picklable.
    Raises `WorldError` naming the first failing rank (with its traceback) or the ranks still
    running when `timeout` seconds have passed.
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # read when the server starts, the first call in this process
    results = ctx.Queue()
    port = free_port()
    environ = dict(os.environ)
    procs = [
        ctx.Process(target=_worker, args=(fn, r, nproc, port, timeout, results, kwargs, environ), daemon=True)
        for r in range(nproc)
    ]
    for p in procs:
        p.start()
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    finished = False
    try:
        while len(values) < nproc:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(nproc)) - set(values))
                raise WorldError(f"ranks {missing} did not finish within {timeout} s")
            try:
                rank, ok, value = results.get(timeout=min(left, 0.5))
            except queue.Empty:
                for r, p in enumerate(procs):
                    if r not in values and not p.is_alive() and p.exitcode not in (0, None):
                        raise WorldError(f"rank {r} died with exit code {p.exitcode}") from None
                continue
            if not ok:
                raise WorldError(f"rank {rank} failed:\n{value}{_also_failed(results, rank)}")
            values[rank] = value
        finished = True
        return [values[r] for r in range(nproc)]
    finally:
        # After success the ranks are only tearing down; after a failure they may be stuck in a
        # collective, so they get no grace period.
        for p in procs:
            p.join(timeout=10 if finished else 0.5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
