"""A local spawn listens on loopback only (rendezvous store and gloo), binds each rank to its own cores, and refuses
absurd world sizes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_util import FAST, commbench

pytestmark = pytest.mark.timeout(120)


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.add(int(p.name))
    return out


def _listening(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets in LISTEN state owned by ``pids`` (from `ss -ltnpH`)."""
    text = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    addrs = []
    for line in text.splitlines():
        if any(f"pid={p}," in line for p in pids):
            addrs.append(line.split()[3])
    return addrs


@pytest.mark.skipif(shutil.which("ss") is None or not Path("/proc").is_dir(), reason="needs iproute2's ss and /proc")
def test_local_spawn_listens_on_loopback_only(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["COMMBENCH_INJECT_FAULT"] = "hang:1:1"  # keep the world up (rank 1 stops at its second point)
    proc = subprocess.Popen(
        [sys.executable, "-m", "commbench", "run", "--collectives", "all_reduce", "--precisions", "fp32", "-b", "1K",
         "-e", "4K", "--nproc", "2", "--timeout", "20", "--no-training", "--no-report", "--quiet", "--out",
         str(tmp_path / "run")],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        addrs: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ranks = _children(proc.pid)
            addrs = _listening(ranks)
            # the store (rank 0) and gloo's listeners (each rank) are up once results start
            if len(ranks) == 2 and len(addrs) >= 3 and (tmp_path / "run" / "rows.jsonl").exists():
                break
            time.sleep(0.2)
        assert len(addrs) >= 3, f"no listeners seen: {addrs}"
        for a in addrs:
            host = a.rsplit(":", 1)[0].strip("[]")
            assert host in ("127.0.0.1", "::ffff:127.0.0.1", "::1"), f"a rank listens on {a}: {addrs}"
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def test_local_nproc_bound_names_the_limit() -> None:
    from commbench.cluster.launch import check_local_nproc

    check_local_nproc(16, cores=2)
    with pytest.raises(ValueError, match=r"--nproc 100000 .* at most 16"):
        check_local_nproc(100000, cores=2)
    check_local_nproc(64, cores=16)
    with pytest.raises(ValueError, match="at most 64"):
        check_local_nproc(65, cores=16)


def test_core_blocks_split_the_allowed_cores_or_leave_oversubscribed_ranks_alone() -> None:
    from commbench.cluster.launch import core_blocks, describe_cores

    assert core_blocks([0, 1], 2) == [{0}, {1}]
    assert core_blocks([0, 1, 2, 3, 4, 5, 6], 3) == [{0, 1}, {2, 3}, {4, 5}]  # core 6 left over
    assert core_blocks([4, 5, 8, 9], 2) == [{4, 5}, {8, 9}]  # the allowed set, not 0..n-1
    assert core_blocks([0, 1], 3) is None
    assert core_blocks([0], 0) is None
    assert describe_cores({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert describe_cores([5]) == "5"


def _rank_cores(run: Path) -> tuple[int, list[str]]:
    import json

    meta = json.loads((run / "metadata.json").read_text())
    (node,) = meta["node_reports"]
    return meta["threads_per_rank"], node["rank_cores"]


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 allowed cores"
)
@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_local_spawn_binds_each_rank_to_its_own_cores_unless_told_not_to(spawn: str, tmp_path: Path) -> None:
    """Both ways of starting ranks (forked from the supervisor, or fresh interpreters) give the same world: bound
    cores, rows, and what the supervisor printed before the spawn printed once."""
    from commbench.cluster.launch import core_blocks, describe_cores

    allowed = sorted(os.sched_getaffinity(0))
    args = ["run", "--collectives", "all_reduce", "--precisions", "fp32", "-b", "1K", "-e", "1K", "--nproc", "2", *FAST,
            "-c", "1"]  # fmt: skip
    env = {"COMMBENCH_PIN_RANKS": "", "COMMBENCH_SPAWN": spawn}
    p = commbench(*args, "--out", str(tmp_path / "bound"), cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    threads, cores = _rank_cores(tmp_path / "bound")
    blocks = core_blocks(allowed, 2)
    assert blocks is not None
    assert cores == [describe_cores(b) for b in blocks] and threads == len(blocks[0])
    notes = [line for line in p.stderr.splitlines() if line.startswith("# note:")]
    assert notes and len(notes) == len(set(notes)), p.stderr  # nothing buffered before the fork printed twice
    assert p.stdout.count("all_reduce") >= 1 and (tmp_path / "bound" / "rows.jsonl").read_text().count("\n") >= 1
    p = commbench(*args, "--out", str(tmp_path / "free"), cwd=tmp_path, env={**env, "COMMBENCH_PIN_RANKS": "0"})
    assert p.returncode == 0, p.stderr
    assert _rank_cores(tmp_path / "free")[1] == [describe_cores(allowed)] * 2


def test_fork_is_refused_where_it_is_unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from commbench.cluster import forked

    monkeypatch.setenv("COMMBENCH_SPAWN", "exec")
    assert forked.fork_refusal() == "COMMBENCH_SPAWN=exec"
    monkeypatch.setenv("COMMBENCH_SPAWN", "vfork")
    with pytest.raises(ValueError, match="COMMBENCH_SPAWN='vfork': valid values are fork, exec"):
        forked.fork_refusal()
    monkeypatch.setenv("COMMBENCH_SPAWN", "fork")
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert "Python threads in the supervisor" in (forked.fork_refusal() or "")
    finally:
        stop.set()
        t.join()
    monkeypatch.setitem(sys.modules, "pynvml", object())
    if threading.active_count() == 1:  # pytest-xdist's worker may run threads of its own
        assert forked.fork_refusal() == "NVML is loaded in the supervisor"


def test_forked_rank_reports_exit_codes_and_signals_as_popen_does() -> None:
    import signal

    from commbench.cluster.forked import ForkedRank

    # the Popen objects stay referenced: a collected one is reaped by subprocess itself, and the exit code with it
    done = subprocess.Popen(["sh", "-c", "exit 3"])
    rank = ForkedRank(done.pid)
    assert rank.wait(timeout=30) == 3 and rank.poll() == 3
    sleeping = subprocess.Popen(["sleep", "30"])
    rank = ForkedRank(sleeping.pid)
    assert rank.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        rank.wait(timeout=0.05)
    rank.terminate()
    assert rank.wait(timeout=30) == -signal.SIGTERM
    rank.kill()  # an ended rank: nothing to signal, no error
