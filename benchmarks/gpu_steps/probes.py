"""The steps that probe devices, memory, timing and the supervisor on one GPU (issue 34): what the CPU models of those
assume, checked where CUDA and NCCL are real.

- ``counts``: launches (CUDA kernels, torch's profiler) and bytes per element (the op counter of
  ``benchmarks/bench_codec_launches.py``) of encode, decode and an fp8 all_reduce on CUDA tensors, and CUDA events
  against the host clock on the same back-to-back all_reduces;
- ``memory``: the fp32 baseline measured twice in one process (priming puts CUDA's first-step workspace in the
  baseline, so the two agree), and after a sweep in the same run against the training step's run without one;
- ``launch``: the supervisor holds no CUDA context while its rank runs (NVML's process list), ``--nproc 2 --backend
  nccl`` on one GPU is refused in one line with exit 2, ``RANK=0 WORLD_SIZE=1 LOCAL_RANK=3`` on one visible GPU
  runs on ``cuda:0``, and the GPU metadata fields of the sweep step's run;
- ``cuda_graph``: ``benchmarks/gpu_cuda_graph.py``'s check (graph-mode rows exist, are right and timed).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpu_steps.constants import CLI_GRACE_S, GPT_TABLE, MIB, REPO
from gpu_steps.report import StepReport
from gpu_steps.runs import Context, cuda_device, fresh_dir, run_suite

MEMORY_TOML = (
    'name = "gpu-check-memory"\ncollectives = ["all_reduce"]\nprecisions = ["fp32"]\nmin_bytes = "1M"\n'
    'max_bytes = "64M"\nfactor = 64\n\n[timing]\nwarmup = 1\nmin_iters = 2\nrepeats = 3\npasses = 1\nbudget_s = 0.5\n'
    "target_ci = 0.5\n\n[training]\n" + GPT_TABLE + 'policies = ["fp32"]\nsteps = 2\nwarmup_steps = 1\n'
    "comm_timed_steps = 0\n"
)
"""A small sweep, then the fp32 baseline: its peak must be the training step's (which ran no sweep)."""
MEM_TOLERANCE = 0.05
"""Relative agreement asked of two measurements of the same policy's peak (plus 2 MiB of allocator rounding)."""
EVENTS_VS_HOST = 0.15
"""How far CUDA events may sit from the host clock around the same synchronised back-to-back ops."""


def _world(ctx: Context, name: str) -> Any:
    """A 1-rank NCCL world in this process (a file rendezvous under the step's folder); returns its device."""
    import datetime

    import torch
    import torch.distributed as dist

    dev = cuda_device()
    torch.cuda.set_device(dev)
    store = fresh_dir(ctx.out / name) / "rendezvous"
    store.parent.mkdir(parents=True, exist_ok=True)
    dist.init_process_group(
        "nccl", init_method=f"file://{store}", rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=max(30.0, ctx.left_s())), device_id=dev,
    )  # fmt: skip
    return dev


def _load_bench(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kernels_of(fn: Any) -> int:
    """CUDA kernels ``fn`` launched (torch's profiler, device events of kind kernel)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA"))


def events_vs_host(op: Any, k: int = 20) -> tuple[float, float]:
    """Seconds per op of ``k`` back-to-back ``op()`` by CUDA events and by the host clock around a synchronize."""
    import torch

    op()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(k):
        op()
    end.record()
    torch.cuda.synchronize()
    host = (time.perf_counter() - t0) / k
    return start.elapsed_time(end) / 1e3 / k, host


def _codec_counts(rep: StepReport, name: str, m: int, dev: Any, bench: Any) -> None:
    """Kernels of one encode, one decode and one fp8 all_reduce of ``m`` elements on ``dev``; bytes per element of
    the code path (the bench's op counter)."""
    import torch

    from commbench.measure.chunked import ChunkedAllReduce, ChunkWire
    from commbench.measure.codec import get_codec

    codec = get_codec(name)
    x = torch.randn(m, device=dev)
    wire = ChunkWire(codec, 1, m, dev)
    out = torch.empty(m, device=dev)
    op = ChunkedAllReduce(codec, m, None, dev)

    def all_reduce() -> None:
        op.load(x)
        op.encode()
        op.comm()
        op.decode()

    wire.encode_chunks(x)  # warm: a fused path compiles here, outside the counts
    wire.decode_chunks(out)
    all_reduce()
    rep.fig(f"{name} encode kernels", kernels_of(lambda: wire.encode_chunks(x)))
    rep.fig(f"{name} decode kernels", kernels_of(lambda: wire.decode_chunks(out)))
    rep.fig(f"{name} all_reduce kernels", kernels_of(all_reduce))
    if bench is not None and hasattr(bench, "wire_counts"):  # dispatched ops of the code path, for the kernels above
        enc_ops, dec_ops, _ = bench.wire_counts(codec, 1, m, True)
        rep.fig(f"{name} encode ops", enc_ops)
        rep.fig(f"{name} decode ops", dec_ops)
    if bench is not None and hasattr(bench, "wire_bytes"):
        enc_b, dec_b, _ = bench.wire_bytes(codec, 1, m, True)
        rep.fig(f"{name} encode B/element", enc_b)
        rep.fig(f"{name} decode B/element", dec_b)


def step_counts(ctx: Context, rep: StepReport) -> None:
    import torch
    import torch.distributed as dist

    from commbench.measure import fp8

    dev = _world(ctx, "counts")
    try:
        bench = _load_bench("bench_codec_launches")
        for name in ("fp8_e4m3", "fp8_e4m3:block128"):
            _codec_counts(rep, name, 1 << 20, dev, bench)
        if hasattr(fp8, "compile_report"):
            rep.fig("fused", fp8.compile_report())
        big = torch.ones(64 * MIB // 4, device=dev)
        ev, host = events_vs_host(lambda: dist.all_reduce(big))
        rep.fig("all_reduce 64M events us", ev * 1e6)
        rep.fig("all_reduce 64M host us", host * 1e6)
        rel = abs(ev - host) / host if host > 0 else math.inf
        rep.check(
            rel <= EVENTS_VS_HOST,
            f"CUDA events {ev * 1e6:.1f} us vs host {host * 1e6:.1f} us per all_reduce: {rel:.0%} apart",
        )
    finally:
        dist.destroy_process_group()


def _fp32_peak(run: Path) -> float:
    from commbench.store.results import load_training

    df = load_training(run)
    rows = df[df["policy"] == "fp32"]
    return float(rows["peak_mem_bytes"].iloc[0]) if len(rows) else math.nan


def agree(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= MEM_TOLERANCE * max(a, b) + 2 * MIB


def step_memory(ctx: Context, rep: StepReport) -> None:
    import torch.distributed as dist

    from commbench.training.runner import run_training

    cuda_device()
    run, cli = run_suite(ctx, "memory", MEMORY_TOML, max(10.0, ctx.left_s() - 8 - CLI_GRACE_S))
    rep.check(cli.rc == 0, f"`commbench run` of sweep + training exited with status {cli.rc} (memory/console.log)")
    after_sweep = _fp32_peak(run) if cli.rc == 0 else math.nan
    alone = _fp32_peak(ctx.out / "training" / "run") if (ctx.out / "training" / "run").exists() else math.nan
    rep.fig("fp32 peak after a sweep MiB", after_sweep / MIB)
    rep.fig("fp32 peak, training alone MiB", alone / MIB)
    rep.check(
        agree(after_sweep, alone),
        f"fp32 peak after a sweep {after_sweep / MIB:.1f} MiB vs training alone {alone / MIB:.1f} MiB",
    )
    dev = _world(ctx, "memory_twice")
    try:
        from commbench.core.suite import tomllib

        section = dict(tomllib.loads(MEMORY_TOML)["training"])
        peaks = [run_training(section, device=dev)[0][0].peak_mem_bytes for _ in range(2)]
    finally:
        dist.destroy_process_group()
    rep.fig("fp32 peak twice in one process MiB", [p / MIB for p in peaks])
    rep.check(
        agree(peaks[0], peaks[1]),
        f"the fp32 baseline measured twice in one process: {peaks[0] / MIB:.1f} vs {peaks[1] / MIB:.1f} MiB",
    )


def _nvml_pids() -> list[int] | None:
    from commbench.cluster import nvml

    return nvml.compute_processes()


def step_launch(ctx: Context, rep: StepReport) -> None:
    cuda_device()
    base = fresh_dir(ctx.out / "launch")
    base.mkdir(parents=True, exist_ok=True)
    tiny = ["--collectives", "all_reduce", "--precisions", "fp32", "-b", "1M", "-e", "1M", "--no-training",
            "--no-report", "--quiet", "--warmup", "1", "--min-iters", "2", "--repeats", "2", "--passes", "1"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    # 1. the supervisor holds no CUDA context while its rank runs
    argv = [
        sys.executable,
        "-m",
        "commbench",
        "run",
        "--nproc",
        "1",
        "--backend",
        "nccl",
        *tiny,
        "--out",
        str(base / "sup"),
    ]
    p = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    seen: set[int] = set()
    nvml_ok = True

    def poll() -> None:
        nonlocal nvml_ok
        while p.poll() is None:
            pids = _nvml_pids()
            if pids is None:
                nvml_ok = False
                return
            seen.update(pids)
            time.sleep(0.2)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    # a CLI start on the GPU machine costs about 10 s (two torch imports, CUDA and NCCL init): what is left after
    # this one goes to the refusal (no world) and the LOCAL_RANK=3 run (a world of its own)
    p.wait(timeout=max(5.0, ctx.left_s() - 20))
    t.join(timeout=5)
    rep.fig("supervisor pid", p.pid)
    rep.fig("pids with a CUDA context", sorted(seen))
    if not nvml_ok:
        rep.fail("NVML's process list is unavailable (pip install nvidia-ml-py): the supervisor's context is unchecked")
    else:
        rep.check(p.pid not in seen, f"the supervisor (pid {p.pid}) holds a CUDA context")
        rep.check(bool(seen - {p.pid}), "no rank was ever seen with a CUDA context: the poll saw nothing")
    # 2. two NCCL ranks on one GPU: one line, exit 2
    one = {**env, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    r = subprocess.run([sys.executable, "-m", "commbench", "run", "--nproc", "2", "--backend", "nccl", *tiny,
                        "--out", str(base / "refused")], cwd=REPO, env=one, capture_output=True, text=True,
                       timeout=max(5.0, ctx.left_s() - 14))  # fmt: skip
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    rep.fig("nproc2 refusal", lines)
    rep.check(
        r.returncode == 2 and len(lines) == 1 and "GPU" in lines[0],
        f"--nproc 2 --backend nccl on one GPU: exit {r.returncode}, {len(lines)} stderr lines",
    )
    # 3. a launcher's LOCAL_RANK=3 with one visible GPU: the rank runs on cuda:0 (r % visible)
    out3 = base / "local_rank3"
    world = {**one, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}  # fmt: skip
    r3 = subprocess.run([sys.executable, "-m", "commbench", "run", "--backend", "nccl", *tiny, "--out", str(out3)],
                        cwd=REPO, env=world, capture_output=True, text=True, timeout=max(5.0, ctx.left_s() - 2))  # fmt: skip
    rep.check(
        r3.returncode == 0,
        f"RANK=0 WORLD_SIZE=1 LOCAL_RANK=3 on one GPU exited {r3.returncode}: {r3.stderr.strip()[-200:]}",
    )
    meta = _metadata(out3)
    gpus = [g for node in meta.get("node_reports") or [] for g in node.get("rank_gpus") or []]
    rep.fig("local_rank3 gpu", gpus)
    rep.check(meta.get("backend") == "nccl", f"LOCAL_RANK=3 run's backend: {meta.get('backend')}")
    # 4. the metadata fields of the sweep step's run (NVML by UUID, the NCCL version)
    sweep_meta = _metadata(ctx.out / "sweep" / "run")
    facts = [g for node in sweep_meta.get("node_reports") or [] for g in node.get("rank_gpus") or [] if g]
    rep.fig("gpu facts", facts)
    for key in ("name", "uuid", "pci_bus_id", "nccl_version"):
        rep.check(bool(facts) and all(f.get(key) for f in facts), f"metadata rank_gpus[].{key} missing: {facts}")
    rep.check(bool(facts) and all("mig_mode" in f for f in facts), "metadata rank_gpus[].mig_mode not recorded")
    rep.check(bool(sweep_meta.get("driver_version") or any(n.get("driver_version") for n in sweep_meta.get("node_reports") or [])),
              "metadata has no driver_version")  # fmt: skip


def _metadata(run: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((run / "metadata.json").read_text()))
    except (OSError, ValueError):
        return {}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def step_cuda_graph(ctx: Context, rep: StepReport) -> None:
    cuda_device()
    bench = REPO / "benchmarks" / "gpu_cuda_graph.py"
    if not bench.is_file():
        rep.fail("benchmarks/gpu_cuda_graph.py is missing: CUDA-graph mode untested")
        return
    mod = _load_bench("gpu_cuda_graph")
    rc = mod.main([str(fresh_dir(ctx.out / "cuda_graph"))])
    rep.fig("rc", rc)
    rep.check(rc == 0, f"gpu_cuda_graph.py exited {rc} (see logs/cuda_graph.log)")
