"""Running the CLI from a step: the step's context (output folder, time left), `commbench run` under a deadline with its console kept, and the arguments of the sweep, native and training runs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_steps.constants import CLI_GRACE_S, COLLECTIVES, FAST_TIMING, NATIVE_PRECISIONS, PRECISIONS, REPO, NoCuda
from gpu_steps.report import StepReport

if TYPE_CHECKING:
    import pandas as pd
    import torch


@dataclass
class Context:
    out: Path
    limit_s: float
    started: float = field(default_factory=time.monotonic)

    def left_s(self) -> float:
        return self.limit_s - (time.monotonic() - self.started)


def cuda_device() -> torch.device:
    import torch

    if not torch.cuda.is_available():
        raise NoCuda(f"no CUDA device visible to torch {torch.__version__} (built with CUDA {torch.version.cuda})")
    return torch.device("cuda", 0)


@dataclass
class CliRun:
    rc: int
    """Exit status; 124 when stopped at the deadline."""
    console: str
    pgid: int
    """Its process group (empty once it returned: the tests check that)."""


def run_cli(args: Sequence[str], log: Path, timeout_s: float, env: Mapping[str, str] | None = None) -> CliRun:
    """``python -m commbench ARGS`` with its console (stdout and stderr) teed into ``log`` and to stdout.

    It runs in a process group of its own so that, past ``timeout_s``, SIGINT reaches the launcher and its ranks
    at once (the launcher's Ctrl-C path stops the ranks and names the point), then SIGKILL reaches whatever is
    left; a SIGTERM to this process (the driver's timeout) does the same first, so no rank outlives the step
    holding the GPU. ``env``: variables set for this run only."""
    import threading

    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "commbench", *args]
    chunks: list[str] = []
    with log.open("w") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        p = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
            start_new_session=True, errors="replace",
        )  # fmt: skip

        def tee() -> None:
            if p.stdout is None:
                return
            for line in p.stdout:
                chunks.append(line)
                f.write(line)
                f.flush()
                sys.stdout.write(line)
                sys.stdout.flush()

        def stop() -> None:
            try:
                os.killpg(p.pid, signal.SIGINT)
                p.wait(timeout=8.0)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            kill()

        def kill() -> None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # what the launcher left behind, if anything
            except ProcessLookupError:
                pass
            p.wait()

        def terminated(signum: int, frame: Any) -> None:
            kill()  # the driver kills this process 2 s after its SIGTERM: no time for the launcher's own stop
            raise SystemExit(128 + signum)

        reader = threading.Thread(target=tee, daemon=True)
        reader.start()
        old = signal.signal(signal.SIGTERM, terminated)
        try:
            rc = p.wait(timeout=max(timeout_s, 1.0))
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            stop()
            rc = 124
        finally:
            signal.signal(signal.SIGTERM, old)
        kill()  # the launcher exited: nothing of its group may keep the GPU
        reader.join(timeout=5.0)
        if timed_out:
            note = f"gpu_check: stopped `commbench run` after {timeout_s:.0f} s (the step's limit less {CLI_GRACE_S:g})"
            note += "\n"
            chunks.append(note)
            f.write(note)
    return CliRun(rc, "".join(chunks), p.pid)


def group_skips(rep: StepReport, df: pd.DataFrame, console: str) -> None:
    """A run without rows says why when its console did: a communicator group it could not build (one rank)."""
    if not len(df):
        for line in console.splitlines():
            if line.startswith("# skipped group"):
                rep.fail(f"console: {line[2:]}")


def fresh_dir(path: Path) -> Path:
    """``path`` emptied (only directories this script names), so a rerun into the same OUT starts clean."""
    if path.exists():
        shutil.rmtree(path)
    return path


def sweep_args(run: Path, lo: str, hi: str, factor: str, extra: Sequence[str] = ()) -> list[str]:
    """`commbench run` of every collective x precision in a 1-rank NCCL world, checked, sizes ``lo..hi``."""
    return [
        "run", "--nproc", "1", "--backend", "nccl", "--groups", "world",
        "--collectives", ",".join(COLLECTIVES), "--precisions", ",".join(PRECISIONS),
        "-b", lo, "-e", hi, "-f", factor, *FAST_TIMING, "--check", "--no-training", "--no-report", "--quiet",
        *extra, "--out", str(run),
    ]  # fmt: skip


def native_args(run: Path) -> list[str]:
    """`commbench run` of the native fp8 precisions on the collectives that reduce (NCCL's init log kept)."""
    return [
        "run", "--nproc", "1", "--backend", "nccl", "--groups", "world", "--collectives", "all_reduce,reduce_scatter",
        "--precisions", ",".join(NATIVE_PRECISIONS), "-b", "4K", "-e", "64K", "-f", "16", *FAST_TIMING,
        "--check", "--no-training", "--no-report", "--quiet", "--nccl-debug", "--out", str(run),
    ]  # fmt: skip


def training_args(toml: Path, run: Path) -> list[str]:
    """`commbench run` of the suite ``toml`` (its sweep and training) in a 1-rank NCCL world."""
    return ["run", str(toml), "--nproc", "1", "--backend", "nccl", "--quiet", "--no-report", "--out", str(run)]


def run_suite(ctx: Context, name: str, toml_text: str, timeout_s: float) -> tuple[Path, CliRun]:
    """``commbench run`` of the suite ``toml_text`` in a 1-rank NCCL world, under ``ctx.out / name``: its run
    directory (fresh) and how the run ended (console in ``name/console.log``)."""
    base = ctx.out / name
    run = fresh_dir(base / "run")
    base.mkdir(parents=True, exist_ok=True)
    toml = base / "suite.toml"
    toml.write_text(toml_text)
    return run, run_cli(training_args(toml, run), base / "console.log", timeout_s)
