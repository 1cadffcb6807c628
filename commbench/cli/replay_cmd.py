"""`commbench replay TRACE...`: read a profiler trace's training step, replay its communication here under each
precision, write ``replay.csv`` and ``replay_steps.csv`` and print the nccl-tests table and the step summary.

The supervisor reads the traces first (a bad trace is one line, exit 2, before anything is spawned); each rank
reads them again (every rank needs the calls, and files are cheaper than a broadcast) and runs
:func:`commbench.measure.replay.replay`; rank 0 writes and prints.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from commbench.cli.common import CLIError, csv_list, positive_float, positive_int
from commbench.store.trace_calls import Trace, TraceCall, TraceError
from commbench.store.trace_exposure import CPU_REASON, Exposure, exposure
from commbench.store.traces import (
    describe,
    load_traces,
    pick_step,
    placement,
    rank_mismatches,
    step_calls,
    trace_groups,
)

DEFAULT_PRECISIONS = ("trace", "bf16", "fp8_e4m3")
ROW_COLUMNS = (
    "collective", "size_bytes", "dtype", "group", "group_size", "precision", "calls_per_step", "time_us",
    "time_ci_low_us", "time_ci_high_us", "comm_us", "encode_us", "decode_us", "wire_bytes", "wire_dtype", "busbw_gbps",
    "speedup", "speedup_ci_low", "speedup_ci_high", "speedup_significant", "step_time_us", "rel_err", "max_abs_err",
    "wrong", "samples", "trace_precision",
)  # fmt: skip
"""``replay.csv``: one row per (collective, size_bytes, dtype, group, precision). ``size_bytes`` and ``dtype`` are the
trace's (nccl-tests' size of the call as the job ran it); ``time_us`` is the call's time at ``precision`` with
encode and decode (what the step pays), its 95 % interval beside it; ``speedup`` is the trace's precision's time
over this one's, paired in the same rounds."""
STEP_COLUMNS = (
    "precision", "step_comm_us", "step_comm_ci_low_us", "step_comm_ci_high_us", "speedup", "speedup_ci_low",
    "speedup_ci_high", "speedup_significant", "bytes_per_step", "rel_err_max", "rel_err_mean", "calls_replayed",
    "trace_step_us", "trace_comm_us", "exposed_us", "overlap_ratio", "projected_step_us", "projected_step_ci_low_us",
    "projected_step_ci_high_us",
)  # fmt: skip


def add_replay_parser(sub: Any) -> None:
    """The ``replay`` sub-parser."""
    r = sub.add_parser(
        "replay",
        help="replay a PyTorch profiler trace's step: its collectives here under each precision",
        description="Read one training step's communication from torch.profiler traces (Kineto JSON, .json.gz, or "
        "the execution trace; one file, per-rank files or a folder) and replay it on this world under each "
        "precision. See docs/replay.md.",
    )  # fmt: skip
    r.add_argument("traces", nargs="+", type=Path, metavar="TRACE", help="trace files or folders of them")
    r.add_argument("--precisions", type=csv_list, default=list(DEFAULT_PRECISIONS),
                   help="comma-separated; 'trace' = each call at the dtype it was recorded in (default: trace,bf16,fp8_e4m3)")  # fmt: skip
    r.add_argument(
        "--step",
        default="last",
        help="step to replay: last (default), first, a ProfilerStep number, all (a trace without steps: the whole "
        "trace) or START:END (microseconds after the first call)",
    )
    r.add_argument("--out", type=Path, help="output folder (default: results/replay-<trace name>)")
    r.add_argument(
        "--nproc",
        type=positive_int,
        help="local ranks to spawn when not under torchrun/Slurm/MPI (default: the trace's world size)",
    )
    r.add_argument(
        "--backend", choices=("auto", "gloo", "nccl"), default="auto", help="process group backend (default: auto)"
    )
    r.add_argument("--max-time", type=positive_float, default=2.0, help="seconds of sampling per call size (default 2)")
    r.add_argument("--repeats", type=positive_int, default=6, help="minimum rounds per size and per step (default 6)")
    r.add_argument("--min-time", type=positive_float, help="minimum seconds per sample (default: the timing core's)")
    r.add_argument("--timeout", type=positive_float, help="collective timeout in seconds (default: torch's)")
    r.add_argument("--dry-run", action="store_true", help="only read the traces and print the step's calls")


def _read(args: argparse.Namespace) -> tuple[list[Trace], int]:
    try:
        traces = load_traces(list(args.traces))
        step = pick_step(traces[0], str(args.step))
        if ":" in str(args.step):  # every rank's trace over its own window (each trace's clock starts at its first call)
            for t in traces[1:]:
                pick_step(t, str(args.step))
        return traces, step
    except TraceError as e:
        raise CLIError(str(e)) from None


def plan_calls(traces: list[Trace], step: int, world: int) -> tuple[list[TraceCall], list[list[list[int]]], list[str]]:
    """(the lowest rank's calls of ``step``, each call's group layout on ``world`` ranks, notes)."""
    calls = step_calls(traces[0], step)
    try:
        layouts = trace_groups(traces, calls, world)
    except TraceError as e:
        raise CLIError(str(e)) from None
    notes = rank_mismatches(traces, step)
    if any(c.group is None for c in calls):
        notes.append(
            "the trace records no process groups (an execution trace): every call is replayed on the whole world"
        )
    return calls, layouts, notes


def cmd_replay(args: argparse.Namespace, argv: list[str]) -> int:
    from commbench.cluster.launch import RankFailure, check_local_nproc, detect_world, resolve_backend, spawn_local
    from commbench.measure.precision import get_precision

    for p in args.precisions:
        if p != "trace":
            get_precision(p)  # an unknown name: one line naming the valid ones, before anything is read or spawned
    traces, step = _read(args)
    if detect_world() is not None:
        return replay_worker(args, traces, step)
    world = traces[0].world_size or max(2, len(traces))
    nproc = args.nproc or world
    plan_calls(traces, step, nproc)  # a layout this world cannot rebuild: one line before anything is spawned
    if args.dry_run:
        print_calls(traces, step)
        return 0
    check_local_nproc(nproc)
    backend = resolve_backend(args.backend, 0, nproc)
    out = args.out or default_out(traces)
    _check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    child = [*argv, "--backend", backend, "--out", str(out), "--nproc", str(nproc)]
    os.environ["COMMBENCH_ARGV"] = json.dumps(argv)  # metadata records what the user typed
    try:
        spawn_local(child, nproc, timeout_s=args.timeout, log_dir=out / "logs")  # fresh interpreters per rank
    except RankFailure as e:
        print(f"commbench: error: {e}", file=sys.stderr)
        return 1
    return 0


def print_calls(traces: list[Trace], step: int) -> None:
    """The step's calls per rank, and what was not read."""
    from commbench.store.traces import step_rows

    for t in traces:
        host = f" on {t.host}" if t.host else ""
        print(f"# {t.path}: rank {t.rank} of {t.world_size or '?'}{host} ({t.backend or t.format}), step {step}")
        for r in step_rows(step_calls(t, step)):
            where = placement(traces, r.group)
            print(
                f"  {r.collective:<15} {r.size_bytes:>12} B {r.dtype:<9} group {r.group_name} {ranks_text(r.group)} "
                f"({where})  x{r.calls_per_step}"
            )
        _print_counts(t)


def ranks_text(group: tuple[int, ...] | None) -> str:
    """``[0, 2]``; a long group as ``[0..127] (128 ranks)`` when consecutive, else its first ranks."""
    if group is None:
        return "[?]"
    if len(group) <= 8:
        return str(list(group))
    if list(group) == list(range(group[0], group[0] + len(group))):
        return f"[{group[0]}..{group[-1]}] ({len(group)} ranks)"
    return f"[{', '.join(map(str, group[:4]))}, ...] ({len(group)} ranks)"


def _print_counts(t: Trace) -> None:
    if t.unread:
        print(f"# unread: {describe(t.unread)}")
    if t.skipped:
        print(f"# not calls: {describe(t.skipped)}")


def replay_worker(args: argparse.Namespace, traces: list[Trace], step: int) -> int:
    """One rank of the replay."""
    from commbench.cluster.launch import detect_world, init_world, shutdown_world
    from commbench.core.suite import load_suite
    from commbench.measure.replay import ReplayCall, group_kind, replay

    info = detect_world()
    assert info is not None
    d = init_world(info, args.backend, args.timeout)
    try:
        calls, layouts, notes = plan_calls(traces, step, d.world_size)
        kinds = {json.dumps(p): group_kind(p, d.hosts) for p in layouts}
        rcalls = [
            ReplayCall(c.collective, c.numel, c.dtype, kinds[json.dumps(p)], c.order)
            for c, p in zip(calls, layouts, strict=True)
        ]
        timing: dict[str, Any] = {"budget_s": args.max_time, "repeats": args.repeats}
        if args.min_time:
            timing["min_time_s"] = args.min_time
        real = [p for p in args.precisions if p != "trace"] or ["fp32"]
        suite = load_suite("quick").with_overrides(precisions=real, timing=timing)
        out = args.out or default_out(traces)
        agree_out(d, out)
        start = run_start()
        result = replay(d, suite, rcalls, args.precisions)
        from commbench.cluster.metadata import gather_nodes

        nodes = gather_nodes(d)  # every rank: one report per node
        if d.rank == 0:
            notes += write_run_dir(out, suite, d, start, nodes, result.records, args.timeout)
            write_calls(out / "replay_calls.csv", traces, calls, [kinds[json.dumps(p)] for p in layouts])
            write_outputs(out, traces, step, result, notes, world=(d.world_size, d.backend))
        d.barrier()
        return 0
    finally:
        shutdown_world()


def default_out(traces: list[Trace]) -> Path:
    return Path("results") / f"replay-{Path(traces[0].path).name.split('.')[0]}"


def _check_out(out: Path) -> None:
    """A replay folder is new, as a run directory is: nothing already written is overwritten."""
    from commbench.store.results import RunDirError, check_new_run_dir

    try:
        check_new_run_dir(out)
    except RunDirError as e:
        raise CLIError(str(e)) from None


def agree_out(d: Any, out: Path) -> None:
    """Rank 0 owns the folder: its verdict on it (a local spawn's supervisor made it, holding only the logs) is
    every rank's, before anything is measured."""
    import torch.distributed as dist

    problem = [""]
    if d.rank == 0:
        try:
            _check_out(out)
        except CLIError as e:
            problem = [str(e)]
    dist.broadcast_object_list(problem, src=0)
    if problem[0]:
        raise CLIError(problem[0])


def run_start() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_run_dir(
    out: Path, suite: Any, d: Any, start: str, nodes: Any, records: list[Any], timeout: float | None
) -> list[str]:
    """The replay folder as a run directory too (metadata.json, results.csv/parquet: the per-call-size records, as
    ``run`` writes them), so ``commbench report``, ``fit`` and ``plan RUN_DIR`` read the job's own call sizes. A row
    on a trace's own group layout stays in replay.csv only (``fit`` knows the registered group kinds); notes say so."""
    from commbench.cli.orchestrate import run_metadata
    from commbench.measure.replay import is_trace_kind
    from commbench.store.results import RunWriter

    argv = json.loads(os.environ.get("COMMBENCH_ARGV", "null")) or sys.argv[1:]
    writer = RunWriter(out)
    writer.write_metadata(
        run_metadata(suite, d, ["python", "-m", "commbench", *argv], start, nodes, collective_timeout_s=timeout)
    )
    keep = [r for r in records if not is_trace_kind(r.group)]
    writer.add(keep)
    writer.flush()
    left = sorted({r.group for r in records if is_trace_kind(r.group)})
    if left:
        return [
            f"{len(records) - len(keep)} rows on the trace's own group layouts ({', '.join(left)}) are in replay.csv only, not results.csv"
        ]
    return []


def _csv(path: Path, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


CALL_COLUMNS = ("order", "collective", "size_bytes", "dtype", "group", "group_size", "placement", "peer", "source",
                "replayed_on")  # fmt: skip
"""``replay_calls.csv``: the step's calls of the replayed rank in the trace's order: the group's ranks in the job,
where they ran (``intra``, ``inter``, ``unknown`` without every rank's trace), the group kind it is replayed on."""


def write_calls(path: Path, traces: list[Trace], calls: list[TraceCall], kinds: list[str]) -> None:
    rows = [
        {"order": c.order, "collective": c.collective, "size_bytes": c.size_bytes, "dtype": c.dtype,
         "group": " ".join(map(str, c.group or ())), "group_size": c.group_size, "placement": placement(traces, c.group),
         "peer": "" if c.peer is None else c.peer, "source": c.source, "replayed_on": k}
        for c, k in zip(calls, kinds, strict=True)
    ]  # fmt: skip
    _csv(path, CALL_COLUMNS, rows)


def write_outputs(
    out: Path, traces: list[Trace], step: int, result: Any, notes: list[str], world: tuple[int, str]
) -> None:
    """replay.csv, replay_steps.csv, replay.json and replay.md, and the console table and summary."""
    from commbench.measure.collectives import get_collective
    from commbench.measure.console import PointPrinter
    from commbench.store.trace_calls import DTYPE_SIZES
    from commbench.views.replay_report import write_replay_report

    rows = []
    for r in result.rows:
        rows.append({
            **r, "size_bytes": r["fp32_bytes"] // 4 * DTYPE_SIZES[r["trace_dtype"]], "dtype": r["trace_dtype"],
            "wire_dtype": r["dtype"], "time_us": r["total_us"], "time_ci_low_us": r["total_ci_low_us"],
            "time_ci_high_us": r["total_ci_high_us"],
        })  # fmt: skip
    _csv(out / "replay.csv", ROW_COLUMNS, rows)
    replayed = sum(int(r["calls_per_step"]) for r in rows if r["trace_precision"])
    exp = exposure(traces[0], step)
    steps = [step_row(s, replayed) | exposure_columns(exp, s) for s in result.steps]
    _csv(out / "replay_steps.csv", STEP_COLUMNS, steps)
    printer = PointPrinter()
    size_key = None
    block: list[dict[str, Any]] = []
    for r in result.rows:
        key = (r["collective"], r["fp32_bytes"], r["group"])
        if key != size_key and block:
            printer.rows(block, get_collective(block[0]["collective"]).redop)
            block = []
        size_key = key
        block.append(r)
    if block:
        printer.rows(block, get_collective(block[0]["collective"]).redop)
    print("#")
    print(f"# replay of step {step} of {traces[0].path} (rank {traces[0].rank} of {traces[0].world_size or '?'}):")
    for s in steps:
        sig = "significant" if s["speedup_significant"] else "not significant"
        gain = (
            ""
            if s["precision"] == "trace"
            else f", speed-up {s['speedup']:.3f} [{s['speedup_ci_low']:.3f}, {s['speedup_ci_high']:.3f}] ({sig})"
        )
        print(
            f"#   {s['precision']:<10} comm {s['step_comm_us']:.1f} us/step [{s['step_comm_ci_low_us']:.1f}, "
            f"{s['step_comm_ci_high_us']:.1f}]{gain}, {s['bytes_per_step']} B/step, rel_err max {s['rel_err_max']:.2e}"
        )
    if exp is None:
        print(f"# exposure: {CPU_REASON}")
    else:
        print(
            f"# exposure (HolisticTraceAnalysis' definition): step {exp.step_us:.1f} us, communication kernels "
            f"{exp.comm_us:.1f} us, {100 * exp.overlap_ratio:.1f} % overlapped with compute, {exp.exposed_us:.1f} us exposed"
        )
        for s in steps[1:]:
            print(
                f"#   {s['precision']:<10} projected step {s['projected_step_us']:.1f} us "
                f"[{s['projected_step_ci_low_us']:.1f}, {s['projected_step_ci_high_us']:.1f}] (exposed part / speed-up)"
            )
    for p in result.same_as_trace:
        notes.append(f"{p} is the dtype of every call of the trace: its step is the trace's own")
    for why, n in result.not_replayed.items():
        print(f"# not replayed: {n} x {why}")
    _print_counts(traces[0])
    for n in notes:
        print(f"# note: {n}")
    t0 = traces[0]
    meta = {
        "trace": t0.path, "step": step, "world_size": world[0], "backend": world[1], "trace_rank": t0.rank,
        "trace_world_size": t0.world_size, "trace_backend": t0.backend or t0.format, "not_replayed": result.not_replayed,
        "unread": dict(t0.unread), "skipped": dict(t0.skipped), "notes": notes,
        "exposure": CPU_REASON if exp is None else (
            f"In the trace, {100 * exp.overlap_ratio:.0f} % of the step's {exp.comm_us:.0f} us of communication kernels "
            f"overlapped compute; {exp.exposed_us:.0f} us were exposed (HolisticTraceAnalysis' definition)."
        ),
    }  # fmt: skip
    (out / "replay.json").write_text(json.dumps(meta, indent=1))
    report = write_replay_report(out)
    print(f"# results: {out / 'replay.csv'}, {out / 'replay_steps.csv'}, {out / 'replay_calls.csv'}, {report}")


def exposure_columns(exp: Exposure | None, s: Any) -> dict[str, float]:
    """The trace's exposure and the step it projects for precision ``s``: the exposed part divided by the measured
    speed-up, its interval from the speed-up's (NaN without a GPU timeline)."""
    if exp is None:
        return dict.fromkeys(STEP_COLUMNS[STEP_COLUMNS.index("trace_step_us") :], math.nan)
    own = s.precision == "trace"
    value, low, high = (1.0, 1.0, 1.0) if own else (s.speedup.value, s.speedup.low, s.speedup.high)
    return {
        "trace_step_us": exp.step_us, "trace_comm_us": exp.comm_us, "exposed_us": exp.exposed_us,
        "overlap_ratio": exp.overlap_ratio, "projected_step_us": exp.projected_step_us(value),
        "projected_step_ci_low_us": exp.projected_step_us(high), "projected_step_ci_high_us": exp.projected_step_us(low),
    }  # fmt: skip


def step_row(s: Any, calls: int) -> dict[str, Any]:
    def us(x: float) -> float:
        return x * 1e6 if math.isfinite(x) else math.nan

    from commbench.core.stats import significant

    own = s.precision == "trace"
    return {
        "precision": s.precision, "step_comm_us": us(s.time.value), "step_comm_ci_low_us": us(s.time.low),
        "step_comm_ci_high_us": us(s.time.high), "speedup": 1.0 if own else s.speedup.value,
        "speedup_ci_low": 1.0 if own else s.speedup.low, "speedup_ci_high": 1.0 if own else s.speedup.high,
        "speedup_significant": False if own else significant(s.speedup), "bytes_per_step": s.wire_bytes,
        "rel_err_max": s.rel_err_max, "rel_err_mean": s.rel_err_mean, "calls_replayed": calls,
    }  # fmt: skip
