"""Sub-commands and argument parsing. Bad input raises :class:`CLIError` (one line, exit code 2); a failed
rank exits 1. ``sys.exit`` happens only in ``__main__``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commbench.cli.common import CLIError
from commbench.cli.common import Parser as _Parser
from commbench.cli.common import csv_list as _csv_list
from commbench.cli.common import positive_float as _positive_float
from commbench.cli.common import positive_int as _positive_int
from commbench.cli.common import size as _size
from commbench.cli.nccl_flags import add_nccl_tests_flags, check_nccl_tests_flags, nccl_tests_notes
from commbench.cli.plan_cmd import add_plan_parser, cmd_plan
from commbench.cli.replay_cmd import add_replay_parser, cmd_replay
from commbench.core.records import COMMBENCH_VERSION
from commbench.core.suite import (
    BACKENDS,
    DEVICE_TIMERS,
    PAYLOADS,
    TIMING_MODES,
    SuiteConfig,
    TimingConfig,
    load_suite,
    suite_from_dict,
)
from commbench.core.units import SIZE_HELP, format_size

DEFAULT_SUITE = "quick"

DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
"""torch's own collective timeout (``launch.DEFAULT_COLLECTIVE_TIMEOUT_S``, which the ranks use), written out so that
``--help`` needs no torch import; ``tests/test_launch_device.py`` checks the two agree."""

DEFAULT_EXIT_GRACE_S = 5.0
"""Seconds a local spawn's supervisor lets the other ranks end on their own after one died (``launch.spawn_local``)."""


def _suite_defaults() -> dict[str, str]:
    """What the default suite sets, as the help shows it: the suite as the loader reads it (the one reader of suite
    files); {} when it cannot be loaded (the help then says "unset")."""
    try:
        suite = load_suite(DEFAULT_SUITE)
    except (OSError, ValueError):
        return {}

    def show(v: Any) -> str:
        if isinstance(v, list):
            return ",".join(map(str, v))
        if isinstance(v, bool):
            return "yes" if v else "no"
        return f"{v:g}" if isinstance(v, float) else str(v)

    out = {k: show(getattr(suite, k)) for k in ("collectives", "precisions", "groups", "factor", "payload", "check")}
    out.update(min_bytes=format_size(suite.min_bytes), max_bytes=format_size(suite.max_bytes))
    out.update({f"timing.{f}": show(getattr(suite.timing, f)) for f in TimingConfig.__slots__})  # type: ignore[attr-defined]
    out["training"] = "yes" if suite.training is not None else "no"
    return out


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

    def dflt(key: str) -> str:
        """'(default: the suite's; quick: 1K)': a flag left out keeps the suite's value."""
        return f"(default: the suite's value; {DEFAULT_SUITE}: {q.get(key, 'unset')})"

    p.add_argument("--version", action="version", version=f"commbench {COMMBENCH_VERSION}")
    p.add_argument("--plugin", action="append", dest="plugins", default=[], metavar="MODULE", help=PLUGIN_HELP)
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    r = sub.add_parser(
        "run",
        help="run a suite (default: the quick suite on a local group)",
        description=f"Run a suite. Sizes: {SIZE_HELP}. A flag left out keeps the suite's value; the defaults "
        f"shown are the {DEFAULT_SUITE} suite's.",
    )
    r.add_argument("suite", nargs="?", help=f"suite name or TOML file (default: {DEFAULT_SUITE}; see `commbench list`)")
    r.add_argument("--collectives", type=_csv_list, help=f"comma-separated collectives {dflt('collectives')}")
    r.add_argument(
        "--groups", type=_csv_list,
        help="comma-separated communicator groups: world, intra (one per node), inter (one per local rank "
        f"across nodes) {dflt('groups')}",
    )  # fmt: skip
    r.add_argument(
        "--precisions", "-d", "--datatype", dest="precisions", type=_csv_list,
        help="comma-separated precisions, e.g. fp32,bf16,fp8_e4m3:block128; nccl-tests' type names (float, half, "
        f"bfloat16, f8e4m3, f8e5m2) and torch's (float32, torch.bfloat16) are accepted, and all {dflt('precisions')}",
    )  # fmt: skip
    r.add_argument("-b", "--minbytes", type=_size, help=f"smallest fp32 tensor size, e.g. 8, 64K, 1MB {dflt('min_bytes')}")
    r.add_argument("-e", "--maxbytes", type=_size, help=f"largest fp32 tensor size {dflt('max_bytes')}")
    r.add_argument("-f", "--stepfactor", type=_positive_int, help=f"multiplicative size step (>= 2) {dflt('factor')}")
    r.add_argument("--nproc", type=int, help="local ranks to spawn when not under torchrun/Slurm/MPI (default: one per GPU if >= 2, else 2)")
    r.add_argument("--backend", choices=BACKENDS, default="auto", help="process group backend (default: auto = nccl when every rank has a GPU, else gloo)")
    r.add_argument("--out", type=Path, help="run directory (default: results/<UTC time>-<host>-<backend>-n<world>)")
    r.add_argument("--payload", choices=PAYLOADS, help=f"value distribution for the error measurement {dflt('payload')}")
    r.add_argument("--check", dest="check", action="store_true", default=None, help=f"count wrong elements (the correctness pass; the gate on a finished run is the `check` command) {dflt('check')}")
    r.add_argument("--no-check", dest="check", action="store_false", help="skip the correctness pass")
    r.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a run, skipping finished points (default: a new run)")
    r.add_argument(
        "-T", "--timeout", "--collective-timeout", dest="timeout", type=_positive_float, metavar="S",
        help="collective timeout: seconds a rank waits for its peers in one collective (and at the rendezvous) "
        "before it gives up, the process group's timeout (NCCL's watchdog); a hung rank is named when it expires "
        f"(default: torch's, {DEFAULT_COLLECTIVE_TIMEOUT_S:g})",
    )  # fmt: skip
    r.add_argument(
        "--exit-grace", type=_positive_float, default=DEFAULT_EXIT_GRACE_S, metavar="S",
        help="local spawn: a rank that dies is seen at once; seconds the other ranks then get to end on their own "
        f"(their last lines name the cause) before they are stopped (default: {DEFAULT_EXIT_GRACE_S:g})",
    )  # fmt: skip
    r.add_argument(
        "--device-timer", choices=DEVICE_TIMERS,
        help="how a sample's k ops are timed on a GPU: host (host clock around the ops and one synchronize, as "
        "nccl-tests) or events (CUDA events on the current stream; CUDA only) " + dflt("timing.device_timer"),
    )  # fmt: skip
    r.add_argument(
        "--nccl-debug", action="store_true",
        help="log NCCL's choices at init (NCCL_DEBUG=INFO, subsystems INIT,NET) to <run dir>/logs/nccl.<host>.rank<r>.log "
        "and show each rank's transport (NVLS, P2P, SHM, IB, Socket) in the report's Nodes table (default: off)",
    )  # fmt: skip
    r.add_argument("-w", "--warmup", type=_positive_int, help=f"untimed calls per phase before calibration (nccl-tests' -w) {dflt('timing.warmup')}")
    r.add_argument("--min-time", type=_positive_float, help=f"minimum seconds per sample (calibrates k) {dflt('timing.min_time_s')}")
    r.add_argument("-n", "--min-iters", type=_positive_int, help=f"back-to-back ops per sample, at least (nccl-tests' -n: k grows from it until a sample lasts --min-time) {dflt('timing.min_iters')}")
    r.add_argument("--repeats", type=_positive_int, help=f"minimum samples per point (6 reach a 95 %% interval) {dflt('timing.repeats')}")
    r.add_argument("--target-ci", type=_positive_float, help=f"target relative half-width of each point's 95 %% interval {dflt('timing.target_ci')}")
    r.add_argument("--max-time", type=_positive_float, help=f"seconds of sampling per size before a point is left noisy {dflt('timing.budget_s')}")
    r.add_argument("--timing-mode", choices=TIMING_MODES, help=f"stream: k back-to-back ops per sample (nccl-tests); isolated: one op after --gap seconds of compute, as a training step issues it {dflt('timing.mode')}")
    r.add_argument("--gap", type=_positive_float, help=f"isolated mode: seconds of compute before each timed op {dflt('timing.gap_s')}")
    r.add_argument("-N", "--passes", type=_positive_int, help=f"visits of the whole grid, each taking its share of every point's rounds (nccl-tests' -N run cycles) {dflt('timing.passes')}")
    r.add_argument("-r", "--root", type=int, metavar="RANK", help=f"root rank, inside each group, of broadcast, reduce, gather and scatter (nccl-tests' -r) {dflt('root')}")
    r.add_argument("-o", "--op", metavar="OP", help=f"reduction op of all_reduce, reduce_scatter and reduce: sum, prod, min, max, avg (nccl-tests' -o; avg needs NCCL, codecs reduce by sum only) {dflt('op')}")
    r.add_argument("-G", "--cuda-graph", "--cudagraph", dest="cuda_graph", type=int, metavar="N", help=f"CUDA-graph mode (nccl-tests' -G): capture each sample's k ops in one CUDA graph and time N launches of it; NCCL on CUDA only (elsewhere one line says so and ops run eagerly) {dflt('timing.cuda_graph')}")
    r.add_argument("--no-training", action="store_true", help=f"skip the suite's [training] section (default: run it; {DEFAULT_SUITE} has one: {q.get('training', 'no')})")
    r.add_argument("--no-report", action="store_true", help="do not write the HTML/Markdown report at the end (default: write it)")
    r.add_argument("--quiet", action="store_true", help="no progress bar (default: a progress bar on a terminal's stderr)")
    add_nccl_tests_flags(r)

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


SUITE_OVERRIDES: dict[str, str] = {
    "collectives": "collectives",
    "precisions": "precisions",
    "groups": "groups",
    "min_bytes": "minbytes",
    "max_bytes": "maxbytes",
    "factor": "stepfactor",
    "payload": "payload",
    "check": "check",
    "root": "root",
    "op": "op",
}
"""Suite field -> `run` flag (argparse dest) that overrides it when given."""


def resolve_suite(args: argparse.Namespace) -> SuiteConfig:
    if args.resume is not None and args.suite is None:
        from commbench.store.results import load_metadata

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
    flags = (
        ("warmup", args.warmup), ("min_time_s", args.min_time), ("min_iters", args.min_iters), ("repeats", args.repeats),
        ("target_ci", args.target_ci), ("budget_s", args.max_time), ("passes", args.passes),
        ("mode", args.timing_mode), ("gap_s", args.gap), ("device_timer", args.device_timer),
        ("cuda_graph", args.cuda_graph),
    )  # fmt: skip
    timing = {k: v for k, v in flags if v is not None}
    if timing.get("min_iters", 0) > suite.timing.max_iters:  # -n 5000: k starts there, so its ceiling goes with it
        timing["max_iters"] = timing["min_iters"]
    if args.no_training and suite.training is not None:
        from dataclasses import replace

        if not suite.collectives:
            raise CLIError(f"suite {suite.name!r} has only a [training] section; --no-training leaves nothing to run")
        suite = replace(suite, training=None)
    overrides = {field: getattr(args, flag) for field, flag in SUITE_OVERRIDES.items()}
    try:
        return suite.with_overrides(**overrides, timing=timing)
    except TypeError as e:
        raise CLIError(str(e)) from None


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
            child_argv + ["--no-report"], nproc, timeout_s=args.timeout, grace_s=args.exit_grace, log_dir=out / LOGS_DIR
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
