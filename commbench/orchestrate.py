"""Rank-side orchestration of a run: join the world, let rank 0 own the run directory and its metadata,
drive the sweep and the training section, and write the report afterwards. Argument parsing and exit
codes belong to `commbench.cli`; what is printed belongs to `commbench.console`."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

from commbench import console
from commbench.config import SuiteConfig, format_size

__all__ = ["default_run_dir", "report_after_run", "run_metadata", "run_worker"]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def default_run_dir(backend: str, world: int) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    return Path("results") / f"{stamp}-{host}-{backend}-n{world}"


def report_after_run(out: Path) -> None:
    try:
        from commbench.report import write_report
    except ImportError:
        return
    try:
        console.report_progress("writing figures and tables (a few seconds per figure)")
        paths = write_report(out, progress=console.report_progress)
        print(f"# report: {paths.get('html', out / 'report.html')}")
    except Exception as e:  # the measurements are safe on disk; a report failure must not hide that
        print(
            f"commbench: warning: report failed ({type(e).__name__}: {e}); run `commbench report {out}` again",
            file=sys.stderr,
        )


def run_metadata(suite: SuiteConfig, d: Any, argv: list[str], start: str) -> dict[str, Any]:
    from commbench.metadata import run_metadata as build

    return build(suite, d, argv, start)


def run_worker(args: argparse.Namespace, suite: SuiteConfig) -> int:
    """One rank of the run (spawned locally, or started by torchrun / srun / mpirun)."""
    import torch.distributed as dist

    from commbench.launch import detect_world, init_world, set_parent_death_signal, shutdown_world
    from commbench.results import RunWriter

    if os.environ.get("COMMBENCH_PARENT_PID"):
        set_parent_death_signal()
    import warnings

    # torch >= 2.10 deprecates the *_into_tensor names once per call site; the numbers do not change.
    warnings.filterwarnings(
        "ignore", message=r".*is deprecated\. Please use `torch\.distributed\.", category=FutureWarning
    )
    info = detect_world()
    assert info is not None
    start = _now()
    d = init_world(info, args.backend, args.timeout)
    try:
        # Rank 0 owns the run directory; a failure there must stop every rank, not leave them waiting.
        writer: RunWriter | None = None
        problem = ""
        out = args.resume or args.out or default_run_dir(d.backend, d.world_size)
        if d.rank == 0:
            try:
                writer = RunWriter(Path(out), resume=args.resume is not None)
                if args.resume is not None:
                    meta = json.loads((writer.dir / "metadata.json").read_text())
                    if (meta.get("world_size"), meta.get("backend")) != (d.world_size, d.backend):
                        raise ValueError(
                            f"cannot resume {out}: it ran {meta.get('world_size')} ranks on {meta.get('backend')}, this world has {d.world_size} on {d.backend}"
                        )
                else:
                    user_argv = json.loads(os.environ.get("COMMBENCH_ARGV", "null")) or sys.argv[1:]
                    writer.write_metadata(run_metadata(suite, d, ["python", "-m", "commbench", *user_argv], start))
            except ValueError as e:
                problem = str(e)
        verdict: list[Any] = [problem]
        dist.broadcast_object_list(verdict, src=0)
        if verdict[0]:
            if d.rank == 0:
                print(f"commbench: error: {verdict[0]}", file=sys.stderr)
            return 2
        _run_sweep(suite, d, writer, quiet=args.quiet)
        if suite.training is not None:
            _run_training(suite, d, writer, quiet=args.quiet)
        if writer is not None:
            meta = json.loads((writer.dir / "metadata.json").read_text())
            meta["end_time"] = _now()
            writer.write_metadata(meta)
            print(f"# results: {writer.dir}")
        # Every rank has finished its collectives and rank 0 its writes: leave together, so no rank tears
        # down while a peer (or the rendezvous store on rank 0) is still needed.
        d.barrier()
        if d.rank == 0 and info.launcher != "local" and not args.no_report:
            report_after_run(Path(out))
        return 0
    except Exception:
        traceback.print_exc()
        print(f"commbench: rank {d.rank} failed", file=sys.stderr)
        return 1
    finally:
        shutdown_world()


def _run_sweep(suite: SuiteConfig, d: Any, writer: Any, *, quiet: bool) -> None:
    from commbench.results import crossover
    from commbench.sweep import Sweep, agree_done, count_points, iter_groups

    sweep = Sweep(suite, d)
    done = agree_done(d, writer.done_keys() if writer is not None else set())
    todo = list(iter_groups(sweep, done))
    lead = d.rank == 0
    if lead:
        console.print_skipped(sweep.skipped(), d.backend)
        if done:
            console.print_resume(writer.dir if writer is not None else "", len(done), count_points(todo))
    progress = console.SweepProgress(count_points(todo), enabled=lead and not quiet)
    printer = console.PointPrinter()
    try:
        for group, indices in todo:
            points = sweep.run_group(group, indices)
            if lead:
                assert writer is not None
                writer.add([p for _, p in points])
                for _, p in points:
                    printer.row(p.as_dict(), group.collective.redop)
                progress.advance(f"{group.collective.name} {format_size(group.fp32_bytes)}", len(indices))
    finally:
        progress.stop()
    if lead and writer is not None:
        import pandas as pd

        df = pd.DataFrame(writer.rows["results"])
        if not df.empty:
            console.print_noise_warning(df)
        cross = crossover(df)
        writer.write_crossover(cross)
        console.print_crossover(cross)


def _run_training(suite: SuiteConfig, d: Any, writer: Any, *, quiet: bool = False) -> None:
    import torch.distributed as dist

    from commbench.training import run_training

    assert suite.training is not None
    # --resume: rank 0 knows which policies finished; every rank must skip the same ones.
    done: list[Any] = [sorted(writer.done_policies()) if writer is not None else None]
    dist.broadcast_object_list(done, src=0)

    policies = list(getattr(suite.training, "policies", None) or [])
    left = len([p for p in policies if p not in set(done[0])])
    lead = d.rank == 0
    if lead:
        if done[0]:
            print(f"# resuming training: {len(done[0])} policies already measured, {left} left")
        print(f"# training: {left} policies, {suite.training.steps} steps each; per policy: median step time [95 % CI],")
        print("#   speed-up vs fp32 (* significant, ~ not), peak memory per rank, bytes per step per rank, loss drift")
    progress = console.SweepProgress(left, enabled=lead and not quiet, label="training")

    def on_done(summary: list[Any], steps: list[Any]) -> None:
        if writer is not None:
            writer.add(summary)
            writer.add(steps)
            for row in summary:
                print(console.training_line(row.as_dict()))
            progress.advance(f"training {summary[0].policy}" if summary else "training")

    try:
        run_training(suite.training, device=d.device, on_policy_done=on_done, skip=tuple(done[0]))
    finally:
        progress.stop()
