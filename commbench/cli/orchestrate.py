"""Rank-side orchestration of a run: join the world, let rank 0 own the run directory and its metadata,
drive the sweep and the training section, and write the report afterwards. Argument parsing and exit
codes belong to `commbench.cli`; what is printed belongs to `commbench.measure.console`."""

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

from commbench.core.suite import SuiteConfig
from commbench.measure import console
from commbench.measure.collectives import check_configuration
from commbench.measure.timing import sample_timer

__all__ = [
    "agree_fp8_codec", "default_run_dir", "memory_check", "report_after_run", "resume_conflicts", "run_metadata",
    "run_worker",
]

RESUME_FIXED: dict[str, str] = {
    "collectives": "--collectives",
    "precisions": "--precisions",
    "min_bytes": "-b/--minbytes",
    "max_bytes": "-e/--maxbytes",
    "factor": "-f/--stepfactor",
    "payload": "--payload",
    "check": "--check/--no-check",
    "seed": "the suite's seed",
    "root": "-r/--root",
    "op": "-o/--op",
    "timing": "--warmup/--min-time/--repeats",
}
"""Suite fields a resumed run must keep (with the flags that set them): they decide which rows exist and how
they were measured, so new rows under other values would mix silently with the old ones."""


def resume_conflicts(meta: dict[str, Any], suite: SuiteConfig) -> list[str]:
    """What ``suite`` changes against the run recorded in ``meta`` (``metadata.json``), one phrase each."""
    old = dict(meta.get("suite") or {})
    new = suite.to_dict()
    if isinstance(old.get("timing"), dict):
        # a timing setting added after the run was made took its default then: fill it in, so the run resumes
        from dataclasses import asdict

        from commbench.core.suite import TimingConfig

        old["timing"] = {**asdict(TimingConfig()), **old["timing"]}
    out = []
    for key, flag in RESUME_FIXED.items():
        if key in old and old[key] != new.get(key):
            out.append(f"{key} {old[key]!r} -> {new.get(key)!r} ({flag})")
    return out


def check_resume(run_dir: Path, meta: dict[str, Any], suite: SuiteConfig) -> None:
    """Refuse (ValueError, one line) to resume ``run_dir`` with settings that differ from its own."""
    diff = resume_conflicts(meta, suite)
    if diff:
        raise ValueError(
            f"cannot resume {run_dir}: the rows already there were measured with other settings: {'; '.join(diff)}; "
            f"resume with `--resume {run_dir}` alone, or start a new run"
        )


def memory_check(
    suite: SuiteConfig, n: int, backend: str, local_ranks: int, device: Any = None, *, device_free: int | None = None
) -> None:
    """Refuse (ValueError, one line) a suite whose largest size cannot fit in host or device memory.

    The supervisor of a local spawn passes ``device_free`` (read through NVML: it must not create a CUDA context)
    and no ``device``; a rank passes its own ``device``, whose free memory it reads itself."""
    from commbench.cluster.launch import device_free_bytes
    from commbench.measure.footprint import host_available_bytes, memory_problem

    on_gpu = backend == "nccl"
    if device_free is None and device is not None:
        device_free = device_free_bytes(device)
    problem = memory_problem(suite, n, backend, local_ranks, on_gpu, host_available_bytes(), device_free)
    if problem:
        raise ValueError(problem)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def default_run_dir(backend: str, world: int) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    return Path("results") / f"{stamp}-{host}-{backend}-n{world}"


def report_after_run(out: Path) -> None:
    try:
        from commbench.views.report import write_report
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


def fp8_codec(device: Any) -> str:
    """The fp8 codec this process runs on ``device`` (``commbench.measure.fp8.codec_info``)."""
    from commbench.measure.fp8 import codec_info

    return codec_info(device)


def agree_fp8_codec(d: Any) -> str:
    """Every rank's fp8 codec (a collective call: every rank calls it); raises ValueError, one line naming the
    ranks, when they differ: the ranks would encode and decode at different speeds, so the timings would mix
    two codecs without saying so."""
    mine = fp8_codec(d.device)
    every = d.gather_object(mine)
    if len(set(every)) > 1:
        groups: dict[str, list[int]] = {}
        for r, c in enumerate(every):
            groups.setdefault(str(c), []).append(r)
        said = "; ".join(f"rank(s) {','.join(map(str, rs))}: {c}" for c, rs in groups.items())
        raise ValueError(
            f"ranks disagree on the fp8 codec ({said}); install the same C compiler on every node or set "
            "COMMBENCH_FP8_KERNEL=0 everywhere"
        )
    return mine


def run_metadata(
    suite: SuiteConfig,
    d: Any,
    argv: list[str],
    start: str,
    nodes: list[dict[str, Any]] | None = None,
    *,
    collective_timeout_s: float | None = None,
) -> dict[str, Any]:
    """Metadata of a run measured now on the world ``d`` (a ``launch.Dist``), from rank 0; ``nodes``: what
    ``cluster.metadata.gather_nodes`` returned; ``collective_timeout_s``: the ``--timeout`` given (None: torch's
    own)."""
    import torch

    from commbench.cluster import nvml
    from commbench.cluster.launch import DEFAULT_COLLECTIVE_TIMEOUT_S
    from commbench.cluster.metadata import build_metadata, git_commit

    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:
            nccl = None
    spec = suite.to_dict()
    return build_metadata(
        start_time=start,
        end_time=None,
        host=d.host,
        hosts=sorted(set(d.hosts)),
        device_name=d.device_name(),
        backend=d.backend,
        world_size=d.world_size,
        nodes=d.nodes,
        nproc_per_node=d.info.local_world_size,
        threads_per_rank=d.threads,
        launcher=d.info.launcher,
        torch_version=torch.__version__,
        nccl_version=nccl,
        suite=spec,
        timing=spec["timing"],
        argv=argv,
        git_commit=git_commit(),
        extra={
            "fp8_codec": fp8_codec(d.device),
            "device": d.device_kind,
            "gloo_available": torch.distributed.is_gloo_available(),
            "cpu_count": os.cpu_count(),
            "cuda_version": torch.version.cuda,
            "driver_version": nvml.driver_version(),
            "collective_timeout_s": DEFAULT_COLLECTIVE_TIMEOUT_S
            if collective_timeout_s is None
            else collective_timeout_s,
            "node_reports": nodes or [],
        },
    )


def nccl_debug_path(out: Any, rank: int) -> Path:
    """Where rank ``rank``'s NCCL log goes with ``--nccl-debug``: the run directory's logs when it is known before
    the world starts (a local spawn always passes it), else a temporary directory; the host is in the name, so
    ranks of several nodes can share a run directory on a shared file system."""
    import tempfile

    from commbench.store.results import LOGS_DIR

    base = Path(out) / LOGS_DIR if out else Path(tempfile.gettempdir()) / "commbench-nccl"
    return base / f"nccl.{socket.gethostname()}.rank{rank}.log"


STOP_GRACE_S = 2.0
"""Seconds after a stopping signal during which a rank ignores the next one (see :func:`_term_as_interrupt`)."""


def _term_as_interrupt() -> None:
    """SIGINT and SIGTERM (Ctrl-C; a launcher stopping its ranks, a batch system's time limit) unwind as a
    KeyboardInterrupt naming the signal, so rank 0 records in the metadata that the run is partial and why (the
    default SIGTERM would end the process where it stands). The first signal wins for :data:`STOP_GRACE_S`: the
    launcher answers a Ctrl-C by terminating its ranks, and that second signal must not cut short what the first
    one's unwinding writes (the launcher kills after a grace period); a signal after that (a user's second Ctrl-C at
    a rank that does not end) raises again. Only where nobody else has claimed the signal."""
    import signal
    import time

    stopping: list[float] = []

    def stop(signum: int, frame: Any) -> None:
        if stopping and time.monotonic() - stopping[0] < STOP_GRACE_S:
            return
        stopping.append(time.monotonic())
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(sig) is default:
            signal.signal(sig, stop)


def run_worker(args: argparse.Namespace, suite: SuiteConfig) -> int:
    """One rank of the run (spawned locally, or started by torchrun / srun / mpirun)."""
    import torch.distributed as dist

    from commbench.cluster.launch import (
        detect_world,
        init_world,
        release_memory,
        set_parent_death_signal,
        shutdown_world,
    )
    from commbench.store.results import RunWriter

    if os.environ.get("COMMBENCH_PARENT_PID"):
        set_parent_death_signal()
    _term_as_interrupt()
    import warnings

    # torch >= 2.10 deprecates the *_into_tensor names once per call site; the numbers do not change.
    warnings.filterwarnings(
        "ignore", message=r".*is deprecated\. Please use `torch\.distributed\.", category=FutureWarning
    )
    info = detect_world()
    assert info is not None
    start = _now()
    out: Any = args.resume or args.out
    nccl_log = nccl_debug_path(out, info.rank) if getattr(args, "nccl_debug", False) else None
    d = init_world(info, args.backend, args.timeout, nccl_debug=nccl_log)
    writer: RunWriter | None = None  # rank 0's
    try:
        # Rank 0 owns the run directory; a failure there must stop every rank, not leave them waiting.
        problem = ""
        out = args.resume or args.out or default_run_dir(d.backend, d.world_size)
        try:
            agree_fp8_codec(d)
            sample_timer(d, suite.timing.device_timer)  # events off CUDA: one line on every rank, before any point
            check_configuration(suite.collectives, suite.root, suite.op, d.backend, d.world_size)  # -r, -o
        except ValueError as e:
            problem = str(e)
        from commbench.cluster.metadata import gather_nodes

        nodes = gather_nodes(d) if args.resume is None else None  # every rank: one report per node
        if d.rank == 0 and not problem:
            try:
                memory_check(suite, d.world_size, d.backend, d.info.local_world_size, d.device)
                if args.resume is not None:
                    from commbench.store.results import load_metadata

                    meta = load_metadata(Path(out))
                    if (meta.get("world_size"), meta.get("backend")) != (d.world_size, d.backend):
                        raise ValueError(
                            f"cannot resume {out}: it ran {meta.get('world_size')} ranks on {meta.get('backend')}, this world has {d.world_size} on {d.backend}"
                        )
                    check_resume(Path(out), meta, suite)
                writer = RunWriter(Path(out), resume=args.resume is not None)
                if args.resume is None:
                    user_argv = json.loads(os.environ.get("COMMBENCH_ARGV", "null")) or sys.argv[1:]
                    writer.write_metadata(
                        run_metadata(
                            suite, d, ["python", "-m", "commbench", *user_argv], start, nodes,
                            collective_timeout_s=args.timeout,
                        )
                    )  # fmt: skip
            except ValueError as e:
                problem = str(e)
        verdict: list[Any] = [problem]
        dist.broadcast_object_list(verdict, src=0)
        if verdict[0]:
            if d.rank == 0:
                print(f"commbench: error: {verdict[0]}", file=sys.stderr)
            return 2
        from commbench.cli.sweep_run import run_sweep

        run_sweep(suite, d, writer, quiet=args.quiet)
        all_skipped = ""
        if suite.training is not None:
            # what the sweep left (payloads, references, the allocator's cached blocks) must not count in any
            # policy's peak memory
            release_memory(d.device)
            all_skipped = _run_training(suite, d, writer, quiet=args.quiet)
        from commbench.cluster.metadata import gather_transports

        # after the run: NCCL connects its channels at the first collective of each communicator, not at init
        transports = gather_transports(d, nccl_log) if nccl_log is not None else None
        if writer is not None:
            writer.flush()
            meta = json.loads((writer.dir / "metadata.json").read_text())
            meta["end_time"] = _now()
            from commbench.measure.fp8 import compile_report

            meta["fp8_compile"] = compile_report()  # the fused codec's graphs: compiled before any timed call
            meta.pop("partial", None)  # a resumed run that completes is whole again
            if transports is not None:
                from commbench.cluster.metadata import add_transports

                add_transports(meta, transports)
            writer.write_metadata(meta)
            print(f"# results: {writer.dir}")
        # Every rank has finished its collectives and rank 0 its writes: leave together, so no rank tears
        # down while a peer (or the rendezvous store on rank 0) is still needed.
        d.barrier()
        if d.rank == 0 and info.launcher != "local" and not args.no_report:
            report_after_run(Path(out))
        if all_skipped:  # the rows are written; the run did not measure what it was asked to
            if d.rank == 0:
                print(f"commbench: error: {all_skipped}", file=sys.stderr)
            return 1
        return 0
    except Exception as e:
        from commbench.cluster.launch import LOG_DIR_ENV, lost_peer

        lost = lost_peer(e, d)
        log = os.environ.get(LOG_DIR_ENV)
        if lost is not None:  # a node went away: name it; the traceback says nothing more
            print(
                f"commbench: error: rank {d.rank} on {d.host}: {lost}; finished points are kept in {out}, "
                f"continue with --resume {out}",
                file=sys.stderr,
            )
        elif log:
            # A local spawn keeps each rank's traceback in the run directory; the supervisor prints one line
            # per rank instead of a traceback from every rank a dead peer dragged down.
            with open(Path(log) / f"rank{d.rank}.log", "a") as f:
                traceback.print_exc(file=f)
            if d.rank == 0:
                print(f"commbench: rank 0 failed: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        else:
            traceback.print_exc()
            print(f"commbench: rank {d.rank} failed", file=sys.stderr)
        return 1
    finally:
        if writer is not None:  # a stopped run's tables catch up with their journals (load reads those anyway)
            try:
                writer.flush()
            except OSError as e:
                print(f"commbench: warning: tables not rewritten from their journals: {e}", file=sys.stderr)
        shutdown_world()


def model_parallel_skipped(rows: list[dict[str, Any]]) -> str:
    """One line when the rows hold tensor/pipeline-parallel policies, or policies skipped before they ran (a package
    or device they need: fsdp2_float8), and every one of them was skipped (its `error` set), else "": such a run did
    not measure what it was asked to and exits non-zero."""
    from commbench.training.records import skipped_before_running

    mp = [r for r in rows if str(r.get("parallelism") or "dp") != "dp" or skipped_before_running(r)]
    if not mp or any(not r.get("error") for r in mp):
        return ""
    names = ", ".join(str(r["policy"]) for r in mp)
    return f"every requested tensor/pipeline-parallel or hardware-bound policy was skipped ({names}); see their rows' error"


def _run_training(suite: SuiteConfig, d: Any, writer: Any, *, quiet: bool = False) -> str:
    """Run the [training] section; `model_parallel_skipped`'s line (the same on every rank), or ""."""
    import torch.distributed as dist

    from commbench.training.config import TrainingConfig
    from commbench.training.runner import run_training

    section = suite.training
    assert isinstance(section, TrainingConfig)  # the parser registered for the [training] table made it
    # --resume: rank 0 knows which policies finished; every rank must skip the same ones.
    done: list[Any] = [sorted(writer.done_policies()) if writer is not None else None]
    dist.broadcast_object_list(done, src=0)

    policies = list(section.policies)
    left = len([p for p in policies if p not in set(done[0])])
    lead = d.rank == 0
    if lead:
        if done[0]:
            print(f"# resuming training: {len(done[0])} policies already measured, {left} left")
        print(f"# training: {left} policies, {section.steps} steps each; per policy: median step time [95 % CI],")
        print("#   speed-up vs fp32 (* significant, ~ not), peak memory per rank, bytes per step per rank, loss drift")
    progress = console.SweepProgress(left, enabled=lead and not quiet, label="training")

    rows: list[dict[str, Any]] = []

    def on_done(summary: list[Any], steps: list[Any]) -> None:
        rows.extend(row.as_dict() for row in summary)
        if writer is not None:
            writer.add(summary)
            writer.add(steps)
            for row in summary:
                print(console.training_line(row.as_dict()))
            progress.advance(f"training {summary[0].policy}" if summary else "training")

    try:
        run_training(section, device=d.device, sync=d.sync, on_policy_done=on_done, skip=tuple(done[0]), hosts=d.hosts)
    finally:
        progress.stop()
    if writer is not None:
        _print_training_gain(writer)
    verdict: list[Any] = [model_parallel_skipped(rows) if lead else ""]
    dist.broadcast_object_list(verdict, src=0)
    return str(verdict[0])


def _print_training_gain(writer: Any) -> None:
    """After the per-policy lines: the low-precision gain of each parallelism against its own reference, side by
    side, from every training row of the run (a resumed run's earlier ones too), with the CPU-timing note."""
    import pandas as pd

    from commbench.views.training_tables import gain_by_parallelism_lines

    lines = gain_by_parallelism_lines(
        pd.DataFrame(writer.rows["training"]), pd.DataFrame(writer.rows["training_steps"])
    )
    for line in lines:
        for out in console.comment(line):
            print(out)
