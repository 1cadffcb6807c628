"""Correctness and numerical error of one point: payloads, exactly representable check inputs, the float64
reference, the ``wrong`` count (nccl-tests ``-c``) and the error of the decoded result.

Each rank regenerates its peers' inputs from their seeds, so the reference needs no communication and does not
trust the backend under test (up to ``LOCAL_REFERENCE_MAX_RANKS``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from commbench.collectives import Collective, Layout
from commbench.config import SuiteConfig
from commbench.launch import Dist
from commbench.precision import PointOp, Precision

LOCAL_REFERENCE_MAX_RANKS = int(os.environ.get("COMMBENCH_LOCAL_REFERENCE_MAX_RANKS", "16"))
"""Worlds up to this size check against a locally computed float64 reference (see :func:`references`); the
environment variable exists so the test suite can exercise the large-world path on two ranks."""


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
    """Check inputs every precision carries exactly, with magnitudes that differ between chunks and blocks
    (the idea of nccl-tests' -c data, made sharp enough to catch a misapplied scale).

    Element ``i`` of rank ``r`` is ``v * 2**e``:

    - ``v = (7i + 3r) mod 5 - 2`` in [-2, 2] (its sum over any 5 consecutive ranks is 0), and rank 0 sends
      ``2 * (v + 1)`` in {-2, 0, 2, 4, 6} instead, so rank 0's chunks need another scale than its peers', and
      the sum over any number of ranks stays within [-3, 7] and is never identically 0 (a negated or zeroed
      result shows at every world size);
    - ``e = floor(3i / numel) + f(i // 16)`` with ``f`` cycling 0,1,0,1,0,2,0,2,1,2,1: the third of the tensor
      sets a coarse magnitude (so the per-destination chunks of every collective differ), the run of 16 a fine
      one (so neighbouring blocks of 16..64 differ).

    Every value and every sum over ranks then has at most 3 significant bits and a magnitude in [1, 112]:
    exact in fp16, bf16, fp8 e5m2 (3 significant bits) and e4m3 (4), scaled or not, and in fp32 sums.
    """
    i = torch.arange(numel, dtype=torch.int64)
    v = (i * 7 + rank * 3) % 5 - 2
    if rank == 0:
        v = 2 * (v + 1)
    fine = torch.tensor(_FINE, dtype=torch.int64)[(i // 16) % len(_FINE)]
    e = (3 * i) // max(numel, 1) + fine
    return (v * (1 << e)).to(torch.float64)


_FINE = (0, 1, 0, 1, 0, 2, 0, 2, 1, 2, 1)
"""Fine magnitude exponents of successive runs of 16 check elements ((7k mod 11) mod 3: no period a power
of two, so blocks of any power-of-two size see different maxima)."""


def point_seed(base: int, rank: int, fp32_bytes: int) -> int:
    return (base * 1_000_003 + rank * 7919 + fp32_bytes) % (2**63)


def rank_payload(suite: SuiteConfig, layout: Layout, rank: int, fp32_bytes: int) -> torch.Tensor:
    """Rank ``rank``'s payload of a point (float64, CPU): the error pass and the timing run on it."""
    return payload(suite.payload, layout.input_numel, point_seed(suite.seed, rank, fp32_bytes))


def references(
    d: Dist,
    coll: Collective,
    layout: Layout,
    make: Callable[[int], torch.Tensor],
    given: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(this rank's input, expected output, expected output of |inputs|, expected output of the inputs as
    given: rounded to ``given``, the precision's input dtype), all float64 on the CPU.

    The first expectation is the total error's reference (the user's exact data); the last is what the
    communication alone is measured against (a lossless collective matches it exactly).

    Up to LOCAL_REFERENCE_MAX_RANKS the expectation is computed locally from every rank's regenerated
    input: independent of the backend under test. Beyond that, regenerating every peer's input costs
    O(world x size) per rank, so the reference is the same collective run in float64 on the backend.
    """

    def rounded(x: torch.Tensor) -> torch.Tensor:
        return x.to(given).to(torch.float64) if given is not None else x

    mine = make(d.rank)
    if d.world_size <= LOCAL_REFERENCE_MAX_RANKS:
        inputs = [mine if r == d.rank else make(r) for r in range(d.world_size)]
        return (
            mine,
            coll.reference(inputs, d.rank),
            coll.reference([x.abs() for x in inputs], d.rank),
            coll.reference([rounded(x) for x in inputs], d.rank),
        )

    def fp64_collective(x: torch.Tensor) -> torch.Tensor:
        inp = x.to(d.device)
        out = inp.clone() if not coll.out_of_place() else torch.empty(layout.output_numel, dtype=torch.float64, device=d.device)
        coll.run(inp, out, getattr(d, "pg", None))
        return out.cpu()

    return mine, fp64_collective(mine), fp64_collective(mine.abs()), fp64_collective(rounded(mine))


def _rel(sq_diff: float, sq_ref: float) -> float:
    return math.sqrt(sq_diff / sq_ref) if sq_ref > 0 else (0.0 if sq_diff == 0 else math.inf)


@dataclass(frozen=True, slots=True)
class Check:
    """What the correctness and error passes found (summed or maxed over ranks)."""

    wrong: int
    tolerance: float
    rel_err: float
    """Total: the result against the float64 result of the user's exact (float64) payload."""
    comm_rel_err: float
    """What the communication adds: the result against the float64 result of the inputs as given (rounded to
    the precision's input dtype); 0 for a lossless collective."""
    max_abs_err: float
    timing_input: torch.Tensor
    """This rank's payload (float64, CPU): the timing phases run on it."""


AfterComm = Callable[[PointOp], None]
"""A test hook run between ``comm`` and ``decode`` of the correctness pass (faults go into ``op.received()``)."""


def check_point(
    d: Dist,
    suite: SuiteConfig,
    coll: Collective,
    prec: Precision,
    layout: Layout,
    op: PointOp,
    fp32_bytes: int,
    after_comm: AfterComm | None = None,
) -> Check:
    """Run the correctness pass (when ``suite.check``) and the error pass of one point through ``op``.

    ``after_comm`` (tests only) edits the received wire of the correctness pass before it is decoded."""

    def roundtrip(x: torch.Tensor, hook: AfterComm | None = None) -> torch.Tensor:
        op.load(x.to(device=d.device, dtype=prec.input_dtype))
        op.encode()
        op.comm()
        if hook is not None:
            d.sync()
            hook(op)
        op.decode()
        d.sync()
        return op.result().to(device="cpu", dtype=torch.float64)

    wrong = 0
    tol = 0.0
    if suite.check:
        mine, ref, abs_ref, _ = references(d, coll, layout, lambda r: exact_inputs(layout.input_numel, r))
        got = roundtrip(mine, after_comm)
        bound = prec.check_tolerance(coll, abs_ref, d.world_size)
        bad = ~((got - ref).abs() <= bound)  # NaN compares false: counted wrong
        tol = float(torch.as_tensor(bound).max()) if isinstance(bound, torch.Tensor) else float(bound)
        wrong = int(bad.sum())
    mine, ref, _, given = references(
        d, coll, layout, lambda r: rank_payload(suite, layout, r, fp32_bytes), prec.input_dtype
    )
    got = roundtrip(mine)
    diff = got - ref
    comm_diff = got - given
    finite = bool(torch.isfinite(got).all())
    # This rank's partial statistics, each with how the ranks' values combine: squares add up, so the relative
    # errors are over the whole result (not a mean of the ranks'); a largest error and a tolerance are maxima.
    partial: dict[str, tuple[Callable[[Iterable[float]], float], float]] = {
        "sq_diff": (sum, float((diff * diff).sum()) if finite else math.inf),
        "sq_ref": (sum, float((ref * ref).sum())),
        "max_abs": (max, float(diff.abs().max()) if finite else math.inf),
        "wrong": (sum, float(wrong)),
        "tol": (max, tol),
        "sq_comm_diff": (sum, float((comm_diff * comm_diff).sum()) if finite else math.inf),
        "sq_given": (sum, float((given * given).sum())),
    }
    stats = d.gather_floats([value for _, value in partial.values()])
    total = {name: combine(s[i] for s in stats) for i, (name, (combine, _)) in enumerate(partial.items())}
    del ref, diff, got, given, comm_diff
    return Check(
        wrong=int(total["wrong"]),
        tolerance=total["tol"],
        rel_err=_rel(total["sq_diff"], total["sq_ref"]),
        comm_rel_err=_rel(total["sq_comm_diff"], total["sq_given"]),
        max_abs_err=total["max_abs"],
        timing_input=mine,
    )


# ----------------------------------------------------------------------------------------------------------
# Memory: refuse a suite whose buffers cannot fit before the first point allocates them.


def _largest_layouts(suite: SuiteConfig, n: int) -> list[tuple[int, Collective, Layout]]:
    from commbench.collectives import get_collective

    out = []
    for c in suite.collectives:
        coll = get_collective(c)
        for s in suite.sizes():
            total = coll.round_total(s // 4, n)
            if total >= n:
                out.append((s, coll, coll.layout(total, n)))
    return out


def point_memory(suite: SuiteConfig, n: int, backend: str) -> list[tuple[int, int, int]]:
    """(fp32 size, device bytes, host bytes) per rank at each size of the suite, worst collective.

    Device bytes: the ops of every precision the backend runs at that size, alive at once (the timing keeps
    all precisions of one size interleaved). Host bytes: the correctness and error passes' float64 data (each
    rank regenerates its peers' inputs up to LOCAL_REFERENCE_MAX_RANKS, plus the reference outputs and the
    decoded result), and on a CPU device the ops as well (added by the caller)."""
    from commbench.precision import get_precision

    per_size: dict[int, tuple[int, int]] = {}
    for size, coll, layout in _largest_layouts(suite, n):
        precs = [get_precision(p) for p in suite.precisions]
        dev = sum(p.buffer_bytes(coll, layout, n) for p in precs if p.supports(coll, backend))
        peers = n if n <= LOCAL_REFERENCE_MAX_RANKS else 1
        host = 8 * (peers * layout.input_numel + 8 * layout.output_numel)
        d0, h0 = per_size.get(size, (0, 0))
        per_size[size] = (max(d0, dev), max(h0, host))
    return [(s, d, h) for s, (d, h) in sorted(per_size.items())]


def _gb(b: float) -> str:
    return f"{b / 1e9:.1f} GB"


def host_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (what the kernel can hand out without swapping), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_problem(
    suite: SuiteConfig,
    n: int,
    backend: str,
    local_ranks: int,
    on_gpu: bool,
    host_free: int | None,
    device_free: int | None,
) -> str | None:
    """One line saying why the suite's largest sizes cannot fit, naming the largest size that does; None
    when everything fits (or nothing is known about free memory)."""
    from commbench.config import format_size

    rows = point_memory(suite, n, backend)
    if not rows:
        return None

    def fits(dev: int, host: int) -> tuple[bool, str]:
        host_total = local_ranks * (host + (0 if on_gpu else dev))
        if host_free is not None and host_total > host_free:
            return False, f"{local_ranks} rank(s) on this host need about {_gb(host_total)} of host memory, {_gb(host_free)} available"
        if on_gpu and device_free is not None and dev > device_free:
            return False, f"each rank needs about {_gb(dev)} of device memory, {_gb(device_free)} free"
        return True, ""

    ok_sizes = [s for s, dv, h in rows if fits(dv, h)[0]]
    size, dev, host = rows[-1]
    good, why = fits(dev, host)
    if good:
        return None
    hint = f"use -e {format_size(max(ok_sizes))} or less" if ok_sizes else "no size of this suite fits"
    return f"-e {format_size(size)} cannot fit: at that size {why}; {hint}"
