"""Import nccl-tests / rccl-tests output into commbench run directories.

This module owns the mapping into the results schema: which reader a file needs, which collective a table
belongs to, the world size of each table, how tables group into runs, and the run directories it writes. The
readers are ``nccl_text`` (the tables the ``*_perf`` binaries print) and ``nccl_json`` (nccl-tests ``-J``,
rccl-tests ``-Z json|csv``).

Which reader: a file whose first character is ``{`` is JSON; one starting with ``[`` is JSON only if it parses as
JSON (or its first line is a lone ``[`` / starts ``[{``): Open MPI's ``--tag-output`` (``[1,0]<stdout>:``) and
bracketed-rank prefixes are text; a first line ``numCycle,...`` or ``collective, ...`` is an rccl-tests CSV.

Which collective a table belongs to (the rows do not say), first rule that applies:
1. the ``collective`` argument (``--collective``), for every table in the file;
2. the file's own name for it (rccl-tests records), or the last binary named before the table (``all_reduce_perf``
   in a command line, in ``# Collective test starting: ...``, or JSON ``args[0]``);
3. the rows: root >= 0 -> broadcast (redop none) or reduce; redop != none -> all_reduce when size == count x type
   width, else reduce_scatter; redop none with size == count x n x width -> all_gather or all_to_all, which the
   rows cannot tell apart: an error asking for ``--collective``.

World size of a table, in this order:
- JSON (nccl-tests ``-J``): one ``devices`` entry per process, each process driving nthreads x ngpus ranks: the
  product (``-g 8`` is 8 ranks, ``-t 2 -g 2`` is 4, ``mpirun -np 2 ... -g 8`` is 16);
- rccl-tests files: ``gpus``, or ``ranks x gpusPerRank``;
- text: the rows when they fix it: size / (count x width) for the collectives whose count is one rank's share,
  else the busbw/algbw ratio, which is the collective's bus factor (2(n-1)/n for all_reduce, (n-1)/n for
  all_gather, ...): the one n whose factor lies within the printed digits' rounding, over every row of the table;
  then the device lines (the highest rank listed + 1). A log that keeps only some device lines ("Rank 7" and
  "Rank 15") reads as the rows say (16), and any disagreement between the sources is a warning in the metadata.

Runs: consecutive tables form one run while their layout (tool, world size, hosts, device, NCCL version, timing)
is the same and no (collective, type, redop, root) repeats; a repeat or a new layout starts the next run. One run
is written to ``out_dir``; several to ``out_dir/run1``, ``out_dir/run2``, ... Repeated rows inside one table
(``-N`` cycles) stay in one run with a ``cycle`` column.

Nothing is dropped silently: a data line that cannot be read is listed (line and reason) in ``warnings`` and in
each run's metadata (``skipped_lines``); rows joined across an NCCL log line are listed in ``recovered_rows``.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from commbench.cluster.metadata import build_metadata
from commbench.core.records import CollectivePoint, Record, col
from commbench.store import results as res
from commbench.store.nccl_common import (
    NCCL_COLLECTIVES,
    NCCL_TYPES,
    Block,
    NcclTestsCollective,
    ParsedLog,
    collective_for,
    nccl_version_string,
)
from commbench.store.nccl_json import RCCL_CSV_START, parse_nccl_json, parse_rccl_csv
from commbench.store.nccl_text import parse_nccl_text

__all__ = [
    "COLLECTIVES",
    "NCCL_TYPES",
    "ImportResult",
    "NcclIteration",
    "NcclTestsPoint",
    "import_log",
    "import_nccl_tests",
    "nccl_version_string",
    "read_log",
    "world_size",
]

COLLECTIVES = sorted(NCCL_COLLECTIVES)

_DOC = CollectivePoint.docs()


@dataclass(kw_only=True, slots=True)
class NcclTestsPoint(CollectivePoint):
    """A results row imported from an nccl-tests / rccl-tests log: the columns a log may not give are redeclared
    as optional (None/NaN, as nccl-tests' own N/A), then what nccl-tests adds and where the row came from."""

    TABLE: ClassVar[str] = "results"

    # Widening a parent's field type breaks substitutability for mypy, on purpose: code reading an import's
    # rows must expect gaps, and the dtypes (nullable Int64, float64 for NaN) follow from these types.
    world_size: int | None = col(_DOC["world_size"] + "; None when the log does not tell")  # type: ignore[assignment]
    nodes: int | None = col(_DOC["nodes"] + "; None when the log lists only some ranks' hosts")  # type: ignore[assignment]
    payload: str | None = col("None: nccl-tests does not say what its data was")  # type: ignore[assignment]
    iters: int | None = col("iterations per measurement (nccl-tests -n); None if the log does not say")  # type: ignore[assignment]
    samples: int | None = col("None: nccl-tests reports one averaged measurement")  # type: ignore[assignment]
    wrong: float = col(_DOC["wrong"] + "; NaN where nccl-tests printed N/A (no data check)")  # type: ignore[assignment]
    timestamp: str = col(
        "when the point was measured: nccl-tests -S's time (the machine's local time as printed, no zone), else the JSON's start_time, else the import's time (UTC)"
    )
    placement: str = col("nccl-tests column group: out-of-place or in-place")
    redop: str = col("nccl-tests redop column (sum, none, ...)")
    root: int = col("nccl-tests root column (-1 for rootless collectives)")
    time_source: str = col(
        "gpu: time_us is the time to completion (nccl-tests' default); cpu: -C 1, the host's time to launch the ops, which excludes the rest of their run"
    )
    iter_min_us: float = col(
        "fastest iteration, microseconds (nccl-tests -I 1: i_min; max over the ranks per iteration)", math.nan
    )
    iter_max_us: float = col("slowest iteration, microseconds (-I 1: i_max)", math.nan)
    iter_p99_us: float = col("99th percentile iteration, nearest rank, microseconds (-I 1: i_p99)", math.nan)
    iter_avg_us: float = col("mean iteration, microseconds (-I 1 JSON avg_us)", math.nan)
    iter_stdev_us: float = col(
        "population standard deviation of the iterations, microseconds (-I 1 JSON stdev_us)", math.nan
    )
    iter_skipped: int | None = col("leading iterations left out of the -I statistics (nccl-tests -K)", None)
    cycle: int = col("repetition of the same point in one table (nccl-tests -N, rccl-tests numCycle), from 0", 0)
    block: int = col("index of the result table (or JSON document) in the imported file")
    source_line: int | None = col(
        "line of the row in a text log (its first line when it was joined across lines); None for JSON"
    )


@dataclass(kw_only=True, slots=True)
class NcclIteration(Record):
    """One iteration's time of one imported point (nccl-tests -I 1 JSON ``times_us`` / ``per_process_max_times_us``)."""

    TABLE: ClassVar[str] = "nccl_iterations"

    block: int = col("index of the JSON document in the imported file")
    collective: str = col("collective name")
    dtype: str = col("nccl-tests type name")
    redop: str = col("nccl-tests redop column")
    root: int = col("nccl-tests root column")
    size_bytes: int = col("nccl-tests size of the call, bytes")
    placement: str = col("out-of-place or in-place")
    process: int = col(
        "-1: the slowest rank of each iteration (times_us); p >= 0: process p's slowest GPU (per_process_max_times_us[p])"
    )
    iteration: int = col("iteration index, from 0 (the -K skipped ones included)")
    time_us: float = col("the iteration's time, microseconds")


@dataclass(slots=True)
class ImportResult:
    """What an import wrote and what the user should know about it."""

    runs: list[Path]
    """The run directories written: ``out_dir`` itself, or ``out_dir/run1``, ``out_dir/run2``, ..."""
    warnings: list[str] = field(default_factory=list)


def read_log(text: str) -> ParsedLog:
    """Parse a file's text with the reader its first line calls for (module docstring)."""
    head = text.lstrip()
    first = head.splitlines()[0].strip() if head else ""
    if head.startswith("{"):
        return parse_nccl_json(text)
    if head.startswith("["):
        try:
            json.loads(text)
        except json.JSONDecodeError:
            if first == "[" or first.startswith(("[{", "[ {")):
                return parse_nccl_json(text)  # raises the parser's error, naming the line
            return parse_nccl_text(text)
        return parse_nccl_json(text)
    if first.startswith(RCCL_CSV_START) and "busbw" in first:
        return parse_rccl_csv(text)
    return parse_nccl_text(text)


# --- collective and world size ------------------------------------------------------------------------------


def _infer_collective(row: dict[str, Any], where: str) -> str:
    width = NCCL_TYPES[row["dtype"]][1]
    if row["root"] >= 0:
        return "broadcast" if row["redop"] == "none" else "reduce"
    full = row["size_bytes"] == row["count"] * width
    if row["redop"] != "none":
        return "all_reduce" if full else "reduce_scatter"
    if full:
        # a rank count of 1 makes every collective look alike; sendrecv is the only one with count == size
        return "sendrecv"
    raise ValueError(
        f"{where}: cannot tell all_gather from all_to_all from the rows (redop none, root -1); "
        f"pass --collective with one of {', '.join(COLLECTIVES)}"
    )


def _assign_collectives(log: ParsedLog, collective: str | None) -> None:
    for b in log.blocks:
        named = collective_for(b.binary) if b.binary else None
        for r in b.rows:
            if collective is not None:
                r["collective"] = collective
            elif "collective" in r:
                continue
            elif named is not None:
                r["collective"] = named.name
            elif b.binary:  # a binary nccl-tests has and commbench does not model: keep its name
                r["collective"] = b.binary
            else:
                where = f"line {r['source_line']}" if r.get("source_line") else f"table {b.index}"
                r["collective"] = _infer_collective(r, where)


def _n_range(c: NcclTestsCollective, lo: float, hi: float, most: int = 1 << 24) -> tuple[int, int]:
    """The n with lo <= bus_factor(n) <= hi (the factor grows with n): (first, last); first > last if none."""

    def first_at_least(x: float) -> int:
        a, b = 1, most + 1
        while a < b:
            m = (a + b) // 2
            a, b = (m + 1, b) if c.bus_factor(m) < x else (a, m)
        return a

    return first_at_least(lo), first_at_least(math.nextafter(hi, math.inf)) - 1


def _world_from_rows(c: NcclTestsCollective | None, rows: list[dict[str, Any]]) -> tuple[int | None, str]:
    """The world size the rows fix, and how; (None, why not) when they do not."""
    if c is None:
        return None, "a collective commbench has no nccl-tests definitions for"
    for r in rows:
        n = c.world_from_count(r["size_bytes"], r["count"], NCCL_TYPES[r["dtype"]][1])
        if n:
            return n, "size / (count x type width)"
    if c.bus_factor(2) == c.bus_factor(3):
        return None, "its bus factor does not depend on the rank count"
    lo, hi = 1, 1 << 24
    informative = False
    for r in rows:
        a, b = r.get("algbw_gbps", math.nan), r.get("busbw_gbps", math.nan)
        da, db = r.get("algbw_res", 0.005), r.get("busbw_res", 0.005)
        if not (math.isfinite(a) and math.isfinite(b)) or a - da <= 0:
            continue
        f_lo, f_hi = c.bus_factor(lo), c.bus_factor(hi)
        r_lo, r_hi = max(0.0, (b - db) / (a + da)), (b + db) / (a - da)
        if r_lo <= f_lo and r_hi >= f_hi:
            continue  # this row cannot narrow the range
        n_lo, n_hi = _n_range(c, r_lo, r_hi)
        lo, hi = max(lo, n_lo), min(hi, n_hi)
        informative = True
    if not informative:
        return None, "no row with a bandwidth large enough to read the ratio"
    if lo == hi:
        return lo, "busbw / algbw (the bus factor)"
    if lo > hi:
        return None, "the rows' busbw/algbw ratios disagree"
    return None, f"busbw / algbw allows {lo} to {hi} ranks"


@dataclass(slots=True)
class _World:
    size: int | None
    source: str
    nodes: int | None
    warnings: list[str]


def world_size(block: Block) -> _World:
    """A block's world size by the module docstring's rule, with the nodes it spans and any disagreement."""
    warns: list[str] = []
    colls = Counter(r["collective"] for r in block.rows)
    coll = colls.most_common(1)[0][0]
    n_rows, how = _world_from_rows(collective_for(coll), [r for r in block.rows if r["collective"] == coll])
    hosts = {d.host for d in block.devices.values()}
    per_process = block.settings.get("nThread", 1) * block.settings.get("nGpus", 1)
    where = f"table {block.index + 1}" + (f" (line {block.line})" if block.line else "")
    if block.processes:  # nccl-tests -J
        n = block.processes * per_process
        if n_rows is not None and n_rows != n:
            warns.append(f"{where}: the JSON lists {block.processes} process(es) x {per_process} rank(s) = {n}, "
                         f"but the rows' {how} says {n_rows}")  # fmt: skip
        return _World(n, f"JSON devices ({block.processes} process(es)) x nthreads x ngpus", len(hosts) or None, warns)
    if block.ranks:  # rccl-tests files
        nodes = block.settings.get("nodes", 1 if block.ranks else None)
        if n_rows is not None and n_rows != block.ranks:
            warns.append(f"{where}: the file says {block.ranks} ranks, but the rows' {how} says {n_rows}")
        return _World(block.ranks, "rccl-tests gpus / ranks x gpusPerRank", nodes, warns)
    listed = len(block.devices)
    top = max(block.devices) + 1 if block.devices else 0
    complete = bool(listed) and listed == top
    if n_rows is not None:
        if top and n_rows < top:
            warns.append(f"{where}: the device lines name rank {top - 1}, but the rows' {how} says {n_rows} "
                         f"ranks: using {top}")  # fmt: skip
            return _World(top, "device lines (highest rank + 1)", len(hosts) if complete else None, warns)
        if listed and n_rows != listed:
            warns.append(f"{where}: {listed} device line(s) listed, but the rows' {how} says {n_rows} ranks: "
                         f"using {n_rows} (the log keeps only some device lines)")  # fmt: skip
        return _World(n_rows, how, len(hosts) if complete and listed == n_rows else None, warns)
    if top:
        if not complete:
            warns.append(f"{where}: the device lines list {listed} of ranks 0..{top - 1} and the rows do not fix "
                         f"the world size ({how}): using {top}, a lower bound")  # fmt: skip
        return _World(top, "device lines (highest rank + 1)", len(hosts) if complete else None, warns)
    warns.append(f"{where}: no device lines and the rows do not fix the world size ({how})")
    return _World(None, "unknown", None, warns)


# --- runs -----------------------------------------------------------------------------------------------------


def _layout(block: Block, w: _World) -> tuple[Any, ...]:
    info = next(iter(block.devices.values())).info if block.devices else None
    return (block.tool, w.size, tuple(sorted({d.host for d in block.devices.values()})), info, block.nccl_version,
            block.time_source)  # fmt: skip


def _group_runs(log: ParsedLog, worlds: list[_World]) -> list[list[int]]:
    runs: list[list[int]] = []
    keys: set[tuple[Any, ...]] = set()
    layout: tuple[Any, ...] | None = None
    for b, w in zip(log.blocks, worlds, strict=True):
        mine = {(r["collective"], r["dtype"], r["redop"], r["root"]) for r in b.rows}
        lay = _layout(b, w)
        if not runs or lay != layout or mine & keys:
            runs.append([])
            keys = set()
            layout = lay
        runs[-1].append(b.index)
        keys |= mine
    return runs


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ValueError(f"output path {out_dir} exists and is not a directory")
        if any(out_dir.iterdir()):
            raise ValueError(f"output directory {out_dir} is not empty; choose a new --out (imports never overwrite)")


def import_log(path: Path, out_dir: Path, collective: str | None = None) -> ImportResult:
    """Read nccl-tests / rccl-tests output at ``path`` and write one run directory per run (module docstring).

    Raises ValueError for a missing or unreadable file, a file no reader accepts (naming the line), an unknown
    collective, a log of independent runs printed together, or a non-empty ``out_dir``.
    """
    path, out_dir = Path(path), Path(out_dir)
    if collective is not None:
        c = collective_for(collective)
        if c is None:
            raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}")
        collective = c.name
    if not path.is_file():
        raise ValueError(f"nccl-tests output file {str(path)!r} does not exist")
    _check_out_dir(out_dir)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    log = read_log(text)
    _assign_collectives(log, collective)
    worlds = [world_size(b) for b in log.blocks]
    runs = _group_runs(log, worlds)
    warnings = [w for wd in worlds for w in wd.warnings]
    if any(b.time_source == "cpu" for b in log.blocks):
        warnings.append("the log was timed on the CPU (nccl-tests -C 1: cputime): time_us is the host's time to "
                        "launch the ops, not to complete them, and algbw/busbw follow from it; the rows say "
                        "time_source=cpu")  # fmt: skip
    if log.skipped:
        shown = ", ".join(str(s["line"]) for s in log.skipped[:20]) + (" ..." if len(log.skipped) > 20 else "")
        warnings.append(f"skipped {len(log.skipped)} line(s) that looked like data but could not be read: line(s) "
                        f"{shown} (each with its reason in metadata.json skipped_lines)")  # fmt: skip
    recovered = [r["joined_lines"] for b in log.blocks for r in b.rows if r.get("joined_lines")]
    if recovered:
        warnings.append(f"{len({tuple(x) for x in recovered})} row(s) were split by NCCL log lines and joined "
                        "back (metadata.json recovered_rows)")  # fmt: skip
    dirs = [out_dir] if len(runs) == 1 else [out_dir / f"run{k + 1}" for k in range(len(runs))]
    if len(runs) > 1:
        warnings.append(f"the log holds {len(runs)} runs (a new layout or a repeated collective x type starts a "
                        f"run): written to {', '.join(str(d) for d in dirs)}")  # fmt: skip
    starts = [log.blocks[r[0]].line for r in runs]
    for k, (members, d) in enumerate(zip(runs, dirs, strict=True)):
        first, nxt = starts[k], starts[k + 1] if k + 1 < len(starts) else None
        skipped = [
            s
            for s in log.skipped
            if (first is None or k == 0 or s["line"] >= first) and (nxt is None or s["line"] < nxt)
        ]
        blocks = [log.blocks[i] for i in members]
        df, iters, meta = _to_schema(blocks, [worlds[i] for i in members], log, path, skipped, warnings, k, len(runs))
        d.mkdir(parents=True, exist_ok=True)
        res.write_table(d, NcclTestsPoint.TABLE, df)
        if len(iters):
            res.write_table(d, NcclIteration.TABLE, iters)
        res.atomic_write_text(d / "metadata.json", json.dumps(meta, indent=2, default=str) + "\n")
    return ImportResult(dirs, warnings)


def import_nccl_tests(path: Path, out_dir: Path, collective: str | None = None) -> Path:
    """:func:`import_log` returning ``out_dir`` (holding the run, or ``run1``, ``run2``, ... for several)."""
    import_log(path, out_dir, collective)
    return Path(out_dir)


def _to_schema(
    blocks: list[Block], worlds: list[_World], log: ParsedLog, path: Path, skipped: list[dict[str, Any]],
    warnings: list[str], run: int, n_runs: int,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:  # fmt: skip
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    out: list[NcclTestsPoint] = []
    iters: list[NcclIteration] = []
    for b, w in zip(blocks, worlds, strict=True):
        seen: Counter[tuple[Any, ...]] = Counter()
        by_result: dict[tuple[int, str], dict[str, Any]] = {}
        for r in b.rows:
            key = (r["collective"], r["size_bytes"], r["dtype"], r["redop"], r["root"], r["placement"])
            cycle = r["cycle"] if r.get("cycle") is not None else seen[key]
            seen[key] += 1
            if "result_index" in r:
                by_result[(r["result_index"], r["placement"])] = r
            prec, width = NCCL_TYPES[r["dtype"]]
            time_us = r.get("time_us", math.nan)
            ts = r.get("timestamp") or b.start_time or now
            n_iters = r.get("iters") if r.get("iters") is not None else b.settings.get("iters")
            out.append(
                NcclTestsPoint(
                    collective=r["collective"], precision=prec, impl=b.tool, backend="nccl", device="cuda",
                    world_size=w.size, nodes=w.nodes if w.nodes else None, payload=None, dtype=r["dtype"],
                    size_bytes=r["size_bytes"], count=r["count"],
                    # same size definition, as if each element were 4 bytes
                    fp32_bytes=r["size_bytes"] // width * 4, wire_bytes=r["size_bytes"],
                    time_us=time_us, time_us_max=math.nan, p50_us=r.get("p50_us", math.nan),
                    p95_us=r.get("p95_us", math.nan), cv=r.get("cv", math.nan), rank_spread=math.nan,
                    iters=n_iters, samples=None, algbw_gbps=r.get("algbw_gbps", math.nan),
                    busbw_gbps=r.get("busbw_gbps", math.nan), encode_us=math.nan, comm_us=time_us,
                    decode_us=math.nan, total_us=math.nan, effective_gbps=math.nan, wrong=r.get("wrong", math.nan),
                    tolerance=math.nan, rel_err=math.nan, max_abs_err=r.get("max_abs_err", math.nan), timestamp=ts,
                    placement=r["placement"], redop=r["redop"], root=r["root"], time_source=b.time_source,
                    iter_min_us=r.get("iter_min_us", math.nan), iter_max_us=r.get("iter_max_us", math.nan),
                    iter_p99_us=r.get("iter_p99_us", math.nan), iter_avg_us=r.get("iter_avg_us", math.nan),
                    iter_stdev_us=r.get("iter_stdev_us", math.nan), iter_skipped=r.get("iter_skipped"),
                    cycle=cycle, block=b.index, source_line=r.get("source_line"),
                )
            )  # fmt: skip
        for it in b.iterations:
            r = by_result[(it["result_index"], it["placement"])]
            iters.append(
                NcclIteration(
                    block=b.index, collective=r["collective"], dtype=r["dtype"], redop=r["redop"], root=r["root"],
                    size_bytes=r["size_bytes"], placement=it["placement"], process=it["process"],
                    iteration=it["iteration"], time_us=it["time_us"],
                )
            )  # fmt: skip
    df = res.records_frame(out)
    devs = [d for b in blocks for d in b.devices.values()]
    hosts_all = sorted({d.host for d in devs})
    sizes = {w.size for w in worlds if w.size}
    world = max(sizes) if sizes else None
    nodes = {w.nodes for w in worlds if w.nodes}
    first = blocks[0]
    stamps = sorted(t for t in df["timestamp"].astype(str) if t and t[:4].isdigit())
    start = first.start_time or (stamps[0] if any(r.get("timestamp") for b in blocks for r in b.rows) else now)
    end = blocks[-1].end_time or (stamps[-1] if any(r.get("timestamp") for b in blocks for r in b.rows) else now)
    n_nodes = max(nodes) if nodes else None
    meta = build_metadata(
        start_time=start,
        end_time=end,
        host=devs[0].host if devs else None,
        hosts=hosts_all,
        device_name=devs[0].info if devs else None,
        backend="nccl",
        world_size=world,
        nodes=n_nodes,
        nproc_per_node=(world // n_nodes) if world and n_nodes and world % n_nodes == 0 else None,
        threads_per_rank=None,
        launcher="import",
        torch_version=None,
        nccl_version=next((b.nccl_version for b in blocks if b.nccl_version), None),
        suite={
            "source": first.tool,
            "format": log.format,
            "file": path.name,
            "nccl_tests_version": first.tests_version,
            "collectives": sorted(df["collective"].unique().tolist()),
            "types": sorted(df["dtype"].unique().tolist()),
            "tables": len(blocks),
            "settings": first.settings,
            "args": first.args,
            "run": run + 1,
            "runs_in_file": n_runs,
            "lines": [b.line for b in blocks if b.line is not None],
        },
        timing={
            "source": first.tool,
            "iters": first.settings.get("iters"),
            "time_source": sorted({b.time_source for b in blocks}),
        },  # fmt: skip
        argv=[*sys.argv],
        extra={
            "imported_from": str(path.resolve()),
            "world_size_from": sorted({w.source for w in worlds}),
            "skipped_lines": skipped,
            "recovered_rows": sorted(
                {tuple(r["joined_lines"]) for b in blocks for r in b.rows if r.get("joined_lines")}
            ),
            "import_warnings": warnings,
        },
    )
    return df, res.records_frame(iters) if iters else pd.DataFrame(), meta
