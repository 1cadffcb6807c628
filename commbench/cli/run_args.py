"""The ``run`` sub-command's arguments and how they make its suite: the parser (commbench's flags and nccl-tests'
spellings of them, :mod:`commbench.cli.nccl_flags` for the rest) and :func:`resolve_suite` (the suite file or the
resumed run's suite, with the flags given laid over it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from commbench.cli.common import CLIError
from commbench.cli.common import csv_list as _csv_list
from commbench.cli.common import positive_float as _positive_float
from commbench.cli.common import positive_int as _positive_int
from commbench.cli.common import size as _size
from commbench.cli.nccl_flags import add_nccl_tests_flags
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


def suite_defaults() -> dict[str, str]:
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


def add_run_parser(sub: Any, q: dict[str, str]) -> argparse.ArgumentParser:
    """Add ``run`` to the sub-parsers ``sub``; ``q`` is :func:`suite_defaults` (or {}: the help says "unset")."""

    def dflt(key: str) -> str:
        """'(default: the suite's; quick: 1K)': a flag left out keeps the suite's value."""
        return f"(default: the suite's value; {DEFAULT_SUITE}: {q.get(key, 'unset')})"

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
    return r  # type: ignore[no-any-return]


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
