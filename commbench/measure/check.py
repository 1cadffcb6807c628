"""Correctness and numerical error of one point: payloads, exactly representable check inputs, the float64
reference, the ``wrong`` count (nccl-tests ``-c``) and the error of the decoded result.

Each rank regenerates its peers' inputs from their seeds, so the reference needs no communication and does not
trust the backend under test (up to ``LOCAL_REFERENCE_MAX_RANKS``).

Memory: no full-size copy of an input is made to build a reference. Every rank's input is made in
blocks (:func:`payload_blocks`, :func:`exact_blocks`: the same values as :func:`payload` and
:func:`exact_inputs`), each block added into the float64 expectation and dropped; the ops load this rank's input
from one tensor per input dtype (:func:`load_inputs`); results are compared with the expectations slice by
slice (``_SLICE`` elements), so no float64 copy of a result, and no full-size tolerance, is ever made.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from commbench.cluster.launch import Dist
from commbench.core.suite import SuiteConfig
from commbench.measure.collectives import Collective, Layout
from commbench.measure.precision import PointOp, Precision

LOCAL_REFERENCE_MAX_RANKS = int(os.environ.get("COMMBENCH_LOCAL_REFERENCE_MAX_RANKS", "16"))
"""Worlds up to this size check against a locally computed float64 reference (see :func:`references`); the
environment variable exists so the test suite can exercise the large-world path on two ranks."""

PAYLOADS = ("normal", "gradient", "outliers")


def payload(kind: str, numel: int, seed: int, device: torch.device | None = None) -> torch.Tensor:
    """Float64 payload of one rank, made by the CPU generator (the same values on every device) and moved to
    ``device``: ``normal`` N(0,1); ``gradient`` N(0, 1e-7^2), the magnitude of
    small late-training gradients: below fp16's smallest normal (6.1e-5) and around its smallest subnormal
    (6.0e-8), so they underflow without loss scaling, while bf16 keeps fp32's exponent range; ``outliers`` N(0,1) with
    one element in a thousand scaled by 1e4 (per-tensor scaling collapses the rest).

    The definition of the values; the sweep makes them in blocks (:func:`payload_blocks`)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        x = torch.randn(numel, generator=g, dtype=torch.float64)
    elif kind == "gradient":
        x = torch.randn(numel, generator=g, dtype=torch.float64) * 1e-7
    elif kind == "outliers":
        x = torch.randn(numel, generator=g, dtype=torch.float64)
        mask = torch.rand(numel, generator=g, dtype=torch.float64) < 1e-3
        x = torch.where(mask, x * 1e4, x)
    else:
        raise ValueError(f"unknown payload {kind!r}; valid choices: {', '.join(PAYLOADS)}")
    return x if device is None else x.to(device)


_BLOCK = 1 << 20
"""Elements per block of an input made in blocks (8 MiB of float64): a multiple of 16 (see
:func:`_normal_blocks`), small next to a 64 MiB tensor, large enough that the per-call cost is nothing."""


def _normal_blocks(g: torch.Generator, numel: int, block: int) -> Iterator[torch.Tensor]:
    """``torch.randn(numel, generator=g, dtype=float64)`` made as consecutive blocks whose concatenation has
    the same values, bit for bit: torch's CPU normal fill draws one uniform per element in order and transforms
    them in groups of 16 from the start of the call, then redraws the last 16 when ``numel % 16 != 0``. Blocks
    that start at multiples of 16 (``block`` is one) give the same groups, and the tail lands in the last block,
    which is extended to the end when less than 16 elements would be left after it. Checked at run time by
    :func:`_blocks_agree` (a torch whose fill differs falls back to whole tensors)."""
    start = 0
    while start < numel:
        end = min(start + block, numel)
        if 0 < numel - end < 16:
            end = numel
        yield torch.randn(end - start, generator=g, dtype=torch.float64)
        start = end


def _payload_blocks(kind: str, numel: int, seed: int, block: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(start, block) of :func:`payload` over the whole tensor, in order."""
    if kind not in PAYLOADS:
        raise ValueError(f"unknown payload {kind!r}; valid choices: {', '.join(PAYLOADS)}")
    if block % 16:
        raise ValueError(f"payload block must be a multiple of 16 elements, got {block}")
    g = torch.Generator().manual_seed(seed)
    gm = None
    if kind == "outliers":
        # payload() draws the mask after the whole normal tensor: a second generator, run through the normal
        # draws once, is where those draws start (one more pass of the generator, no memory)
        gm = torch.Generator().manual_seed(seed)
        for _ in _normal_blocks(gm, numel, block):
            pass
    start = 0
    for x in _normal_blocks(g, numel, block):
        if kind == "gradient":
            x = x * 1e-7
        elif gm is not None:
            mask = torch.rand(x.numel(), generator=gm, dtype=torch.float64) < 1e-3  # one draw per element
            x = torch.where(mask, x * 1e4, x)
        yield start, x
        start += x.numel()


_AGREE: dict[str, bool] = {}


def _blocks_agree(kind: str) -> bool:
    """Whether :func:`_payload_blocks` gives :func:`payload`'s values on this torch (sizes around a block,
    with and without a tail of less than 16, and under 16), once per payload kind."""
    if kind not in _AGREE:
        ok = True
        for numel in (5, 16, 96, 101, 117, 130):
            whole = payload(kind, numel, 12345)
            parts = torch.cat([x for _, x in _payload_blocks(kind, numel, 12345, 32)])
            ok = ok and torch.equal(whole, parts)
        _AGREE[kind] = ok
    return _AGREE[kind]


def payload_blocks(
    kind: str, numel: int, seed: int, lo: int = 0, hi: int | None = None, block: int | None = None
) -> Iterator[tuple[int, torch.Tensor]]:
    """Elements ``[lo, hi)`` of :func:`payload` (float64, on the CPU) as (start, piece) in order, pieces of at most
    ``block`` elements, never the whole tensor at once. The generator runs from the start: elements before ``lo``
    are made and dropped (the cost of a whole payload, not its memory). ``block`` defaults to ``_BLOCK``."""
    hi = numel if hi is None else hi
    block = _BLOCK if block is None else block
    if not _blocks_agree(kind):  # a torch whose normal fill differs: whole tensors (correct, not lean)
        x = payload(kind, numel, seed)
        for s in range(lo, hi, block):
            yield s, x[s : min(s + block, hi)]
        return
    for start, x in _payload_blocks(kind, numel, seed, block):
        end = start + x.numel()
        if end <= lo:
            continue
        if start >= hi:
            return
        a, b = max(lo, start), min(hi, end)
        yield a, x[a - start : b - start]


def exact_inputs(numel: int, rank: int, device: torch.device | None = None) -> torch.Tensor:
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
    The same values on any ``device``; made by :func:`exact_piece`.
    """
    return exact_piece(numel, rank, 0, numel, device)


_PERIOD = 5 * 16 * 11
"""Period of ``v * 2**f`` in :func:`exact_inputs` (``v`` has period 5, ``f`` period 16 * 11)."""


def exact_piece(numel: int, rank: int, lo: int, hi: int, device: torch.device | None = None) -> torch.Tensor:
    """Elements ``[lo, hi)`` of :func:`exact_inputs` (float64, on ``device``). ``v * 2**f`` is periodic (``_PERIOD``),
    so one period is computed in integers and tiled, then each third is multiplied by its power of two: exact
    (powers of two), a few memory passes instead of int64 arithmetic per element."""
    i = torch.arange(_PERIOD, dtype=torch.int64, device=device)
    v = (i * 7 + rank * 3) % 5 - 2
    if rank == 0:
        v = 2 * (v + 1)
    fine_of = torch.tensor(_FINE, dtype=torch.int64, device=device)
    period = (v * (1 << fine_of[(i // 16) % len(_FINE)])).to(torch.float64)
    count = hi - lo
    if count <= 0:
        return torch.empty(0, dtype=torch.float64, device=device)
    start = lo % _PERIOD
    reps = -(-(start + count) // _PERIOD)
    out = period.repeat(reps)[start : start + count].clone()
    for k in (1, 2):  # e's coarse part: floor(3i / numel) >= k from i = ceil(k * numel / 3)
        first = max(-(-k * numel // 3) - lo, 0)
        if first < count:
            out[first:].mul_(2.0)
    return out


def exact_blocks(
    numel: int,
    rank: int,
    lo: int = 0,
    hi: int | None = None,
    device: torch.device | None = None,
    block: int | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Elements ``[lo, hi)`` of :func:`exact_inputs` as (start, piece) in order (computed by index: nothing before
    ``lo`` is made); ``block`` defaults to ``_BLOCK``."""
    hi = numel if hi is None else hi
    block = _BLOCK if block is None else block
    for s in range(lo, hi, block):
        yield s, exact_piece(numel, rank, s, min(s + block, hi), device)


_FINE = (0, 1, 0, 1, 0, 2, 0, 2, 1, 2, 1)
"""Fine magnitude exponents of successive runs of 16 check elements ((7k mod 11) mod 3: no period a power
of two, so blocks of any power-of-two size see different maxima)."""


def point_seed(base: int, rank: int, fp32_bytes: int) -> int:
    return (base * 1_000_003 + rank * 7919 + fp32_bytes) % (2**63)


Source = Callable[[int, int, int], Iterator[tuple[int, torch.Tensor]]]
"""``source(r, lo, hi)``: elements ``[lo, hi)`` of rank ``r``'s float64 input as (start, piece), in order."""


def payload_source(suite: SuiteConfig, layout: Layout, fp32_bytes: int) -> Source:
    """Every rank's payload of a point, in blocks: the error pass and the timing run on it."""
    n = layout.input_numel
    return lambda r, lo, hi: payload_blocks(suite.payload, n, point_seed(suite.seed, r, fp32_bytes), lo, hi)


def exact_source(layout: Layout, device: torch.device | None = None) -> Source:
    """Every rank's check inputs (:func:`exact_inputs`), in blocks."""
    n = layout.input_numel
    return lambda r, lo, hi: exact_blocks(n, r, lo, hi, device)


def whole(source: Source, r: int, numel: int, device: torch.device | None = None) -> torch.Tensor:
    """Rank ``r``'s whole input from ``source`` (float64, on ``device``)."""
    out = torch.empty(numel, dtype=torch.float64, device=device)
    for s, x in source(r, 0, numel):
        out[s : s + x.numel()].copy_(x)
    return out


def load_inputs(
    ops: Sequence[tuple[Precision, PointOp]], source: Source, rank: int, numel: int, device: torch.device
) -> None:
    """Load every op with this rank's input from ``source``, converted to its precision's input dtype: one tensor
    per distinct input dtype, filled block by block (no float64 copy of the input, no per-op conversion)."""
    dtypes = list(dict.fromkeys(prec.input_dtype for prec, _ in ops))
    inputs = {dt: torch.empty(numel, dtype=dt, device=device) for dt in dtypes}
    for s, x in source(rank, 0, numel):
        x = x.to(device)
        for t in inputs.values():
            t[s : s + x.numel()].copy_(x)  # the same rounding as x.to(t.dtype)
    for prec, op in ops:
        op.load(inputs[prec.input_dtype])
    del inputs


@dataclass(slots=True)
class References:
    """What one group's points are compared against, computed once for all its precisions (float64, on the
    rank's device)."""

    exact: torch.Tensor | None
    """Expected output of the inputs as generated (the user's exact data); None when not asked for."""
    abs: torch.Tensor | None
    """Expected output of ``|inputs|`` (the tolerance of the ``wrong`` count); None unless asked for."""
    given: dict[torch.dtype, torch.Tensor]
    """Expected output of the inputs as given to a precision: rounded to its input dtype (one per dtype)."""


View = Callable[[torch.Tensor], torch.Tensor]
"""One expectation's input from a rank's float64 input (itself, ``|x|``, rounded to a dtype): float64 or a
narrower dtype whose values upcast exactly (added into a float64 sum or copied into a float64 slot)."""


def _piece(coll: Collective, layout: Layout, rank: int, n: int) -> tuple[int, int, int] | None:
    """How a peer's input enters this rank's expected output, guessed from the shapes: (offset in the peer's
    input, length, width of the output slot per peer: 0 = summed into the whole output); None for no guess.

    Reductions sum each peer's ``[reduced_offset, +output_numel)`` (all_reduce: all, reduce_scatter: this
    rank's slice); the others concatenate one piece per peer (all_gather: the peer's whole input, all_to_all:
    its chunk for this rank). A guess is used only where :func:`_rule_holds` confirmed it."""
    m_in, m_out = layout.input_numel, layout.output_numel
    if coll.reduces:
        off = coll.reduced_offset(rank, layout)
        return (off, m_out, 0) if off + m_out <= m_in else None
    k = m_out // n
    if k * n != m_out:
        return None
    if m_in == k:
        return 0, k, k
    if m_in == m_out:
        return rank * k, k, k
    return None


def _accumulate(
    coll: Collective,
    layout: Layout,
    rank: int,
    n: int,
    source: Source,
    views: dict[str, View],
    device: torch.device,
) -> dict[str, torch.Tensor] | None:
    """Every expectation of ``views`` by the :func:`_piece` rule: each peer's input is made block by block, each
    view of a block added into (or copied into its slot of) its float64 output and dropped. None when the rule
    has no guess for this shape."""
    piece = _piece(coll, layout, rank, n)
    if piece is None:
        return None
    off, length, slot = piece
    got = {k: torch.empty(layout.output_numel, dtype=torch.float64, device=device) for k in views}
    for r in range(n):
        for s, src in source(r, off, off + length):
            src = src.to(device)
            lo, hi = s - off, s - off + src.numel()
            dst = slice(r * slot + lo, r * slot + hi) if slot else slice(lo, hi)
            for k, view in views.items():
                part = view(src)
                if slot or r == 0:
                    got[k][dst].copy_(part)  # a narrower dtype is upcast exactly
                else:
                    got[k][dst].add_(part)  # ... then summed in float64, rank by rank
                del part
            del src
    return got


_RULE: dict[tuple[str, int, int], bool] = {}


def _rule_holds(coll: Collective, n: int, rank: int) -> bool:
    """Whether :func:`_accumulate` gives :meth:`Collective.reference` for ``coll`` (at a small layout of the
    same world, on integer-valued inputs, so any order of summation is exact); once per collective and world.
    A collective whose shape the rule misreads (a broadcast: input and output alike) is found here and keeps
    the world's stacked copies."""
    key = (coll.name, n, rank)
    if key not in _RULE:
        small = coll.layout(coll.round_total(64 * n * n, n), n)
        xs = [((torch.arange(small.input_numel, dtype=torch.float64) * 7 + 13 * r) % 29) - 11 for r in range(n)]

        def src(r: int, lo: int, hi: int) -> Iterator[tuple[int, torch.Tensor]]:
            for s in range(lo, hi, 7):  # odd pieces: the rule must not depend on where blocks start
                yield s, xs[r][s : min(s + 7, hi)]

        got = _accumulate(coll, small, rank, n, src, {"x": lambda x: x}, torch.device("cpu"))
        want = coll.reference(xs, rank)
        _RULE[key] = got is not None and got["x"].shape == want.shape and bool(torch.equal(got["x"], want))
    return _RULE[key]


def _rounded_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as the precision's input dtype gives it (the "as given" view of a payload)."""
    return x.to(dtype)


def references(
    d: Dist,
    coll: Collective,
    layout: Layout,
    source: Source,
    givens: Sequence[torch.dtype] = (),
    with_abs: bool = False,
    with_exact: bool = True,
) -> References:
    """The expected outputs of one group (see :class:`References`), on ``d.device``.

    Up to LOCAL_REFERENCE_MAX_RANKS the expectation is computed locally from every rank's regenerated
    input (independent of the backend under test): each peer's input is made block by block, each block added
    into (or copied into its slot of) the expectations and dropped, so a rank never holds even one whole input.
    Beyond that, regenerating every peer's input costs O(world x size) per rank, so the reference is the same
    collective run in float64 on the backend.

    A sum of more than 4 addends may round differently in float64 than ``torch.stack(inputs).sum(0)`` (which
    pairs rows): a few units in the 16th digit of the error, never the ``wrong`` count (exact inputs sum
    exactly in any order)."""
    n = d.world_size
    m = layout.input_numel
    views: dict[str, View] = {"exact": lambda x: x} if with_exact else {}
    if with_abs:
        views["abs"] = torch.abs
    for dt in givens:
        views[str(dt)] = functools.partial(_rounded_to, dtype=dt)

    if n > LOCAL_REFERENCE_MAX_RANKS:
        mine = whole(source, d.rank, m, d.device)

        def fp64_collective(x: torch.Tensor) -> torch.Tensor:
            x = x.to(torch.float64)
            out = (
                x.clone()
                if not coll.out_of_place()
                else torch.empty(layout.output_numel, dtype=torch.float64, device=d.device)
            )
            coll.run(x, out, getattr(d, "pg", None))  # an in-place collective sums into the clone
            return out

        got = {k: fp64_collective(view(mine)) for k, view in views.items()}
        del mine
    else:
        acc = _accumulate(coll, layout, d.rank, n, source, views, d.device) if _rule_holds(coll, n, d.rank) else None
        if acc is None:  # a collective shape the accumulation does not know: the world's copies, stacked
            inputs = [whole(source, r, m, d.device) for r in range(n)]
            acc = {k: coll.reference([view(x).to(torch.float64) for x in inputs], d.rank) for k, view in views.items()}
            del inputs
        got = acc
    return References(
        exact=got.pop("exact", None),
        abs=got.pop("abs", None),
        given={dt: got.pop(str(dt)) for dt in givens},
    )


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


AfterComm = Callable[[PointOp], None]
"""A test hook run between ``comm`` and ``decode`` of the correctness pass (faults go into ``op.received()``)."""

_PARTIALS = ("sq_diff", "sq_ref", "max_abs", "wrong", "tol", "sq_comm_diff", "sq_given")
_COMBINE: dict[str, Callable[[Iterable[float]], float]] = {
    "sq_diff": sum, "sq_ref": sum, "max_abs": max, "wrong": sum, "tol": max, "sq_comm_diff": sum, "sq_given": sum,
}  # fmt: skip
"""How the ranks' partial statistics combine: squares add up, so the relative errors are over the whole result
(not a mean of the ranks'); a largest error and a tolerance are maxima."""


_SLICE = 1 << 20
"""Elements of a result compared with its expectation at once (8 MiB of float64 temporaries).

Sums of squares are taken per slice and the slices' sums added in Python: another summation order than one
``sum()`` over the whole result, so ``rel_err`` and ``comm_rel_err`` may differ from a whole-tensor sum in their
last bits (relative 1e-15 or so); ``wrong``, ``tolerance`` and ``max_abs_err`` are the same to the bit."""


def _slices(numel: int) -> Iterator[slice]:
    for lo in range(0, numel, _SLICE):
        yield slice(lo, min(lo + _SLICE, numel))


def _sum_sq(t: torch.Tensor) -> float:
    """Sum of squares of a float64 tensor, slice by slice (no full-size temporary)."""
    return sum(float(t[s].square().sum()) for s in _slices(t.numel()))


def _count_wrong(
    prec: Precision, coll: Collective, n: int, got: torch.Tensor, exact: torch.Tensor, abs_sum: torch.Tensor
) -> tuple[int, float]:
    """(wrong elements, tolerance) of a result against the check's expectation, slice by slice.

    A precision's tolerance is a function of each element's ``|x|`` sum and of the largest of them (every
    bound here is: the floors of :func:`commbench.measure.fp8.error_bound` scale with it): each slice's bound is computed
    with the tensor's largest ``|x|`` sum appended, so it is the bound of the whole tensor, element for element,
    and the largest bound of any slice is the whole tensor's. NaN compares false: counted wrong."""
    top = abs_sum.max().reshape(1)
    wrong, tol = 0, -math.inf
    for s in _slices(got.numel()):
        bound = prec.check_tolerance(coll, torch.cat([abs_sum[s], top]), n)
        if isinstance(bound, torch.Tensor) and bound.dim() > 0:
            tol = max(tol, float(bound.max()))
            bound = bound[:-1]
        else:
            tol = float(bound)
        diff = got[s].to(torch.float64).sub_(exact[s]).abs_()
        wrong += int((~(diff <= bound)).sum())
    return wrong, tol


def _errors(got: torch.Tensor, exact: torch.Tensor, given: torch.Tensor) -> tuple[float, float, float]:
    """(sum of squared errors against ``exact``, largest such error, sum of squared errors against ``given``) of a
    result, slice by slice; all three infinite when the result holds inf or NaN (a widening cast keeps them)."""
    sq_diff = sq_comm = 0.0
    max_abs = 0.0
    for s in _slices(got.numel()):
        r = got[s].to(torch.float64)
        if not bool(torch.isfinite(r).all()):
            return math.inf, math.inf, math.inf
        c = r - given[s]
        sq_comm += float(c.square_().sum())
        del c
        r.sub_(exact[s]).abs_()  # |d| * |d| == d * d: the same squares
        max_abs = max(max_abs, float(r.max()))
        sq_diff += float(r.square_().sum())
    return sq_diff, max_abs, sq_comm


def check_group(
    d: Dist,
    suite: SuiteConfig,
    coll: Collective,
    layout: Layout,
    points: Sequence[tuple[Precision, PointOp]],
    fp32_bytes: int,
    after_comm: AfterComm | None = None,
) -> list[Check]:
    """The correctness pass (when ``suite.check``) and the error pass of every point of one group.

    The points of a group share their inputs, so each reference is made once for all of them: the check's and
    the exact payload's once per group, the "as given" one once per distinct input dtype (an error pass per
    dtype, each regenerating the payloads, so only one such reference is alive at a time). Every op is loaded
    from one tensor per input dtype (:func:`load_inputs`), and the passes run one after the other: the check's
    data are dropped before the payload's are made; results are compared slice by slice (``_SLICE``). The
    ranks exchange their partial statistics once. The ops are left holding the error pass's results: the caller
    loads them again for the timing. ``after_comm`` (tests only) edits the received wire of the correctness
    pass before it is decoded."""

    def run(op: PointOp, hook: AfterComm | None = None) -> None:
        op.encode()
        op.comm()
        if hook is not None:
            d.sync()
            hook(op)
        op.decode()
        d.sync()

    n, m = d.world_size, layout.input_numel
    wrong = [0] * len(points)
    tol = [0.0] * len(points)
    if suite.check:
        source = exact_source(layout, d.device)
        load_inputs(points, source, d.rank, m, d.device)
        refs = references(d, coll, layout, source, with_abs=True)
        assert refs.abs is not None and refs.exact is not None  # asked for
        for i, (prec, op) in enumerate(points):
            run(op, after_comm)
            wrong[i], tol[i] = _count_wrong(prec, coll, n, op.result(), refs.exact, refs.abs)
        del refs
    # One error pass per input dtype of the group (most groups have one or two): the exact payload's expectation
    # is made with the first and kept, each "as given" one only while its points run.
    partial: list[list[float]] = [[] for _ in points]
    exact: torch.Tensor | None = None
    sq_ref = 0.0
    source = payload_source(suite, layout, fp32_bytes)
    for dt in dict.fromkeys(prec.input_dtype for prec, _ in points):
        mine = [i for i, (prec, _) in enumerate(points) if prec.input_dtype == dt]
        load_inputs([points[i] for i in mine], source, d.rank, m, d.device)
        refs = references(d, coll, layout, source, [dt], with_exact=exact is None)
        if exact is None:
            assert refs.exact is not None  # asked for
            exact = refs.exact
            sq_ref = _sum_sq(exact)
        given = refs.given.pop(dt)
        del refs
        sq_given = _sum_sq(given)
        for i in mine:
            op = points[i][1]
            run(op)
            sq_diff, max_abs, sq_comm_diff = _errors(op.result(), exact, given)
            values = {
                "sq_diff": sq_diff,
                "sq_ref": sq_ref,
                "max_abs": max_abs,
                "wrong": float(wrong[i]),
                "tol": tol[i],
                "sq_comm_diff": sq_comm_diff,
                "sq_given": sq_given,
            }
            partial[i] = [values[k] for k in _PARTIALS]
        del given
    del exact
    stats = d.gather_floats([v for p in partial for v in p])
    k = len(_PARTIALS)
    out = []
    for i in range(len(points)):
        total = {name: _COMBINE[name](s[i * k + j] for s in stats) for j, name in enumerate(_PARTIALS)}
        out.append(
            Check(
                wrong=int(total["wrong"]),
                tolerance=total["tol"],
                rel_err=_rel(total["sq_diff"], total["sq_ref"]),
                comm_rel_err=_rel(total["sq_comm_diff"], total["sq_given"]),
                max_abs_err=total["max_abs"],
            )
        )
    return out


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
    """:func:`check_group` of a group of one point (the fault and error tests check one op at a time)."""
    return check_group(d, suite, coll, layout, [(prec, op)], fp32_bytes, after_comm)[0]


# ----------------------------------------------------------------------------------------------------------
# Memory of the references (``commbench.measure.footprint`` adds the ops' and refuses a suite that cannot fit).


def check_bytes(coll: Collective, layout: Layout, n: int, dtypes: int, check: bool) -> int:
    """Bytes the correctness and error passes of one group hold at their peak on the rank's device (float64):
    the largest of the passes, which run one after the other (:func:`check_group`).

    Correctness pass: the expected output and that of ``|inputs|``, and either a block of a peer's input with
    its views, or a slice of a result with its bound (three block-sized temporaries). Error passes (one per
    input dtype; ``dtypes`` is how many, which changes the time, not the peak): the exact payload's expected
    output and one "as given", with the same temporaries. Before either, the ops are loaded from one tensor per
    input dtype (at most 8 bytes per element in all) and a block. Inputs are made in blocks (``_BLOCK``),
    results compared in slices (``_SLICE``): no pass holds a whole input or a float64 copy of a result."""
    i, o = layout.input_numel, layout.output_numel
    temps = 3 * min(max(i, o), max(_BLOCK, _SLICE))
    load = i + min(i, _BLOCK)
    correctness = max(2 * o + temps, load) if check else 0
    error = max(2 * o + temps, load) if dtypes else 0
    return 8 * max(error, correctness)
