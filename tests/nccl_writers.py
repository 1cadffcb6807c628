"""nccl-tests' and rccl-tests' output writers, ported line by line to Python for the import tests.

Sources (fetched, read, ported; nothing here imports commbench):
- NVIDIA/nccl-tests v2.19.6 (commit a0b82b2), ``src/util.cu``: ``writeDeviceReport`` (the ``# nThread`` and
  ``#  Rank`` lines), ``writeResultHeader``, ``writeBenchmarkLinePreamble`` (``%12li  %12li  %8s  %6s  %6s``),
  ``writeBenchmarkLineBody`` (``getFloatStr``: ``%7s  %6s  %6s  %6g`` or ``N/A``), ``writePerIterReport``
  (``computeIterStats``: nearest-rank percentiles, population stdev), ``writeTimestamp`` (``%21s`` of
  ``%Y-%m-%d %H:%M:%S``), ``writeResultFooter``; and its JSON writer (``JSON_FILE_VERSION 3``: keys in the order
  it writes them, no whitespace, doubles as ``%lf``, NaN as ``"nan"``, ``root`` as the ``%6i`` string, one
  ``devices`` entry per process: with MPI the first line each process reports, without MPI the one process's);
  ``src/common.cu`` ``BenchTime``: the time the bandwidths come from (``deltaSec``, or ``cputimeSec`` with -C 1)
  and the order of prints (preamble, then what NCCL logs while the op runs, then the body).
- ROCm/rccl-tests ``src/common.cu``: ``-O 0`` (in-place only) header and rows, ``test_typenames`` (fp8_e4m3,
  fp8_e5m2), ``Reporter`` (``-Z json|csv -x FILE``) in its 2024 form (commit c0eac93: ", " separators, JSON one
  object per line) and its 2025 form (``numCycle``; "," separators; a JSON list).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
"""busbw / algbw per binary (nccl-tests src/*.cu ``*GetBw``)."""
PER_RANK_COUNT = {"all_gather", "reduce_scatter", "alltoall"}


def float_str(value: float, width: int) -> str:
    """``getFloatStr``: the widest precision that fits ``width`` columns."""
    for spec in (f"{width}.2f", f"{width}.1f", f"{width}.0f"):
        s = format(value, spec)
        if len(s) <= width:
            return s
    return format(value, f"{width}.1e" if width >= 7 else f"{width}.0e")


@dataclass
class Measure:
    """One row of a table: the size, the per-placement times (us), and optional per-iteration times (us)."""

    size: int
    times: dict[str, float]
    iter_times: dict[str, list[float]] = field(default_factory=dict)
    per_process: dict[str, list[list[float]]] = field(default_factory=dict)
    wrong: int | None = 0


def bandwidths(binary: str, size: int, time_us: float, n: int) -> tuple[float, float]:
    """``*GetBw``: algbw = size / time (GB/s, 1e9), busbw = algbw x the binary's factor."""
    alg = size / 1e9 / (time_us / 1e6)
    return alg, alg * FACTORS[binary](n)


def count_of(binary: str, size: int, width: int, n: int) -> int:
    return size // width // n if binary in PER_RANK_COUNT else size // width


def iter_stats(times_us: list[float]) -> dict[str, float]:
    """``computeIterStats`` (seconds in the C code; the same in microseconds here)."""
    s = sorted(times_us)
    n = len(s)

    def pct(p: int) -> float:
        return s[min(n - 1, (n * p + 99) // 100 - 1)]

    avg = sum(s) / n
    sd = math.sqrt(sum((x - avg) ** 2 for x in s) / n)
    return {"min": s[0], "max": s[-1], "p50": s[n // 2], "p95": pct(95), "p99": pct(99), "avg": avg, "stdev": sd,
            "cv_pct": sd / avg * 100 if avg > 0 else 0.0}  # fmt: skip


def device_line(rank: int, pid: int, host: str, dev: int, bus: tuple[int, int, int], name: str, group: int = 0) -> str:
    return f"#  Rank {rank:2d} Group {group:2d} Pid {pid:6d} on {host:>10s} device {dev:2d} [{bus[0]:04x}:{bus[1]:02x}:{bus[2]:02x}] {name}"


@dataclass
class Layout:
    """How many processes, threads and GPUs: ranks = procs x nthreads x ngpus (nccl-tests ``nranks``)."""

    procs: int = 1
    nthreads: int = 1
    ngpus: int = 1
    hosts: tuple[str, ...] = ("node0",)
    device_name: str = "NVIDIA H100 80GB HBM3"

    @property
    def ranks(self) -> int:
        return self.procs * self.nthreads * self.ngpus

    def devices(self) -> list[tuple[int, int, str, int]]:
        """(rank, pid, host, device) per rank, processes spread evenly over the hosts."""
        per_host = max(1, self.procs // len(self.hosts))
        out = []
        for p in range(self.procs):
            host = self.hosts[min(p // per_host, len(self.hosts) - 1)]
            for i in range(self.nthreads * self.ngpus):
                out.append(
                    (
                        p * self.nthreads * self.ngpus + i,
                        4000 + p,
                        host,
                        (p % per_host) * self.nthreads * self.ngpus + i,
                    )
                )
        return out


def nccl_text(
    binary: str,
    rows: list[Measure],
    layout: Layout,
    *,
    dtype: str = "float",
    width: int = 4,
    redop: str = "sum",
    cputime: bool = False,
    timestamps: list[str] | None = None,
    per_iter: bool = False,
    per_iter_skip: int = 0,
    iters: int = 20,
    check: bool = True,
    log_line: str | None = None,
    version: str = "2.19.6",
    library: int = 22703,
) -> str:
    """A ``<binary>_perf`` run's stdout: version, settings, devices, header, rows, footer. ``log_line``: an NCCL
    log line printed while each row's out-of-place op runs (after the preamble) and before its in-place body."""
    n = layout.ranks
    out = [
        f"# nccl-tests version {version} nccl-headers={library} nccl-library={library}",
        f"# Collective test starting: {binary}_perf",
        f"# nThread {layout.nthreads} nGpus {layout.ngpus} minBytes {rows[0].size} maxBytes {rows[-1].size} step: "
        f"2(factor) warmup iters: 5 iters: {iters} agg iters: 1 validation: {int(check)} graph: 0 unalign: 0",
    ]
    if per_iter:
        line = "# Per-Iteration Report: CUDA event timing; i_* uses max over process rows"
        if per_iter_skip:
            line += f"; summary skips first {per_iter_skip} iterations"
        out.append(line + " ")
    out += ["#", "# Using devices"]
    out += [
        device_line(r, pid, host, dev, (0, 0x1B + dev, 0), layout.device_name) for r, pid, host, dev in layout.devices()
    ]
    t = "cputime" if cputime else "time"
    ts_lbl, ts_pad, ts_fmt = ("timestamp", 19, "%Y-%m-%d %H:%M:%S") if timestamps else ("", 0, "")
    out.append("#")
    e = ""
    if per_iter:
        out.append(
            f"# {e:>10s}  {e:>12s}  {e:>8s}  {e:>6s}  {e:>6s}              out-of-place (+ per-iteration)                                in-place (+ per-iteration)"
        )
        names = ["size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%",
                 t, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%"]  # fmt: skip
        widths = [10, 12, 8, 6, 6, 7, 6, 6, 6, 7, 7, 7, 7, 7, 6, 6, 6, 7, 7, 7, 7]
        units = ["(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)",
                 "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)"]  # fmt: skip
    else:
        out.append(
            f"# {e:>10s}  {e:>12s}  {e:>8s}  {e:>6s}  {e:>6s}           out-of-place                       in-place          "
        )
        names = ["size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", t, "algbw", "busbw", "#wrong"]
        widths = [10, 12, 8, 6, 6, 7, 6, 6, 6, 7, 6, 6, 6]
        units = ["(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""]
    out.append("# " + "  ".join(f"{s:>{w}s}" for s, w in zip(names, widths, strict=True)) + f" {ts_lbl:>{ts_pad}s}")
    out.append("# " + "  ".join(f"{s:>{w}s}" for s, w in zip(units, widths, strict=True)) + f" {ts_fmt:>{ts_pad}s}")
    bus_sum = 0.0
    for k, m in enumerate(rows):
        line = f"{m.size:12d}  {count_of(binary, m.size, width, n):12d}  {dtype:>8s}  {redop:>6s}  {-1:6d}"
        for placement in ("out-of-place", "in-place"):
            if log_line and placement == "out-of-place":
                out.append(line + log_line)  # NCCL logs from inside the op: the row goes on after its newline
                line = ""
            alg, bus = bandwidths(binary, m.size, m.times[placement], n)
            bus_sum += bus
            body = f"  {float_str(m.times[placement], 7):>7s}  {float_str(alg, 6):>6s}  {float_str(bus, 6):>6s}"
            body += f"  {m.wrong:6g}" if check else "    N/A"
            line += body
            if placement == "in-place" and timestamps and not per_iter:
                line += f"{timestamps[k]:>21s}"
            if per_iter:
                st = iter_stats(m.iter_times[placement][per_iter_skip:])
                line += "".join(f"  {float_str(st[x], 7):>7s}" for x in ("min", "max", "p99", "cv_pct"))
                if placement == "in-place" and timestamps:
                    line += f"{timestamps[k]:>21s}"
            if log_line and placement == "out-of-place":
                out.append(line + log_line)
                line = ""
        out.append(line)
    out += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {bus_sum / (2 * len(rows)):g} ", "#",
            f"# Collective test concluded: {binary}_perf", ""]  # fmt: skip
    return "\n".join(out) + "\n"


def _jd(v: float) -> str:
    """``jsonDouble``: ``%lf``, NaN as the string "nan"."""
    return '"nan"' if v != v else f"{v:f}"


def nccl_json(
    binary: str,
    rows: list[Measure],
    layout: Layout,
    *,
    mpi: bool,
    dtype: str = "float",
    width: int = 4,
    redop: str = "sum",
    cputime: bool = False,
    per_iter: bool = False,
    per_iter_skip: int = 0,
    iters: int = 20,
    args: list[str] | None = None,
    nccl_version: int = 22703,
) -> str:
    """The ``-J`` file of that run, as nccl-tests v2.19.6 writes it (format version 3)."""
    n = layout.ranks
    args = args or [f"./build/{binary}_perf", "-g", str(layout.ngpus), "-J", "out.json"]
    devs = layout.devices()
    per_proc = layout.nthreads * layout.ngpus
    # MPI: root parses the first line each process reports; without MPI: only the one process's first line
    firsts = [d for d in devs if d[0] % per_proc == 0] if mpi else devs[:1]
    dev_json = ",".join(
        f'{{"rank":{r},"group":0,"pid":{pid},"hostname":"{host}","device":{dev},"device_hex":"0000:{0x1B + dev:02x}:00",'
        f'"device_info":"{layout.device_name}"}}'
        for r, pid, host, dev in firsts
    )
    cfg = (
        f'{{"nthreads":{layout.nthreads},"ngpus":{layout.ngpus},"minimum_bytes":{rows[0].size},'
        f'"maximum_bytes":{rows[-1].size},"step_factor":2,"warmup_iters":5,"iterations":{iters},'
        f'"aggregated_iterations":1,"validation":1,"graph":0,"blocking_collectives":"false",'
        f'"per_iter_timing":"{str(per_iter).lower()}","per_iter_skip":{per_iter_skip},"parallel_init":"false",'
        f'"devices":[{dev_json}]}}'
    )
    results = []
    bus_sum = 0.0
    for m in rows:
        parts = [f'"size":{m.size}', f'"count":{count_of(binary, m.size, width, n)}', f'"type":"{dtype}"',
                 f'"redop":"{redop}"', f'"root":"{-1:6d}"']  # fmt: skip
        for placement, key in (("out-of-place", "out_of_place"), ("in-place", "in_place")):
            alg, bus = bandwidths(binary, m.size, m.times[placement], n)
            bus_sum += bus
            nwrong = _jd(float(m.wrong)) if m.wrong is not None else "null"
            parts.append(f'"{key}":{{"{"cpu_time" if cputime else "time"}":{_jd(m.times[placement])},'
                         f'"alg_bw":{_jd(alg)},"bus_bw":{_jd(bus)},"nwrong":{nwrong}}}')  # fmt: skip
            if per_iter:
                it = m.iter_times[placement]
                st = iter_stats(it[per_iter_skip:])
                body = (
                    [f'"skipped_iterations":{per_iter_skip}']
                    + [f'"{k}_us":{_jd(st[k])}' for k in ("min", "max", "avg", "p50", "p95", "p99", "stdev")]
                    + [f'"cv_pct":{_jd(st["cv_pct"])}', f'"times_us":[{",".join(_jd(t) for t in it)}]']
                )
                pp = m.per_process.get(placement)
                if pp and len(pp) > 1:
                    body.append(
                        '"per_process_max_times_us":['
                        + ",".join("[" + ",".join(_jd(t) for t in s) + "]" for s in pp)
                        + "]"
                    )
                parts.append(f'"{key}_per_iter":{{{",".join(body)}}}')
        parts += [f'"actual_iterations":{iters}', '"experiment_name":""']
        results.append("{" + ",".join(parts) + "}")
    arg_json = ",".join(f'"{a}"' for a in args)
    return (
        f'{{"version":3,"start_time":"2026-07-09 16:03:21","args":[{arg_json}],"env":["PATH=/usr/bin"],'
        f'"nccl_version":{nccl_version},"config":{cfg},"results":[{",".join(results)}],'
        f'"out_of_bounds":{{"count":0,"okay":"true"}},"average_bus_bandwidth":{{"bandwidth":{_jd(bus_sum / (2 * len(rows)))},'
        f'"okay":"unchecked"}},"errors":[],"end_time":"2026-07-09 16:03:29"}}'
    )


def rccl_text_in_place_only(
    binary: str, rows: list[Measure], n: int, *, dtype: str, width: int, host: str = "mi300x-0"
) -> str:
    """rccl-tests with ``-O 0``: the header names one in-place group and each row holds only it."""
    e = ""
    out = [f"# nThread 1 nGpus {n} minBytes {rows[0].size} maxBytes {rows[-1].size} step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
           "#", "rccl-tests: Version develop:5272cd1", "# Using devices"]  # fmt: skip
    out += [device_line(r, 37300, host, r, (0, 5 + 0x20 * r, 0), "AMD Instinct MI300X") for r in range(n)]
    out += ["#", f"# {e:>10s}  {e:>12s}  {e:>8s}  {e:>6s}  {e:>6s}           in-place          ",
            f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s} {'#wrong':>6s}",
            f"# {'(B)':>10s}  {'(elements)':>12s}  {e:>8s}  {e:>6s}  {e:>6s}  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {e:>5s}"]  # fmt: skip
    for m in rows:
        t = m.times["in-place"]
        alg, bus = bandwidths(binary, m.size, t, n)
        ts = f"{t:7.0f}" if t >= 10000 else f"{t:7.1f}" if t >= 100 else f"{t:7.2f}"
        out.append(f"{m.size:12d}  {count_of(binary, m.size, width, n):12d}  {dtype:>8s}  {'sum':>6s}  {-1:6d}"
                   f"  {ts:>7s}  {alg:6.2f}  {bus:6.2f}  {m.wrong:5g}")  # fmt: skip
    out += ["# Errors with asterisks indicate errors that have exceeded the maximum threshold.",
            "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.0 ", "#"]  # fmt: skip
    return "\n".join(out) + "\n"


RCCL_NAMES = {
    "all_reduce": "AllReduce",
    "all_gather": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "alltoall": "AlltoAll",
}


def rccl_records(binary: str, rows: list[Measure], n: int, *, dtype: str, mpi_ranks: int | None = None,
                 cycle: int | None = 0) -> list[list[tuple[str, str]]]:  # fmt: skip
    """``Reporter::addResult``: (value as std::to_string / quoted string, key) per column, in its order."""
    recs = []
    for m in rows:
        for in_place, placement in ((0, "out-of-place"), (1, "in-place")):
            alg, bus = bandwidths(binary, m.size, m.times[placement], n)
            kv = [] if cycle is None else [(str(cycle), "numCycle")]
            kv.append((f'"{RCCL_NAMES[binary]}"', "name"))
            if mpi_ranks:
                gpus = n // mpi_ranks
                kv += [
                    ("1", "nodes"),
                    (str(mpi_ranks), "ranks"),
                    (str(mpi_ranks), "ranksPerNode"),
                    (str(gpus), "gpusPerRank"),
                ]
            else:
                kv.append((str(n), "gpus"))
            kv += [(str(m.size), "size"), (f'"{dtype}"', "type"), ('"sum"', "redop"), (str(in_place), "inPlace"),
                   (f"{m.times[placement]:f}", "time"), (f"{alg:f}", "algBw"), (f"{bus:f}", "busBw"),
                   ('"N/A"' if m.wrong is None else f'"{m.wrong}"', "wrong")]  # fmt: skip
            recs.append(kv)
    return recs


def rccl_csv(recs: list[list[tuple[str, str]]], *, new_format: bool, mpi: bool) -> str:
    """``Reporter``'s CSV: 2025 (``writeFile``: numCycle, "," separators) or 2024 (the constructor's header, ", ")."""
    sep = "," if new_format else ", "
    head = (["numCycle"] if new_format else []) + ["collective"]
    head += ["ranks", "rankspernode", "gpusperrank"] if mpi else ["gpus"]
    head += ["size", "type", "redop", "inplace", "time", "algbw", "busbw", "#wrong"]
    lines = [sep.join(head)] + [sep.join(v for v, _ in kv) for kv in recs]
    return "\n".join(lines) + "\n"


def rccl_json(recs: list[list[tuple[str, str]]], *, new_format: bool) -> str:
    """``Reporter``'s JSON: 2025 a list of objects, 2024 one object per line."""
    objs = ["{" + ", ".join(f'"{k}":{v}' for v, k in kv) + "}" for kv in recs]
    if new_format:
        return "[\n" + ",\n".join(objs) + "\n]\n"
    return "\n".join(objs) + "\n"
