"""Device mapping, backend choice, timeouts and a CUDA-free supervisor, without a GPU.

The GPUs are faked where commbench asks for them: ``torch.cuda.device_count`` / ``get_device_properties`` inside a
rank (patched per thread, so eight threads are eight ranks with their own view: per-task binding), and a fake
``pynvml`` module for the supervisor. The references are written out: local rank r on ``cuda:(r % visible)``, the
UUIDs distinct or one line naming the two ranks and the GPU.
"""

from __future__ import annotations

import datetime as _dt
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from commbench.cluster import launch, nvml
from commbench.cluster.launch import LocalView, agree_devices, detect_world, plan_devices
from commbench.measure.timing import sample_timer


def uuid(i: int) -> str:
    return f"GPU-{i:08d}-0000-0000-0000-000000000000"


EIGHT = tuple(uuid(i) for i in range(8))


# --- the plan of one node (pure) ------------------------------------------------------------------------------


def test_eight_ranks_that_see_eight_gpus_run_on_cuda_r() -> None:
    views = [LocalView(r, r, EIGHT) for r in range(8)]
    assert plan_devices("auto", views) == {r: r for r in range(8)}
    assert plan_devices("nccl", views) == {r: r for r in range(8)}


def test_per_task_binding_one_gpu_each_runs_on_cuda_0() -> None:
    views = [LocalView(r, r, (uuid(r),)) for r in range(8)]
    assert plan_devices("auto", views) == dict.fromkeys(range(8), 0)
    # two GPUs per task, four tasks: r % 2
    views = [LocalView(r, r, (uuid(2 * r), uuid(2 * r + 1))) for r in range(4)]
    assert plan_devices("nccl", views) == {0: 0, 1: 1, 2: 0, 3: 1}


def test_two_ranks_on_one_gpu_refused_naming_them_or_gloo_under_auto() -> None:
    views = [LocalView(4, 0, (uuid(0),)), LocalView(5, 1, (uuid(0),))]
    with pytest.raises(ValueError) as e:
        plan_devices("nccl", views, host="node7")
    msg = str(e.value)
    assert "ranks 4 and 5 on node7 would share GPU " + uuid(0) in msg and "\n" not in msg
    assert plan_devices("auto", views) == {4: None, 5: None}
    # more ranks than the GPUs they all see: rank 0 and rank 4 land on GPU 0
    views = [LocalView(r, r, EIGHT[:4]) for r in range(8)]
    with pytest.raises(ValueError, match=r"ranks 0 and 4 on this node would share GPU " + uuid(0)):
        plan_devices("nccl", views)


def test_no_gpu_is_gloo_or_one_line_for_nccl() -> None:
    views = [LocalView(r, r, ()) for r in range(2)]
    assert plan_devices("auto", views) == {0: None, 1: None}
    assert plan_devices("gloo", [LocalView(0, 0, EIGHT)]) == {0: None}
    with pytest.raises(ValueError, match=r"backend 'nccl' needs a GPU per rank: rank\(s\) 0 and 1 on h see no GPU"):
        plan_devices("nccl", views, host="h")


def test_local_ranks_that_do_not_number_the_node_are_ordered_by_global_rank() -> None:
    # an MPI launch without local-rank variables: every rank says local rank 0
    views = [LocalView(r, 0, EIGHT[:2]) for r in (3, 1)]
    assert plan_devices("nccl", views) == {1: 0, 3: 1}


# --- the whole world through the store, each thread a rank with its own CUDA view -------------------------------


class FakeCuda:
    """torch.cuda as a rank sees it: ``device_count`` and ``get_device_properties`` answer from this thread's
    visible UUIDs (what CUDA_VISIBLE_DEVICES or a Slurm cgroup left it)."""

    def __init__(self) -> None:
        self.tl = threading.local()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(self.tl.visible))
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.tl.visible))
        monkeypatch.setattr(
            torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=self.tl.visible[i])
        )


def run_world(
    monkeypatch: pytest.MonkeyPatch, requested: str, visible: list[tuple[str, ...]], hosts: list[str]
) -> list[Any]:
    """Every rank's agreed CUDA ordinal (or the exception it raised), one thread per rank sharing one store,
    each with SLURM variables and CUDA_VISIBLE_DEVICES as srun --gpus-per-task sets them."""
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    store = dist.HashStore()
    n = len(visible)
    out: list[Any] = [None] * n

    def rank(r: int) -> None:
        local = [i for i in range(n) if hosts[i] == hosts[r]]
        env = {
            "SLURM_PROCID": str(r), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(local.index(r)),
            "SLURM_NTASKS_PER_NODE": str(len(local)), "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "7",
            "CUDA_VISIBLE_DEVICES": "0",
        }  # fmt: skip
        info = detect_world(env)
        assert info is not None and info.launcher == "slurm" and info.local_rank == local.index(r)
        cuda.tl.visible = visible[r]
        try:
            out[r] = agree_devices(store, info, requested, hosts[r], launch.gpu_uuids())
        except ValueError as e:
            out[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return out


@pytest.mark.timeout(60)
def test_world_of_eight_per_task_ranks_agrees_on_nccl_and_cuda_0(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_world(monkeypatch, "auto", [(uuid(r),) for r in range(8)], ["a"] * 8) == [0] * 8


@pytest.mark.timeout(60)
def test_world_of_eight_ranks_seeing_eight_gpus_runs_on_cuda_r(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_world(monkeypatch, "nccl", [EIGHT] * 8, ["a"] * 8) == list(range(8))


@pytest.mark.timeout(60)
def test_one_node_with_a_shared_gpu_decides_for_the_world(monkeypatch: pytest.MonkeyPatch) -> None:
    # node a: ranks 0, 1 on their own GPUs; node b: ranks 2, 3 both bound to one GPU
    visible = [(uuid(0),), (uuid(1),), (uuid(9),), (uuid(9),)]
    hosts = ["a", "a", "b", "b"]
    assert run_world(monkeypatch, "auto", visible, hosts) == [None] * 4  # gloo everywhere, never a mixed world
    errors = run_world(monkeypatch, "nccl", visible, hosts)
    assert all(isinstance(e, ValueError) for e in errors)
    assert {str(e) for e in errors} == {str(errors[0])} and "ranks 2 and 3 on b would share GPU " + uuid(9) in str(
        errors[0]
    )


@pytest.mark.timeout(60)
def test_world_without_gpus_is_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_world(monkeypatch, "auto", [()] * 3, ["a"] * 3) == [None] * 3


# --- timeouts -------------------------------------------------------------------------------------------------


def test_collective_timeout_defaults_to_torchs_own_and_flags_say_which() -> None:
    from commbench import cli

    assert launch.DEFAULT_COLLECTIVE_TIMEOUT_S == 600.0 == cli.DEFAULT_COLLECTIVE_TIMEOUT_S
    if dist.constants.default_pg_nccl_timeout is not None:
        assert launch.DEFAULT_COLLECTIVE_TIMEOUT_S == dist.constants.default_pg_nccl_timeout.total_seconds()
    p = cli.build_parser()
    args = p.parse_args(["run"])
    assert args.timeout is None and args.exit_grace == 5.0
    assert p.parse_args(["run", "--timeout", "90"]).timeout == 90.0  # an old invocation keeps its meaning
    assert p.parse_args(["run", "--collective-timeout", "90", "--exit-grace", "2"]).exit_grace == 2.0
    run = next(a for a in p._actions if getattr(a, "choices", None) and "run" in a.choices).choices["run"]
    helps = {o: a.help for a in run._actions for o in a.option_strings}
    assert "collective timeout" in helps["--timeout"] and "600" in helps["--timeout"]
    assert "a rank that dies is seen at once" in helps["--exit-grace"]


@pytest.mark.timeout(60)
def test_init_world_gives_the_process_group_the_collective_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[_dt.timedelta] = []

    class Stop(Exception):
        pass

    def fake_init(**kw: Any) -> None:
        seen.append(kw["timeout"])
        raise Stop

    monkeypatch.setattr(dist, "init_process_group", fake_init)
    monkeypatch.delenv(launch.STORE_FD_ENV, raising=False)
    for given, want in ((None, 600.0), (42.0, 42.0)):
        info = launch.WorldInfo(0, 1, 0, 1, "127.0.0.1", launch.free_port(), "torchrun")
        with pytest.raises(Stop):
            launch.init_world(info, "gloo", given)
        assert seen[-1] == _dt.timedelta(seconds=want)


# --- the supervisor never creates a CUDA context ---------------------------------------------------------------


def fake_pynvml(count: int, free: list[int], driver: str = "550.54.15") -> types.ModuleType:
    """NVML as nvidia-ml-py exposes it, for ``count`` GPUs with ``free`` bytes each."""
    m = types.ModuleType("pynvml")
    m.nvmlInit = lambda: None  # type: ignore[attr-defined]
    m.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: count  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = lambda h: uuid(h)  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(free=free[h], total=free[h] * 2)  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = lambda: driver  # type: ignore[attr-defined]
    return m


CONTEXT_MAKERS = ("mem_get_info", "set_device", "init", "_lazy_init", "synchronize", "get_device_properties",
                  "current_device", "is_available", "device_count")  # fmt: skip


def forbid_cuda(monkeypatch: pytest.MonkeyPatch, allow_count: int | None = None) -> None:
    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("the supervisor touched CUDA")

    for name in CONTEXT_MAKERS:
        monkeypatch.setattr(torch.cuda, name, boom)
    if allow_count is not None:  # torch's own NVML-based count, the fallback without nvidia-ml-py
        monkeypatch.setattr(torch.cuda, "device_count", lambda: allow_count)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)


def test_visible_devices_parsed_like_the_cuda_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    assert nvml.parse_visible_devices(None) is None
    assert nvml.parse_visible_devices("0,2") == [0, 2]
    assert nvml.parse_visible_devices("1,x,3") == [1]
    assert nvml.parse_visible_devices("0,0") == [] and nvml.parse_visible_devices("-1") == []
    assert nvml.parse_visible_devices("GPU-00000003,GPU-00000001") == ["GPU-00000003", "GPU-00000001"]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(8, [80 << 30] * 6 + [10 << 30, 80 << 30]))
    assert nvml.visible_count({}) == 8
    assert nvml.visible_count({"CUDA_VISIBLE_DEVICES": "3,9"}) == 1  # the runtime stops at the first missing GPU
    assert nvml.visible_count({"CUDA_VISIBLE_DEVICES": "GPU-00000006,GPU-00000001"}) == 2
    assert nvml.min_free_bytes({"CUDA_VISIBLE_DEVICES": "5,6"}) == 10 << 30
    assert nvml.min_free_bytes({"CUDA_VISIBLE_DEVICES": "0,1"}) == 80 << 30
    assert nvml.driver_version() == "550.54.15"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert nvml.visible_count({}) is None and nvml.min_free_bytes({}) is None and nvml.driver_version() is None


def supervise_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    """``commbench run ARGV`` in this process up to the spawn, which is recorded instead of run."""
    from commbench import cli

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(k, raising=False)
    spawned: dict[str, Any] = {}

    def fake_spawn(
        argv: list[str], nproc: int, timeout_s: Any = None, grace_s: float = 5.0, log_dir: Any = None,
        entry: Any = None,
    ) -> None:
        spawned.update(argv=argv, nproc=nproc, timeout_s=timeout_s, grace_s=grace_s)

    monkeypatch.setattr(launch, "spawn_local", fake_spawn)
    base = ["run", "--collectives", "all_reduce", "--precisions", "fp32", "-b", "1K", "-e", "64M", "--no-report",
            "--no-training", "--out", str(tmp_path / "run")]  # fmt: skip
    code = cli.main([*base, *argv])
    return code, spawned


def test_supervisor_counts_gpus_and_checks_memory_through_nvml_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forbid_cuda(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(8, [80 << 30] * 8))
    assert launch.has_gpus() == 8 and launch.default_nproc() == 8
    assert launch.resolve_backend("auto", 0, 8) == "nccl"
    code, spawned = supervise_once(monkeypatch, tmp_path, "--timeout", "90", "--exit-grace", "3")
    assert code == 0, capsys.readouterr().err
    assert spawned["nproc"] == 8 and spawned["timeout_s"] == 90.0 and spawned["grace_s"] == 3.0
    i = spawned["argv"].index("--backend")
    assert spawned["argv"][i + 1] == "nccl"  # the ranks take the supervisor's decision, not a second guess


def test_supervisor_refuses_a_size_that_cannot_fit_the_gpu_nvml_reports(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forbid_cuda(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(2, [80 << 30, 1 << 20]))  # GPU 1 has 1 MiB free
    code, spawned = supervise_once(monkeypatch, tmp_path, "--nproc", "2")
    err = capsys.readouterr().err
    assert code == 2 and not spawned
    assert "-e 64M cannot fit" in err and "of device memory" in err and "use -e" in err


def test_supervisor_without_nvidia_ml_py_skips_the_device_check_with_a_note(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forbid_cuda(monkeypatch, allow_count=2)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    code, spawned = supervise_once(monkeypatch, tmp_path)
    err = capsys.readouterr().err
    assert code == 0 and spawned["nproc"] == 2, err
    assert "device memory not checked" in err and "nvidia-ml-py" in err


def test_events_timer_off_cuda_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    code, spawned = supervise_once(monkeypatch, tmp_path, "--device-timer", "events")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not spawned and len(err) == 1
    assert "--device-timer events needs CUDA devices" in err[0] and "--device-timer host" in err[0]
    d = launch.Dist(
        info=launch.WorldInfo(0, 1, 0, 1, "127.0.0.1", 0, "local"), backend="gloo", device=torch.device("cpu"),
        host="h", hosts=("h",), threads=1,
    )  # fmt: skip
    assert sample_timer(d, "host") is None
    with pytest.raises(ValueError, match="needs CUDA devices: this run is on cpu"):
        sample_timer(d, "events")


def test_release_memory_collects_and_empties_the_cache_on_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(launch.gc, "collect", lambda: calls.append("gc") or 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    launch.release_memory(torch.device("cpu"))
    assert calls == ["gc"]
    launch.release_memory(torch.device("cuda", 0))
    assert calls == ["gc", "gc", "empty_cache"]


# --- devices by identity: MIG instances, per-task binding (issue 34) --------------------------------------------


def mig_uuid(gpu: int, k: int) -> str:
    return f"MIG-{gpu:04d}{k:04d}-0000-0000-0000-000000000000"


def fake_pynvml_mig(count: int, migs: dict[int, int], arch: dict[int, int] | None = None) -> types.ModuleType:
    """NVML of ``count`` GPUs, GPU g split into ``migs[g]`` MIG devices (nvidia-ml-py's MIG calls: the max count,
    handles by index with NVML_ERROR_NOT_FOUND past the last, handles by UUID, the parent of a MIG handle)."""
    m = fake_pynvml(count, [80 << 30] * count)

    class NotFound(Exception):
        pass

    def mig_handle(g: int, k: int) -> tuple[str, int, int]:
        if k >= migs.get(g, 0):
            raise NotFound("NVML_ERROR_NOT_FOUND")
        return ("mig", g, k)

    def by_uuid(u: str) -> Any:
        for g in range(count):
            if uuid(g) == u:
                return g
            for k in range(migs.get(g, 0)):
                if mig_uuid(g, k) == u:
                    return ("mig", g, k)
        raise NotFound(u)

    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7 if migs.get(h) else 0  # type: ignore[attr-defined]
    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = lambda h: mig_uuid(h[1], h[2]) if isinstance(h, tuple) else uuid(h)  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByUUID = by_uuid  # type: ignore[attr-defined]
    m.nvmlDeviceGetDeviceHandleFromMigDeviceHandle = lambda h: h[1]  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByPciBusId = lambda bus: int(bus.split(":")[1], 16)  # type: ignore[attr-defined]
    m.nvmlDeviceGetArchitecture = lambda h: (arch or {}).get(h, 9)  # type: ignore[attr-defined]
    m.nvmlDeviceGetNvLinkState = lambda h, link: 1 if link < 2 + 2 * h else (_ for _ in ()).throw(NotFound())  # type: ignore[attr-defined]
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5  # type: ignore[attr-defined]
    m.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"  # type: ignore[attr-defined]
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{h:02X}:00.0")  # type: ignore[attr-defined]
    m.nvmlDeviceGetMigMode = lambda h: (1, 1) if migs.get(h) else (0, 0)  # type: ignore[attr-defined]
    return m


def test_mig_and_gpu_uuids_in_cuda_visible_devices_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    forbid_cuda(monkeypatch)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml_mig(2, {1: 3}))
    assert nvml.parse_visible_devices(f"{mig_uuid(1, 0)},{uuid(0)}") == [mig_uuid(1, 0), uuid(0)]
    assert nvml.visible_count({"CUDA_VISIBLE_DEVICES": mig_uuid(1, 2)}) == 1  # was 0: `--backend nccl` refused
    assert nvml.visible_count({"CUDA_VISIBLE_DEVICES": f"{mig_uuid(1, 0)},{mig_uuid(1, 1)}"}) == 2
    assert nvml.visible_count({"CUDA_VISIBLE_DEVICES": "MIG-0001"}) == 0  # a prefix of three instances: ambiguous
    assert nvml.visible_count({"CUDA_VISIBLE_DEVICES": f"{uuid(0)[:12]},{mig_uuid(1, 1)}"}) == 2
    assert nvml.visible_count({"CUDA_VISIBLE_DEVICES": f"{mig_uuid(1, 0)},MIG-9999"}) == 1  # stops at the unknown
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mig_uuid(1, 1))
    assert launch.has_gpus() == 1
    assert launch.resolve_backend("auto", 0, 1) == "nccl" and launch.resolve_backend("nccl", 0, 1) == "nccl"


def test_gpu_link_and_facts_are_looked_up_by_identity_not_ordinal(monkeypatch: pytest.MonkeyPatch) -> None:
    from commbench.cluster.metadata import gpu_link

    # GPU g has 2 + 2g active NVLinks, so each GPU's answer is its own; under per-task binding every rank's
    # device is cuda:0, and an ordinal lookup would give every rank GPU 0's 2 links
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml_mig(4, {3: 2}))
    assert gpu_link(uuid(2)) == (6 * 25.0, "6 × NVLink (hopper, 25 GB/s each)")
    assert gpu_link(uuid(2)[4:])[0] == 6 * 25.0  # torch prints the UUID without "GPU-"
    assert gpu_link(mig_uuid(3, 1))[0] == 8 * 25.0  # a MIG device's links are its parent GPU's
    assert gpu_link(None, "00000000:01:00.0")[0] == 4 * 25.0  # by PCI bus id
    assert gpu_link(None)[0] is None
    facts = nvml.device_facts(uuid=mig_uuid(3, 0))
    assert facts == {"name": "NVIDIA H100 80GB HBM3", "uuid": uuid(3), "pci_bus_id": "00000000:03:00.0",
                     "mig_mode": "enabled"}  # fmt: skip

    # what a rank asks: its cuda:i's UUID from torch, then NVML by that UUID
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=uuid(1)[4:]))
    assert launch.gpu_identity(0) == (uuid(1)[4:], None)
    from commbench.cluster.metadata import rank_link_facts

    assert rank_link_facts("nccl", 0)["intra"] == [4 * 25.0, "4 × NVLink (hopper, 25 GB/s each)"]
