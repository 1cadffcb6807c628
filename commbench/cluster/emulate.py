"""Emulated hosts on one machine: network namespaces as nodes, a bridge between them, links shaped with ``tc tbf``.

:class:`EmulatedCluster` creates a hub namespace holding a bridge and N node namespaces, each joined to the
bridge by a veth pair and given a link-local address (``169.254.1.<i+1>/16``) that exists only inside these
namespaces, so a job on the cluster sends traffic to nothing outside it. Each node's link can be shaped to a
rate in both directions (``tbf`` on the node's ``eth0`` for its egress, on the bridge port for its ingress);
netem is not assumed, so only bandwidth is emulated. Processes run through ``ip netns exec`` inside a fresh
UTS namespace with the node's own host name, because commbench counts nodes by ``socket.gethostname()``.

:mod:`commbench.cluster.emulate_jobs` runs jobs on it (``torchrun`` on every node, or ranks as Slurm and Open MPI
start them) and holds the CLI.

Teardown kills every process inside the namespaces (``ip netns pids``) and deletes the namespaces, which
removes their links and the bridge with them. It runs on leaving the ``with`` block (exceptions included), on
SIGTERM/SIGHUP while the block is active, and at interpreter exit; :func:`cleanup_stale` removes what a
killed owner (SIGKILL) left behind. Needs root, ``ip`` and ``tc`` (iproute2).

"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

DEFAULT_PREFIX = "cbemu"
QUEUE_LATENCY = "1s"
"""tbf queue length as time at the rate (see where the qdisc is added)."""
"""Namespace names are ``<prefix>-<owner pid>-<instance>-{hub,n<i>}``; the pid lets stale ones be found."""
NODE_IFNAME = "eth0"
"""The node's end of its veth pair (inside the node namespace, so the name never collides)."""
MASTER_PORT = 29500
"""Node 0's rendezvous port: its namespace is fresh, so the port is always free there."""
MAX_NODES = 250
ETC_NETNS = Path("/etc/netns")
"""``ip netns exec NS`` bind-mounts ``/etc/netns/NS/*`` over ``/etc``: each node gets a ``hosts`` file naming
every node, so host names resolve (and addresses reverse-resolve) inside the cluster as on a real one."""

_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)\s*$", re.IGNORECASE)
_RATE_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_RATE_BYTES = {"bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}  # tc: "bps" is bytes per second

# Variables that would make a process started inside a node join (or think it is in) the caller's world.
_WORLD_ENV = re.compile(
    r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|ROLE_RANK|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_.*|"
    r"COMMBENCH_PARENT_PID|COMMBENCH_ARGV|COMMBENCH_LAUNCHER|COMMBENCH_STORE_FD|SLURM_.*|OMPI_.*|PMI_.*|PMIX_.*)$"
)


class EmulationError(RuntimeError):
    """The emulated cluster could not be created or used (missing privilege or tool, a failed ``ip``/``tc``)."""


def rate_bits_per_s(rate: str) -> float:
    """A ``tc`` rate (``200mbit``, ``1gbit``, ``10mbps`` = bytes) in bits per second; ValueError when malformed."""
    m = _RATE_RE.match(rate)
    if not m:
        raise ValueError(f"rate must look like 100mbit, 1gbit or 50mbps (tc units), got {rate!r}")
    value, unit = float(m.group(1)), m.group(2).lower()
    bits = value * (_RATE_BITS.get(unit) or _RATE_BYTES[unit])
    if bits <= 0:
        raise ValueError(f"rate must be positive, got {rate!r}")
    return bits


def missing_requirements() -> str | None:
    """Why this process cannot emulate a cluster (not root, no ``ip``/``tc``/``unshare``), or ``None``."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    return None


def _sh(argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EmulationError(f"`{' '.join(argv)}` failed: {e}") from None
    if check and p.returncode != 0:
        raise EmulationError(f"`{' '.join(argv)}` failed ({p.returncode}): {p.stderr.strip()}")
    return p


def list_namespaces() -> list[str]:
    """Names of the network namespaces that ``ip netns`` knows."""
    out = _sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_namespace_processes(ns: str, attempts: int = 20) -> None:
    """SIGKILL every process whose network namespace is ``ns`` until none is left (children forked meanwhile too)."""
    for _ in range(attempts):
        pids = [int(p) for p in _sh(["ip", "netns", "pids", ns], check=False).stdout.split() if p.isdigit()]
        pids = [p for p in pids if p != os.getpid()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _delete_namespace(ns: str) -> str | None:
    """Kill what runs in ``ns`` and delete it (its links go with it) and its ``/etc/netns`` files; error text or ``None``."""
    _kill_namespace_processes(ns)
    shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
    p = _sh(["ip", "netns", "delete", ns], check=False)
    if p.returncode != 0 and ns in list_namespaces():
        return f"{ns}: {p.stderr.strip()}"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(prefix: str = DEFAULT_PREFIX, *, everything: bool = False) -> list[str]:
    """Delete namespaces named ``<prefix>-<pid>-...`` whose owner process is gone (all of them with ``everything``).

    Returns the deleted names. Covers an owner killed with SIGKILL, the one exit no handler sees.
    """
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-\d+-(hub|n\d+)$")
    removed = []
    for ns in list_namespaces():
        m = pattern.match(ns)
        if m and (everything or not _pid_alive(int(m.group(1)))):
            if _delete_namespace(ns) is None:
                removed.append(ns)
    return removed


@dataclass(frozen=True, slots=True)
class Node:
    """One emulated host."""

    index: int
    netns: str
    hostname: str
    address: str
    """IPv4 address of ``ifname`` (link-local, on this cluster's bridge only)."""
    ifname: str = NODE_IFNAME
    bridge_port: str = ""
    """The veth end on the bridge, in the hub namespace."""


_live: weakref.WeakSet[EmulatedCluster] = weakref.WeakSet()
_instances = itertools.count()


def _close_all_live() -> None:
    for cluster in list(_live):
        cluster.close()


atexit.register(_close_all_live)


class EmulatedCluster:
    """N network-namespace "nodes" on one bridge, optionally rate-limited; a context manager.

    >>> with EmulatedCluster(nodes=2, rate="200mbit") as c:      # doctest: +SKIP
    ...     c.run(1, ["ping", "-c1", c.nodes[0].address])
    """

    def __init__(
        self,
        nodes: int = 2,
        rate: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        burst: str | None = None,
        node_rates: Mapping[int, str] | None = None,
    ) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be in 1..{MAX_NODES}, got {nodes}")
        # A node whose link is shaped apart from the others' (a degraded NIC, for the gate's tests): its rate
        # replaces ``rate`` on its two tbf queues; each node reads its own shaping back (tc) for link_util.
        self.node_rates = dict(node_rates or {})
        for i, r in self.node_rates.items():
            if not 0 <= i < nodes:
                raise ValueError(f"node_rates names node {i}; nodes are 0..{nodes - 1}")
            rate_bits_per_s(r)
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,15}", prefix):
            raise ValueError(f"prefix must be a letter then up to 15 letters, digits or _, got {prefix!r}")
        self.rate = rate
        self.rate_bps = rate_bits_per_s(rate) if rate is not None else None
        # The bucket must hold a whole GSO segment (64 KiB on veth) or large packets are dropped; beyond that,
        # ~1 ms of traffic at the rate: a message starting with a full bucket passes its first `burst` bytes at
        # memory speed, which inflates the busbw of MiB-sized messages with a larger bucket (figures:
        # benchmarks/results/2026-12-01_2core-vm_gloo.md).
        self.burst = burst or (f"{max(96 * 1024, int((self.rate_bps or 0) / 8 * 0.001))}b" if rate else None)
        self.prefix = prefix
        self.name = f"{prefix}-{os.getpid()}-{next(_instances)}"
        self.hub = f"{self.name}-hub"
        self.bridge = "br0"
        self.nodes: tuple[Node, ...] = tuple(
            Node(
                index=i,
                netns=f"{self.name}-n{i}",
                hostname=f"{prefix}-node{i}",
                address=f"169.254.1.{i + 1}",
                bridge_port=f"v{i}",
            )
            for i in range(nodes)
        )
        self._created: list[str] = []
        self._procs: list[subprocess.Popen[Any]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._saved_handlers: dict[int, Any] = {}

    # -- lifecycle -----------------------------------------------------------------------------------------

    def __enter__(self) -> EmulatedCluster:
        self._install_signal_handlers()
        try:
            self.start()
        except BaseException:
            self._restore_signal_handlers()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            self._restore_signal_handlers()

    def start(self) -> None:
        """Create the namespaces, bridge, links, addresses and shaping; on any failure remove what exists."""
        why = missing_requirements()
        if why:
            raise EmulationError(why)
        _live.add(self)
        try:
            self._add_ns(self.hub)
            self._ip(self.hub, "link", "add", self.bridge, "type", "bridge")
            self._ip(self.hub, "link", "set", self.bridge, "up")
            self._ip(self.hub, "link", "set", "lo", "up")
            for n in self.nodes:
                self._add_ns(n.netns)
                self._write_hosts(n)
                self._ip(
                    self.hub, "link", "add", n.bridge_port, "type", "veth", "peer", "name", n.ifname, "netns", n.netns
                )
                self._ip(self.hub, "link", "set", n.bridge_port, "master", self.bridge)
                self._ip(self.hub, "link", "set", n.bridge_port, "up")
                self._ip(n.netns, "addr", "add", f"{n.address}/16", "dev", n.ifname)
                self._ip(n.netns, "link", "set", n.ifname, "up")
                self._ip(n.netns, "link", "set", "lo", "up")
                rate = self.node_rates.get(n.index, self.rate)
                if rate is not None:
                    # A queue of 1 s at the rate: a collective puts whole MiB-sized buffers on the link at once (two
                    # inter-node groups share a node's link), and a shorter queue overflowed and ran large
                    # all_gathers below the rate (figures: benchmarks/results/2026-12-01_2core-vm_gloo.md).
                    for ns, dev in ((n.netns, n.ifname), (self.hub, n.bridge_port)):
                        _sh(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                             "rate", rate, "burst", self._burst(rate), "latency", QUEUE_LATENCY])  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _burst(self, rate: str) -> str:
        """The cluster's burst at ``rate`` (a given ``burst`` wins; else the rule in ``__init__``)."""
        if rate == self.rate and self.burst:
            return str(self.burst)
        return f"{max(96 * 1024, int(rate_bits_per_s(rate) / 8 * 0.001))}b"

    def _add_ns(self, ns: str) -> None:
        _sh(["ip", "netns", "add", ns])
        self._created.append(ns)

    def _write_hosts(self, n: Node) -> None:
        d = ETC_NETNS / n.netns
        d.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{m.address}\t{m.hostname}" for m in self.nodes]
        # A dual-stack listener (the c10d store) sees peers as v4-mapped IPv6 addresses.
        lines += [f"::ffff:{m.address}\t{m.hostname}" for m in self.nodes]
        (d / "hosts").write_text("\n".join(lines) + "\n")

    @staticmethod
    def _ip(ns: str, *args: str) -> None:
        _sh(["ip", "-n", ns, *args])

    def close(self) -> None:
        """Kill every process in the cluster and delete its namespaces; idempotent, safe on a half-built cluster."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            errors = []
            for p in self._procs:
                _kill_group(p)
            # Nodes first: deleting a node namespace deletes its veth pair, then the hub takes the bridge.
            for ns in reversed(self._created):
                err = _delete_namespace(ns)
                if err:
                    errors.append(err)
            for p in self._procs:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    errors.append(f"pid {p.pid} did not exit")
            _live.discard(self)
        if errors:
            raise EmulationError("teardown incomplete: " + "; ".join(errors))

    @property
    def namespaces(self) -> list[str]:
        """Every namespace this cluster created (hub first)."""
        return list(self._created)

    def _install_signal_handlers(self) -> None:
        # SIGTERM/SIGHUP would end the interpreter without unwinding: turn them into SystemExit so the `with`
        # block's teardown runs. Only where nobody else has claimed the signal, and only from the main thread.
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                self._saved_handlers[sig] = signal.signal(sig, _raise_exit)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._saved_handlers.items():
            signal.signal(sig, handler)
        self._saved_handlers.clear()

    # -- processes -----------------------------------------------------------------------------------------

    def node(self, node: int | Node) -> Node:
        if isinstance(node, Node):
            return node
        if not 0 <= node < len(self.nodes):
            raise ValueError(f"node must be in 0..{len(self.nodes) - 1}, got {node}")
        return self.nodes[node]

    def command(self, node: int | Node, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run in ``node``'s network namespace with its own UTS namespace and host name."""
        n = self.node(node)
        return ["ip", "netns", "exec", n.netns, "unshare", "--uts", "--",
                "sh", "-c", 'hostname "$0" && exec "$@"', n.hostname, *argv]  # fmt: skip

    def environment(self, node: int | Node, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The caller's environment minus any launcher's world variables, plus ``HOSTNAME`` and ``env``."""
        n = self.node(node)
        out = {k: v for k, v in os.environ.items() if not _WORLD_ENV.match(k)}
        out["HOSTNAME"] = n.hostname
        out.update(env or {})
        return out

    def popen(
        self, node: int | Node, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``node`` (its own session; killed at teardown). kwargs go to Popen."""
        if self._closed or not self._created:
            raise EmulationError(f"cluster {self.name} is not running")
        p = subprocess.Popen(
            self.command(node, argv),
            env=self.environment(node, env),
            start_new_session=True,
            preexec_fn=_die_with_parent,
            **kwargs,
        )
        self._procs.append(p)
        return p

    def run(
        self,
        node: int | Node,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        timeout: float | None = 60,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``node`` to completion, output captured as text; killed (and raised) after ``timeout``."""
        p = self.popen(node, argv, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            p.communicate()
            raise
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def describe(self) -> str:
        """What exists: namespaces, addresses, host names and shaping, one node a line."""
        shaping = f"tbf {self.rate} both directions (burst {self.burst})" if self.rate else "unshaped"
        lines = [f"cluster {self.name}: bridge {self.bridge} in netns {self.hub}, links {shaping}"]
        lines += [
            f"  node{n.index}: netns {n.netns}  host {n.hostname}  {n.ifname} {n.address}/16  <-> {n.bridge_port}"
            + (f"  tbf {self.node_rates[n.index]}" if n.index in self.node_rates else "")
            for n in self.nodes
        ]
        return "\n".join(lines)


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _die_with_parent() -> None:
    # A SIGKILLed owner cannot tear down; at least its direct children (torchrun, which then stops its
    # workers) go with it. cleanup_stale() removes the namespaces.
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _kill_group(p: subprocess.Popen[Any]) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
