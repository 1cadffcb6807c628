"""A local spawn listens on loopback only (rendezvous store and gloo), and refuses absurd world sizes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
    from commbench.launch import check_local_nproc

    check_local_nproc(16, cores=2)
    with pytest.raises(ValueError, match=r"--nproc 100000 .* at most 16"):
        check_local_nproc(100000, cores=2)
    check_local_nproc(64, cores=16)
    with pytest.raises(ValueError, match="at most 64"):
        check_local_nproc(65, cores=16)
