"""Shared helpers for the view tests (plots, report, compare, browser, notebook).

Not a conftest: pytest does not load it by itself; the view test files import it. It owns
- `fabricate_run`: a small run directory written with pandas from closed-form timings (used to test
  edge cases a real run cannot produce: hostile host names, training-only runs, no training);
- `real_run`: one REAL small run produced by `python -m commbench run`, made once per test session
  (a module-level cache, since this module is imported once) and shared by every view test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from commbench.cluster.metadata import build_metadata
from commbench.core.records import CollectivePoint
from commbench.measure.collectives import get_collective
from commbench.store.results import records_frame, write_table

REPO = Path(__file__).resolve().parents[1]

WIRE = {"fp32": ("float", 4), "bf16": ("bfloat16", 2), "fp8_e4m3": ("uint8", 1)}
IMPL = {"fp32": "native", "bf16": "native", "fp8_e4m3": "fp8_bytes"}


def fabricate_rows(
    world: int = 2,
    collectives: tuple[str, ...] = ("all_reduce", "all_gather"),
    precisions: tuple[str, ...] = ("fp32", "bf16", "fp8_e4m3"),
    payloads: tuple[str, ...] = ("normal", "gradient"),
    sizes: tuple[int, ...] = (1024, 4096, 16384, 65536, 262144),
    backend: str = "gloo",
    beta_gbps: float = 2.0,
) -> pd.DataFrame:
    """Results records from a latency + size/bandwidth model (numbers follow formulas), as a frame."""
    rows: list[CollectivePoint] = []
    for coll in collectives:
        for prec in precisions:
            dtype, width = WIRE[prec]
            for payload in payloads:
                for fp32_bytes in sizes:
                    count = fp32_bytes // 4
                    size = count * width + (4 if prec.startswith("fp8") else 0)
                    comm = 20.0 + size / (beta_gbps * 1e3)
                    enc = 0.0 if prec == "fp32" else 2.0 + fp32_bytes / 8e3
                    total = enc * 2 + comm
                    algbw = size / comm / 1e3
                    err = {"fp32": 1e-7, "bf16": 4e-3, "fp8_e4m3": 6e-2}[prec]
                    rows.append(
                        CollectivePoint(
                            collective=coll,
                            precision=prec,
                            impl=IMPL[prec],
                            backend=backend,
                            device="cpu",
                            world_size=world,
                            nodes=1,
                            payload=payload,
                            dtype=dtype,
                            size_bytes=size,
                            count=count,
                            fp32_bytes=fp32_bytes,
                            wire_bytes=size,
                            time_us=comm,
                            time_us_max=comm * 1.05,
                            p50_us=comm,
                            p95_us=comm * 1.1,
                            cv=0.02,
                            rank_spread=0.01,
                            iters=100,
                            samples=5,
                            algbw_gbps=algbw,
                            busbw_gbps=algbw * get_collective(coll).bus_factor(world),
                            encode_us=enc,
                            comm_us=comm,
                            decode_us=enc,
                            total_us=total,
                            effective_gbps=fp32_bytes / total / 1e3,
                            wrong=0,
                            tolerance=err * 4,
                            rel_err=0.0 if prec == "fp32" and payload == "normal" else err,
                            max_abs_err=err * 3,
                            timestamp="2026-01-01T00:00:00+00:00",
                        )
                    )
    return records_frame(rows)


def fabricate_training() -> tuple[pd.DataFrame, pd.DataFrame]:
    """A training summary and step table in the training schema (three policies, 5 steps)."""
    pols = [
        ("fp32", 1.0, {"all_reduce:float": 4_000_000}),
        ("bf16", 0.8, {"all_reduce:bfloat16": 2_000_000}),
        ("fp8_e4m3", 0.7, {"all_to_all:uint8": 1_000_000, "all_gather:uint8": 1_000_000, "all_reduce:float": 64}),
    ]
    summary, steps = [], []
    for name, speed, comm in pols:
        summary.append(
            {
                "policy": name,
                "family": "ddp",
                "model": "mlp",
                "world_size": 2,
                "backend": "gloo",
                "device": "cpu",
                "steps": 5,
                "step_time_us_p50": 10_000 * speed,
                "step_time_us_p95": 12_000 * speed,
                "samples_per_s": 100 / speed,
                "tokens_per_s": 0.0,
                "peak_mem_bytes": int(50e6 * speed),
                "peak_mem_kind": "cpu_measured",
                "model_state_bytes": 1_000_000,
                "comm_bytes_per_step": sum(comm.values()),
                "comm_bytes_expected": sum(comm.values()),
                "comm_by_op": json.dumps(comm),
                "final_loss": 1.0,
                "final_loss_drift": 0.0 if name == "fp32" else 0.01,
                "max_grad_norm_drift": 0.0,
                "skipped_steps": 0,
                "nonfinite_steps": 0,
                "underflow_frac": 0.0,
                "speedup_vs_fp32": 1 / speed,
                "mem_saved_vs_fp32": 1 - speed,
                "comm_saved_vs_fp32": 0.0,
                "warnings": "" if name != "fp8_e4m3" else "loss drift 1%",
            }
        )
        for step in range(5):
            steps.append(
                {
                    "policy": name,
                    "step": step,
                    "loss": 2.0 / (step + 1),
                    "grad_norm": 1.0 + 0.1 * step,
                    "step_time_us": 10_000 * speed,
                    "skipped": False,
                    "nonfinite": False,
                    "underflow_frac": 0.0,
                    "loss_drift": 0.0,
                    "grad_norm_drift": 0.0,
                }
            )
    return pd.DataFrame(summary), pd.DataFrame(steps)


def fabricate_run(
    run_dir: Path,
    host: str = "node01",
    results: bool = True,
    training: bool = True,
    meta_extra: dict[str, Any] | None = None,
    **rows_kwargs: Any,
) -> Path:
    """Write a run directory in the results schema; returns it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    world = int(rows_kwargs.get("world", 2))
    if results:
        write_table(run_dir, CollectivePoint.TABLE, fabricate_rows(**rows_kwargs))
    if training:
        summary, steps = fabricate_training()
        write_table(run_dir, "training", summary)
        write_table(run_dir, "training_steps", steps)
    meta = build_metadata(
        git_commit="abc123",
        start_time="2026-01-01T00:00:00+00:00",
        end_time="2026-01-01T00:01:00+00:00",
        host=host,
        hosts=[host],
        device_name="cpu",
        backend=rows_kwargs.get("backend", "gloo"),
        world_size=world,
        nodes=1,
        nproc_per_node=world,
        threads_per_rank=1,
        launcher="local",
        torch_version="2.13.0+cpu",
        nccl_version=None,
        suite={"name": "fabricated"},
        timing={"warmup": 1, "min_time_s": 0.01, "min_iters": 1, "repeats": 5, "max_iters": 1000},
        argv=["commbench", "run"],
    )
    meta.update(meta_extra or {})
    (run_dir / "metadata.json").write_text(json.dumps(meta, indent=1))
    return run_dir


_REAL_RUNS: dict[str, Path] = {}


def commbench_cli_available() -> bool:
    """True once the lead's CLI exists (`python -m commbench run --help` succeeds)."""
    try:
        r = subprocess.run(
            [sys.executable, "-m", "commbench", "run", "--help"],
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def real_run(base: Path, name: str = "a", precisions: str = "fp32,bf16") -> Path:
    """A real small 2-rank gloo run (all_reduce + all_gather, 1K..64K), made once per session per name."""
    if name in _REAL_RUNS:
        return _REAL_RUNS[name]
    out = base / f"real-{name}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "commbench",
        "run",
        "--collectives",
        "all_reduce,all_gather",
        "--precisions",
        precisions,
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "4",
        "--out",
        str(out),
        "--no-report",
        "--no-training",
        # short timing: views need real rows, not precise ones
        "--min-time",
        "0.002",
        "--min-iters",
        "1",
        "--repeats",
        "3",
        "--warmup",
        "1",
        "--max-time",
        "0.3",
        "--quiet",
    ]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"commbench run failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    _REAL_RUNS[name] = _find_run_dir(out)
    return _REAL_RUNS[name]


TRAINING_SUITE = """
name = "views-training"
collectives = ["all_reduce"]
precisions = ["fp32", "bf16"]
min_bytes = "1K"
max_bytes = "4K"
factor = 4

[timing]
warmup = 1
min_time_s = 0.002
min_iters = 1
repeats = 3
budget_s = 0.3

[training]
model = "mlp"
policies = ["fp32", "bf16_hook"]
steps = 3
warmup_steps = 1
vocab = 32
paired = false
comm_timed_steps = 2
"""


def real_training_run(base: Path) -> Path:
    """A real small run with a training section (mlp, fp32 and bf16_hook DDP), made once per session."""
    if "training" in _REAL_RUNS:
        return _REAL_RUNS["training"]
    base.mkdir(parents=True, exist_ok=True)
    suite = base / "views-training.toml"
    suite.write_text(TRAINING_SUITE)
    out = base / "real-training"
    cmd = [sys.executable, "-m", "commbench", "run", str(suite), "--out", str(out), "--no-report", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"commbench run (training) failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    _REAL_RUNS["training"] = _find_run_dir(out)
    return _REAL_RUNS["training"]


def _find_run_dir(out: Path) -> Path:
    """--out may be the run directory itself or a parent holding one timestamped run directory."""
    if (out / "metadata.json").is_file():
        return out
    found = sorted(p.parent for p in out.rglob("metadata.json"))
    if not found:
        raise RuntimeError(f"no metadata.json under {out}")
    return found[-1]
