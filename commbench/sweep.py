"""The sweep: drives the collective x precision x size grid on every rank and yields one record per point
(a :class:`~commbench.records.CollectivePoint`).

For each point: a correctness pass on exactly representable inputs (``wrong``, as nccl-tests -c), an error
pass on the chosen payload distribution against a float64 reference computed locally from every rank's
inputs (each rank regenerates its peers' inputs from their seeds: no communication, an independent check),
then encode / comm / decode timed separately by the timing core.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from commbench.collectives import Collective, Layout, get_collective
from commbench.config import SuiteConfig
from commbench.launch import Dist
from commbench.precision import Precision, get_precision
from commbench.records import CollectivePoint
from commbench.timing import Measurement, Stats, bandwidth_gbps, measure

LOCAL_REFERENCE_MAX_RANKS = int(os.environ.get("COMMBENCH_LOCAL_REFERENCE_MAX_RANKS", "16"))
"""Worlds up to this size check against a locally computed float64 reference (see Sweep.references); the
environment variable exists so the test suite can exercise the large-world path on two ranks."""


@dataclass(frozen=True, slots=True)
class Point:
    collective: Collective
    precision: Precision
    fp32_bytes: int


def payload(kind: str, numel: int, seed: int) -> torch.Tensor:
    """Float64 payload of one rank: ``normal`` N(0,1); ``gradient`` N(0, 1e-7^2), the magnitude of
    small late-training gradients: below fp16's smallest normal (6.1e-5) and around its smallest subnormal
    (6.0e-8), so they underflow without loss scaling, while bf16 keeps fp32's exponent range; ``outliers`` N(0,1) with
    one element in a thousand scaled by 1e4 (per-tensor scaling collapses the rest)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        return torch.randn(numel, generator=g, dtype=torch.float64)
    if kind == "gradient":
        return torch.randn(numel, generator=g, dtype=torch.float64) * 1e-7
    if kind == "outliers":
        x = torch.randn(numel, generator=g, dtype=torch.float64)
        mask = torch.rand(numel, generator=g, dtype=torch.float64) < 1e-3
        return torch.where(mask, x * 1e4, x)
    raise ValueError(f"unknown payload {kind!r}")


def exact_inputs(numel: int, rank: int) -> torch.Tensor:
    """Integers in [-2, 2] whose sum over any 5 consecutive ranks is 0, so partial sums stay small and every
    format carries them exactly (the idea of nccl-tests' -c data)."""
    i = torch.arange(numel, dtype=torch.int64)
    return ((i * 7 + rank * 3) % 5 - 2).to(torch.float64)


def point_seed(base: int, rank: int, fp32_bytes: int) -> int:
    return (base * 1_000_003 + rank * 7919 + fp32_bytes) % (2**63)


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

    def references(
        self, coll: Collective, layout: Layout, make: Callable[[int], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(this rank's input, expected output, expected output of |inputs|), all float64 on the CPU.

        Up to LOCAL_REFERENCE_MAX_RANKS the expectation is computed locally from every rank's regenerated
        input: independent of the backend under test. Beyond that, regenerating every peer's input costs
        O(world x size) per rank, so the reference is the same collective run in float64 on the backend.
        """
        d = self.d
        mine = make(d.rank)
        if d.world_size <= LOCAL_REFERENCE_MAX_RANKS:
            inputs = [mine if r == d.rank else make(r) for r in range(d.world_size)]
            return mine, coll.reference(inputs, d.rank), coll.reference([x.abs() for x in inputs], d.rank)

        def fp64_collective(x: torch.Tensor) -> torch.Tensor:
            inp = x.to(d.device)
            out = inp.clone() if not coll.out_of_place() else torch.empty(layout.output_numel, dtype=torch.float64, device=d.device)
            coll.run(inp, out)
            return out.cpu()

        return mine, fp64_collective(mine), fp64_collective(mine.abs())

    def run_point(self, pt: Point, index: int) -> CollectivePoint | None:
        _fault_hook(self.d.rank, index)
        layout = self.layout(pt)
        if layout is None:
            return None
        d, suite, coll, prec = self.d, self.suite, pt.collective, pt.precision
        op = prec.make_op(coll, layout, None, d.device)

        def roundtrip(x: torch.Tensor) -> torch.Tensor:
            op.load(x.to(device=d.device, dtype=prec.input_dtype))
            op.encode()
            op.comm()
            op.decode()
            d.sync()
            return op.result().to(device="cpu", dtype=torch.float64)

        wrong = 0
        tol = 0.0
        if suite.check:
            mine, ref, abs_ref = self.references(coll, layout, lambda r: exact_inputs(layout.input_numel, r))
            got = roundtrip(mine)
            bound = prec.error_bound(coll, abs_ref, d.world_size)
            bad = ~((got - ref).abs() <= bound)  # NaN compares false: counted wrong
            tol = float(torch.as_tensor(bound).max()) if isinstance(bound, torch.Tensor) else float(bound)
            wrong = int(bad.sum())
        seeds = [point_seed(suite.seed, r, pt.fp32_bytes) for r in range(d.world_size)]
        mine, ref, _ = self.references(coll, layout, lambda r: payload(suite.payload, layout.input_numel, seeds[r]))
        got = roundtrip(mine)
        diff = got - ref
        finite = bool(torch.isfinite(got).all())
        err = torch.tensor(
            [
                float((diff * diff).sum()) if finite else math.inf,
                float((ref * ref).sum()),
                float(diff.abs().max()) if finite else math.inf,
                float(wrong),
                tol,
            ],
            dtype=torch.float64,
        )
        stats = d.gather_floats(err.tolist())
        sq_diff = sum(s[0] for s in stats)
        sq_ref = sum(s[1] for s in stats)
        max_abs = max(s[2] for s in stats)
        wrong_total = int(sum(s[3] for s in stats))
        tol = max(s[4] for s in stats)
        rel_err = math.sqrt(sq_diff / sq_ref) if sq_ref > 0 else (0.0 if sq_diff == 0 else math.inf)
        del ref, diff, got

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
