"""Sub-commands and argument parsing. Bad input raises :class:`CLIError` (one line, exit code 2); a failed
rank exits 1. ``sys.exit`` happens only in ``__main__``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from commbench.cli.common import CLIError
from commbench.cli.common import Parser as _Parser
from commbench.cli.common import csv_list as _csv_list
from commbench.cli.common import positive_float as _positive_float
from commbench.cli.common import size as _size
from commbench.cli.nccl_flags import check_nccl_tests_flags, nccl_tests_notes
from commbench.cli.plan_cmd import add_plan_parser, cmd_plan
from commbench.cli.replay_cmd import add_replay_parser, cmd_replay
from commbench.cli.run_args import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_EXIT_GRACE_S,
    DEFAULT_SUITE,
    add_run_parser,
    resolve_suite,
)
from commbench.cli.run_args import suite_defaults as _suite_defaults
from commbench.core.records import COMMBENCH_VERSION

__all__ = [
    "COMMANDS", "DEFAULT_COLLECTIVE_TIMEOUT_S", "DEFAULT_SUITE", "CLIError", "build_parser", "main", "nccl_tests_notes",
    "resolve_suite",
]  # fmt: skip

PLUGIN_HELP = (
    "import MODULE before the command runs, so that what it registers (a codec, a collective, a policy, a figure) "
    "can be named; repeatable, and passed on to spawned ranks (COMMBENCH_PLUGINS) (default: none; installed "
    "distributions' entry points of the group commbench.plugins are always loaded)"
)


def build_parser(suite_defaults: bool = True) -> argparse.ArgumentParser:
    """The parser; with ``suite_defaults`` the help states the default suite's values (which loads that suite:
    only worth it when the help is shown)."""
    p = _Parser(prog="commbench", description="Communication-precision benchmarks for distributed PyTorch.")
    q = _suite_defaults() if suite_defaults else {}

    p.add_argument("--version", action="version", version=f"commbench {COMMBENCH_VERSION}")
    p.add_argument("--plugin", action="append", dest="plugins", default=[], metavar="MODULE", help=PLUGIN_HELP)
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    add_run_parser(sub, q)

    sub.add_parser("list", help="list collectives, precisions and suites")

    rep = sub.add_parser("report", help="write report.html and report.md for a run directory")
    rep.add_argument("run_dir", type=Path)
    rep.add_argument("--out", type=Path, help="where to write (default: the run directory)")

    cmp_ = sub.add_parser("compare", help="compare two or more run directories")
    cmp_.add_argument("run_dirs", type=Path, nargs="+")
    cmp_.add_argument("--labels", type=_csv_list, help="one label per run, comma-separated")
    cmp_.add_argument("--out", type=Path, help="output directory (default: compare-<A>-vs-<B> next to the first run)")
    cmp_.add_argument(
        "--min-effect", type=float, default=0.0,
        help="also require a ratio to differ from 1 by at least this fraction to be significant (default 0)",
    )  # fmt: skip
    cmp_.add_argument(
        "--threshold", metavar="PCT", default="5%",
        help="runs without samples per point (nccl-tests text logs): call a point slower or faster when its time "
        "ratio is beyond 1 +- this, a threshold verdict, labelled so (default 5%%)",
    )  # fmt: skip

    chk = sub.add_parser(
        "check",
        help="gate a finished run (acceptance, CI): exit 1 naming every point significantly below a bar, 0 when "
        "all hold; a per-node view of ranks.csv (not `run --check`, the correctness pass)",
        description="Exit 1 and name every point whose 95 % interval lies on the wrong side of a bar; 0 when all hold; 2 on bad "
        "input. Then the per-node view: each node's link, its ranks' time against the others', waits, spikes.",
    )  # fmt: skip
    chk.add_argument("run_dir", type=Path, metavar="RUN")
    chk.add_argument("--baseline", type=Path, metavar="RUN", help="run to measure --max-slowdown against")
    chk.add_argument("--min-busbw", type=_positive_float, metavar="GB/s", help="fail points whose busbw interval lies below this")
    chk.add_argument("--max-slowdown", metavar="PCT", help="fail points whose time over the baseline's (its interval) exceeds 1 + this, e.g. 10%%")
    chk.add_argument("--min-link-util", type=_positive_float, metavar="FRACTION", help="fail points whose busbw interval lies below this fraction of their link (link_util), e.g. 0.8")
    chk.add_argument("--from-size", type=_size, metavar="SIZE", help="judge every point of at least this size on the wire, e.g. 64M (default: the bandwidth bars judge each series' largest size, --max-slowdown every size)")

    imp = sub.add_parser("import", help="import another tool's output into a run directory")
    imp.add_argument("tool", choices=["nccl-tests", "rccl-tests"], help="nccl-tests or rccl-tests (one reader for both)")
    imp.add_argument("file", type=Path)
    imp.add_argument("--out", type=Path, required=True, help="new run directory")
    imp.add_argument("--collective", help="collective of every block when the file does not say")

    ft = sub.add_parser("fit", help="fit a latency-bandwidth cost model to run directories")
    ft.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    ft.add_argument("--out", type=Path, required=True, help="model JSON to write (e.g. model.json)")

    add_plan_parser(sub)
    add_replay_parser(sub)
    for parser in sub.choices.values():  # also after the sub-command (its own dest: the sub-parser's would win)
        parser.add_argument(
            "--plugin", action="append", dest="plugins_after", default=[], metavar="MODULE", help=PLUGIN_HELP
        )
    return p


def _leading_plugins(argv: list[str]) -> int:
    """How many of ``argv``'s first arguments are ``--plugin MODULE`` options (before a sub-command)."""
    i = 0
    while i < len(argv):
        if argv[i].startswith("--plugin="):
            i += 1
        elif argv[i] == "--plugin" and i + 1 < len(argv):
            i += 2
        else:
            break
    return i


def load_plugins(modules: list[str]) -> None:
    """Load the ``--plugin`` modules (and the installed entry points) now, so a module that cannot be imported is
    one line and exit 2 before anything runs; the environment carries them to every process this one starts. The
    built-ins load with their registries (so `list` and `--help` import no torch)."""
    from commbench.core import plugins

    plugins.request(modules)
    plugins.load(builtins=False)


# The rank variables a launcher sets (torchrun, Slurm, Open MPI, other PMI MPIs), read without importing the launch
# module (and torch): only to keep one error line per job, not per rank.
_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def _launcher_rank() -> int:
    """This process's rank in the world of an external launcher; 0 when none (or a value that is not a number)."""
    for key in _RANK_VARIABLES:
        value = os.environ.get(key, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `python -m commbench [run flags]` is `run` on the default suite, like a bare nccl-tests binary.
    lead = _leading_plugins(argv)
    rest = argv[lead:]
    if not rest or (rest[0].startswith("-") and rest[0] not in ("-h", "--help", "--version")):
        argv = [*argv[:lead], "run", *rest]
    try:
        args = build_parser(suite_defaults="-h" in argv or "--help" in argv).parse_args(argv)
        load_plugins([*args.plugins, *getattr(args, "plugins_after", [])])
        if args.command is None:
            raise CLIError(f"no command given; valid commands: {', '.join(COMMANDS)}")
        command = COMMANDS.get(args.command)
        if command is None:
            raise CLIError(f"unknown command {args.command!r}")
        return command(args, argv)
    except (CLIError, ValueError) as e:  # ValueError: validation from config/registries/results
        # one line, exit 2; under a launcher every rank meets the same bad input: only its rank 0 says so
        if _launcher_rank() == 0:
            print(f"commbench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # a spawned rank stays silent: its launcher prints the one line, with the command that resumes
        if not os.environ.get("COMMBENCH_PARENT_PID"):
            print("commbench: interrupted", file=sys.stderr)
        return 130


# ----------------------------------------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace, argv: list[str]) -> int:
    from commbench.cli.orchestrate import check_resume, default_run_dir, memory_check, report_after_run, run_worker
    from commbench.cluster.launch import (
        RankFailure,
        check_local_nproc,
        default_nproc,
        detect_world,
        resolve_backend,
        spawn_local,
    )
    from commbench.store.results import LOGS_DIR, RunDirError, check_new_run_dir, load_metadata

    check_nccl_tests_flags(args)
    suite = resolve_suite(args)  # validate before anything is spawned or written
    info = detect_world()
    if (info is None or not os.environ.get("COMMBENCH_PARENT_PID")) and _launcher_rank() == 0:
        for note in nccl_tests_notes(args, argv):
            print(f"# note: {note}", file=sys.stderr)
    if info is not None:
        return run_worker(args, suite)
    meta = load_metadata(args.resume) if args.resume is not None else None
    if args.nproc is not None:
        nproc = args.nproc
    elif meta is not None:
        # a resumed local run continues with the world it started with
        nproc = meta.get("world_size")
        if not isinstance(nproc, int) or nproc < 1:
            raise CLIError(f"cannot resume {args.resume}: its metadata.json records no world size (an imported run?)")
    else:
        nproc = default_nproc()
    if nproc < 1:
        raise CLIError(f"--nproc must be >= 1, got {nproc}")
    check_local_nproc(nproc)
    requested = args.backend
    if meta is not None and requested == "auto" and isinstance(meta.get("backend"), str):
        requested = meta["backend"]
    backend = resolve_backend(requested, 0, nproc)
    if suite.timing.device_timer == "events" and backend != "nccl":
        raise CLIError(f"--device-timer events needs CUDA devices: this run would use {backend} on the CPU; use --device-timer host")
    from commbench.measure.collectives import check_configuration

    check_configuration(suite.collectives, suite.root, suite.op, backend, nproc)  # -r, -o: before anything is spawned
    # the supervisor never touches CUDA: free device memory comes from NVML (None without it: the check is skipped)
    memory_check(suite, nproc, backend, nproc, device_free=supervisor_free_memory(backend))
    child_argv = list(argv)
    if args.backend == "auto" and meta is None:
        # every rank of a local spawn sees the same GPUs, so the supervisor's decision is theirs: say it
        child_argv += ["--backend", backend]
    if meta is not None:
        if meta.get("world_size") != nproc or meta.get("backend") != backend:
            raise CLIError(
                f"cannot resume {args.resume}: it ran {meta.get('world_size')} ranks on {meta.get('backend')}, this run would use {nproc} on {backend}"
            )
        check_resume(args.resume, meta, suite)
        out = args.resume
        if args.backend == "auto":
            child_argv += ["--backend", backend]
    else:
        out = args.out or default_run_dir(backend, nproc)
        try:
            check_new_run_dir(out)
            out.mkdir(parents=True, exist_ok=True)
        except RunDirError as e:
            raise CLIError(str(e)) from None
        except OSError as e:
            raise CLIError(f"output directory {out} cannot be created: {e.strerror}") from None
        if args.out is None:
            child_argv += ["--out", str(out)]
    os.environ["COMMBENCH_ARGV"] = json.dumps(argv)  # metadata records what the user typed, not our re-exec
    try:
        spawn_local(
            child_argv + ["--no-report"], nproc, timeout_s=args.timeout, grace_s=args.exit_grace, log_dir=out / LOGS_DIR,
            entry=main,
        )
    except KeyboardInterrupt:
        print(f"\ncommbench: interrupted; {resume_hint(args, out)}", file=sys.stderr)
        return 130
    except RankFailure as e:
        print(f"commbench: error: {e}", file=sys.stderr)
        for line in e.ranks:
            print(f"commbench:   {line}", file=sys.stderr)
        if (out / "metadata.json").exists():
            print(f"commbench: finished points are kept in {out} (continue with --resume {out})", file=sys.stderr)
        return 1
    if not args.no_report:
        report_after_run(out)
    return 0


def supervisor_free_memory(backend: str) -> int | None:
    """Free bytes on the visible GPU with least, for the memory estimate of a local NCCL spawn, read through NVML
    (never a CUDA context in the supervisor); None for gloo, or without NVML (the device check is then skipped,
    with a note)."""
    if backend != "nccl":
        return None
    from commbench.cluster import nvml

    free = nvml.min_free_bytes()
    if free is None:
        print(
            f"commbench: note: device memory not checked before the start ({nvml.INSTALL_HINT} lets the supervisor "
            "read it without a CUDA context); rank 0 checks its own GPU once started",
            file=sys.stderr,
        )
    return free


def resume_hint(args: argparse.Namespace, out: Path) -> str:
    """The exact command that continues this run (finished points are on disk), or why there is nothing to
    continue. Flags that must match the interrupted world (ranks, backend) are repeated."""
    import shlex

    if not (out / "metadata.json").exists():
        return "nothing was measured yet"
    cmd = ["python", "-m", "commbench", "run", "--resume", str(out)]
    if args.nproc is not None:
        cmd += ["--nproc", str(args.nproc)]
    if args.backend != "auto":
        cmd += ["--backend", args.backend]
    if args.timeout is not None:
        cmd += ["--timeout", f"{args.timeout:g}"]
    if args.exit_grace != DEFAULT_EXIT_GRACE_S:
        cmd += ["--exit-grace", f"{args.exit_grace:g}"]
    if args.nccl_debug:
        cmd += ["--nccl-debug"]
    cmd += [flag for flag, on in (("--no-training", args.no_training), ("--no-report", args.no_report),
                                  ("--quiet", args.quiet)) if on]  # fmt: skip
    return "finished points are kept; continue with: " + " ".join(shlex.quote(c) for c in cmd)


def cmd_list(args: argparse.Namespace, argv: list[str]) -> int:
    from commbench.core import plugins
    from commbench.core.suite import available_suites
    from commbench.measure.collectives import COLLECTIVES
    from commbench.measure.precision import get_precision, precision_help, precision_names

    print("collectives (size definition; busbw factor):")
    for name, coll in COLLECTIVES.items():
        print(f"  {name:<16} {getattr(coll, 'description', '')}")
    print("precisions (name[:option]):")
    helps = precision_help()
    for name in precision_names():
        prec = get_precision(name)
        extra = f"  options: {helps[name]}" if helps.get(name) else ""
        print(f"  {name:<16} {prec.impl:<10} wire {prec.nccl_type:<9} {prec.description}{extra}")
    from commbench.core.names import ALIASES

    other = ", ".join(f"{a}={p}" for a, p in ALIASES["precision"].items() if not a.startswith("torch."))
    print(f"  (also nccl-tests' and torch's names: {other}, torch.<dtype>; -d all: every precision)")
    print("suites:")
    for name, path in available_suites().items():
        print(f"  {name:<16} {path}")
    try:
        from commbench.training.policies import get_policy, list_policies

        print("training policies:")
        for name in list_policies():
            policy = get_policy(name)
            print(f"  {name:<22} {policy.family:<6} {policy.description}")
    except ImportError:
        pass
    from commbench.views.plots import FIGURES

    print("report figures:")
    print("  " + ", ".join(FIGURES))
    external = [p for p in plugins.loaded() if p.source != "builtin"]
    if external:
        print("plugins:")
        for p in external:
            print(f"  {p.name:<16} {p.source}")
    return 0


def cmd_report(args: argparse.Namespace, argv: list[str]) -> int:
    from commbench.store.results import load_metadata
    from commbench.views.report import write_report

    load_metadata(args.run_dir)  # a clear error for a missing/foreign directory
    paths = write_report(args.run_dir, args.out)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def cmd_compare(args: argparse.Namespace, argv: list[str]) -> int:
    from commbench.store.results import load_metadata
    from commbench.views.compare import compare_runs, compare_warnings, console_lines

    if len(args.run_dirs) < 2:
        raise CLIError("compare needs at least two run directories")
    for r in args.run_dirs:
        load_metadata(r)
    if args.labels is not None and len(args.labels) != len(args.run_dirs):
        raise CLIError(f"--labels has {len(args.labels)} labels for {len(args.run_dirs)} runs")
    # next to the runs compared (the first one's parent), never into the caller's working directory
    first = Path(args.run_dirs[0]).resolve()
    names = "-vs-".join(Path(d).resolve().name for d in args.run_dirs[:3])
    out = args.out or first.parent / f"compare-{names}"
    for w in compare_warnings(args.run_dirs, args.labels):
        print(f"commbench: warning: {w}", file=sys.stderr)
    from commbench.views.gate import parse_slowdown

    threshold = parse_slowdown(args.threshold, "--threshold")
    paths = compare_runs(args.run_dirs, args.labels, out, min_effect=args.min_effect, threshold=threshold)
    for line in console_lines(paths["csv"]):
        print(line)
    print(f"# compare: {paths['html']} (also compare.md, compare.csv)")
    return 0


def cmd_check(args: argparse.Namespace, argv: list[str]) -> int:
    from commbench.store.results import load_metadata
    from commbench.views.gate import Bars, check_run, link_lines, node_view, parse_slowdown

    for r in (args.run_dir, args.baseline):
        if r is not None:
            load_metadata(r)  # a clear error for a missing/foreign directory
    if args.min_link_util is not None and args.min_link_util > 10:
        raise CLIError(f"--min-link-util is a fraction of the link (e.g. 0.8), got {args.min_link_util:g}")
    slowdown = parse_slowdown(args.max_slowdown) if args.max_slowdown is not None else None
    bars = Bars(args.min_busbw, slowdown, args.min_link_util, args.from_size)
    result = check_run(args.run_dir, bars, args.baseline)
    for line in link_lines(args.run_dir):
        print(f"# {line}")
    table, notes = node_view(args.run_dir)
    if table:
        print("# nodes: time/median = a node's ranks' per-op time over the point's median rank (median over points)")
        for line in table:
            print(f"#   {line}")
    for line in notes + result.notes:
        print(f"# {line}")
    for line in result.failures:
        print(f"FAIL {line}")
    judged = ", ".join(f"{k} {v}" for k, v in result.judged.items())
    verdict = f"{len(result.failures)} point(s) significantly below the bar" if result.failures else "every bar holds"
    estimates = sum(1 for r in result.rows if not r["passed"] and r["basis"] != "interval")
    if estimates:  # without intervals there is no significance: say how many were judged on their value alone
        verdict += f" ({estimates} of them point estimates without an interval, judged on their value)"
    print(f"# check {args.run_dir}: {verdict} (points judged: {judged})")
    return result.exit_code


def cmd_import(args: argparse.Namespace, argv: list[str]) -> int:
    from commbench.store.nccl_import import import_log

    if not args.file.is_file():
        raise CLIError(f"nccl-tests file {str(args.file)!r} does not exist")
    result = import_log(args.file, args.out, collective=args.collective)
    for w in result.warnings:  # nothing is dropped or guessed without a word (skipped lines, world size, -C 1)
        print(f"warning: {w}", file=sys.stderr)
    for run in result.runs:
        print(f"imported {args.file} -> {run}")
    return 0


def cmd_fit(args: argparse.Namespace, argv: list[str]) -> int:
    from commbench.planning.fitting import main_fit
    from commbench.store.results import load_metadata

    for r in args.run_dirs:
        load_metadata(r)  # a clear error for a missing/foreign directory
    print(main_fit(args.run_dirs, args.out))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {
    "run": cmd_run,
    "list": cmd_list,
    "report": cmd_report,
    "compare": cmd_compare,
    "check": cmd_check,
    "import": cmd_import,
    "fit": cmd_fit,
    "plan": cmd_plan,
    "replay": cmd_replay,
}
"""Sub-command -> handler (parsed arguments, the argv as typed) -> exit code."""


def console_main() -> None:
    """Entry point of the ``commbench`` console script."""
    sys.exit(main())
