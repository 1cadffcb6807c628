"""Every rank's inputs of a point, made anywhere by index: the payloads (:func:`payload`, in blocks
:func:`payload_blocks`), the exactly representable check inputs (:func:`exact_inputs`, :func:`exact_blocks`), a
point's seeds and the :data:`Source` that hands any rank's elements ``[lo, hi)`` to the references of
:mod:`commbench.measure.check`, and the loading of this rank's ops (:func:`load_inputs`).

Both kinds of input are functions of (seed, element index) written in torch ops, so each is made on the device
that uses it, block by block, and any block of any rank can be made without the ones before it: a rank's own
payload once per load, a peer's block where a reference needs it, never a stream replayed on the CPU. The
payloads' generator is counter-based (an integer hash of the point's seed and the index, then Box-Muller in
float64); on a GPU its cost is a few passes over memory per element, on a CPU comparable to torch's own
generator (``benchmarks/bench_payloads.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from commbench.core.suite import PAYLOADS, SuiteConfig
from commbench.measure.collectives import Layout
from commbench.measure.precision import PointOp, Precision


def payload(kind: str, numel: int, seed: int, device: torch.device | None = None) -> torch.Tensor:
    """Float64 payload of one rank, made on ``device`` (CPU by default): ``normal`` N(0,1); ``gradient``
    N(0, 1e-7^2), the magnitude of small late-training gradients: below fp16's smallest normal (6.1e-5) and around
    its smallest subnormal (6.0e-8), so they underflow without loss scaling, while bf16 keeps fp32's exponent range;
    ``outliers`` N(0,1) with one element in a thousand scaled by 1e4 (per-tensor scaling collapses the rest).

    The definition of the values (:func:`payload_piece`: any range, by element index)."""
    return payload_piece(kind, seed, 0, numel, device)


BLOCK = 1 << 20
"""Elements per block of an input made in blocks (8 MiB of float64): small next to a 64 MiB tensor, large enough
that the per-call cost is nothing."""

# ----------------------------------------------------------------------------------------------------------
# A counter-based generator in torch ops: element i of a payload is a function of (seed, i) alone, so any block
# of any rank is made where it is needed, on that device, without replaying a stream; and the values are the same
# on every device type and model up to the last bit of a float64 log/cos (integer hashing is exact everywhere;
# torch's own generators are not: CUDA's Philox output depends on the launch grid, hence on the GPU's SM count).

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply, the "lowbias32" shape of C. Wellons' hash-prospector), in place
    on int64 holding values < 2**32: multipliers below 2**31, so no product overflows int64 and every op is exact."""
    x.bitwise_xor_(x >> 16)
    x.mul_(0x7FEB352D).bitwise_and_(_M32)
    x.bitwise_xor_(x >> 15)
    x.mul_(0x5BD1E995).bitwise_and_(_M32)
    return x.bitwise_xor_(x >> 16)


def _hash(i: torch.Tensor, key: int, stream: int) -> torch.Tensor:
    """32 random bits (a new int64 tensor) for counters ``i`` (int64 >= 0) of a 63-bit ``key``, one of several
    streams."""
    k0, k1 = key & _M32, (key >> 32) & _M32
    a = _mix32((i & _M32).bitwise_xor_(k0 ^ ((stream * 0x9E3779B9) & _M32)))
    return _mix32(a.bitwise_xor_(i >> 32).bitwise_xor_(k1))


_TWO_PI = 6.283185307179586


def _normals(
    seed: int, lo: int, hi: int, device: torch.device | None, outliers: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """N(0,1) float64 for elements ``[lo, hi)``: Box-Muller on pair ``p = i // 2`` (element ``2p`` the cosine,
    ``2p + 1`` the sine), the radius from a 53-bit uniform in (0, 1) (so |z| reaches 8.6, not 6.7 as 32 bits
    would give), the angle from 32 bits; the pair's hash is rehashed for each next 32 bits. With ``outliers``, also
    each element's outlier mask (``u < 1e-3`` from two more rehashes, one per element of the pair)."""
    p0, p1 = lo // 2, (hi + 1) // 2
    h = _hash(torch.arange(p0, p1, dtype=torch.int64, device=device), seed, 0)
    u1 = (h << 21).to(torch.float64)
    h = _mix32(h.bitwise_xor_(0x2545F491))
    u1.add_((h >> 11).to(torch.float64)).add_(0.5).mul_(2.0**-53)
    h = _mix32(h.bitwise_xor_(0x68E31DA4))
    u2 = h.to(torch.float64).mul_(2.0**-32 * _TWO_PI)
    mask = None
    if outliers:
        mask = torch.empty(2 * (p1 - p0), dtype=torch.bool, device=device)
        threshold = int(1e-3 * 2**32)  # one in a thousand
        h = _mix32(h.bitwise_xor_(0x1B873593))
        torch.lt(h, threshold, out=mask[0::2])
        torch.lt(_mix32(h.bitwise_xor_(0x3C6EF372)), threshold, out=mask[1::2])
        mask = mask[lo - 2 * p0 : hi - 2 * p0]
    del h
    r = u1.log_().mul_(-2.0).sqrt_()
    z = torch.empty(2 * (p1 - p0), dtype=torch.float64, device=device)
    torch.mul(r, torch.cos(u2), out=z[0::2])
    torch.mul(r, u2.sin_(), out=z[1::2])
    return z[lo - 2 * p0 : hi - 2 * p0], mask


def payload_piece(kind: str, seed: int, lo: int, hi: int, device: torch.device | None = None) -> torch.Tensor:
    """Elements ``[lo, hi)`` of :func:`payload` (float64, made on ``device``), computed by index: nothing
    before ``lo`` is made."""
    if kind not in PAYLOADS:
        raise ValueError(f"unknown payload {kind!r}; valid choices: {', '.join(PAYLOADS)}")
    if hi <= lo:
        return torch.empty(0, dtype=torch.float64, device=device)
    x, mask = _normals(seed, lo, hi, device, outliers=kind == "outliers")
    if kind == "gradient":
        x.mul_(1e-7)
    elif mask is not None:
        x = torch.where(mask, x * 1e4, x)
    return x


def payload_blocks(
    kind: str,
    numel: int,
    seed: int,
    lo: int = 0,
    hi: int | None = None,
    block: int | None = None,
    device: torch.device | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Elements ``[lo, hi)`` of :func:`payload` (float64, made on ``device``) as (start, piece) in order, pieces
    of at most ``block`` elements (default ``BLOCK``), each computed by index: nothing before ``lo`` is made, and
    never the whole tensor at once."""
    hi = numel if hi is None else hi
    block = BLOCK if block is None else block
    if kind not in PAYLOADS:
        raise ValueError(f"unknown payload {kind!r}; valid choices: {', '.join(PAYLOADS)}")
    for s in range(lo, hi, block):
        yield s, payload_piece(kind, seed, s, min(s + block, hi), device)


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


def payload_source(suite: SuiteConfig, layout: Layout, fp32_bytes: int, device: torch.device | None = None) -> Source:
    """Every rank's payload of a point, in blocks made on ``device``: the error pass and the timing run on it."""
    n = layout.input_numel
    return lambda r, lo, hi: payload_blocks(
        suite.payload, n, point_seed(suite.seed, r, fp32_bytes), lo, hi, device=device
    )


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
