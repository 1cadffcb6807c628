"""Failures agreed across ranks through the rendezvous store, never through the communicator: a rank that fails
anywhere (inside a backward's gradient reduction, a pipeline schedule, FSDP's forward) is named by the others in
seconds, and the world goes on with fresh process groups.

Why a side channel. A rank that fails between two collectives leaves its peers blocked inside the next one, where
only the collective timeout (10 minutes) would end them; a flag all-reduced on the communicator cannot help, since
the peers are already inside another collective. The c10d store is a separate TCP connection every rank has.

The protocol (:class:`FailureBoard`), per epoch (one training policy, say):

1. A rank whose work raises posts ``(its error, whether a peer had failed already)`` under the epoch's key and adds
   one to the epoch's failure count, unwinds out of the epoch (dropping the model), and aborts every process group
   (:func:`commbench.cluster.compat.abort_world`): a pending NCCL collective of the aborting rank itself returns.
   Under gloo it also shuts down its gloo connections (:func:`close_gloo_connections`), so a peer blocked on it
   fails at once ("Connection closed by peer"): gloo closes them only when the group is freed, and a DDP model
   that ever used the group keeps it alive in C++ after the model is gone (torch 2.13: neither ``abort`` nor
   ``destroy_process_group`` then closes a connection; measured).
2. Under NCCL a watcher thread on every rank polls the failure count every ``poll_s`` seconds (its own store
   client) and, when it rises, aborts that rank's groups: a peer blocked in a kernel is released by its own abort
   (``ncclCommAbort``), not by the failed rank's. Under gloo the failed rank's closed connections release its
   peers, and a local abort would not (gloo's ``abort`` leaves a pending operation waiting; measured), so there is
   no watcher. A collective that raised makes that rank post too, as a consequence (so the report names the
   cause, not the chain), and close its own connections in turn: a rank blocked on a healthy peer is released
   by the chain.
3. A rank that finished its work waits at the epoch's end (:meth:`FailureBoard.settle`) until every rank is done or
   one failed.
4. Every rank that saw a failure meets the others at a store barrier, initialises a fresh default process group
   (same backend, rank, timeout, device; a new store prefix) and raises :class:`RanksFailed` naming the ranks that
   failed first and their errors: the same text on every rank. Every group of the epoch is gone (the next policy
   makes its own).

Cost when nothing fails: one store query per ``poll_s`` on the watcher thread and one store round trip per rank
at each epoch's end. The sweep's collectives can run under the same board (one epoch per group of points).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from commbench.cluster import compat

T = TypeVar("T")

SHOWN_ERRORS = 3  # distinct errors named in a RanksFailed message; the rest are counted
ERROR_CHARS = 400  # a CUDA out-of-memory message is ~350 characters
POLL_S = 1.0
"""How often the watcher asks the store (a failure is named within this plus the time a rank takes to notice)."""


class RanksFailed(RuntimeError):
    """Some ranks failed; raised on every rank with the same ``failures``: (rank, error) of each rank that failed
    first, each error naming where it happened on that rank."""

    def __init__(self, failures: Sequence[tuple[int, str]]) -> None:
        self.failures = list(failures)
        by_error: dict[str, list[int]] = {}
        for rank, error in self.failures:
            by_error.setdefault(error, []).append(rank)
        parts = [f"{rank_list(ranks)}: {error}" for error, ranks in list(by_error.items())[:SHOWN_ERRORS]]
        rest = sum(len(ranks) for ranks in list(by_error.values())[SHOWN_ERRORS:])
        if rest:
            parts.append(f"{rest} more rank{'s' if rest > 1 else ''} with other errors")
        super().__init__("; ".join(parts))


def rank_list(ranks: Sequence[int]) -> str:
    """ "rank 1", "ranks 0-3, 6": consecutive ranks as ranges (a large world's failures stay one short line)."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def describe(exc: BaseException, where: str) -> str:
    """``OutOfMemoryError: CUDA out of memory ... (building the model)``: one line, shortened. An exception raised
    from another (torch's pipelining wraps a stage's error: "[Stage 1] failed to run forward") names that cause
    first, the error the user's code raised."""
    cause = exc.__cause__
    if cause is not None:
        outer = " ".join(str(exc).split())
        exc, suffix = cause, f" [in: {type(exc).__name__}: {outer[:80]}]"
    else:
        suffix = ""
    message = " ".join(str(exc).split()) + suffix
    if len(message) > ERROR_CHARS:
        message = message[: ERROR_CHARS - 3] + "..."
    return f"{type(exc).__name__}: {message} ({where})" if message else f"{type(exc).__name__} ({where})"


def _tcp_sockets() -> list[tuple[int, int, int]]:
    """(fd, local port, remote port) of this process's established TCP sockets (Linux ``/proc``; [] elsewhere)."""
    fds: dict[int, int] = {}
    try:
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{name}")
                if target.startswith("socket:["):
                    fds[int(target[8:-1])] = int(name)
    except OSError:
        return []
    out = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if len(cols) > 9 and cols[3] == "01" and int(cols[9]) in fds:  # 01: ESTABLISHED
                    out.append((fds[int(cols[9])], int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16)))
    return out


def close_gloo_connections(store_ports: set[int]) -> int:
    """Shut down every established TCP connection of this process except the rendezvous store's (local or remote
    port in ``store_ports``): in a rank those are gloo's pairs. ``shutdown`` acts on the socket, not on a file
    descriptor, so gloo's own descriptor sees it: the peer's pending receive fails at once. How many were shut."""
    done = 0
    for fd, local, remote in _tcp_sockets():
        if local in store_ports or remote in store_ports:
            continue
        with contextlib.suppress(OSError):
            s = socket.socket(fileno=os.dup(fd))
            try:
                s.shutdown(socket.SHUT_RDWR)
                done += 1
            finally:
                s.close()
    return done


def store_barrier(store: Any, key: str, world_size: int) -> None:
    """Every rank arrives before any leaves: O(1) store calls per rank (the last one to arrive opens the door)."""
    if int(store.add(f"{key}/arrived", 1)) == world_size:
        store.set(f"{key}/open", "1")
    store.wait([f"{key}/open"])


class _Watcher(threading.Thread):
    """Polls one epoch's failure count; calls ``on_failure`` once when it becomes non-zero."""

    def __init__(self, store: Any, key: str, poll_s: float, on_failure: Callable[[], None]) -> None:
        super().__init__(name="commbench-failure-watch", daemon=True)
        self.store, self.key, self.poll_s, self.on_failure = store, key, poll_s, on_failure
        self.stopped = threading.Event()
        self.fired = False

    def run(self) -> None:
        while not self.stopped.wait(self.poll_s):
            try:
                failed = int(self.store.add(self.key, 0))
            except Exception:  # the store is gone (teardown): nothing left to watch
                return
            if failed:
                self.fired = True
                self.on_failure()
                return

    def stop(self) -> None:
        self.stopped.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join()


class _Posted(BaseException):
    """This rank posted a failure (or saw one at the epoch's end): unwinds to :meth:`FailureBoard.epoch`. A
    BaseException, so that no ``except Exception`` on the way (a hook's, a library's) holds it."""


class FailureBoard:
    """The side channel of one world (module docstring). Make it after the default process group exists, on every
    rank; :meth:`epoch` around each unit of work (a policy), :meth:`run` around each phase in it.

    ``abort`` and ``rebuild`` are what a failure does to this process's groups (default: abort every group, then
    a fresh default group like the one there was); ``watch``: run the watcher (default: under NCCL); a test gives
    fakes, and ``rank``, ``world_size``, ``backend`` in place of the default group's."""

    def __init__(
        self,
        *,
        poll_s: float = POLL_S,
        store: Any | None = None,
        abort: Callable[[], None] | None = None,
        rebuild: Callable[[Any], None] | None = None,
        device: Any = None,
        watch: bool | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        backend: str | None = None,
    ) -> None:
        import torch
        import torch.distributed as dist

        self.rank = dist.get_rank() if rank is None else rank
        self.n = dist.get_world_size() if world_size is None else world_size
        base = store if store is not None else compat.default_store()
        self._base = base
        self.store = dist.PrefixStore("commbench/failures", base)
        self._watch_store = dist.PrefixStore("commbench/failures", compat.clone_store(base))
        self.poll_s = poll_s
        self.device = device if device is not None else torch.device("cpu")
        self._backend = str(dist.get_backend()) if backend is None else backend
        self._timeout = compat.default_timeout(self.device) if rebuild is None else None
        self._abort = abort or (self._abort_gloo if self._backend == "gloo" else compat.abort_world)
        self._store_ports = compat.store_ports(base)
        self._rebuild = rebuild or self._fresh_world
        self._lock = threading.Lock()
        self._aborted = False
        self._index = -1
        self.label = ""
        self._watcher: _Watcher | None = None
        self.watches = watch if watch is not None else self._backend == "nccl"
        """Whether a watcher aborts this rank's groups when a peer posts (module docstring, step 2)."""

    # --- epochs -------------------------------------------------------------------------------------------

    def epoch(self, label: str, fn: Callable[[], T]) -> T:
        """``fn()`` as the next epoch (the same order on every rank): its result when no rank failed in it, else
        :class:`RanksFailed` on every rank, after the recovery (module docstring)."""
        self._begin(label)
        try:
            result = fn()
            self._settle()
            return result
        except _Posted:
            pass
        finally:
            self._stop_watching()
        # Outside the handler: the exception and its traceback are gone, so the frames that held the epoch's model,
        # its DDP reducer and with it the process group are released; a gloo group's connections close only when
        # the group itself is freed (its abort leaves them open while anything holds it), which releases the peers.
        gc.collect()
        self._recover()

    def run(self, where: str, fn: Callable[[], T]) -> T:
        """``fn()`` as one phase of the current epoch; when it raises, its description is posted and the epoch
        ends on this rank (:meth:`epoch` recovers)."""
        try:
            return fn()
        except _Posted:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever stops this rank is posted, agreed, then skips the epoch
            # Turned into text here so nothing keeps the traceback, whose frames hold the epoch's model.
            error = describe(exc, where)
        self._post(error)
        raise _Posted

    def close(self) -> None:
        """Stop the watcher (at the end of the run)."""
        self._stop_watching()

    def failed_count(self) -> int:
        """How many ranks posted a failure in the current epoch."""
        return int(self.store.add(self._key("failed"), 0))

    # --- the protocol --------------------------------------------------------------------------------------

    def _key(self, what: str) -> str:
        return f"{self._index}/{what}"

    def _begin(self, label: str) -> None:
        self._stop_watching()
        self._index += 1
        self.label = label
        self._aborted = False
        if self.watches:
            self._watcher = _Watcher(self._watch_store, self._key("failed"), self.poll_s, self._abort_once)
            self._watcher.start()

    def _settle(self) -> None:
        """The epoch's end: wait until every rank is done (return) or one failed (end the epoch here)."""
        self.store.add(self._key("done"), 1)
        while True:
            if self.failed_count():
                raise _Posted
            if int(self.store.add(self._key("done"), 0)) >= self.n:
                return
            time.sleep(0.01)

    def _post(self, error: str) -> None:
        consequence = self.failed_count() > 0
        self.store.set(self._key(f"error/{self.rank}"), json.dumps([error, consequence]))
        self.store.add(self._key("failed"), 1)

    def _recover(self) -> NoReturn:
        """Abort, meet every rank, start a fresh default group, raise :class:`RanksFailed` alike on every rank."""
        self._abort_once()
        store_barrier(self.store, self._key("recovering"), self.n)
        posted = [(r, json.loads(self.store.get(self._key(f"error/{r}"))))
                  for r in range(self.n) if self.store.check([self._key(f"error/{r}")])]  # fmt: skip
        self._rebuild(self._base)
        first = [(r, str(e)) for r, (e, after) in posted if not after] or [(r, str(e)) for r, (e, _) in posted]
        raise RanksFailed(first)

    # --- the process groups --------------------------------------------------------------------------------

    def _abort_once(self) -> None:
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
        self._abort()

    def _abort_gloo(self) -> None:
        close_gloo_connections(self._store_ports)
        compat.abort_world()

    def _stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def _fresh_world(self, base: Any) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group(
            backend=self._backend,
            store=dist.PrefixStore(f"commbench/world/{self._index}", base),
            rank=self.rank,
            world_size=self.n,
            timeout=self._timeout,
            device_id=self.device if self._backend == "nccl" else None,
        )
