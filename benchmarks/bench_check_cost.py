"""What the correctness check costs a run: peak RSS per rank and wall time, with ``--check`` and ``--no-check``.

Runs the CLI as a user would (issue 22's measurement: 4 local gloo ranks, one all_reduce group of a 64 MiB
fp32 tensor with fp32, bf16 and fp8_e4m3; ``fp32_chunked`` joins it on its own)::

    python -m commbench run --nproc 4 --collectives all_reduce --precisions fp32,bf16,fp8_e4m3 -b 64M -e 64M \\
        --check | --no-check --no-training --no-report --quiet --out <tmp>

``--no-training --no-report`` keep the sweep alone: training and the report cost the same with and without the
check and would only dilute the ratio. The timing settings are the quick suite's own (none is passed).

Peak RSS per rank: the benchmark polls ``/proc/<pid>/status`` of every descendant of the CLI whose environment
has ``RANK=`` (the spawned ranks) every ``--poll`` seconds and keeps ``VmHWM``, the kernel's own high-water mark
of the process's resident set: a peak between two polls is not missed, only growth in the last poll interval
before the rank exits (teardown, which frees). Linux only. Wall: the CLI's start to exit.

Targets (issue 22): <= 1.5 GiB per rank with --check; --check wall <= 1.3x --no-check wall. Measured figures, with
their machine and date: ``benchmarks/results/``.

    python benchmarks/bench_check_cost.py            # the code on PYTHONPATH / the installed package
    PYTHONPATH=/tmp/base python benchmarks/bench_check_cost.py   # another checkout (run from outside it)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIB = 1 << 30
RSS_TARGET = 1.5 * GIB
WALL_RATIO_TARGET = 1.3


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and parentheses


def _descendants(root: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            pp = _ppid(int(entry))
            if pp is not None:
                parents[int(entry)] = pp
    out = []
    for pid in parents:
        p = parents.get(pid)
        while p is not None and p > 1:
            if p == root:
                out.append(pid)
                break
            p = parents.get(p)
    return out


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for kv in env:
        if kv.startswith(b"RANK="):
            return int(kv[5:])
    return None


def _hwm(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def run_once(check: bool, nproc: int, size: str, poll: float, extra: list[str]) -> tuple[float, dict[int, int], int]:
    """(wall seconds, peak RSS bytes per rank, exit code) of one CLI run."""
    with tempfile.TemporaryDirectory(prefix="bench_check_cost_") as tmp:
        cmd = [
            sys.executable, "-m", "commbench", "run", "--nproc", str(nproc), "--collectives", "all_reduce",
            "--precisions", "fp32,bf16,fp8_e4m3", "-b", size, "-e", size, "--check" if check else "--no-check",
            "--no-training", "--no-report", "--quiet", "--out", str(Path(tmp) / "run"), *extra,
        ]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        peaks: dict[int, int] = {}
        ranks: dict[int, int] = {}
        while proc.poll() is None:
            for pid in _descendants(proc.pid):
                if pid not in ranks:
                    r = _rank_of(pid)
                    if r is None:
                        continue
                    ranks[pid] = r
                hwm = _hwm(pid)
                if hwm is not None:
                    peaks[ranks[pid]] = max(peaks.get(ranks[pid], 0), hwm)
            time.sleep(poll)
        wall = time.perf_counter() - t0
        out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        if proc.returncode != 0:
            print(out[-3000:], file=sys.stderr)
        return wall, peaks, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--size", default="64M", help="fp32 tensor size (-b = -e)")
    ap.add_argument("--poll", type=float, default=0.2, help="seconds between reads of the ranks' VmHWM")
    ap.add_argument("--only", choices=["check", "no-check"], help="run one of the two")
    args, extra = ap.parse_known_args()
    import commbench

    print(f"# commbench from {Path(commbench.__file__).parent}; load average {os.getloadavg()}; {os.cpu_count()} cpus")
    results = {}
    for check in (True, False):
        name = "check" if check else "no-check"
        if args.only and args.only != name:
            continue
        wall, peaks, rc = run_once(check, args.nproc, args.size, args.poll, extra)
        results[name] = (wall, peaks)
        per = " ".join(f"r{r}={peaks[r] / GIB:.2f}" for r in sorted(peaks))
        print(
            f"--{name:<8} rc={rc} wall {wall:7.1f} s  peak RSS per rank (GiB): {per}  max {max(peaks.values(), default=0) / GIB:.2f}"
        )
    if len(results) == 2:
        (wc, pc), (wn, pn) = results["check"], results["no-check"]
        mc, mn = max(pc.values(), default=0), max(pn.values(), default=0)
        print(f"# ratio check/no-check: wall {wc / wn:.2f}x (target <= {WALL_RATIO_TARGET}x), "
              f"peak RSS {mc / mn:.2f}x; --check peak {mc / GIB:.2f} GiB (target <= {RSS_TARGET / GIB:.1f} GiB)")  # fmt: skip
        print(f"# load average after: {os.getloadavg()}")
        ok = mc <= RSS_TARGET and wc <= WALL_RATIO_TARGET * wn
        print("# targets met" if ok else "# targets NOT met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
