"""link_util's denominator: which link a group crosses and its rate, against line rates written out by hand
(Gb/s -> GB/s: divide by 8), the data sheets' NVLink totals and PCIe's per-lane rates."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from commbench.cluster.metadata import (
    NO_LINK,
    ONE_RANK,
    gpu_link_gbps,
    group_link,
    nics,
    node_link,
    shaped_rates,
)
from commbench.measure.groups import get_group_kind


def nic(
    name: str, mbps: int | None, *, virtual: bool = False, shaped: float | None = None, up: bool = True
) -> dict[str, Any]:
    return {"name": name, "speed_mbps": mbps, "virtual": virtual, "shaped_mbps": shaped, "up": up}


def test_node_link_nccl_spreads_over_the_fastest_nics_gloo_takes_one() -> None:
    node = [nic("eno1", 100_000), *(nic(f"ib{i}", 400_000) for i in range(8)), nic("docker0", None, virtual=True)]
    nccl = node_link(node, {}, "nccl")
    assert nccl["gbps"] == pytest.approx(8 * 400e9 / 8 / 1e9)  # 8 x 400 Gb/s = 400 GB/s
    assert nccl["label"].startswith("8 × 400 Gb/s") and nccl["nics"] == [f"ib{i}" for i in range(8)]
    gloo = node_link(node, {}, "gloo")
    assert gloo["gbps"] == pytest.approx(50.0) and gloo["nics"] == ["ib0"]
    # named by the backend's variable: that NIC, even when a faster one exists (NCCL syntax: prefix, =exact, ^not)
    assert node_link(node, {"GLOO_SOCKET_IFNAME": "eno1"}, "gloo")["gbps"] == pytest.approx(12.5)
    assert node_link(node, {"NCCL_SOCKET_IFNAME": "=ib3"}, "nccl")["nics"] == ["ib3"]
    assert node_link(node, {"NCCL_SOCKET_IFNAME": "^ib"}, "nccl")["nics"] == ["eno1"]
    none = node_link([nic("lo", None, virtual=True)], {}, "gloo")
    assert none["gbps"] is None and "no NIC" in none["label"]
    local = node_link([nic("lo", None, virtual=True), nic("eth0", 1000)], {"GLOO_SOCKET_IFNAME": "lo"}, "gloo")
    assert local == {"gbps": None, "label": "loopback only (GLOO_SOCKET_IFNAME=lo): no link between nodes", "nics": []}


def test_a_shaped_link_reads_as_its_tbf_rate() -> None:
    # an emulated node: a veth (virtual, 10 Gb/s) shaped to 200 Mbit/s by tbf, named by GLOO_SOCKET_IFNAME
    link = node_link([nic("eth0", 10_000, virtual=True, shaped=200.0), nic("lo", None, virtual=True)],
                     {"GLOO_SOCKET_IFNAME": "eth0"}, "gloo")  # fmt: skip
    assert link["gbps"] == pytest.approx(200e6 / 8 / 1e9)  # 0.025 GB/s
    assert "200 Mb/s tbf" in link["label"]
    # a tbf above the line rate does not raise it
    assert node_link([nic("eth0", 1000, shaped=5000.0)], {}, "gloo")["gbps"] == pytest.approx(0.125)


def test_shaped_rates_reads_tc_json_in_bytes_per_second() -> None:
    out = [
        {"kind": "tbf", "handle": "8001:", "dev": "eth0", "root": True, "options": {"rate": 25_000_000}},
        {"kind": "noqueue", "handle": "0:", "dev": "lo", "root": True, "options": {}},
        {"kind": "tbf", "handle": "8002:", "dev": "eth1", "root": False, "options": {"rate": 1}},  # not root
    ]

    def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        assert argv[1:] == ["-j", "qdisc", "show"]
        return subprocess.CompletedProcess(argv, 0, json.dumps(out), "")

    assert shaped_rates(run) == {"eth0": pytest.approx(200.0)}  # 25e6 B/s = 200 Mbit/s


def test_nics_reads_speed_operstate_and_whether_a_device_is_behind(tmp_path: Path) -> None:
    for name, speed, state, dev in (
        ("eth0", "25000", "up", True),
        ("br0", "-1", "up", False),
        ("eth1", "x", "down", True),
    ):
        d = tmp_path / name
        d.mkdir()
        (d / "speed").write_text(speed + "\n")
        (d / "operstate").write_text(state + "\n")
        if dev:
            (d / "device").mkdir()
    got = {n["name"]: n for n in nics(tmp_path, shaped={"eth0": 100.0})}
    assert got["eth0"] == {"name": "eth0", "speed_mbps": 25000, "virtual": False, "up": True, "shaped_mbps": 100.0}
    assert got["br0"]["virtual"] and got["br0"]["speed_mbps"] is None
    assert not got["eth1"]["up"] and got["eth1"]["speed_mbps"] is None


def test_gpu_links_from_generation_and_count() -> None:
    # H100 SXM: 900 GB/s over 18 links counted both ways -> 450 GB/s per direction
    assert gpu_link_gbps("hopper", 18, 5, 16)[0] == pytest.approx(450.0)
    assert gpu_link_gbps("ampere", 12, 4, 16)[0] == pytest.approx(300.0)  # A100: 600 GB/s both ways
    assert gpu_link_gbps("blackwell", 18, 6, 16)[0] == pytest.approx(900.0)
    # no NVLink: PCIe gen4 x16 = 16 GT/s x 128/130 / 8 bits x 16 lanes = 31.5 GB/s
    rate, label = gpu_link_gbps(None, 0, 4, 16)
    assert rate == pytest.approx(16 * 128 / 130 / 8 * 16, rel=1e-3) and label == "PCIe gen4 x16"
    assert gpu_link_gbps(None, 0, 5, 8)[0] == pytest.approx(32 * 128 / 130 / 8 * 8, rel=1e-3)
    assert gpu_link_gbps(None, 0, None, None)[0] is None


def facts(rate_gbps: float | None, label: str = "1 × 200 Mb/s") -> dict[str, Any]:
    return {"inter": {"gbps": rate_gbps, "label": label, "nics": ["eth0"]}, "intra": [None, NO_LINK]}


def test_group_link_world_inter_and_intra() -> None:
    hosts = ["a", "a", "b", "b"]  # 2 nodes x 2 ranks, node by node
    f = [facts(0.025), facts(0.025), facts(0.025), facts(0.025)]
    world = group_link(f, hosts, get_group_kind("world").partition(hosts), [0, 1, 2, 3])
    assert world["gbps"] == pytest.approx(0.025) and world["label"].startswith("inter-node")
    # two inter groups ({0,2} and {1,3}) cross each node's link at once: half of it each
    inter = group_link(f, hosts, get_group_kind("inter").partition(hosts), [0, 2])
    assert inter["gbps"] == pytest.approx(0.0125) and "shared by 2 groups" in inter["label"]
    intra = group_link(f, hosts, get_group_kind("intra").partition(hosts), [0, 1])
    assert intra["gbps"] is None and intra["label"] == NO_LINK and intra["host"] == ""


def test_group_link_names_the_slowest_node() -> None:
    hosts = ["a", "b", "c"]
    f = [facts(0.025), facts(0.00625, "1 × 50 Mb/s tbf (eth0)"), facts(0.025)]
    link = group_link(f, hosts, [[0, 1, 2]], [0, 1, 2])
    assert link["gbps"] == pytest.approx(50e6 / 8 / 1e9) and link["host"] == "b"
    assert "on b" in link["label"] and "slowest of 3 nodes" in link["label"]
    unknown = group_link([facts(0.025), facts(None, "no NIC with a known rate")], ["a", "b"], [[0, 1]], [0, 1])
    assert unknown["gbps"] is None and unknown["host"] == "b"


def test_a_group_of_one_rank_crosses_no_link() -> None:
    f = [{"inter": {}, "intra": [31.5, "PCIe gen5 x16"]}]
    link = group_link(f, ["a"], [[0]], [0])
    assert link["gbps"] is None and link["label"] == ONE_RANK


def test_group_link_on_gpus_takes_the_slowest_gpu() -> None:
    f = [{"inter": {}, "intra": [450.0, "18 × NVLink"]}, {"inter": {}, "intra": [31.5, "PCIe gen4 x16"]}]
    link = group_link(f, ["a", "a"], [[0, 1]], [0, 1])
    assert link["gbps"] == 31.5 and link["label"] == "intra-node: PCIe gen4 x16"


def test_link_phrase_and_finding_state_the_largest_size_with_its_interval() -> None:
    import pandas as pd

    from commbench.core.records import link_phrase
    from commbench.core.units import human_bytes
    from commbench.views.findings import link_findings

    rate = 8 * 400e9 / 8 / 1e9  # 8 x 400 Gb/s = 400 GB/s
    label = "inter-node: 8 × 400 Gb/s (ib0, ib1, ib2, ib3, ib4, ib5, ib6, ib7) on n3"
    rows = [
        {"collective": "all_reduce", "precision": "fp32", "group": "world", "payload": "normal", "size_bytes": s,
         "busbw_gbps": bw, "busbw_ci_low_gbps": bw - 4, "busbw_ci_high_gbps": bw + 4, "link_gbps": rate,
         "link_util": bw / rate, "link": label, "link_host": "n3"}
        for s, bw in ((1 << 20, 100.0), (1 << 30, 368.0))
    ] + [{"collective": "all_reduce", "precision": "fp32", "group": "intra", "payload": "normal", "size_bytes": 1 << 30,
          "busbw_gbps": 1.0, "link_gbps": math.nan, "link_util": math.nan, "link": NO_LINK, "link_host": ""}]  # fmt: skip
    phrase = link_phrase(rows[1], human_bytes)
    # 368 / 400 = 0.92; interval (368 -+ 4) / 400
    assert phrase == (
        "inter-node all_reduce fp32 reaches 0.92 [0.91-0.93] of 8 × 400 Gb/s (ib0, ib1, ib2, ib3, ib4, ib5, ib6, "
        "ib7) on n3 at 1 GiB"
    ), phrase
    assert link_phrase(rows[2], human_bytes) == ""
    found = link_findings(pd.DataFrame(rows))
    assert found[0] == phrase[0].upper() + phrase[1:] + "."  # the largest size, not the 1 MiB point
    assert found[1] == f"No link_util for the intra group ({NO_LINK})."


def test_console_prints_the_link_and_a_link_column(capsys: pytest.CaptureFixture[str]) -> None:
    from commbench.measure.console import PointPrinter

    row = {"collective": "all_reduce", "backend": "gloo", "world_size": 2, "nodes": 2, "payload": "normal",
           "size_bytes": 4 << 20, "count": 1 << 20, "dtype": "float", "time_us": 200_000.0, "algbw_gbps": 0.02097,
           "busbw_gbps": 0.02097, "wrong": 0, "precision": "fp32", "link_gbps": 0.025, "link_util": 0.8389,
           "link": "inter-node: 1 × 200 Mb/s tbf (eth0) on h1", "link_host": "h1"}  # fmt: skip
    PointPrinter(width=100).row(row, "sum")
    out = capsys.readouterr().out.splitlines()
    assert "# link: inter-node: 1 × 200 Mb/s tbf (eth0) on h1; link = busbw / 0.025 GB/s" in out
    assert out[-1].endswith("  0.84") and all(len(line) < 100 for line in out)


def test_gpu_link_asks_nvml_as_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    # a fake pynvml with NVML's documented calls: an H100 SXM (architecture code 9) with 18 NVLinks enabled and
    # an error past the last link (NVML_ERROR_INVALID_ARGUMENT), and a PCIe-only GPU (its links: not supported)
    import sys
    import types

    from commbench.cluster.metadata import gpu_link

    class NVMLError(Exception):
        pass

    def fake(arch: int, links: int, gen: int, width: int) -> types.ModuleType:
        nv = types.ModuleType("pynvml")
        calls: list[str] = []

        def state(h: object, link: int) -> int:
            if link >= links:
                raise NVMLError("invalid argument" if links else "not supported")
            return 1

        nv.__dict__.update(
            NVML_FEATURE_ENABLED=1, NVML_NVLINK_MAX_LINKS=18, NVMLError=NVMLError, calls=calls,
            nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
            nvmlDeviceGetHandleByUUID=lambda u: ("gpu", u), nvmlDeviceGetArchitecture=lambda h: arch,
            nvmlDeviceGetNvLinkState=state, nvmlDeviceGetMaxPcieLinkGeneration=lambda h: gen,
            nvmlDeviceGetCurrPcieLinkWidth=lambda h: width,
        )  # fmt: skip
        return nv

    h100 = fake(9, 18, 5, 16)
    monkeypatch.setitem(sys.modules, "pynvml", h100)
    assert gpu_link("GPU-0") == (450.0, "18 × NVLink (hopper, 25 GB/s each)")
    assert h100.calls == ["init", "shutdown"]
    monkeypatch.setitem(sys.modules, "pynvml", fake(8, 0, 4, 16))  # an Ada GPU on PCIe gen4 x16
    rate, label = gpu_link("GPU-0")
    assert label == "PCIe gen4 x16" and rate == pytest.approx(16 * 128 / 130 / 8 * 16, rel=1e-3)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert gpu_link("GPU-0")[0] is None
