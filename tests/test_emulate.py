"""Emulated hosts: namespaces, addresses and host names exist while the cluster does and are all gone after it
(also after an exception, SIGTERM, or a SIGKILLed owner plus ``cleanup_stale``); a 2-node torchrun job of
commbench crosses the links; ``tbf`` shaping limits the measured bandwidth in proportion to the rate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import commbench
from commbench.cluster.emulate import (
    EmulatedCluster,
    cleanup_stale,
    list_namespaces,
    missing_requirements,
    rate_bits_per_s,
)
from commbench.cluster.emulate_jobs import launch_job
from tests.cli_util import FAST

PREFIX = "cbtest"
WHY = missing_requirements()
needs_root = pytest.mark.skipif(WHY is not None, reason=f"emulated hosts unavailable: {WHY}")
REPO = Path(__file__).resolve().parent.parent


def _ours() -> list[str]:
    return [ns for ns in list_namespaces() if ns.startswith(f"{PREFIX}-{os.getpid()}-")]


def _sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


# -- no privilege needed --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "bits"), [("200mbit", 200e6), ("1gbit", 1e9), ("1.5Gbit", 1.5e9), ("10mbps", 80e6), ("64kbit", 64e3)]
)
def test_rate_units_follow_tc(rate: str, bits: float) -> None:
    # tc(8): "bit"-suffixed units are bits per second, "bps"-suffixed ones are bytes per second.
    assert rate_bits_per_s(rate) == pytest.approx(bits)


@pytest.mark.parametrize("bad", ["fast", "100", "100mb", "-1mbit", "0mbit"])
def test_bad_rate_is_a_value_error(bad: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        EmulatedCluster(nodes=2, rate=bad)


@pytest.mark.timeout(30)
def test_cli_bad_input_exits_2_in_one_line() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "commbench.emulate", "--nodes", "2", "--rate", "fast", "--", "run"],
        capture_output=True, text=True, timeout=30, cwd=REPO,
    )  # fmt: skip
    assert p.returncode == 2 and "rate must look like" in p.stderr and len(p.stderr.strip().splitlines()) == 1


# -- root, ip, tc -----------------------------------------------------------------------------------------------


@needs_root
@pytest.mark.timeout(60)
def test_namespaces_addresses_hostnames_then_all_gone() -> None:
    with EmulatedCluster(nodes=3, prefix=PREFIX) as c:
        assert sorted(_ours()) == sorted(c.namespaces) and len(c.namespaces) == 4
        for n in c.nodes:
            addr = _sh("ip", "-n", n.netns, "-4", "-o", "addr", "show", "dev", "eth0")
            assert f"inet {n.address}/16" in addr and n.address.startswith("169.254.")
            assert "UP" in _sh("ip", "-n", n.netns, "link", "show", "lo")
            r = c.run(n.index, [sys.executable, "-c", "import socket; print(socket.gethostname())"])
            assert r.stdout.strip() == n.hostname
        assert len({n.hostname for n in c.nodes}) == len({n.address for n in c.nodes}) == 3
        # The nodes reach each other over the bridge: a TCP echo from node 2 to node 0.
        server = c.popen(0, [sys.executable, "-c", textwrap.dedent(f"""
            import socket
            s = socket.create_server(("{c.nodes[0].address}", 5000)); print("ready", flush=True)
            conn, _ = s.accept(); conn.sendall(conn.recv(16))
        """)], stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        client = c.run(2, [sys.executable, "-c", "import socket; s = socket.create_connection(('cbtest-node0', 5000), timeout=10); s.sendall(b'hi'); print(s.recv(16).decode())"])  # fmt: skip
        assert client.returncode == 0 and client.stdout.strip() == "hi", client.stderr
        # ...and nothing outside the cluster exists for them: no default route.
        assert "default" not in _sh("ip", "-n", c.nodes[0].netns, "route")
        names = c.namespaces
    assert not set(names) & set(list_namespaces())
    assert not any((Path("/etc/netns") / ns).exists() for ns in names)


@needs_root
@pytest.mark.timeout(60)
def test_exception_inside_removes_namespaces_and_processes() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with EmulatedCluster(nodes=2, rate="100mbit", prefix=PREFIX) as c:
            p = c.popen(1, ["sleep", "1000"])
            names = c.namespaces
            raise RuntimeError("boom")
    assert p.poll() is not None
    assert not set(names) & set(list_namespaces()) and not _ours()


@needs_root
@pytest.mark.timeout(60)
def test_parallel_clusters_do_not_collide() -> None:
    with EmulatedCluster(nodes=2, prefix=PREFIX) as a, EmulatedCluster(nodes=2, prefix=PREFIX) as b:
        assert not set(a.namespaces) & set(b.namespaces)
        assert len(_ours()) == 6
    assert not _ours()


_OWNER = """
import sys, time
from commbench.cluster.emulate import EmulatedCluster
with EmulatedCluster(nodes=2, prefix=sys.argv[1]) as c:
    c.popen(0, ["sleep", "1000"])
    print(" ".join(c.namespaces), flush=True)
    time.sleep(1000)
"""


def _owner(prefix: str) -> tuple[subprocess.Popen[str], list[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-c", _OWNER, prefix], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None
    return p, p.stdout.readline().split()


@needs_root
@pytest.mark.timeout(60)
def test_sigterm_to_the_owner_tears_down() -> None:
    p, names = _owner("cbtestterm")
    assert len(names) == 3 and set(names) <= set(list_namespaces())
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    assert not set(names) & set(list_namespaces())


@needs_root
@pytest.mark.timeout(60)
def test_cleanup_stale_after_sigkill() -> None:
    p, names = _owner("cbtestkill")
    p.kill()
    p.wait(timeout=10)
    assert set(names) <= set(list_namespaces())  # SIGKILL: nobody could tear down
    sleeper_pids = [int(x) for ns in names for x in _sh("ip", "netns", "pids", ns).split()]
    removed = cleanup_stale("cbtestkill")
    assert sorted(removed) == sorted(names) and not set(names) & set(list_namespaces())
    time.sleep(0.2)
    for pid in sleeper_pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


@needs_root
@pytest.mark.timeout(60)
def test_cleanup_stale_spares_live_owners() -> None:
    with EmulatedCluster(nodes=1, prefix=PREFIX) as c:
        assert cleanup_stale(PREFIX) == [] and set(c.namespaces) <= set(list_namespaces())


@needs_root
@pytest.mark.timeout(60)
def test_job_timeout_kills_every_process() -> None:
    with EmulatedCluster(nodes=2, prefix=PREFIX) as c:
        job = launch_job(c, 1, ["run", "--collectives", "all_reduce", "-b", "1K", "-e", "1K", *FAST], timeout=1.5)
        assert job.timed_out and job.returncode == 124
        for n in c.nodes:
            assert _sh("ip", "netns", "pids", n.netns).split() == []


@needs_root
@pytest.mark.timeout(240)
def test_two_node_commbench_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with EmulatedCluster(nodes=2, prefix=PREFIX) as c:
        job = launch_job(
            c, 1, ["run", "--collectives", "all_reduce,all_gather", "--precisions", "fp32,bf16", "-b", "1K", "-e", "16K",
                   "-f", "4", "--out", str(out), *FAST], timeout=200,
        )  # fmt: skip
    assert job.returncode == 0, [r.stderr[-2000:] for r in job.nodes]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["nodes"] == 2 and meta["world_size"] == 2 and meta["launcher"] == "torchrun"
    assert sorted(meta["hosts"]) == sorted(n.hostname for n in c.nodes)
    df = commbench.load(out)
    assert len(df) == 2 * 2 * 3 and set(df["nodes"]) == {2}  # collectives x precisions x {1K, 4K, 16K}
    assert (df["wrong"] == 0).all()


def _busbw_4mib(rate: str, out: Path) -> float:
    with EmulatedCluster(nodes=2, rate=rate, prefix=PREFIX) as c:
        job = launch_job(
            c, 1, ["run", "--collectives", "all_reduce", "--precisions", "fp32", "-b", "4M", "-e", "4M", "--no-check",
                   "--out", str(out), *FAST], timeout=200,
        )  # fmt: skip
    assert job.returncode == 0, [r.stderr[-2000:] for r in job.nodes]
    return float(commbench.load(out)["busbw_gbps"].iloc[0])


@needs_root
@pytest.mark.timeout(300)
def test_shaping_limits_bandwidth(tmp_path: Path) -> None:
    fast = _busbw_4mib("1gbit", tmp_path / "fast")
    slow = _busbw_4mib("100mbit", tmp_path / "slow")
    # 2 ranks: all_reduce busbw = the bytes each rank sends per second, so it sits just under the link rate.
    assert slow <= 0.1e9 / 8 / 1e9 * 1.15, slow
    assert 5 < fast / slow < 13, (fast, slow)
