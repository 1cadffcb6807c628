"""Read the machine-readable files: nccl-tests' ``-J`` JSON and rccl-tests' ``-Z json|csv -x FILE`` output.

nccl-tests ``-J FILE`` (src/util.cu, JSON format versions 2 and 3): one object with ``args``, ``nccl_version``,
``config`` and ``results``. ``config.devices`` holds ONE entry per process (the process's first rank: a process
drives ``nthreads x ngpus`` ranks), so the world is ``len(devices) x nthreads x ngpus``. Each result has size,
count, type, redop, root and ``out_of_place``/``in_place`` objects (``time``, or ``cpu_time`` with ``-C 1``;
alg_bw, bus_bw, nwrong; ``out_of_place`` is null in trace replay), and with ``-I 1`` ``*_per_iter`` objects
(min/max/avg/p50/p95/p99/stdev, cv_pct, ``times_us`` and ``per_process_max_times_us``). Also accepted: a list of
such objects, or one per line.

rccl-tests ``-Z json|csv -x FILE`` (src/common.cu ``Reporter``): one record per measurement with ``name``
(AllReduce, ...), the layout (``gpus``; with MPI ``nodes, ranks, ranksPerNode, gpusPerRank``), size, type, redop,
``inPlace``, time, algBw, busBw, wrong (``"N/A"`` without a check) and, since 2025, ``numCycle``. The JSON was one
object per line before the 2025 format change and is a list since; the CSV's separator was ", " and is ",", and its
MPI header names one column less than each row holds (``nodes`` is written but not named): both are read.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any

from commbench.store.nccl_common import (
    NCCL_TYPES,
    Block,
    Device,
    ParsedLog,
    collective_for,
    nccl_version_string,
    number,
)

__all__ = ["RCCL_CSV_START", "is_rccl_record", "parse_nccl_json", "parse_rccl_csv", "parse_rccl_json"]

_BINARY_RE = re.compile(r"\b([a-z_]+?)_perf(?:_mpi)?\b")
_JSON_RES = 5e-7
"""Half a unit of ``%lf`` / ``std::to_string``'s sixth decimal: how far a written bandwidth may be from the computed."""
RCCL_CSV_START = ("numCycle,", "collective,", "collective, ")
"""How the first line of an rccl-tests CSV starts (the 2025 format, then the 2024 one)."""


def _json_num(v: Any, where: str) -> float:
    if v is None:
        return math.nan
    if isinstance(v, str):  # nccl-tests writes NaN as the string "nan"; rccl-tests #wrong as "0" or "N/A"
        return number(v.strip(), where)
    if isinstance(v, bool):
        raise ValueError(f"{where}: expected a number, got {v!r}")
    if isinstance(v, (int, float)):
        return float(v)
    raise ValueError(f"{where}: expected a number, got {v!r}")


def _docs(text: str) -> list[Any]:
    """The JSON values of ``text``: one document, or one per line (nccl-tests older output, rccl-tests 2024)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        lines = [(n, ln) for n, ln in enumerate(text.splitlines(), start=1) if ln.strip()]
        if len(lines) > 1 and _parses(lines[0][1]):
            docs = []
            for n, ln in lines:
                try:
                    docs.append(json.loads(ln))
                except json.JSONDecodeError as e2:
                    raise ValueError(f"line {n}: malformed nccl-tests JSON: {e2.msg} (column {e2.colno})") from None
            return docs
        raise ValueError(f"line {e.lineno}: malformed nccl-tests JSON: {e.msg} (column {e.colno})") from None
    return doc if isinstance(doc, list) else [doc]


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def is_rccl_record(d: Any) -> bool:
    """An rccl-tests ``-Z json`` record (not an nccl-tests ``-J`` document)."""
    return isinstance(d, dict) and "busBw" in d and ("name" in d or "collective" in d)


def _type_of(v: Any, where: str) -> str:
    t = str(v).strip()
    if t not in NCCL_TYPES:
        raise ValueError(f"{where}: unknown nccl-tests data type {t!r}; known: {', '.join(NCCL_TYPES)}")
    return t


def parse_nccl_json(text: str) -> ParsedLog:
    """Parse nccl-tests ``-J`` JSON into blocks (one per document)."""
    docs = _docs(text)
    if docs and all(is_rccl_record(d) for d in docs):
        return _rccl_blocks(docs, "rccl-json")
    blocks: list[Block] = []
    for b, doc in enumerate(docs):
        if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
            raise ValueError(f"JSON document {b}: not nccl-tests -J output (no 'results' list)")
        blocks.append(_json_block(b, doc))
    blocks = [blk for blk in blocks if blk.rows]  # a run that failed before its first size writes an empty list
    if not blocks:
        raise ValueError("nccl-tests JSON holds no results")
    for k, blk in enumerate(blocks):
        blk.index = k
    return ParsedLog("json", blocks)


def _json_block(b: int, doc: dict[str, Any]) -> Block:
    args = [str(a) for a in doc.get("args") or []]
    binary = next((m.group(1) for a in args for m in [_BINARY_RE.search(Path(a).name)] if m), None)
    cfg = doc.get("config") or {}
    block = Block(index=b, binary=binary, args=args, start_time=doc.get("start_time"), end_time=doc.get("end_time"))
    if isinstance(doc.get("nccl_version"), int):
        block.nccl_version = nccl_version_string(doc["nccl_version"])
    for d in cfg.get("devices") or []:
        try:
            dev = Device(
                int(d["rank"]), str(d.get("hostname", "")), int(d.get("device", 0)), str(d.get("device_info", "")),
                int(d["pid"]) if d.get("pid") is not None else None,
            )  # fmt: skip
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"JSON document {b}: malformed device entry {d!r}") from None
        block.devices[dev.rank] = dev
    block.processes = len(cfg.get("devices") or []) or None
    keys = {"nthreads": "nThread", "ngpus": "nGpus", "iterations": "iters", "warmup_iters": "warmup_iters",
            "minimum_bytes": "minBytes", "maximum_bytes": "maxBytes", "aggregated_iterations": "agg_iters",
            "validation": "validation", "graph": "graph", "per_iter_skip": "per_iter_skip"}  # fmt: skip
    block.settings = {k2: int(cfg[k]) for k, k2 in keys.items() if isinstance(cfg.get(k), (int, float))}
    for j, r in enumerate(doc["results"]):
        where = f"JSON document {b} results[{j}]"
        try:
            fixed: dict[str, Any] = {
                "size_bytes": int(r["size"]),
                "count": int(r["count"]),
                "dtype": _type_of(r["type"], where),
                "redop": str(r.get("redop", "none")).strip(),
                "root": int(str(r.get("root", -1)).strip()),
            }
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: missing or malformed field ({e})") from None
        seen = False
        for key, placement in (("out_of_place", "out-of-place"), ("in_place", "in-place")):
            g = r.get(key)
            if not isinstance(g, dict):
                continue
            seen = True
            if "cpu_time" in g:
                block.time_source = "cpu"
            row: dict[str, Any] = {
                **fixed,
                "placement": placement,
                "time_us": _json_num(g.get("time", g.get("cpu_time")), where),
                "algbw_gbps": _json_num(g.get("alg_bw"), where),
                "busbw_gbps": _json_num(g.get("bus_bw"), where),
                "algbw_res": _JSON_RES,
                "busbw_res": _JSON_RES,
                "wrong": _json_num(g.get("nwrong"), where),
                "iters": r.get("actual_iterations"),
                "result_index": j,
            }
            it = r.get(f"{key}_per_iter")
            if isinstance(it, dict):
                for src, dst in (("min_us", "iter_min_us"), ("max_us", "iter_max_us"), ("avg_us", "iter_avg_us"),
                                 ("p50_us", "p50_us"), ("p95_us", "p95_us"), ("p99_us", "iter_p99_us"),
                                 ("stdev_us", "iter_stdev_us")):  # fmt: skip
                    row[dst] = _json_num(it.get(src), where)
                cv = _json_num(it.get("cv_pct"), where)
                row["cv"] = cv / 100 if math.isfinite(cv) else math.nan
                row["iter_skipped"] = it.get("skipped_iterations")
                times = it.get("times_us") or []
                block.iterations += [
                    {"result_index": j, "placement": placement, "process": -1, "iteration": k,
                     "time_us": _json_num(t, where)} for k, t in enumerate(times)
                ]  # fmt: skip
                for p, series in enumerate(it.get("per_process_max_times_us") or []):
                    block.iterations += [
                        {"result_index": j, "placement": placement, "process": p, "iteration": k,
                         "time_us": _json_num(t, where)} for k, t in enumerate(series)
                    ]  # fmt: skip
            block.rows.append(row)
        if not seen:
            raise ValueError(f"{where}: neither 'out_of_place' nor 'in_place' results")
    return block


def parse_rccl_json(text: str) -> ParsedLog:
    """rccl-tests ``-Z json`` output: one block of records."""
    docs = _docs(text)
    bad = next((k for k, d in enumerate(docs) if not is_rccl_record(d)), None)
    if bad is not None:
        raise ValueError(f"record {bad}: not rccl-tests -Z json output (no 'name' and 'busBw')")
    return _rccl_blocks(docs, "rccl-json")


def parse_rccl_csv(text: str) -> ParsedLog:
    """rccl-tests ``-Z csv`` output: a header line, then one line per measurement."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    reader = csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    rows = list(reader)
    header = [h.strip() for h in rows[0]]
    records = []
    for n, vals in enumerate(rows[1:], start=2):
        names = header
        if len(vals) == len(header) + 1 and "ranks" in header:  # the MPI build writes nodes without naming it
            at = header.index("ranks")
            names = [*header[:at], "nodes", *header[at:]]
        if len(vals) != len(names):
            raise ValueError(f"line {n}: {len(vals)} values where the CSV header names {len(header)} columns")
        rec: dict[str, Any] = dict(zip(names, (v.strip() for v in vals), strict=True))
        rec["_line"] = n
        records.append(rec)
    return _rccl_blocks(records, "rccl-csv")


_RCCL_KEYS = {"collective": "name", "inplace": "inPlace", "algbw": "algBw", "busbw": "busBw", "#wrong": "wrong",
              "rankspernode": "ranksPerNode", "gpusperrank": "gpusPerRank"}  # fmt: skip


def _rccl_blocks(records: list[Any], fmt: str) -> ParsedLog:
    block = Block(index=0, tool="rccl-tests")
    worlds: set[int] = set()
    for k, raw in enumerate(records):
        rec = {_RCCL_KEYS.get(key, key): v for key, v in raw.items()}
        where = f"line {rec['_line']}" if "_line" in rec else f"record {k}"
        name = str(rec.get("name", "")).strip()
        coll = collective_for(name)
        if coll is None:
            raise ValueError(f"{where}: unknown rccl-tests collective {name!r}")
        dtype = _type_of(rec.get("type"), where)
        if "ranks" in rec:
            n = int(_json_num(rec["ranks"], where)) * int(_json_num(rec.get("gpusPerRank", 1), where))
        else:
            n = int(_json_num(rec.get("gpus"), where))
        worlds.add(n)
        size = int(_json_num(rec.get("size"), where))
        in_place = int(_json_num(rec.get("inPlace"), where))
        block.rows.append(
            {
                "collective": coll.name,
                "size_bytes": size,
                "count": coll.count_for(size, NCCL_TYPES[dtype][1], n),
                "dtype": dtype,
                "redop": str(rec.get("redop", "none")).strip(),
                "root": -1,
                "placement": "in-place" if in_place else "out-of-place",
                "time_us": _json_num(rec.get("time"), where),
                "algbw_gbps": _json_num(rec.get("algBw"), where),
                "busbw_gbps": _json_num(rec.get("busBw"), where),
                "algbw_res": _JSON_RES,
                "busbw_res": _JSON_RES,
                "wrong": _json_num(rec.get("wrong"), where),
                "cycle": int(_json_num(rec["numCycle"], where)) if "numCycle" in rec else None,
                "source_line": rec.get("_line"),
            }
        )
        if "nodes" in rec:
            block.settings["nodes"] = int(_json_num(rec["nodes"], where))
    if len(worlds) > 1:
        raise ValueError(f"the rccl-tests file mixes world sizes {sorted(worlds)}: import each run's file on its own")
    block.ranks = worlds.pop() if worlds else None
    if not block.rows:
        raise ValueError("the rccl-tests file holds no results")
    return ParsedLog(fmt, [block])
