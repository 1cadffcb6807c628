"""Sub-commands and argument parsing. Bad input raises :class:`CLIError` (one line, exit code 2); a failed
rank exits 1. ``sys.exit`` happens only in ``__main__``."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

from commbench import __version__
from commbench.config import BACKENDS, PAYLOADS, SuiteConfig, load_suite, parse_size, suite_from_dict

DEFAULT_SUITE = "quick"


class CLIError(ValueError):
    """Bad input: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's default exits itself; we want one line and code 2
        raise CLIError(f"{message} (see `{self.prog} --help`)")


def _csv_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return items


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="commbench", description="Communication-precision benchmarks for distributed PyTorch.")
    p.add_argument("--version", action="version", version=f"commbench {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    r = sub.add_parser("run", help="run a suite (default: the quick suite on a local group)")
    r.add_argument("suite", nargs="?", help=f"suite name or TOML file (default: {DEFAULT_SUITE})")
    r.add_argument("--collectives", type=_csv_list, help="comma-separated collectives (see `commbench list`)")
    r.add_argument("--precisions", type=_csv_list, help="comma-separated precisions, e.g. fp32,bf16,fp8_e4m3:block128")
    r.add_argument("-b", "--minbytes", type=_size, help="smallest fp32 tensor size (8, 64K, 1M, 4G; 1024-based)")
    r.add_argument("-e", "--maxbytes", type=_size, help="largest fp32 tensor size")
    r.add_argument("-f", "--stepfactor", type=_positive_int, help="multiplicative size step (>= 2)")
    r.add_argument("--nproc", type=int, help="local ranks to spawn when not under torchrun/Slurm/MPI (default: one per GPU if >= 2, else 2)")
    r.add_argument("--backend", choices=BACKENDS, default="auto", help="process group backend (default auto: nccl when every rank has a GPU)")
    r.add_argument("--out", type=Path, help="run directory (default results/<UTC time>-<host>-<backend>-n<world>)")
    r.add_argument("--payload", choices=PAYLOADS, help="value distribution for the error measurement")
    r.add_argument("--check", dest="check", action="store_true", default=None, help="count wrong elements (default)")
    r.add_argument("--no-check", dest="check", action="store_false", help="skip the correctness pass")
    r.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a run, skipping finished points")
    r.add_argument("--timeout", type=_positive_float, default=60.0, help="seconds before a silent rank ends the run (default 60)")
    r.add_argument("--warmup", type=_positive_int, help="untimed calls per phase before calibration")
    r.add_argument("--min-time", type=_positive_float, help="minimum seconds per sample (calibrates k)")
    r.add_argument("--repeats", type=_positive_int, help="samples per point and rank")
    r.add_argument("--no-training", action="store_true", help="skip the suite's [training] section")
    r.add_argument("--no-report", action="store_true", help="do not write the HTML/Markdown report at the end")
    r.add_argument("--quiet", action="store_true", help="no progress bar")

    sub.add_parser("list", help="list collectives, precisions and suites")

    rep = sub.add_parser("report", help="write report.html and report.md for a run directory")
    rep.add_argument("run_dir", type=Path)
    rep.add_argument("--out", type=Path, help="where to write (default: the run directory)")

    cmp_ = sub.add_parser("compare", help="compare two or more run directories")
    cmp_.add_argument("run_dirs", type=Path, nargs="+")
    cmp_.add_argument("--labels", type=_csv_list, help="one label per run, comma-separated")
    cmp_.add_argument("--out", type=Path, help="output directory (default results/compare-<UTC time>)")

    imp = sub.add_parser("import", help="import another tool's output into a run directory")
    imp.add_argument("tool", choices=["nccl-tests"])
    imp.add_argument("file", type=Path)
    imp.add_argument("--out", type=Path, required=True, help="new run directory")
    imp.add_argument("--collective", help="collective of every block when the file does not say")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `python -m commbench [run flags]` is `run` on the default suite, like a bare nccl-tests binary.
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]
    try:
        args = build_parser().parse_args(argv)
        if args.command == "run":
            return cmd_run(args, argv)
        if args.command is None:
            raise CLIError("no command given; valid commands: run, list, report, compare, import")
        if args.command == "list":
            return cmd_list()
        if args.command == "report":
            return cmd_report(args)
        if args.command == "compare":
            return cmd_compare(args)
        if args.command == "import":
            return cmd_import(args)
        raise CLIError(f"unknown command {args.command!r}")
    except CLIError as e:
        print(f"commbench: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # validation from config/registries/results: one line, exit 2
        print(f"commbench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("commbench: interrupted", file=sys.stderr)
        return 130


# ----------------------------------------------------------------------------------------------- run


def resolve_suite(args: argparse.Namespace) -> SuiteConfig:
    if args.resume is not None and args.suite is None:
        from commbench.results import load_metadata

        meta = load_metadata(args.resume)
        suite_dict = dict(meta["suite"])
        suite_dict.pop("timing", None)
        timing = meta["suite"].get("timing", {})
        training = suite_dict.pop("training", None)
        suite = suite_from_dict({**suite_dict, "timing": timing})
        if training is not None:
            from dataclasses import replace

            from commbench.training.config import TrainingConfig

            suite = replace(suite, training=TrainingConfig.from_dict(training))
    else:
        suite = load_suite(args.suite or DEFAULT_SUITE)
    timing = {k: v for k, v in (("warmup", args.warmup), ("min_time_s", args.min_time), ("repeats", args.repeats)) if v is not None}
    if args.no_training and suite.training is not None:
        from dataclasses import replace

        if not suite.collectives:
            raise CLIError(f"suite {suite.name!r} has only a [training] section; --no-training leaves nothing to run")
        suite = replace(suite, training=None)
    try:
        return suite.with_overrides(
            collectives=args.collectives,
            precisions=args.precisions,
            min_bytes=args.minbytes,
            max_bytes=args.maxbytes,
            factor=args.stepfactor,
            payload=args.payload,
            check=args.check,
            timing=timing,
        )
    except TypeError as e:
        raise CLIError(str(e)) from None


def default_run_dir(backend: str, world: int) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    return Path("results") / f"{stamp}-{host}-{backend}-n{world}"


def cmd_run(args: argparse.Namespace, argv: list[str]) -> int:
    from commbench.launch import RankFailure, default_nproc, detect_world, resolve_backend, spawn_local
    from commbench.results import RunDirError, check_new_run_dir, load_metadata

    suite = resolve_suite(args)  # validate before anything is spawned or written
    info = detect_world()
    if info is not None:
        return run_worker(args, suite)
    nproc = args.nproc if args.nproc is not None else default_nproc()
    if nproc < 1:
        raise CLIError(f"--nproc must be >= 1, got {nproc}")
    backend = resolve_backend(args.backend, 0, nproc)
    if args.resume is not None:
        meta = load_metadata(args.resume)
        if meta.get("world_size") != nproc or meta.get("backend") != backend:
            raise CLIError(
                f"cannot resume {args.resume}: it ran {meta.get('world_size')} ranks on {meta.get('backend')}, this run would use {nproc} on {backend}"
            )
        out = args.resume
    else:
        out = args.out or default_run_dir(backend, nproc)
        try:
            check_new_run_dir(out)
            out.mkdir(parents=True, exist_ok=True)
        except RunDirError as e:
            raise CLIError(str(e)) from None
        except OSError as e:
            raise CLIError(f"output directory {out} cannot be created: {e.strerror}") from None
    child_argv = [a for a in argv]
    if args.resume is None and args.out is None:
        child_argv += ["--out", str(out)]
    os.environ["COMMBENCH_ARGV"] = json.dumps(argv)  # metadata records what the user typed, not our re-exec
    try:
        spawn_local(child_argv + ["--no-report"], nproc, timeout_s=args.timeout)
    except RankFailure as e:
        print(f"commbench: error: {e}", file=sys.stderr)
        if (out / "metadata.json").exists():
            print(f"commbench: finished points are kept in {out} (continue with --resume {out})", file=sys.stderr)
        return 1
    if not args.no_report:
        _report_after_run(out)
    return 0


def _report_after_run(out: Path) -> None:
    try:
        from commbench.report import write_report
    except ImportError:
        return
    try:
        paths = write_report(out)
        print(f"# report: {paths.get('html', out / 'report.html')}")
    except Exception as e:  # the measurements are safe on disk; a report failure must not hide that
        print(f"commbench: warning: report failed ({type(e).__name__}: {e}); run `commbench report {out}` again", file=sys.stderr)


def git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent.parent
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def run_metadata(suite: SuiteConfig, d: Any, argv: list[str], start: str) -> dict[str, Any]:
    import torch

    from commbench.results import SCHEMA_VERSION

    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:
            nccl = None
    return {
        "schema_version": SCHEMA_VERSION,
        "commbench_version": __version__,
        "git_commit": git_commit(),
        "start_time": start,
        "end_time": None,
        "host": d.host,
        "hosts": sorted(set(d.hosts)),
        "device_name": d.device_name(),
        "device": str(d.device.type),
        "backend": d.backend,
        "world_size": d.world_size,
        "nodes": d.nodes,
        "nproc_per_node": d.info.local_world_size,
        "threads_per_rank": d.threads,
        "launcher": d.info.launcher,
        "torch_version": torch.__version__,
        "nccl_version": nccl,
        "gloo_available": torch.distributed.is_gloo_available(),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "suite": suite.to_dict(),
        "timing": suite.to_dict()["timing"],
        "argv": argv,
    }


def run_worker(args: argparse.Namespace, suite: SuiteConfig) -> int:
    """One rank of the run (spawned locally, or started by torchrun / srun / mpirun)."""
    import torch.distributed as dist

    from commbench.launch import detect_world, init_world, set_parent_death_signal, shutdown_world
    from commbench.results import RunWriter

    if os.environ.get("COMMBENCH_PARENT_PID"):
        set_parent_death_signal()
    import warnings

    # torch >= 2.10 deprecates the *_into_tensor names once per call site; the numbers do not change.
    warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use `torch\.distributed\.", category=FutureWarning)
    info = detect_world()
    assert info is not None
    start = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
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
            _run_training(suite, d, writer)
        if writer is not None:
            meta = json.loads((writer.dir / "metadata.json").read_text())
            meta["end_time"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            writer.write_metadata(meta)
            print(f"# results: {writer.dir}")
        # Every rank has finished its collectives and rank 0 its writes: leave together, so no rank tears
        # down while a peer (or the rendezvous store on rank 0) is still needed.
        d.barrier()
        if d.rank == 0 and info.launcher != "local" and not args.no_report:
            _report_after_run(Path(out))
        return 0
    except Exception:
        traceback.print_exc()
        print(f"commbench: rank {d.rank} failed", file=sys.stderr)
        return 1
    finally:
        shutdown_world()


def _run_sweep(suite: SuiteConfig, d: Any, writer: Any, *, quiet: bool) -> None:
    from commbench.results import crossover
    from commbench.sweep import Sweep, agree_done, iter_points
    from commbench.table import HEADER, UNITS, block_title, format_row

    sweep = Sweep(suite, d)
    done = agree_done(d, writer.done_keys() if writer is not None else set())
    todo = list(iter_points(sweep, done))
    progress = None
    task = None
    printer = print
    if d.rank == 0:
        for c, p in sweep.skipped():
            print(f"# skipped {c} x {p}: not supported on backend {d.backend}")
        if not quiet and todo:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=True,
            )  # fmt: skip
            progress.start()
            task = progress.add_task("sweep", total=len(todo))
    current: tuple[str, str] | None = None
    try:
        for index, pt in todo:
            row = sweep.run_point(pt, index)
            if d.rank == 0:
                if row is not None:
                    assert writer is not None
                    writer.add("results", [row])
                    block = (row["collective"], row["precision"])
                    if block != current:
                        current = block
                        printer("#")
                        printer(block_title(row, pt.collective.redop))
                        printer(HEADER)
                        printer(UNITS)
                    printer(format_row(row, pt.collective.redop))
                    sys.stdout.flush()
                if progress is not None and task is not None:
                    progress.update(task, advance=1, description=f"{pt.collective.name} {pt.precision.name}")
    finally:
        if progress is not None:
            progress.stop()
    if d.rank == 0 and writer is not None:
        import pandas as pd

        df = pd.DataFrame(writer.rows["results"])
        if not df.empty:
            noisy = int((df["cv"] >= 0.10).sum())
            if noisy:  # pyperf's rule: say so instead of hiding it
                print(
                    f"# warning: {noisy} of {len(df)} points have a coefficient of variation >= 10 %: timings are noisy "
                    "(other load on the machine, or too few samples: raise --min-time / --repeats)"
                )
        cross = crossover(df)
        writer.write_crossover(cross)
        if cross:
            print("#\n# crossover: smallest fp32 tensor size from which a precision beats fp32 on effective bandwidth")
            from commbench.config import format_size

            for row in cross:
                where = format_size(int(row["crossover_bytes"])) if row["note"] == "" else row["note"]
                print(f"#   {row['collective']:<15} {row['precision']:<20} {where}")


def _run_training(suite: SuiteConfig, d: Any, writer: Any) -> None:
    import torch.distributed as dist

    from commbench.records import is_missing
    from commbench.training import run_training

    assert suite.training is not None
    # --resume: rank 0 knows which policies finished; every rank must skip the same ones.
    done: list[Any] = [sorted(writer.done_policies()) if writer is not None else None]
    dist.broadcast_object_list(done, src=0)

    def on_done(summary: list[Any], steps: list[Any]) -> None:
        if writer is not None:
            writer.add(summary)
            writer.add(steps)
            for row in summary:
                print(
                    f"# training {row.policy:<24} step p50 {row.step_time_us_p50 / 1e3:8.2f} ms"
                    f"  comm/step {0 if is_missing(row.comm_bytes_per_step) else row.comm_bytes_per_step:>12,.0f} B  final-loss drift {row.final_loss_drift:.3g}"
                    + (f"  WARN {row.warnings}" if row.warnings else "")
                )

    run_training(suite.training, device=d.device, on_policy_done=on_done, skip=tuple(done[0]))


def cmd_list() -> int:
    from commbench.collectives import COLLECTIVES
    from commbench.config import available_suites
    from commbench.precision import get_precision, precision_help, precision_names

    print("collectives (size definition; busbw factor):")
    defs = {"all_reduce": "buffer; 2(n-1)/n", "all_gather": "total output; (n-1)/n", "reduce_scatter": "total input; (n-1)/n", "all_to_all": "per-rank buffer; (n-1)/n"}
    for name in COLLECTIVES:
        print(f"  {name:<16} {defs.get(name, '')}")
    print("precisions (name[:option]):")
    helps = precision_help()
    for name in precision_names():
        prec = get_precision(name)
        extra = f"  options: {helps[name]}" if helps.get(name) else ""
        print(f"  {name:<16} {prec.impl:<10} wire {prec.nccl_type:<9} {prec.description}{extra}")
    print("suites:")
    for name, path in available_suites().items():
        print(f"  {name:<16} {path}")
    try:
        from commbench.training import list_policies

        print("training policies:")
        print("  " + ", ".join(list_policies()))
    except ImportError:
        pass
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from commbench.report import write_report
    from commbench.results import load_metadata

    load_metadata(args.run_dir)  # a clear error for a missing/foreign directory
    paths = write_report(args.run_dir, args.out)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from commbench.compare import compare_runs, compare_warnings
    from commbench.results import load_metadata

    if len(args.run_dirs) < 2:
        raise CLIError("compare needs at least two run directories")
    for r in args.run_dirs:
        load_metadata(r)
    if args.labels is not None and len(args.labels) != len(args.run_dirs):
        raise CLIError(f"--labels has {len(args.labels)} labels for {len(args.run_dirs)} runs")
    out = args.out or Path("results") / f"compare-{_dt.datetime.now(_dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    for w in compare_warnings(args.run_dirs, args.labels):
        print(f"commbench: warning: {w}", file=sys.stderr)
    paths = compare_runs(args.run_dirs, args.labels, out)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from commbench.nccl_import import import_nccl_tests

    if not args.file.is_file():
        raise CLIError(f"nccl-tests file {str(args.file)!r} does not exist")
    out = import_nccl_tests(args.file, args.out, collective=args.collective)
    print(f"imported {args.file} -> {out}")
    return 0


def console_main() -> None:
    """Entry point of the ``commbench`` console script."""
    sys.exit(main())
