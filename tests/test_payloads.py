"""The counter-based payloads (``commbench.measure.payloads``): the documented distributions (checked against the
normal law's own figures, not against earlier output), any range made by index without the elements before it,
independent ranks and points; and the byte counter the codec benchmarks use."""

from __future__ import annotations

import math

import pytest
import torch

from commbench.measure.opcount import ByteCounter, footprint
from commbench.measure.payloads import payload, payload_blocks, payload_piece, point_seed

N = 1 << 18


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def test_normal_payload_follows_the_normal_law() -> None:
    x = payload("normal", N, point_seed(1, 0, 4096))
    assert x.dtype == torch.float64 and x.numel() == N
    se = 1 / math.sqrt(N)
    assert abs(float(x.mean())) < 5 * se
    assert abs(float(x.std()) - 1) < 5 * se
    for z in (1.0, 2.0, 3.0):  # tail masses against 2 (1 - Phi(z))
        p = 2 * (1 - _phi(z))
        got = float((x.abs() > z).double().mean())
        assert abs(got - p) < 5 * math.sqrt(p * (1 - p) / N), (z, got, p)
    kurtosis = float((x**4).mean() / x.var() ** 2)
    assert abs(kurtosis - 3) < 0.1
    # adjacent elements (the two halves of a Box-Muller pair) and neighbours are uncorrelated
    for lag in (1, 2, 3):
        c = float((x[:-lag] * x[lag:]).mean())
        assert abs(c) < 5 * se, lag


def test_gradient_and_outlier_payloads() -> None:
    seed = point_seed(7, 1, 1 << 20)
    g = payload("gradient", N, seed)
    assert abs(float(g.std()) / 1e-7 - 1) < 5 / math.sqrt(N)
    assert torch.equal(g, payload("normal", N, seed) * 1e-7)  # the same draws, scaled
    o, x = payload("outliers", N, seed), payload("normal", N, seed)
    big = o != x
    frac = float(big.double().mean())
    assert abs(frac - 1e-3) < 5 * math.sqrt(1e-3 / N), frac
    assert torch.equal(o[big], x[big] * 1e4)  # one in a thousand scaled by 1e4, the rest the normal payload


@pytest.mark.parametrize("kind", ["normal", "gradient", "outliers"])
def test_any_range_by_index(kind: str) -> None:
    """A range starting or ending inside a Box-Muller pair, and far beyond any tensor made before: the
    whole tensor's values, made without the elements before it."""
    whole = payload(kind, 1001, 99)
    for lo, hi in ((0, 1001), (1, 1000), (3, 4), (500, 501), (999, 1001)):
        assert torch.equal(payload_piece(kind, 99, lo, hi), whole[lo:hi]), (lo, hi)
    parts = list(payload_blocks(kind, 1001, 99, 7, 1001, block=64))
    assert [s for s, _ in parts] == list(range(7, 1001, 64)) and all(p.numel() <= 64 for _, p in parts)
    assert torch.equal(torch.cat([p for _, p in parts]), whole[7:])
    far = 1 << 40  # a trillion elements in: made at once, nothing replayed
    assert payload_piece(kind, 99, far, far + 8).shape == (8,)


def test_ranks_and_points_are_independent() -> None:
    a = payload("normal", N, point_seed(3, 0, 4096))
    b = payload("normal", N, point_seed(3, 1, 4096))
    c = payload("normal", N, point_seed(3, 0, 8192))
    for u, v in ((a, b), (a, c), (b, c)):
        assert abs(float((u * v).mean())) < 5 / math.sqrt(N)
    with pytest.raises(ValueError, match="unknown payload 'uniform'; valid choices: normal, gradient, outliers"):
        payload("uniform", 4, 1)


def test_byte_counter_counts_what_each_op_reads_and_writes() -> None:
    n = 1000
    x, y = torch.randn(n), torch.empty(n)
    s = torch.ones(10)
    with ByteCounter() as c:
        y.copy_(x)  # reads x, writes y: the destination is not read
    assert (c.read, c.written) == (4 * n, 4 * n)
    with ByteCounter() as c:
        torch.add(x, x, out=y)  # two reads of x, one write; out= is written, not read
    assert (c.read, c.written) == (8 * n, 4 * n)
    with ByteCounter() as c:
        y.view(10, 100).mul_(s.unsqueeze(1))  # in place: reads y and 10 scales, writes y
    assert (c.read, c.written) == (4 * n + 40, 4 * n)
    assert footprint(s.unsqueeze(1).expand(10, 100)) == 40  # an expanded view covers its 10 floats once
