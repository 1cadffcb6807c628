"""Reading PyTorch profiler traces for ``commbench replay``: files, folders and gzip; which format a document is
(Kineto JSON, :mod:`commbench.store.trace_kineto`; execution trace, :mod:`commbench.store.trace_et`); several
ranks' traces of one run together; and one step's communication as rows of (collective, size, dtype, group) with
their calls per step.

Every refusal is a :class:`~commbench.store.trace_calls.TraceError`: one line naming the file and the problem
(truncated, not JSON, an unknown format or schema, no communication, no step).
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from commbench.store.trace_calls import DTYPE_SIZES, Trace, TraceCall, TraceError
from commbench.store.trace_et import read_execution_trace
from commbench.store.trace_kineto import read_kineto

KINETO_SCHEMAS = (1,)
"""Kineto's ``schemaVersion`` values this reader knows (torch 1.8 to 2.13 write 1)."""
ET_SCHEMA_MAJOR = "1."
"""The execution trace's ``schema`` major version this reader knows (``1.1.1-chakra.0.0.4`` in torch 2.13)."""

TRACE_SUFFIXES = (".json", ".json.gz")


def trace_files(paths: list[Path]) -> list[Path]:
    """The files named, a folder standing for every ``*.json`` / ``*.json.gz`` in it (sorted)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise TraceError(f"{p}: no trace files (*.json, *.json.gz) in this folder")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise TraceError(f"{p}: no such file or folder")
    return out


def _document(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise TraceError(f"{path}: truncated or damaged gzip ({e})") from None
    try:
        doc = json.loads(raw)
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text JSON file") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: truncated or not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise TraceError(f"{path}: unknown format (a JSON {type(doc).__name__}, not a torch.profiler trace)")
    return doc


def read_trace(path: Path) -> Trace:
    """One trace file of either format; TraceError (one line) when it cannot be read."""
    doc = _document(path)
    if "traceEvents" in doc:
        v = doc.get("schemaVersion", 1)
        if v not in KINETO_SCHEMAS:
            raise TraceError(
                f"{path}: Kineto schemaVersion {v!r}; this reader knows {', '.join(map(str, KINETO_SCHEMAS))}"
            )
        return read_kineto(str(path), doc)
    if "nodes" in doc and "schema" in doc:
        schema = str(doc.get("schema"))
        if not schema.startswith(ET_SCHEMA_MAJOR):
            raise TraceError(f"{path}: execution-trace schema {schema!r}; this reader knows {ET_SCHEMA_MAJOR}x")
        return read_execution_trace(str(path), doc)
    raise TraceError(
        f"{path}: unknown format: neither a torch.profiler Kineto trace ('traceEvents') nor an execution trace "
        "('schema' and 'nodes')"
    )


def load_traces(paths: list[Path]) -> list[Trace]:
    """Every rank's trace, by rank; TraceError when two files claim one rank, or none holds a communication call."""
    traces = [read_trace(p) for p in trace_files(paths)]
    seen: dict[int, str] = {}
    for t in traces:
        if t.rank in seen and t.format == "kineto":
            raise TraceError(f"{t.path} and {seen[t.rank]} are both traces of rank {t.rank}; give one run's traces")
        seen[t.rank] = t.path
    worlds = {t.world_size for t in traces if t.world_size is not None}
    if len(worlds) > 1:
        raise TraceError(
            f"the traces come from worlds of {', '.join(map(str, sorted(worlds)))} ranks; give one run's traces"
        )
    if not any(t.calls for t in traces):
        t = traces[0]
        why = f"; unread: {describe(t.unread)}" if t.unread else f"; not calls: {describe(t.skipped)}" if t.skipped else ""
        raise TraceError(f"{t.path}: no communication call in the trace{why}")
    # a run's Kineto trace before its execution trace: the Kineto one knows the groups
    return sorted(traces, key=lambda t: (t.rank, t.format != "kineto"))


def describe(counts: Counter[str]) -> str:
    """``3 x c10d::allreduce_: dtype not recorded, 1 x ...``: what was not read, named and counted."""
    return ", ".join(f"{n} x {k}" for k, n in counts.most_common())


WINDOW = -2
"""The step number of a window given as ``--step A:B``."""


def window(trace: Trace, spec: str) -> int:
    """``A:B``: the calls between A and B microseconds after the trace's first call (the timeline's times, as a
    trace viewer shows them relative to its start) as one step, :data:`WINDOW`."""
    if trace.format != "kineto":
        raise TraceError(f"--step {spec}: a window needs a Kineto trace's times; this is an {trace.format}")
    try:
        a, b = (float(x) for x in spec.split(":"))
    except ValueError:
        raise TraceError(f"--step {spec!r}: a window is START:END in microseconds, e.g. 1500:9000") from None
    if not trace.calls or b <= a:
        raise TraceError(f"--step {spec}: an empty window")
    t0 = min(c.ts_us for c in trace.calls)
    inside = sorted((c for c in trace.calls if t0 + a <= c.ts_us <= t0 + b), key=lambda c: c.ts_us)
    if not inside:
        raise TraceError(f"--step {spec}: no communication call between {a:g} and {b:g} us")
    trace.calls = [replace(c, step=WINDOW, order=i) for i, c in enumerate(inside)]
    trace.steps = [WINDOW]
    return WINDOW


def pick_step(trace: Trace, step: str) -> int:
    """The step to replay: ``last`` (the default: the first steps carry warm-up work), ``first``, ``all`` (a trace
    without ``ProfilerStep#N`` spans, as one step), a step number, or a window ``A:B`` (:func:`window`)."""
    if ":" in step:
        return window(trace, step)
    if not trace.steps:
        if step == "all":
            return -1
        raise TraceError(
            f"{trace.path}: no ProfilerStep#N spans (profile with a schedule and call prof.step() each step), "
            "so the step cannot be told; give --step all (the whole trace as one step) or --step START:END (us)"
        )
    with_calls = [s for s in trace.steps if any(c.step == s for c in trace.calls)]
    if step in ("last", "first"):
        if not with_calls:
            raise TraceError(f"{trace.path}: no step holds a communication call")
        return with_calls[-1] if step == "last" else with_calls[0]
    if step == "all":
        raise TraceError(f"{trace.path}: the trace has steps {trace.steps}; --step all is for a trace without them")
    try:
        n = int(step)
    except ValueError:
        raise TraceError(f"--step {step!r}: valid: last, first, all, a step number ({trace.steps}) or START:END in us") from None
    if n not in trace.steps:
        raise TraceError(f"--step {n}: the trace has steps {trace.steps}")
    return n


@dataclass(frozen=True, slots=True)
class StepRow:
    """The calls of one step that share (collective, size, dtype, group): one row of ``replay.csv``."""

    collective: str
    numel: int
    """Elements of nccl-tests' size."""
    dtype: str
    group: tuple[int, ...] | None
    group_name: str
    calls_per_step: int
    first: int
    """Order of its first call in the step."""

    @property
    def size_bytes(self) -> int:
        return self.numel * DTYPE_SIZES.get(self.dtype, 0)


def step_calls(trace: Trace, step: int) -> list[TraceCall]:
    return sorted((c for c in trace.calls if c.step == step), key=lambda c: c.order)


def step_rows(calls: list[TraceCall]) -> list[StepRow]:
    """The step's calls as rows, in the order of each row's first call."""
    rows: dict[tuple[Any, ...], list[TraceCall]] = {}
    for c in calls:
        rows.setdefault((c.collective, c.numel, c.dtype, c.group, c.group_name), []).append(c)
    return [
        StepRow(k[0], k[1], k[2], k[3], k[4], len(v), v[0].order)
        for k, v in sorted(rows.items(), key=lambda kv: kv[1][0].order)
    ]


def placement(traces: list[Trace], group: tuple[int, ...] | None) -> str:
    """Where the job's group ran: ``intra`` (every rank on one host), ``inter`` (across hosts), or ``unknown`` when
    the traces do not hold every rank's host (give every rank's trace)."""
    hosts = {t.rank: t.host for t in traces if t.host and t.format == "kineto"}
    if group is None or any(r not in hosts for r in group):
        return "unknown"
    return "intra" if len({hosts[r] for r in group}) == 1 else "inter"


def rank_mismatches(traces: list[Trace], step: int) -> list[str]:
    """Where the ranks' traces disagree on the step's collectives (point-to-point calls differ by rank): one line
    per rank that differs from the lowest rank."""

    def key(t: Trace) -> list[tuple[Any, ...]]:
        return [
            (c.collective, c.numel, c.dtype)
            for c in step_calls(t, step)
            if c.peer is None and c.collective not in ("send", "recv")
        ]

    base = traces[0]
    out = []
    for t in traces[1:]:
        if t.steps and step not in t.steps:
            out.append(f"rank {t.rank}'s trace has no step {step}")
        elif key(t) != key(base):
            out.append(f"rank {t.rank}'s collectives in step {step} differ from rank {base.rank}'s")
    return out


def _completed(group: tuple[int, ...], world: int) -> list[list[int]] | None:
    """Every group of ``group``'s layout on ``world`` ranks, when ``group`` is a block of consecutive ranks or ranks
    a fixed stride apart (how DeviceMesh and torchrun's rank order lay out TP, DP and PP groups): the blocks of
    ``stride x size`` ranks, each split into ``stride`` groups."""
    k = len(group)
    stride = group[1] - group[0] if k > 1 else 1
    if stride < 1 or any(b - a != stride for a, b in zip(group, group[1:], strict=False)) or world % (stride * k):
        return None
    span = stride * k
    parts = [[start + off + i * stride for i in range(k)] for start in range(0, world, span) for off in range(stride)]
    return parts if list(group) in parts else None


def trace_groups(traces: list[Trace], calls: list[TraceCall], world: int) -> list[list[list[int]]]:
    """Each call's group layout on ``world`` ranks (every group of the layout, as lists of ranks): the trace's own
    groups of the same description where every rank's traces list them all, else completed from the call's group
    (:func:`_completed`). A trace of another world size maps onto this one only through whole-world groups;
    TraceError (one line) for a group that cannot be rebuilt."""
    trace_world = traces[0].world_size
    known: dict[tuple[int, ...], str] = {}
    for t in traces:
        for g in t.groups.values():
            known.setdefault(g.ranks, g.desc)
    out = []
    for c in calls:
        if c.group is None or (trace_world is not None and sorted(c.group) == list(range(trace_world))):
            out.append([list(range(world))])
            continue
        if trace_world != world:
            raise TraceError(
                f"the trace's {c.collective} runs on group {list(c.group)} of a {trace_world}-rank world: only "
                f"whole-world groups map onto {world} ranks (replay with --nproc {trace_world})"
            )
        desc = known.get(c.group, "")
        family = [list(g) for g, d in known.items() if desc and d == desc and len(g) == len(c.group)]
        if sorted(r for g in family for r in g) != list(range(world)):
            family = _completed(c.group, world) or []
        if sorted(r for g in family for r in g) != list(range(world)):
            raise TraceError(
                f"the trace's group {list(c.group)} ({desc or 'no description'}) is neither regular nor listed with "
                f"the rest of its layout: give every rank's trace"
            )
        out.append(sorted(family))
    return out
