"""The trace reader on a real NCCL trace: what only a GPU proves about ``commbench replay``.

    python benchmarks/gpu_replay_check.py [OUT_DIR]

On CUDA it profiles one step of a 1-rank NCCL world (``torch.profiler``, CPU and CUDA activities,
``record_shapes=True``): two all_reduces of 1M bf16 elements, an all_gather_into_tensor of 256K floats, a
reduce_scatter_tensor of 512K floats, and a matmul on a second stream meanwhile; it reads the trace back with
commbench's reader and asserts what the committed fixtures (``tests/data/traces/``) assume of torch's schema: the
calls come from ``record_param_comms`` with the sizes and dtypes issued, nothing is left unread, the NCCL kernels are
in the timeline and the exposure is read (its NCCL kernels need >= 2 GPUs: one rank's collective may be a copy). Then it replays the trace (``commbench replay --nproc 1``) and checks the
outputs exist. Without CUDA it prints one line and exits 2: a check that tests nothing must not pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def profile(path: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29731")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    a = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
    g_in = torch.randn(1 << 18, device="cuda")
    g_out = torch.empty(1 << 18, device="cuda")
    rs_in = torch.randn(1 << 19, device="cuda")
    rs_out = torch.empty(1 << 19, device="cuda")
    m = torch.randn(2048, 2048, device="cuda")
    side = torch.cuda.Stream()
    sched = schedule(wait=0, warmup=1, active=1, repeat=1)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, schedule=sched,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:  # fmt: skip
        for _ in range(2):
            with torch.cuda.stream(side):
                m @ m  # compute the collectives can overlap
            dist.all_reduce(a)
            dist.all_reduce(a)
            dist.all_gather_into_tensor(g_out, g_in)
            dist.reduce_scatter_tensor(rs_out, rs_in)
            torch.cuda.synchronize()
            prof.step()
    dist.destroy_process_group()


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_replay_check: no CUDA device: nothing checked", file=sys.stderr)
        return 2
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="gpu_replay_"))
    out.mkdir(parents=True, exist_ok=True)
    trace_path = out / "rank0.json"
    profile(trace_path)
    from commbench.store.trace_exposure import exposure
    from commbench.store.traces import describe, pick_step, read_trace, step_calls, step_rows

    t = read_trace(trace_path)
    step = pick_step(t, "last")
    rows = [(r.collective, r.numel, r.dtype, r.calls_per_step) for r in step_rows(step_calls(t, step))]
    print("backend", t.backend, "world", t.world_size, "step", step, "rows", rows)
    print("unread:", describe(t.unread) or "none")
    print("not calls:", describe(t.skipped) or "none")
    failures = []
    want = [("all_reduce", 1 << 20, "bfloat16", 2), ("all_gather", 1 << 18, "float32", 1), ("reduce_scatter", 1 << 19, "float32", 1)]
    if rows != want:
        failures.append(f"rows {rows} != {want}")
    if any(c.source != "record_param_comms" for c in step_calls(t, step)):
        failures.append("calls not read from record_param_comms")
    if t.unread:
        failures.append(f"unread events: {describe(t.unread)}")
    e = exposure(t, step)
    print("exposure:", e)
    if e is None:
        failures.append("no GPU kernels in the timeline")
    elif e.comm_us <= 0 and (t.world_size or 1) > 1:
        failures.append("no NCCL kernels in the timeline")
    elif e.comm_us <= 0:  # NCCL may run a 1-rank collective as a copy: no kernel of its own
        print("note: no NCCL kernel on a 1-rank world (NCCL copies); the exposure's figures need >= 2 GPUs")
    rep = out / "replay"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    argv = [sys.executable, "-m", "commbench", "replay", str(trace_path), "--nproc", "1", "--backend", "nccl",
            "--out", str(rep), "--max-time", "0.5"]  # fmt: skip
    print("$", " ".join(argv), flush=True)
    if subprocess.run(argv, cwd=REPO, env=env, timeout=300).returncode != 0:
        failures.append("commbench replay failed")
    for name in ("replay.csv", "replay_steps.csv", "replay_calls.csv", "replay.md"):
        if not (rep / name).exists():
            failures.append(f"no {name}")
    for f in failures:
        print("FAIL:", f)
    print("gpu_replay_check:", "FAILED" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
