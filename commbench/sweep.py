"""The sweep: drives the collective x precision x size grid on every rank and yields one record per point
(a :class:`~commbench.records.CollectivePoint`).

For each point: a correctness pass on exactly representable inputs (``wrong``, as nccl-tests -c), an error
pass on the chosen payload distribution against a float64 reference computed locally from every rank's
inputs (each rank regenerates its peers' inputs from their seeds: no communication, an independent check),
then encode / comm / decode timed separately by the timing core.
"""

from __future__ import annotations

import datetime as _dt
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from commbench.check import check_point
from commbench.collectives import Collective, Layout, get_collective
from commbench.config import SuiteConfig
from commbench.launch import Dist
from commbench.precision import Precision, get_precision
from commbench.records import CollectivePoint
from commbench.timing import Measurement, Stats, bandwidth_gbps, measure


@dataclass(frozen=True, slots=True)
class Point:
    collective: Collective
    precision: Precision
    fp32_bytes: int


def _fault_hook(rank: int, index: int) -> None:
    """Test hook: ``COMMBENCH_INJECT_FAULT=kill:RANK:POINT`` or ``hang:RANK:POINT`` (used by the test suite
    to check that a dead or hung rank ends the run and is named)."""
    spec = os.environ.get("COMMBENCH_INJECT_FAULT")
    if not spec:
        return
    kind, r, p = spec.split(":")
    if int(r) == rank and int(p) == index:
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "hang":
            time.sleep(3600)


class Sweep:
    """Runs points on one rank; every rank runs the same points in the same order."""

    def __init__(self, suite: SuiteConfig, d: Dist) -> None:
        self.suite = suite
        self.d = d

    def points(self) -> list[Point]:
        pts = []
        for c in self.suite.collectives:
            coll = get_collective(c)
            for p in self.suite.precisions:
                prec = get_precision(p)
                if not prec.supports(coll, self.d.backend):
                    continue
                for s in self.suite.sizes():
                    pts.append(Point(coll, prec, s))
        return pts

    def skipped(self) -> list[tuple[str, str]]:
        """(collective, precision) pairs the backend cannot run."""
        out = []
        for c in self.suite.collectives:
            for p in self.suite.precisions:
                if not get_precision(p).supports(get_collective(c), self.d.backend):
                    out.append((c, p))
        return out

    def layout(self, pt: Point) -> Layout | None:
        n = self.d.world_size
        total = pt.collective.round_total(pt.fp32_bytes // 4, n)
        if total < n:
            return None
        return pt.collective.layout(total, n)

    def run_point(self, pt: Point, index: int) -> CollectivePoint | None:
        _fault_hook(self.d.rank, index)
        layout = self.layout(pt)
        if layout is None:
            return None
        d, suite, coll, prec = self.d, self.suite, pt.collective, pt.precision
        op = prec.make_op(coll, layout, None, d.device)

        chk = check_point(d, suite, coll, prec, layout, op, pt.fp32_bytes)
        mine = chk.timing_input
        wrong_total, tol, rel_err, max_abs = chk.wrong, chk.tolerance, chk.rel_err, chk.max_abs_err

        # Timing on the payload (in-place collectives keep summing into the buffer: like nccl-tests in-place).
        op.load(mine.to(device=d.device, dtype=prec.input_dtype))
        op.encode()
        t = suite.timing

        def timed(fn: Callable[[], None]) -> Measurement:
            return measure(
                fn,
                warmup=t.warmup,
                min_time_s=t.min_time_s,
                repeats=t.repeats,
                max_iters=t.max_iters,
                sync=d.sync,
                agree=d.agree_max,
                barrier=d.barrier,
            )

        enc = timed(op.encode) if op.has_codec else None
        comm = timed(op.comm)
        dec = timed(op.decode) if op.has_codec else None
        comm_stats = Stats.from_ranks(d.gather_floats(comm.samples))
        enc_us = Stats.from_ranks(d.gather_floats(enc.samples)).time_us if enc else 0.0
        dec_us = Stats.from_ranks(d.gather_floats(dec.samples)).time_us if dec else 0.0
        total_us = enc_us + comm_stats.time_us + dec_us
        fp32_bytes = layout.total * 4
        algbw = bandwidth_gbps(op.wire_bytes, comm_stats.time_us)
        return CollectivePoint(
            collective=coll.name,
            precision=prec.name,
            impl=prec.impl,
            backend=d.backend,
            device=d.device_name(),
            world_size=d.world_size,
            nodes=d.nodes,
            payload=suite.payload,
            dtype=prec.nccl_type,
            size_bytes=op.wire_bytes,
            count=layout.count,
            fp32_bytes=pt.fp32_bytes,
            wire_bytes=op.wire_bytes,
            time_us=comm_stats.time_us,
            time_us_max=comm_stats.time_us_max,
            p50_us=comm_stats.p50_us,
            p95_us=comm_stats.p95_us,
            cv=comm_stats.cv,
            rank_spread=comm_stats.rank_spread,
            iters=comm.iters,
            samples=len(comm.samples),
            algbw_gbps=algbw,
            busbw_gbps=algbw * coll.bus_factor(d.world_size),
            encode_us=enc_us,
            comm_us=comm_stats.time_us,
            decode_us=dec_us,
            total_us=total_us,
            effective_gbps=bandwidth_gbps(fp32_bytes, total_us),
            wrong=wrong_total,
            tolerance=tol,
            rel_err=rel_err,
            comm_rel_err=chk.comm_rel_err,
            max_abs_err=max_abs,
            timestamp=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )


def iter_points(sweep: Sweep, done: set[tuple[Any, ...]]) -> Iterator[tuple[int, Point]]:
    """Points still to run (``done`` holds POINT_KEY tuples of finished rows, for --resume)."""
    for i, pt in enumerate(sweep.points()):
        key = (pt.collective.name, pt.precision.name, sweep.suite.payload, pt.fp32_bytes)
        if key not in done:
            yield i, pt


def agree_done(d: Dist, done: set[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """Rank 0's set of finished points, on every rank (only rank 0 reads the run directory)."""
    obj: list[Any] = [sorted(done) if d.rank == 0 else None]
    dist.broadcast_object_list(obj, src=0)
    return {tuple(k) for k in obj[0]}
