"""Import nccl-tests output (text logs and `-J` JSON) into a commbench run directory.

This module owns the parser and the mapping into the results schema, so existing nccl-tests logs
join reports and comparisons. It accepts:

Text (what `*_perf` binaries print):
- any number of result tables in one file (several binaries, data types or repeated runs); each
  table starts at its column header line (`#  size  count  type  redop  root  time  algbw  busbw
  #wrong ...`) and ends at `# Out of bounds values`/`# Avg bus bandwidth` or the next header;
- out-of-place and in-place column groups (one row each, column `placement`), a blank out-of-place
  group (trace replay), `cputime` instead of `time`, per-iteration columns, a trailing timestamp,
  old headers without `root` and with `error` (max error) instead of `#wrong`;
- `N/A` in #wrong (no data check) -> NaN; the device lines (`#  Rank  0 Group  0 Pid 1234 on host
  device  0 [0000:1b:00] NVIDIA H100 ...`, Group optional) give world size, nodes, host and device;
  the version line gives the NCCL version;
- other lines (NCCL INFO, MPI banners, blank lines) are ignored; a line inside a table that starts
  with a number but does not parse is an error naming the line.

JSON (`-J FILE`, nccl-tests' JSON writer, version 2): an object with `args`, `nccl_version`,
`config` (with `devices`) and `results` (each with size, count, type, redop, root, `out_of_place`/
`in_place` objects holding time or cpu_time, alg_bw, bus_bw, nwrong, and optional `*_per_iter`
statistics); also a list of such objects or one object per line.

Which collective a table belongs to (the rows do not say), first rule that applies:
1. the `collective` argument (`--collective`), for every table in the file;
2. the last binary name seen before the table (`all_reduce_perf` in a command line, in
   `# Collective test starting: ...`, or JSON `args[0]`); `alltoall` becomes `all_to_all`;
3. the rows: root >= 0 -> broadcast (redop none) or reduce; redop != none -> all_reduce when
   size == count x type width, else reduce_scatter; redop none with size == count x n x width ->
   all_gather or all_to_all, which the rows cannot tell apart: an error asking for `--collective`.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pandas as pd

from commbench.cluster.metadata import build_metadata
from commbench.core.records import CollectivePoint, col
from commbench.store import results as res

if TYPE_CHECKING:
    from commbench.measure.collectives import Collective

__all__ = [
    "NCCL_TYPES",
    "NcclTestsPoint",
    "import_nccl_tests",
    "nccl_version_string",
    "parse_nccl_json",
    "parse_nccl_text",
]

# nccl-tests type name -> (commbench precision name, bytes per element)
NCCL_TYPES: dict[str, tuple[str, int]] = {
    "float": ("fp32", 4),
    "half": ("fp16", 2),
    "bfloat16": ("bf16", 2),
    "double": ("fp64", 8),
    "f8e4m3": ("fp8_e4m3", 1),
    "f8e5m2": ("fp8_e5m2", 1),
    # integer types: the same name in both, the width in the name
    **{f"{sign}int{bits}": (f"{sign}int{bits}", bits // 8) for bits in (8, 32, 64) for sign in ("", "u")},
}

# binary stem (`<stem>_perf`) -> collective name used in results
BINARY_COLLECTIVES: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "sendrecv": "sendrecv",
    "gather": "gather",
    "scatter": "scatter",
    "hypercube": "hypercube",
}
COLLECTIVES = sorted(set(BINARY_COLLECTIVES.values()))

_DOC = CollectivePoint.docs()


@dataclass(kw_only=True, slots=True)
class NcclTestsPoint(CollectivePoint):
    """A results row imported from an nccl-tests log: the columns a log may not give are redeclared as
    optional (None/NaN, as nccl-tests' own N/A), then where the row came from."""

    TABLE: ClassVar[str] = "results"

    # Widening a parent's field type breaks substitutability for mypy, on purpose: code reading an import's
    # rows must expect gaps, and the dtypes (nullable Int64, float64 for NaN) follow from these types.
    world_size: int | None = col(_DOC["world_size"] + "; None when the log has no device lines to tell")  # type: ignore[assignment]
    nodes: int | None = col(_DOC["nodes"] + "; None without device lines")  # type: ignore[assignment]
    payload: str | None = col("None: nccl-tests does not say what its data was")  # type: ignore[assignment]
    iters: int | None = col("iterations per measurement (nccl-tests -n); None if the log does not say")  # type: ignore[assignment]
    samples: int | None = col("None: nccl-tests reports one averaged measurement")  # type: ignore[assignment]
    wrong: float = col(_DOC["wrong"] + "; NaN where nccl-tests printed N/A (no data check)")  # type: ignore[assignment]
    placement: str = col("nccl-tests column group: out-of-place or in-place")
    redop: str = col("nccl-tests redop column (sum, none, ...)")
    root: int = col("nccl-tests root column (-1 for rootless collectives)")
    block: int = col("index of the result table (or JSON document) in the imported file")
    source_line: int | None = col("line of the row in a text log; None for JSON")


_BINARY_RE = re.compile(r"\b([a-z_]+?)_perf(?:_mpi)?\b")
_RANK_RE = re.compile(
    r"^#\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+(?P<group>\d+)\s+)?Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)\s+"
    r"device\s+(?P<device>\d+)\s+\[(?P<hex>[^\]]*)\]\s*(?P<info>.*)$"
)
_VERSION_RE = re.compile(r"nccl-tests version\s+(?P<tests>\S+)(?:.*?nccl-library=(?P<lib>\d+))?")
_KV_RE = re.compile(r"([A-Za-z][A-Za-z ]*?):?\s+(-?\d+)")
_TIMESTAMP_RE = re.compile(r"\d{4}-\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}$")
_TIME_TOKENS = ("time", "cputime")


@dataclass(slots=True)
class _Device:
    rank: int
    host: str
    device: int
    info: str


@dataclass(slots=True)
class _Context:
    """What the text said before a table: binary, devices, settings, versions."""

    binary: str | None = None
    devices: dict[int, _Device] = field(default_factory=dict)
    settings: dict[str, int] = field(default_factory=dict)
    nccl_version: str | None = None
    tests_version: str | None = None


def nccl_version_string(code: int) -> str:
    """NCCL_VERSION_CODE -> 'major.minor.patch' (codes >= 10000 since NCCL 2.9: X*10000+Y*100+Z)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _collective_from_binary(stem: str) -> str:
    return BINARY_COLLECTIVES.get(stem, stem)


def _resolve_collective(
    collective: str | None, binary: str | None, fixed: dict[str, Any], type_name: str, where: str
) -> str:
    """The module docstring's rule: the --collective option, else the binary name, else the rows."""
    if collective is not None:
        return collective
    if binary is not None:
        return _collective_from_binary(binary)
    return _infer_collective(fixed["size_bytes"], fixed["count"], type_name, fixed["redop"], fixed["root"], where)


def _infer_collective(size: int, count: int, type_name: str, redop: str, root: int, where: str) -> str:
    width = NCCL_TYPES[type_name][1]
    if root >= 0:
        return "broadcast" if redop == "none" else "reduce"
    full = size == count * width
    if redop != "none":
        return "all_reduce" if full else "reduce_scatter"
    if full:
        # a rank count of 1 makes every collective look alike; sendrecv is the only one with count == size
        return "sendrecv"
    raise ValueError(
        f"{where}: cannot tell all_gather from all_to_all from the rows (redop none, root -1); "
        f"pass --collective with one of {', '.join(COLLECTIVES)}"
    )


def _world_from_rows(coll: str, rows: list[dict[str, Any]]) -> int | None:
    """Ranks from the data when no device lines exist: size/count where the collective's count is a per-rank
    share (its nccl-tests size convention), else the busbw/algbw ratio (its bus factor) inverted. None for a
    collective commbench does not model (their sizes and factors are nccl-tests', not ours to guess)."""
    from commbench.measure.collectives import get_collective  # imports torch: only when a log lacks device lines

    try:
        c = get_collective(coll)
    except ValueError:
        return None
    for r in rows:
        total, rest = divmod(r["size_bytes"], NCCL_TYPES[r["dtype"]][1])
        count = r["count"]
        if count > 0 and not rest and total % count == 0:
            n = total // count
            # the count must pin the world: all_reduce's count is the whole buffer for every n
            if c.layout(total, n).count == count != c.layout(c.round_total(total, n + 1), n + 1).count:
                return n
    for r in rows:
        a, b = r.get("algbw_gbps"), r.get("busbw_gbps")
        if a and b and a > 0 and math.isfinite(a) and math.isfinite(b):
            n = _invert_bus_factor(c, b / a)
            if n is not None:
                return n
    return None


def _invert_bus_factor(c: Collective, ratio: float, most: int = 1 << 20) -> int | None:
    """The world size whose bus factor is ``ratio``, for a factor that grows with n. Logs print bandwidths
    with two decimals, so the ratio is approximate: accept a solution within 0.05 of a whole rank."""
    f = c.bus_factor
    lo, hi = 1, most
    if not f(lo) < ratio < f(hi):
        return None
    while hi - lo > 1:  # f(lo) < ratio <= f(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if f(mid) < ratio else (lo, mid)
    x = lo + (ratio - f(lo)) / (f(hi) - f(lo))
    n = round(x)
    return n if abs(x - n) < 0.05 else None


def _float(tok: str, where: str) -> float:
    if tok.upper() in ("N/A", "NA", "NAN", "-"):
        return math.nan
    try:
        return float(tok)
    except ValueError:
        raise ValueError(f"{where}: expected a number, got {tok!r}") from None


def _int(tok: str, where: str) -> int:
    try:
        return int(tok)
    except ValueError:
        raise ValueError(f"{where}: expected an integer, got {tok!r}") from None


@dataclass(slots=True)
class _Header:
    line_no: int
    fixed: list[str]
    """Leading columns (size, count, type, redop[, root])."""
    groups: list[list[str]]
    """Per placement (out-of-place, in-place): the column names, starting with time/cputime."""
    has_timestamp: bool


def _parse_header(text: str, line_no: int) -> _Header:
    toks = text.lstrip("#").split()
    starts = [i for i, t in enumerate(toks) if t in _TIME_TOKENS]
    fixed = toks[: starts[0]]
    groups: list[list[str]] = []
    for j, s in enumerate(starts):
        end = starts[j + 1] if j + 1 < len(starts) else len(toks)
        groups.append(toks[s:end])
    ts = bool(groups) and groups[-1][-1] == "timestamp"
    if ts:
        groups[-1] = groups[-1][:-1]
    for need in ("size", "count", "type"):
        if need not in fixed:
            raise ValueError(f"line {line_no}: column header without {need!r}: {text.strip()!r}")
    return _Header(line_no, fixed, groups, ts)


def _placements(n_groups: int) -> list[str]:
    return ["out-of-place", "in-place"][:n_groups] if n_groups <= 2 else [f"group{i}" for i in range(n_groups)]


def _row_from_groups(
    fixed: dict[str, Any], group_vals: list[tuple[str, dict[str, float]]], extra: dict[str, Any]
) -> list[dict[str, Any]]:
    out = []
    for placement, vals in group_vals:
        out.append({**fixed, **extra, "placement": placement, **vals})
    return out


def _group_values(names: list[str], toks: list[str], where: str) -> dict[str, float]:
    vals: dict[str, float] = {}
    for name, tok in zip(names, toks, strict=True):
        v = _float(tok, f"{where} (column {name})")
        if name in _TIME_TOKENS:
            vals["time_us"] = v
        elif name == "algbw":
            vals["algbw_gbps"] = v
        elif name == "busbw":
            vals["busbw_gbps"] = v
        elif name in ("#wrong", "wrong"):
            vals["wrong"] = v
        elif name == "error":  # old nccl-tests: max error instead of a wrong count
            vals["max_abs_err"] = v
        elif name.startswith("i_"):
            key = {"i_p99": "p99_us", "i_min": "min_us", "i_max": "max_us", "i_cv%": "cv"}.get(name)
            if key:
                vals[key] = v / 100 if key == "cv" else v
    return vals


def parse_nccl_text(text: str, collective: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Parse nccl-tests text output -> (rows without derived columns, file-level info)."""
    ctx = _Context()
    header: _Header | None = None
    block = -1
    block_binary: str | None = None
    rows: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    for i, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        s = line.strip()
        if not s:
            continue
        where = f"line {i}"
        if s.startswith("#"):
            body = s.lstrip("#").strip()
            m = _RANK_RE.match(s)
            if m:
                if header is not None:  # a new run's device list: forget the old one
                    header = None
                    ctx.devices = {}
                d = _Device(int(m["rank"]), m["host"], int(m["device"]), m["info"].strip())
                ctx.devices[d.rank] = d
                continue
            mv = _VERSION_RE.search(body)
            if mv:
                ctx.tests_version = mv["tests"]
                if mv["lib"]:
                    ctx.nccl_version = nccl_version_string(int(mv["lib"]))
            mb = _BINARY_RE.search(body)
            if mb and "concluded" not in body:
                ctx.binary = mb.group(1)
            if body.startswith("nThread"):
                ctx.settings = {k.strip().replace(" ", "_"): int(v) for k, v in _KV_RE.findall(body)}
                ctx.devices = {}
                header = None
                continue
            toks = body.split()
            if toks[:3] == ["size", "count", "type"] or (
                "size" in toks and "count" in toks and any(t in _TIME_TOKENS for t in toks)
            ):
                header = _parse_header(s, i)
                block += 1
                block_binary = ctx.binary
                blocks.append(
                    {
                        "line": i,
                        "binary": block_binary,
                        "devices": dict(ctx.devices),
                        "settings": dict(ctx.settings),
                    }
                )
                continue
            if body.startswith(("Out of bounds", "Avg bus bandwidth", "Collective test concluded")):
                header = None
            continue
        mb = _BINARY_RE.search(s)
        first = s.split()[0]
        if header is None or not first.isdigit():
            if mb:  # a command line or launcher echo naming the binary
                ctx.binary = mb.group(1)
            continue
        # a data row of the current table
        toks = s.split()
        if header.has_timestamp and len(toks) >= 2 and _TIMESTAMP_RE.match(" ".join(toks[-2:])):
            toks = toks[:-2]
        nfix = len(header.fixed)
        sizes = [len(g) for g in header.groups]
        if len(toks) == nfix + sum(sizes):
            spans = list(zip(_placements(len(sizes)), header.groups, strict=True))
        elif len(sizes) == 2 and len(toks) == nfix + sizes[1]:  # blank out-of-place group (trace replay)
            spans = [("in-place", header.groups[1])]
        else:
            raise ValueError(
                f"{where}: malformed nccl-tests data row: expected {nfix + sum(sizes)} columns as in the header "
                f"at line {header.line_no}, got {len(toks)}: {s!r}"
            )
        fx = dict(zip(header.fixed, toks[:nfix], strict=True))
        type_name = fx["type"]
        if type_name not in NCCL_TYPES:
            raise ValueError(f"{where}: unknown nccl-tests data type {type_name!r}; known: {', '.join(NCCL_TYPES)}")
        fixed: dict[str, Any] = {
            "size_bytes": _int(fx["size"], where),
            "count": _int(fx["count"], where),
            "dtype": type_name,
            "redop": fx.get("redop", "none"),
            "root": _int(fx["root"], where) if "root" in fx else -1,
        }
        pos = nfix
        group_vals = []
        for placement, names in spans:
            group_vals.append((placement, _group_values(names, toks[pos : pos + len(names)], where)))
            pos += len(names)
        coll = _resolve_collective(collective, block_binary, fixed, type_name, where)
        rows += _row_from_groups(fixed, group_vals, {"collective": coll, "block": block, "source_line": i})
    if not rows:
        raise ValueError(
            "no nccl-tests result rows found (expected a '#  size  count  type ...' header followed by data rows)"
        )
    info = {"blocks": blocks, "nccl_version": ctx.nccl_version, "nccl_tests_version": ctx.tests_version}
    return rows, info


def _json_docs(text: str) -> list[dict[str, Any]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        # one object per line is also accepted; otherwise report the parser's line
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) > 1 and _parses(lines[0]):
            docs = []
            for n, ln in enumerate(text.splitlines(), start=1):
                if not ln.strip():
                    continue
                try:
                    docs.append(json.loads(ln))
                except json.JSONDecodeError as e2:
                    raise ValueError(f"line {n}: malformed nccl-tests JSON: {e2.msg} (column {e2.colno})") from None
            return _check_docs(docs)
        raise ValueError(f"line {e.lineno}: malformed nccl-tests JSON: {e.msg} (column {e.colno})") from None
    return _check_docs(doc if isinstance(doc, list) else [doc])


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def _check_docs(docs: list[Any]) -> list[dict[str, Any]]:
    for k, d in enumerate(docs):
        if not isinstance(d, dict) or not isinstance(d.get("results"), list):
            raise ValueError(f"JSON document {k}: not nccl-tests -J output (no 'results' list)")
    return docs


def parse_nccl_json(text: str, collective: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Parse nccl-tests `-J` JSON -> (rows, file-level info) in the same form as parse_nccl_text."""
    rows: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    nccl_version = None
    for b, doc in enumerate(_json_docs(text)):
        args = [str(a) for a in doc.get("args") or []]
        binary = None
        for a in args[:1] + args[1:]:
            m = _BINARY_RE.search(Path(a).name)
            if m:
                binary = m.group(1)
                break
        if isinstance(doc.get("nccl_version"), int):
            nccl_version = nccl_version_string(doc["nccl_version"])
        cfg = doc.get("config") or {}
        devices = {}
        for d in cfg.get("devices") or []:
            try:
                dev = _Device(
                    int(d["rank"]), str(d.get("hostname", "")), int(d.get("device", 0)), str(d.get("device_info", ""))
                )
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"JSON document {b}: malformed device entry {d!r}") from None
            devices[dev.rank] = dev
        settings = {
            "warmup_iters": cfg.get("warmup_iters"),
            "iters": cfg.get("iterations"),
            "minBytes": cfg.get("minimum_bytes"),
            "maxBytes": cfg.get("maximum_bytes"),
        }
        blocks.append(
            {
                "line": None,
                "binary": binary,
                "devices": devices,
                "settings": {k: v for k, v in settings.items() if v is not None},
                "start_time": doc.get("start_time"),
                "end_time": doc.get("end_time"),
                "args": args,
            }
        )
        for j, r in enumerate(doc["results"]):
            where = f"JSON document {b} results[{j}]"
            try:
                type_name = str(r["type"]).strip()
                fixed: dict[str, Any] = {
                    "size_bytes": int(r["size"]),
                    "count": int(r["count"]),
                    "dtype": type_name,
                    "redop": str(r.get("redop", "none")).strip(),
                    "root": int(str(r.get("root", -1)).strip()),
                }
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{where}: missing or malformed field ({e})") from None
            if type_name not in NCCL_TYPES:
                raise ValueError(f"{where}: unknown nccl-tests data type {type_name!r}; known: {', '.join(NCCL_TYPES)}")
            group_vals = []
            for key, placement in (("out_of_place", "out-of-place"), ("in_place", "in-place")):
                g = r.get(key)
                if not isinstance(g, dict):
                    continue
                vals = {
                    "time_us": _json_num(g.get("time", g.get("cpu_time")), where),
                    "algbw_gbps": _json_num(g.get("alg_bw"), where),
                    "busbw_gbps": _json_num(g.get("bus_bw"), where),
                    "wrong": _json_num(g.get("nwrong"), where),
                }
                it = r.get(f"{key}_per_iter")
                if isinstance(it, dict):
                    vals["p50_us"] = _json_num(it.get("p50_us"), where)
                    vals["p95_us"] = _json_num(it.get("p95_us"), where)
                    cv = _json_num(it.get("cv_pct"), where)
                    vals["cv"] = cv / 100 if math.isfinite(cv) else math.nan
                group_vals.append((placement, vals))
            if not group_vals:
                raise ValueError(f"{where}: neither 'out_of_place' nor 'in_place' results")
            coll = _resolve_collective(collective, binary, fixed, type_name, where)
            extra = {"collective": coll, "block": b, "iters": r.get("actual_iterations")}
            rows += _row_from_groups(fixed, group_vals, extra)
    if not rows:
        raise ValueError("nccl-tests JSON holds no results")
    return rows, {"blocks": blocks, "nccl_version": nccl_version, "nccl_tests_version": None}


def _json_num(v: Any, where: str) -> float:
    if v is None:
        return math.nan
    if isinstance(v, str):  # nccl-tests writes NaN as the string "nan"
        return _float(v, where)
    if isinstance(v, (int, float)):
        return float(v)
    raise ValueError(f"{where}: expected a number, got {v!r}")


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ValueError(f"output path {out_dir} exists and is not a directory")
        if any(out_dir.iterdir()):
            raise ValueError(f"output directory {out_dir} is not empty; choose a new --out (imports never overwrite)")


def import_nccl_tests(path: Path, out_dir: Path, collective: str | None = None) -> Path:
    """Read nccl-tests text or -J JSON output at `path`; write a run directory at `out_dir`.

    Returns out_dir. Raises ValueError for a missing/malformed file (naming the line), an unknown
    collective, or a non-empty out_dir.
    """
    path, out_dir = Path(path), Path(out_dir)
    if collective is not None:
        collective = BINARY_COLLECTIVES.get(collective, collective)
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(COLLECTIVES)}")
    if not path.is_file():
        raise ValueError(f"nccl-tests output file {str(path)!r} does not exist")
    _check_out_dir(out_dir)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    is_json = text.lstrip()[:1] in ("{", "[")
    rows, info = parse_nccl_json(text, collective) if is_json else parse_nccl_text(text, collective)
    df, meta = _to_schema(rows, info, path, "json" if is_json else "text")
    out_dir.mkdir(parents=True, exist_ok=True)
    res.write_table(out_dir, NcclTestsPoint.TABLE, df)
    res.atomic_write_text(out_dir / "metadata.json", json.dumps(meta, indent=2, default=str) + "\n")
    return out_dir


def _to_schema(
    rows: list[dict[str, Any]], info: dict[str, Any], path: Path, fmt: str
) -> tuple[pd.DataFrame, dict[str, Any]]:
    blocks = info["blocks"]
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    out: list[NcclTestsPoint] = []
    by_block: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_block.setdefault(r["block"], []).append(r)
    worlds: list[int] = []
    all_devices: dict[tuple[int, int], _Device] = {}
    for b, brows in by_block.items():
        binfo = blocks[b] if b < len(blocks) else {"devices": {}, "settings": {}}
        devices: dict[int, _Device] = binfo["devices"]
        for d in devices.values():
            all_devices[(b, d.rank)] = d
        hosts = sorted({d.host for d in devices.values()})
        for r in brows:
            coll = r["collective"]
            world = len(devices) or _world_from_rows(coll, [r]) or _world_from_rows(coll, brows)
            if world:
                worlds.append(world)
            prec, width = NCCL_TYPES[r["dtype"]]
            time_us = r.get("time_us", math.nan)
            ts = binfo.get("start_time")
            iters = r.get("iters") if r.get("iters") is not None else binfo["settings"].get("iters")
            out.append(
                NcclTestsPoint(
                    collective=coll,
                    precision=prec,
                    impl="nccl-tests",
                    backend="nccl",
                    device="cuda",
                    world_size=world or None,
                    nodes=len(hosts) or None,
                    payload=None,
                    dtype=r["dtype"],
                    size_bytes=r["size_bytes"],
                    count=r["count"],
                    # same size definition, as if each element were 4 bytes
                    fp32_bytes=r["size_bytes"] // width * 4,
                    wire_bytes=r["size_bytes"],
                    time_us=time_us,
                    time_us_max=math.nan,
                    p50_us=r.get("p50_us", math.nan),
                    p95_us=r.get("p95_us", math.nan),
                    cv=r.get("cv", math.nan),
                    rank_spread=math.nan,
                    iters=iters,
                    samples=None,
                    algbw_gbps=r.get("algbw_gbps", math.nan),
                    busbw_gbps=r.get("busbw_gbps", math.nan),
                    encode_us=math.nan,
                    comm_us=time_us,
                    decode_us=math.nan,
                    total_us=math.nan,
                    effective_gbps=math.nan,
                    wrong=r.get("wrong", math.nan),
                    tolerance=math.nan,
                    rel_err=math.nan,
                    max_abs_err=r.get("max_abs_err", math.nan),
                    timestamp=ts if isinstance(ts, str) else now,
                    placement=r["placement"],
                    redop=r["redop"],
                    root=r["root"],
                    block=b,
                    source_line=r.get("source_line"),
                )
            )
    df = res.records_frame(out)
    devs = list(all_devices.values())
    hosts_all = sorted({d.host for d in devs})
    world = max(worlds) if worlds else None
    nodes = len({d.host for d in devs if d.rank is not None}) if devs else None
    first_block = blocks[0] if blocks else {}
    argv = [*sys.argv]
    starts = [b.get("start_time") for b in blocks if b.get("start_time")]
    ends = [b.get("end_time") for b in blocks if b.get("end_time")]
    meta = build_metadata(
        start_time=starts[0] if starts else now,
        end_time=ends[-1] if ends else now,
        host=devs[0].host if devs else None,
        hosts=hosts_all,
        device_name=devs[0].info if devs else None,
        backend="nccl",
        world_size=world,
        nodes=nodes,
        nproc_per_node=(world // nodes) if world and nodes and world % nodes == 0 else None,
        threads_per_rank=None,
        launcher="import",
        torch_version=None,
        nccl_version=info.get("nccl_version"),
        suite={
            "source": "nccl-tests",
            "format": fmt,
            "file": path.name,
            "nccl_tests_version": info.get("nccl_tests_version"),
            "collectives": sorted(df["collective"].unique().tolist()),
            "types": sorted(df["dtype"].unique().tolist()),
            "tables": len(blocks),
            "settings": first_block.get("settings", {}),
            "args": first_block.get("args"),
        },
        timing={"source": "nccl-tests", "iters": first_block.get("settings", {}).get("iters")},
        argv=argv,
        extra={"imported_from": str(path.resolve())},
    )
    return df, meta
