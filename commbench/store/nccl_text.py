"""Read the text that nccl-tests' and rccl-tests' ``*_perf`` binaries print: tables, headers, device lines.

This module owns the text reader. It accepts, in one file, any number of result tables (several binaries, data
types or runs); each starts at its column header line (``#  size  count  type  redop  root  time  algbw  busbw
#wrong ...``) and ends at ``# Out of bounds values``/``# Avg bus bandwidth`` or the next header. What it reads:

- out-of-place and in-place column groups, one row each (column ``placement``); one group labelled by the line
  above the header (rccl-tests ``-O 0`` prints only ``in-place``); a blank out-of-place group (trace replay);
- ``cputime`` instead of ``time`` (``-C 1``: the host's launch time, flagged as ``time_source`` cpu); the
  per-iteration columns of ``-I 1`` (``i_min i_max i_p99 i_cv%``); the trailing timestamp of ``-S 1``; old
  headers without ``root`` and with ``error`` instead of ``#wrong``; ``N/A`` in #wrong (no data check);
- the device lines (Group optional) for ranks, hosts and devices; the ``# nThread`` line for the settings; the
  version lines (nccl-tests, rccl-tests, the NCCL library) for versions;
- launcher tags, anywhere in a line: Open MPI's ``--tag-output`` (``[1,0]<stdout>:``), a bracketed rank
  (``[0]``, also in the middle of a line where the launcher tagged each write), Slurm's ``--label``
  (``0: ``) and a ``host:`` prefix;
- a row broken by an NCCL log line (``host:pid:tid [dev] NCCL INFO ...``) printed between its columns: the log
  line is cut out and the row's pieces are joined across lines. A data line that still cannot be read is not an
  error: it is reported in ``ParsedLog.skipped`` with its line number and why.

Two device lists that claim the same rank on different hosts or processes mean independent runs printed together
(an nccl-tests built without MPI, started by mpirun, prints one 1-process run per process): their rows cannot be
told apart, so that is an error naming both lines.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from commbench.store.nccl_common import NCCL_TYPES, Block, Device, ParsedLog, nccl_version_string, number, resolution

__all__ = ["parse_nccl_text", "strip_launcher_tags"]

_LOG_LINE = re.compile(r"[A-Za-z][\w.-]*:\d+:\d+ \[\d+\] NCCL (?:INFO|WARN|TRACE|ERROR)")
"""NCCL's own log line prefix (``host:pid:tid [dev] NCCL INFO``), printed to stdout by NCCL_DEBUG."""
_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:|\[\d+\]")
_LINE_PREFIX = re.compile(r"^\s*(?:\d+|[A-Za-z][\w.-]*):\s+(?=[#\d])")
_BINARY_RE = re.compile(r"\b([a-z_]+?)_perf(?:_mpi)?\b")
_RANK_RE = re.compile(
    r"^#\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+(?P<group>\d+)\s+)?Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)\s+"
    r"device\s+(?P<device>\d+)\s+\[(?P<hex>[^\]]*)\]\s*(?P<info>.*)$"
)
_TESTS_VERSION_RE = re.compile(r"nccl-tests version\s+(?P<tests>\S+)")
_LIBRARY_RE = re.compile(r"nccl-library=(?P<lib>\d+)")
_RCCL_TESTS_RE = re.compile(r"rccl-tests:\s*Version\s+(?P<v>\S+)")
_NCCL_VERSION_RE = re.compile(r"\b[NR]CCL version\s+(?P<v>\d+\.\d+\.\d+)")
_KV_RE = re.compile(r"([A-Za-z][A-Za-z ]*?):?\s+(-?\d+)")
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}$")
_CLOCK_RE = re.compile(r"\d{2}:\d{2}:\d{2}$")
_INT_RE = re.compile(r"-?\d+$")
_WORD_RE = re.compile(r"[A-Za-z_][\w]*$")
_TIME_TOKENS = ("time", "cputime")
_END = ("Out of bounds", "Avg bus bandwidth", "Collective test concluded")
_PER_ITER = {"i_min": "iter_min_us", "i_max": "iter_max_us", "i_p99": "iter_p99_us", "i_cv%": "cv"}


def strip_launcher_tags(line: str) -> str:
    """``line`` without the tags launchers put in front of (or, per write, inside) a process's output."""
    return _TAG.sub(" ", _LINE_PREFIX.sub("", line))


def _segments(raw: str) -> list[tuple[str, bool, bool]]:
    """A physical line cut before each NCCL log line inside it: (text, is a log line, a log line cut it off)
    per piece, launcher tags removed."""
    cuts = [m.start() for m in _LOG_LINE.finditer(raw)]
    bounds = [0, *cuts, len(raw)]
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        piece = raw[a:b]
        if piece.strip():
            out.append((strip_launcher_tags(piece), a in cuts, b in cuts))
    return out


def _fits(kind: str, tok: str) -> bool:
    if kind == "int":
        return bool(_INT_RE.match(tok))
    if kind == "word":
        return bool(_WORD_RE.match(tok))
    if kind == "date":
        return bool(_DATE_RE.match(tok))
    if kind == "clock":
        return bool(_CLOCK_RE.match(tok))
    try:
        number(tok, "")
    except ValueError:
        return False
    return True


_FIXED_KINDS = {"size": "int", "count": "int", "root": "int"}


@dataclass(slots=True)
class _Header:
    line_no: int
    fixed: list[str]
    """Leading columns (size, count, type, redop[, root])."""
    groups: list[list[str]]
    """Per placement: the column names, starting with time/cputime."""
    placements: list[str]
    has_timestamp: bool
    kinds: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kinds = [_FIXED_KINDS.get(n, "word") for n in self.fixed]
        for g in self.groups:
            self.kinds += ["num"] * len(g)
        if self.has_timestamp:
            self.kinds += ["date", "clock"]

    @property
    def replay_kinds(self) -> list[str]:
        """A trace-replay row: the fixed columns and the last group only (nccl-tests blanks out-of-place)."""
        tail = ["date", "clock"] if self.has_timestamp else []
        return self.kinds[: len(self.fixed)] + ["num"] * len(self.groups[-1]) + tail


def _parse_header(text: str, line_no: int, labels: list[str]) -> _Header:
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
    if len(labels) == len(groups):
        placements = labels
    elif len(groups) <= 2:
        placements = ["out-of-place", "in-place"][: len(groups)]
    else:
        placements = [f"group{i}" for i in range(len(groups))]
    return _Header(line_no, fixed, groups, placements, ts)


def _group_values(names: list[str], toks: list[str], where: str) -> dict[str, Any]:
    vals: dict[str, Any] = {}
    for name, tok in zip(names, toks, strict=True):
        v = number(tok, f"{where} (column {name})")
        if name in _TIME_TOKENS:
            vals["time_us"] = v
        elif name == "algbw":
            vals["algbw_gbps"], vals["algbw_res"] = v, resolution(tok)
        elif name == "busbw":
            vals["busbw_gbps"], vals["busbw_res"] = v, resolution(tok)
        elif name in ("#wrong", "wrong"):
            vals["wrong"] = v
        elif name == "error":  # old nccl-tests: max error instead of a wrong count
            vals["max_abs_err"] = v
        elif name in _PER_ITER:
            key = _PER_ITER[name]
            vals[key] = v / 100 if key == "cv" and math.isfinite(v) else v
    return vals


@dataclass(slots=True)
class _Pending:
    """A row whose columns are spread over several lines (an NCCL log line was printed in between)."""

    toks: list[str]
    lines: list[int]


@dataclass(slots=True)
class _Context:
    """What the text said before a table: tool, binary, devices, settings, versions."""

    tool: str = "nccl-tests"
    binary: str | None = None
    devices: dict[int, Device] = field(default_factory=dict)
    settings: dict[str, int] = field(default_factory=dict)
    nccl_version: str | None = None
    tests_version: str | None = None
    table_seen: bool = False
    """A table followed the device lines: the next device line starts another run's list."""


class _TextReader:
    def __init__(self) -> None:
        self.ctx = _Context()
        self.header: _Header | None = None
        self.labels: list[str] = []
        self.blocks: list[Block] = []
        self.skipped: list[dict[str, Any]] = []
        self.pending: _Pending | None = None

    # --- header lines --------------------------------------------------------------------------------------
    def comment(self, s: str, i: int) -> None:
        body = s.lstrip("#").strip()
        m = _RANK_RE.match(s)
        if m:
            self.device(m, i)
            return
        mv = _TESTS_VERSION_RE.search(body)
        if mv:
            self.ctx.tests_version = mv["tests"]
        ml = _LIBRARY_RE.search(body)
        if ml:
            self.ctx.nccl_version = nccl_version_string(int(ml["lib"]))
        mb = _BINARY_RE.search(body)
        if mb and "concluded" not in body:
            self.ctx.binary = mb.group(1)
        if body.startswith("nThread"):
            self.end_table(i)
            self.ctx.settings = {k.strip().replace(" ", "_"): int(v) for k, v in _KV_RE.findall(body)}
            self.ctx.devices = {}
            self.ctx.table_seen = False
            return
        toks = body.split()
        if "size" in toks and "count" in toks and any(t in _TIME_TOKENS for t in toks):
            self.start_table(s, i)
            return
        if ("out-of-place" in toks or "in-place" in toks) and "size" not in toks:
            self.labels = [t for t in toks if t in ("out-of-place", "in-place")]
            return
        if body.startswith(_END):
            self.end_table(i)

    def device(self, m: re.Match[str], i: int) -> None:
        if self.ctx.table_seen:  # another run's device list
            self.end_table(i)
            self.ctx.devices = {}
            self.ctx.table_seen = False
        d = Device(int(m["rank"]), m["host"], int(m["device"]), m["info"].strip(), int(m["pid"]), i)
        old = self.ctx.devices.get(d.rank)
        if old is not None and (old.host, old.pid) != (d.host, d.pid):
            raise ValueError(
                f"lines {old.line} and {i}: rank {d.rank} is listed twice ({old.host} pid {old.pid}, {d.host} pid "
                f"{d.pid}): the log holds independent runs printed together (an nccl-tests binary built without "
                "MPI support started by mpirun runs one process per run); their rows cannot be told apart, so "
                "import each process's output on its own, or rebuild nccl-tests with MPI=1"
            )
        self.ctx.devices[d.rank] = d

    def start_table(self, s: str, i: int) -> None:
        self.end_table(i)
        self.header = _parse_header(s, i, self.labels)
        self.labels = []
        self.ctx.table_seen = True
        cpu = any(g and g[0] == "cputime" for g in self.header.groups)
        self.blocks.append(
            Block(
                index=len(self.blocks),
                tool=self.ctx.tool,
                line=i,
                binary=self.ctx.binary,
                devices=dict(self.ctx.devices),
                settings=dict(self.ctx.settings),
                nccl_version=self.ctx.nccl_version,
                tests_version=self.ctx.tests_version,
                time_source="cpu" if cpu else "gpu",
            )
        )

    def end_table(self, i: int) -> None:
        self.drop_pending("the row was never completed before the table ended")
        self.header = None

    def drop_pending(self, why: str) -> None:
        if self.pending is not None:
            for n in self.pending.lines:
                self.skipped.append({"line": n, "reason": why})
            self.pending = None

    # --- other lines ---------------------------------------------------------------------------------------
    def plain(self, s: str, i: int, cut: bool) -> None:
        mr = _RCCL_TESTS_RE.search(s)
        if mr:
            self.ctx.tool, self.ctx.tests_version = "rccl-tests", mr["v"]
            return
        mn = _NCCL_VERSION_RE.search(s)
        if mn and self.ctx.nccl_version is None:
            self.ctx.nccl_version = mn["v"]
        toks = s.split()
        if self.header is None:
            mb = _BINARY_RE.search(s)
            if mb:  # a command line or launcher echo naming the binary
                self.ctx.binary = mb.group(1)
            return
        if self.starts_row(toks):
            self.drop_pending("a new row started before this one was complete")
            self.take(toks, _Pending([], [i]), cut)
        elif self.pending is not None and toks and _fits(self.header.kinds[len(self.pending.toks)], toks[0]):
            self.pending.lines.append(i)
            self.take(toks, self.pending, cut)
        elif toks and toks[0][:1].isdigit():
            self.skipped.append({"line": i, "reason": "a data line that continues no row and starts none"})

    def starts_row(self, toks: list[str]) -> bool:
        h = self.header
        assert h is not None
        n = min(len(h.fixed), 3)
        return len(toks) >= n and all(_fits(k, t) for k, t in zip(h.kinds[:n], toks[:n], strict=False))

    def take(self, toks: list[str], p: _Pending, cut: bool) -> None:
        """Append the tokens of one line that fit the row's next columns; emit the row once complete. ``cut``: an
        NCCL log line followed on the same line, so the row goes on after it."""
        h = self.header
        assert h is not None
        start = len(p.toks)
        if start == 0 and not cut and self.is_replay(toks):
            p.toks = list(toks)
            self.pending = None
            self.emit(p, replay=True)
            return
        k = 0
        while start + k < len(h.kinds) and k < len(toks) and _fits(h.kinds[start + k], toks[k]):
            k += 1
        p.toks += toks[:k]
        rest = toks[k:]
        if len(p.toks) == len(h.kinds):
            self.pending = None
            self.emit(p)
        elif not rest and not cut and len(p.lines) == 1 and len(p.toks) > len(h.fixed):
            # a whole line of numbers that is not the header's shape: not a broken row, a malformed one
            self.pending = None
            self.skipped.append(
                {
                    "line": p.lines[0],
                    "reason": f"{len(p.toks)} columns where the header at line {h.line_no} has {len(h.kinds)}",
                }
            )
        else:
            self.pending = p  # wait for the rest on the next lines

    def is_replay(self, toks: list[str]) -> bool:
        h = self.header
        assert h is not None
        kinds = h.replay_kinds
        return (
            len(h.groups) == 2
            and len(toks) == len(kinds)
            and all(_fits(k, t) for k, t in zip(kinds, toks, strict=True))
        )

    def emit(self, p: _Pending, replay: bool = False) -> None:
        h = self.header
        assert h is not None
        toks = list(p.toks)
        where = f"line {p.lines[0]}"
        stamp = None
        if h.has_timestamp:
            stamp = f"{toks[-2]}T{toks[-1]}"
            toks = toks[:-2]
        nfix = len(h.fixed)
        fx = dict(zip(h.fixed, toks[:nfix], strict=True))
        if fx["type"] not in NCCL_TYPES:
            self.skipped.append(
                {
                    "line": p.lines[0],
                    "reason": f"unknown nccl-tests data type {fx['type']!r}; known: {', '.join(NCCL_TYPES)}",
                }
            )
            return
        spans = [(h.placements[-1], h.groups[-1])] if replay else list(zip(h.placements, h.groups, strict=True))
        fixed: dict[str, Any] = {
            "size_bytes": int(fx["size"]),
            "count": int(fx["count"]),
            "dtype": fx["type"],
            "redop": fx.get("redop", "none"),
            "root": int(fx["root"]) if "root" in fx else -1,
        }
        pos = nfix
        block = self.blocks[-1]
        for placement, names in spans:
            vals = _group_values(names, toks[pos : pos + len(names)], where)
            pos += len(names)
            row = {**fixed, **vals, "placement": placement, "source_line": p.lines[0], "timestamp": stamp}
            if len(p.lines) > 1:
                row["joined_lines"] = list(p.lines)
            block.rows.append(row)


def parse_nccl_text(text: str) -> ParsedLog:
    """Parse nccl-tests / rccl-tests text output into blocks of rows (no derived columns)."""
    r = _TextReader()
    for i, raw in enumerate(text.splitlines(), start=1):
        for seg, is_log, cut in _segments(raw.rstrip()):
            s = seg.strip()
            if not s:
                continue
            if is_log:
                mn = _NCCL_VERSION_RE.search(s)
                if mn and r.ctx.nccl_version is None:
                    r.ctx.nccl_version = mn["v"]
                continue
            if s.startswith("#"):
                r.comment(s, i)
            else:
                r.plain(s, i, cut)
    r.end_table(0)
    blocks = [b for b in r.blocks if b.rows]
    if not blocks:
        why = "; ".join(f"line {s['line']}: {s['reason']}" for s in sorted(r.skipped, key=lambda d: d["line"])[:3])
        raise ValueError(
            "no nccl-tests result rows found (expected a '#  size  count  type ...' header followed by data rows)"
            + (f"; {len(r.skipped)} data line(s) could not be read: {why}" if why else "")
        )
    for k, b in enumerate(blocks):
        b.index = k
    return ParsedLog("text", blocks, sorted(r.skipped, key=lambda d: d["line"]))
