"""The failure side channel (`commbench.cluster.failures`) in one process, with fakes for what only a GPU or a second
process would show.

NCCL's semantics, modelled: a collective whose peer failed stays pending until this rank aborts its own
communicator (``ncclCommAbort``), and then returns with an error. Two ranks are two threads sharing one in-process
store; rank 1 fails in a phase, rank 0 sits in such a collective. The watcher must abort rank 0 (the failed rank's
abort releases nobody under NCCL), both ranks must raise the same `RanksFailed` naming rank 1's error only (rank 0's
"aborted" error is a consequence), and each rank must have made a fresh group once. gloo's release (the failed
rank's connections shut down) is checked on real sockets: the peer's receive ends, the store's connection stays.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest
import torch.distributed as dist

from commbench.cluster.failures import FailureBoard, RanksFailed, close_gloo_connections, describe

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


class FakeComm:
    """One rank's NCCL communicator: a pending collective returns (with an error) only after a local abort."""

    def __init__(self) -> None:
        self.aborted = threading.Event()
        self.aborts = 0
        self.rebuilds = 0

    def abort(self) -> None:
        self.aborts += 1
        self.aborted.set()

    def rebuild(self, store: Any) -> None:
        self.rebuilds += 1

    def pending_collective(self) -> None:
        if not self.aborted.wait(timeout=30):  # bounded, so a broken watcher fails the test rather than hanging it
            raise AssertionError("the collective was never released")
        raise RuntimeError("NCCL communicator was aborted on rank 0")


@pytest.mark.timeout(60)
def test_a_failure_inside_a_phase_releases_a_peer_blocked_in_an_nccl_collective() -> None:
    store = dist.HashStore()
    comms = [FakeComm(), FakeComm()]
    boards = [
        FailureBoard(store=store, rank=r, world_size=2, backend="nccl", poll_s=0.05,
                     abort=comms[r].abort, rebuild=comms[r].rebuild)
        for r in range(2)
    ]  # fmt: skip
    assert all(b.watches for b in boards)  # NCCL: a watcher on every rank
    outcome: dict[int, Any] = {}

    def oom() -> None:
        raise RuntimeError(OOM)

    work = {0: comms[0].pending_collective, 1: oom}

    def rank(r: int) -> None:
        try:
            boards[r].epoch("policy", lambda: boards[r].run("step 1", work[r]))
            outcome[r] = "finished"
        except RanksFailed as exc:
            outcome[r] = exc.failures
        finally:
            boards[r].close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=50)
    assert outcome == {0: [(1, f"RuntimeError: {OOM} (step 1)")], 1: [(1, f"RuntimeError: {OOM} (step 1)")]}
    assert [c.aborts for c in comms] == [1, 1] and [c.rebuilds for c in comms] == [1, 1]
    # the next epoch starts clean on both ranks: no failure carried over
    results = []
    for b in boards:
        b._begin("next")
        results.append(b.failed_count())
        b.close()
    assert results == [0, 0]


def test_a_clean_epoch_returns_its_result_on_every_rank() -> None:
    store = dist.HashStore()
    comms = [FakeComm(), FakeComm()]
    boards = [FailureBoard(store=store, rank=r, world_size=2, backend="gloo", abort=comms[r].abort,
                           rebuild=comms[r].rebuild) for r in range(2)]  # fmt: skip
    assert not any(b.watches for b in boards)  # gloo: the failed rank's shut connections release its peers
    out: dict[int, int] = {}
    threads = [threading.Thread(target=lambda r=r: out.setdefault(r, boards[r].epoch("p", lambda: 10 + r)))
               for r in range(2)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert out == {0: 10, 1: 11} and [c.aborts for c in comms] == [0, 0]


def test_closing_gloo_connections_ends_the_peers_receive_and_spares_the_store() -> None:
    def pair() -> tuple[socket.socket, socket.socket, socket.socket]:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        return listener, client, server

    store_l, store_c, store_s = pair()
    gloo_l, gloo_c, gloo_s = pair()
    try:
        store_port = store_l.getsockname()[1]
        closed = close_gloo_connections({store_port})
        assert closed >= 2  # both ends of the "gloo" pair live in this process
        gloo_c.settimeout(5)
        assert gloo_c.recv(1) == b""  # the peer sees the connection closed: its pending receive ends
        store_c.sendall(b"x")
        store_s.settimeout(5)
        assert store_s.recv(1) == b"x"  # the store's connection is untouched
    finally:
        for s in (store_l, store_c, store_s, gloo_l, gloo_c, gloo_s):
            s.close()


def test_a_wrapped_error_is_named_by_its_cause() -> None:
    try:
        try:
            raise ValueError("the user's error")
        except ValueError as inner:
            raise RuntimeError("[Stage 1] failed to run forward: args: (...)") from inner
    except RuntimeError as exc:
        text = describe(exc, "step 0")
    assert text == "ValueError: the user's error [in: RuntimeError: [Stage 1] failed to run forward: args: (...)] (step 0)"


def test_compat_falls_back_to_the_older_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed import _functional_collectives as funcol

    from commbench.cluster import compat

    calls: list[str] = []
    monkeypatch.delattr(funcol, "all_gather_single", raising=False)
    monkeypatch.delattr(funcol, "reduce_scatter_single", raising=False)
    monkeypatch.setattr(funcol, "all_gather_tensor", lambda t, dim, g: calls.append(f"all_gather_tensor {dim}") or t)
    monkeypatch.setattr(funcol, "reduce_scatter_tensor", lambda t, op, dim, g: calls.append(f"rs {op} {dim}") or t)
    compat.all_gather_single("x", 1, None)
    compat.reduce_scatter_single("x", "sum", 1, None)
    assert calls == ["all_gather_tensor 1", "rs sum 1"]  # torch < 2.10's names, same arguments
    fully_shard, mp = compat.fsdp2()
    assert fully_shard.__name__ == "fully_shard" and mp.__name__ == "MixedPrecisionPolicy"
    assert compat.pipeline_schedule("ScheduleGPipe") is not None and compat.pipeline_schedule("ScheduleNope") is None
    tcp = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    assert compat.store_ports(dist.PrefixStore("a", dist.PrefixStore("b", tcp))) == {tcp.port}
    assert compat.store_ports(dist.HashStore()) == set()
