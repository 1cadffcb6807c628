"""Correctness and numerical error of one point: payloads, exactly representable check inputs, the float64
reference, the ``wrong`` count (nccl-tests ``-c``) and the error of the decoded result.

Each rank regenerates its peers' inputs from their seeds, so the reference needs no communication and does not
trust the backend under test (up to ``LOCAL_REFERENCE_MAX_RANKS``).

Memory: no full-size copy of an input is made to build a reference. Every rank's input is made in
blocks (:mod:`commbench.measure.payloads`: :func:`payload_blocks`, :func:`exact_blocks`, the same values as
:func:`payload` and :func:`exact_inputs`), each block added into the float64 expectation and dropped; the ops load this rank's input
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
from commbench.measure.payloads import BLOCK, Source, exact_source, load_inputs, payload_source, whole
from commbench.measure.precision import PointOp, Precision

LOCAL_REFERENCE_MAX_RANKS = int(os.environ.get("COMMBENCH_LOCAL_REFERENCE_MAX_RANKS", "16"))
"""Worlds up to this size check against a locally computed float64 reference (see :func:`references`); the
environment variable exists so the test suite can exercise the large-world path on two ranks."""


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


ABS = "abs"
"""The view whose expectation is the tolerance's ``sum |x|``: summed over the contributing ranks whatever the op."""


def _accumulate(
    coll: Collective,
    layout: Layout,
    rank: int,
    n: int,
    source: Source,
    views: dict[str, View],
    device: torch.device,
) -> dict[str, torch.Tensor] | None:
    """Every expectation of ``views`` by the collective's :meth:`~Collective.sources`: each peer's piece is made
    block by block, each view of a block copied into its slot of the float64 output (or combined there by the
    reduction op, rank by rank) and dropped. None when the collective does not say where its pieces go."""
    pieces = coll.sources(rank, n, layout)
    if pieces is None:
        return None
    numel = coll.expected_numel(rank, n, layout)
    got = {k: torch.empty(numel, dtype=torch.float64, device=device) for k in views}
    for i, p in enumerate(pieces):
        for s, src in source(p.peer, p.in_offset, p.in_offset + p.length):
            src = src.to(device)
            lo = p.out_offset + s - p.in_offset
            dst = slice(lo, lo + src.numel())
            for k, view in views.items():
                part = view(src)
                if not coll.reduces or i == 0:
                    got[k][dst].copy_(part)  # a narrower dtype is upcast exactly
                elif k == ABS:
                    got[k][dst].add_(part)
                else:
                    coll.combine(got[k][dst], part.to(torch.float64))  # ... then reduced in float64, rank by rank
                del part
            del src
    if coll.reduces:
        for k, t in got.items():
            if k != ABS:
                coll.finish(t, len(pieces))
    return got


_RULE: dict[tuple[str, int, str, int, int], bool] = {}


def _rule_holds(coll: Collective, n: int, rank: int) -> bool:
    """Whether :func:`_accumulate` gives :meth:`Collective.reference` for ``coll`` (at a small layout of the
    same world, on integer-valued inputs, so any order of summation or product is exact); once per collective,
    root, op and world. A collective whose :meth:`~Collective.sources` disagree with its reference is found here
    and keeps the world's stacked copies."""
    key = (coll.name, coll.root, coll.redop, n, rank)
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
        views[ABS] = torch.abs
    for dt in givens:
        views[str(dt)] = functools.partial(_rounded_to, dtype=dt)

    if n > LOCAL_REFERENCE_MAX_RANKS:
        mine = whole(source, d.rank, m, d.device)

        def fp64_collective(x: torch.Tensor, c: Collective) -> torch.Tensor:
            x = x.to(torch.float64)
            out = (
                x.clone()
                if not c.out_of_place()
                else torch.empty(layout.output_numel, dtype=torch.float64, device=d.device)
            )
            c.run(x, out, getattr(d, "pg", None))  # an in-place collective sums into the clone
            return out[: coll.expected_numel(d.rank, n, layout)]

        summed = coll.configured(root=coll.root, op="sum") if coll.reduces else coll  # sum |x|, whatever the op
        got = {k: fp64_collective(view(mine), summed if k == ABS else coll) for k, view in views.items()}
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
        abs=got.pop(ABS, None),
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
    and the largest bound of any slice is the whole tensor's; the reduction op's own rounding
    (:meth:`~Collective.op_tolerance`, ``avg``) is added. NaN compares false: counted wrong. An empty result (a
    rank whose output the collective leaves undefined) has nothing wrong."""
    if got.numel() == 0:
        return 0, 0.0
    top = abs_sum.max().reshape(1)
    wrong, tol = 0, -math.inf
    for s in _slices(got.numel()):
        sums = torch.cat([abs_sum[s], top])
        bound = prec.check_tolerance(coll, sums, n) + coll.op_tolerance(sums, prec)
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
    defined = coll.expected_numel(d.rank, n, layout)  # reduce, gather off the root: nothing to compare

    def result(op: PointOp) -> torch.Tensor:
        return op.result()[:defined]

    wrong = [0] * len(points)
    tol = [0.0] * len(points)
    if suite.check:
        source = exact_source(layout, d.device)
        load_inputs(points, source, d.rank, m, d.device)
        refs = references(d, coll, layout, source, with_abs=True)
        assert refs.abs is not None and refs.exact is not None  # asked for
        for i, (prec, op) in enumerate(points):
            run(op, after_comm)
            wrong[i], tol[i] = _count_wrong(prec, coll, n, result(op), refs.exact, refs.abs)
        del refs
    # One error pass per input dtype of the group (most groups have one or two): the exact payload's expectation
    # is made with the first and kept, each "as given" one only while its points run.
    partial: list[list[float]] = [[] for _ in points]
    exact: torch.Tensor | None = None
    sq_ref = 0.0
    source = payload_source(suite, layout, fp32_bytes, d.device)
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
            sq_diff, max_abs, sq_comm_diff = _errors(result(op), exact, given)
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
    input dtype (at most 8 bytes per element in all) and a block. Inputs are made in blocks (``BLOCK``),
    results compared in slices (``_SLICE``): no pass holds a whole input or a float64 copy of a result."""
    i, o = layout.input_numel, layout.output_numel
    temps = 3 * min(max(i, o), max(BLOCK, _SLICE))
    load = i + min(i, BLOCK)
    correctness = max(2 * o + temps, load) if check else 0
    error = max(2 * o + temps, load) if dtypes else 0
    return 8 * max(error, correctness)
