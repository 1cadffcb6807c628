"""Every rank's inputs of a point, made anywhere by index: the payloads (:func:`payload`, in blocks
:func:`payload_blocks`), the exactly representable check inputs (:func:`exact_inputs`, :func:`exact_blocks`), a
point's seeds and the :data:`Source` that hands any rank's elements ``[lo, hi)`` to the references of
:mod:`commbench.measure.check`, and the loading of this rank's ops (:func:`load_inputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from commbench.core.suite import PAYLOADS, SuiteConfig
from commbench.measure.collectives import Layout
from commbench.measure.precision import PointOp, Precision


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


BLOCK = 1 << 20
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
    are made and dropped (the cost of a whole payload, not its memory). ``block`` defaults to ``BLOCK``."""
    hi = numel if hi is None else hi
    block = BLOCK if block is None else block
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
    ``lo`` is made); ``block`` defaults to ``BLOCK``."""
    hi = numel if hi is None else hi
    block = BLOCK if block is None else block
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
