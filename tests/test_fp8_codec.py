"""FP8 codecs (commbench.measure.fp8) against torch's own casts, special values, the error-bound formula, precision
naming, and native-NCCL detection. Every check runs on both codec paths: the fused C kernel (when it builds)
and pure torch."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from commbench.measure import fp8
from commbench.measure.collectives import get_collective
from commbench.measure.fp8_ops import native_fp8_available
from commbench.measure.precision import get_precision

FMAX = {"e4m3": 448.0, "e5m2": 57344.0}
DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
SUB = {"e4m3": 2.0**-9, "e5m2": 2.0**-16}
PATHS = ["kernel", "torch"]


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "kernel":
        fp8.use_kernel(True)
        if not fp8.kernel_status() == "c":
            pytest.skip(f"fp8 C kernel unavailable: {fp8.kernel_status()}")
    else:
        fp8.use_kernel(False)
    yield request.param
    fp8.use_kernel(True)


def ref_scale(amax: float, fmt: str) -> float:
    """Smallest power of two s (exponent >= -126) with amax / s <= max; 1 for amax 0 (float64 math)."""
    if amax == 0:
        return 1.0
    return 2.0 ** max(math.ceil(math.log2(amax / FMAX[fmt])), -126)


def ref_quantize(x: torch.Tensor, fmt: str, scaling: str, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent reference: per-tensor/block scale from finite values, then torch's cast; inf -> NaN (e4m3)."""
    b = {"tensor": max(x.numel(), 1), "none": max(x.numel(), 1), "block": block}[scaling]
    q = torch.empty(x.numel(), dtype=torch.uint8)
    scales = []
    for s in range(0, x.numel(), b):
        seg = x[s : s + b]
        fin = seg[torch.isfinite(seg)]
        amax = float(fin.abs().max()) if fin.numel() else 0.0
        scale = 1.0 if scaling == "none" else ref_scale(amax, fmt)
        scales.append(scale)
        y = (seg.double() / scale).float().clamp(-FMAX[fmt], FMAX[fmt])
        y = torch.where(torch.isinf(seg), seg, y)  # clamp would make inf finite
        codes = y.to(DTYPE[fmt]).view(torch.uint8).clone()
        if fmt == "e4m3":  # torch saturates inf to 448 for e4m3fn; the codec must not (NaN keeps the sign)
            inf = torch.isinf(seg)
            codes[inf] = (0x7F | (torch.signbit(seg[inf]).to(torch.uint8) << 7)).to(torch.uint8)
        q[s : s + b] = codes
    return q, torch.tensor(scales or [1.0], dtype=torch.float32)


def nan_blind(q: torch.Tensor, x: torch.Tensor, path: str) -> torch.Tensor:
    """Codes with the sign bit of NaN *inputs* cleared on the torch path: the C kernel keeps a NaN's sign, the
    vectorised torch path does not promise it (e4m3 encodes every NaN input as 0x7F, and CUDA arithmetic
    returns a canonical NaN anyway). Every other code, +-inf included, must match exactly."""
    if path != "torch":
        return q
    return torch.where(torch.isnan(x), q & 0x7F, q)


def same_floats(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal except that any NaN matches any NaN (payloads differ between paths)."""
    if not torch.equal(torch.isnan(a), torch.isnan(b)):
        return False
    z = torch.zeros((), dtype=a.dtype)
    return torch.equal(
        torch.where(torch.isnan(a), z, a).view(torch.int32), torch.where(torch.isnan(b), z, b).view(torch.int32)
    )


def samples() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = 20_011  # not a multiple of any block size used
    specials = torch.tensor(
        [0.0, -0.0, 2.0**-149, -(2.0**-140), 1e-30, 448.0, -448.0, 57344.0, 3.0e38, -3.0e38, 1.0, -1.0, 0.5, 7.0],
        dtype=torch.float32,
    )
    return {
        "normal": torch.randn(n, generator=g),
        "wide": torch.randn(n, generator=g) * torch.exp2(torch.randint(-40, 40, (n,), generator=g).float()),
        "bits": torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int32).view(torch.float32),
        "specials": torch.cat([specials, torch.randn(200, generator=g)]),
        "nonfinite": torch.cat(
            [torch.tensor([math.inf, -math.inf, math.nan, -math.nan]), torch.randn(300, generator=g)]
        ),
        "zeros": torch.zeros(1000),
    }


CASES = [("tensor", 128), ("block", 128), ("block", 7), ("none", 128)]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize(("scaling", "block"), CASES)
def test_quantize_bit_exact_against_torch_cast(path: str, fmt: str, scaling: str, block: int) -> None:
    for name, x in samples().items():
        q, scales = fp8.quantize(x, fmt, scaling, block)
        rq, rs = ref_quantize(x, fmt, scaling, block)
        assert torch.equal(scales, rs), (name, path)
        bad = (nan_blind(q, x, path) != nan_blind(rq, x, path)).nonzero().flatten()[:5]
        assert bad.numel() == 0, (name, path, x[bad].tolist(), q[bad].tolist(), rq[bad].tolist())


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize(("scaling", "block"), CASES)
def test_dequantize_matches_torch_cast_times_scale(path: str, fmt: str, scaling: str, block: int) -> None:
    for name, x in samples().items():
        q, scales = fp8.quantize(x, fmt, scaling, block)
        y = fp8.dequantize(q, scales, fmt, scaling, block)
        rep = scales.repeat_interleave(block)[: x.numel()] if scaling == "block" else scales.expand(x.numel())
        want = q.view(DTYPE[fmt]).to(torch.float32) * rep
        assert same_floats(y, want), (name, path)
        # accumulate adds into the output
        acc = torch.full_like(y, 0.25)
        fp8.dequantize(q, scales, fmt, scaling, block, out=acc, accumulate=True)
        assert same_floats(acc, want + 0.25), (name, path)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_code_decodes_like_torch(path: str, fmt: str) -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    for scale in (1.0, 2.0**-20, 2.0**40):
        y = fp8.dequantize(codes, torch.tensor([scale]), fmt, "tensor")
        assert same_floats(y, codes.view(DTYPE[fmt]).to(torch.float32) * scale)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_ties_and_neighbours_of_every_code_round_like_torch(path: str, fmt: str) -> None:
    # Midpoints between consecutive fp8 values (round-half-even ties) and one float32 ulp either side.
    vals = torch.arange(256, dtype=torch.uint8).view(DTYPE[fmt]).to(torch.float64)
    vals = vals[torch.isfinite(vals) & (vals >= 0)].unique()
    mids = ((vals[1:] + vals[:-1]) / 2).float()
    x = torch.cat(
        [mids, torch.nextafter(mids, torch.tensor(math.inf)), torch.nextafter(mids, torch.tensor(0.0)), vals.float()]
    )
    x = torch.cat([x, -x])
    q, _ = fp8.quantize(x, fmt, "none")
    assert torch.equal(q, x.clamp(-FMAX[fmt], FMAX[fmt]).to(DTYPE[fmt]).view(torch.uint8))


def test_special_values(path: str) -> None:
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, 0.5, -0.25])
    for fmt in ("e4m3", "e5m2"):
        for scaling in ("tensor", "block", "none"):
            y = fp8.dequantize(*fp8.quantize(x, fmt, scaling, 4), fmt, scaling, 4)
            assert y[0] == 0 and not torch.signbit(y[0]) and y[1] == 0 and torch.signbit(y[1])
            assert not torch.isfinite(y[2:5]).any(), (fmt, scaling, y)  # never silently finite
            assert torch.isnan(y[4])
            if fmt == "e5m2":
                assert y[2] == math.inf and y[3] == -math.inf
            # the non-finite values did not spoil the scale of the finite ones
            assert y[5:].tolist() == [1.0, 0.5, -0.25]
    # 'none' saturates finite overflow (a plain cast would give inf for e5m2)
    y = fp8.dequantize(*fp8.quantize(torch.tensor([1e6, -1e6]), "e5m2", "none"), "e5m2", "none")
    assert y.tolist() == [57344.0, -57344.0]


def test_all_zero_and_empty_tensors(path: str) -> None:
    for fmt in ("e4m3", "e5m2"):
        for scaling in ("tensor", "block", "none"):
            q, s = fp8.quantize(torch.zeros(300), fmt, scaling)
            assert torch.equal(s, torch.ones_like(s)) and int(q.sum()) == 0
            assert torch.equal(fp8.dequantize(q, s, fmt, scaling), torch.zeros(300))
            q, s = fp8.quantize(torch.zeros(0), fmt, scaling)
            assert q.numel() == 0 and s.numel() == (0 if scaling == "block" else 1)
            assert fp8.dequantize(q, s, fmt, scaling).numel() == 0


def test_scales_are_tight_powers_of_two(path: str) -> None:
    g = torch.Generator().manual_seed(1)
    for fmt in ("e4m3", "e5m2"):
        for mag in (1e-30, 1e-7, 1.0, 448.0, 449.0, 1e20):
            x = torch.randn(1000, generator=g) * mag
            _, s = fp8.quantize(x, fmt, "tensor")
            amax = float(x.abs().max())
            k = math.log2(float(s))
            assert k == int(k)
            assert amax / float(s) <= FMAX[fmt] < 2 * amax / float(s)


def test_out_buffers_are_used_and_thread_count_does_not_change_bits(path: str) -> None:
    x = torch.randn(100_003)
    q = torch.empty(200_000, dtype=torch.uint8)[5 : 5 + x.numel()]  # a slice of a wire buffer
    s = torch.empty(fp8.num_scales(x.numel(), "block", 64))
    got_q, got_s = fp8.quantize(x, "e4m3", "block", 64, out=(q, s))
    assert got_q.data_ptr() == q.data_ptr() and got_s.data_ptr() == s.data_ptr()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        q1, s1 = fp8.quantize(x, "e4m3", "block", 64)
        y1 = fp8.dequantize(q1, s1, "e4m3", "block", 64)
        torch.set_num_threads(2)
        q2, s2 = fp8.quantize(x, "e4m3", "block", 64)
        y2 = fp8.dequantize(q2, s2, "e4m3", "block", 64)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(q1, q2) and torch.equal(q1, q) and torch.equal(y1, y2)


def test_bad_arguments_raise_value_error() -> None:
    x = torch.randn(10)
    with pytest.raises(ValueError, match="e4m3, e5m2"):
        fp8.quantize(x, "e3m4", "tensor")
    with pytest.raises(ValueError, match="tensor, block, none"):
        fp8.quantize(x, "e4m3", "row")
    with pytest.raises(ValueError, match="positive"):
        fp8.quantize(x, "e4m3", "block", 0)
    with pytest.raises(ValueError, match="float32"):
        fp8.quantize(x.double(), "e4m3", "tensor")
    with pytest.raises(ValueError, match="scales"):
        fp8.dequantize(torch.zeros(10, dtype=torch.uint8), torch.ones(2), "e4m3", "tensor")
    with pytest.raises(ValueError, match="out"):
        fp8.quantize(x, "e4m3", "tensor", out=(torch.empty(9, dtype=torch.uint8), torch.empty(1)))


def test_error_bound_formula() -> None:
    abs_sum = torch.tensor([1.0, 2.0], dtype=torch.float64)
    # one quantisation, one contribution: rel*|x| + floor(scale <= 2*amax/max) + fp32 slack
    b = fp8.error_bound("e4m3", "tensor", abs_sum, 1)
    want = 2.0**-3 * abs_sum + 2.0**-9 * 2 * 2.0 / 448 + 2.0**-23 * abs_sum
    assert torch.allclose(b, want, rtol=1e-12, atol=0)
    b = fp8.error_bound("e5m2", "none", abs_sum, 3)
    assert torch.allclose(b, 2.0**-2 * abs_sum + 3 * 2.0**-16 + 3 * 2.0**-23 * abs_sum, rtol=1e-12, atol=0)
    # all_reduce quantises twice: strictly larger, and at least the second relative step
    b1 = fp8.error_bound("e4m3", "block", abs_sum, 2, 1)
    b2 = fp8.error_bound("e4m3", "block", abs_sum, 2, 2)
    assert bool((b2 >= b1 + 2.0**-3 * abs_sum).all())
    prec = get_precision("fp8_e4m3")
    ar, ag = get_collective("all_reduce"), get_collective("all_gather")
    assert torch.allclose(
        torch.as_tensor(prec.error_bound(ar, abs_sum, 2)),
        fp8.error_bound("e4m3", "tensor", abs_sum, 2, 2),
    )
    assert torch.allclose(
        torch.as_tensor(prec.error_bound(ag, abs_sum, 2)), fp8.error_bound("e4m3", "tensor", abs_sum, 1, 1)
    )


def test_precision_names_and_options() -> None:
    for name, canon, scaling, block in [
        ("fp8_e4m3", "fp8_e4m3", "tensor", 128),
        ("fp8_e4m3:tensor", "fp8_e4m3", "tensor", 128),
        ("fp8_e4m3:block", "fp8_e4m3:block128", "block", 128),
        ("fp8_e5m2:block64", "fp8_e5m2:block64", "block", 64),
        ("fp8_e5m2:none", "fp8_e5m2:none", "none", 128),
    ]:
        p = get_precision(name)
        codec = p.codec  # type: ignore[attr-defined]
        assert (p.name, codec.scaling.name, codec.block, p.impl, p.nccl_type) == (
            canon,
            scaling,
            block,
            "fp8_bytes",
            "uint8",
        )
        assert p.input_dtype == torch.float32
    for bad in ("fp8_e4m3:block0", "fp8_e4m3:blockx", "fp8_e4m3:row", "fp8_e5m2:block-4"):
        with pytest.raises(ValueError, match="valid options"):
            get_precision(bad)


def test_native_fp8_detected_false_on_cpu_and_gloo() -> None:
    assert native_fp8_available("gloo") is False
    assert native_fp8_available("nccl") is (torch.cuda.is_available() and native_fp8_available("nccl"))
    if not torch.cuda.is_available():
        assert native_fp8_available("nccl") is False
    p = get_precision("fp8_e4m3_native")
    assert p.impl == "fp8_native" and p.nccl_type == "f8e4m3"
    for cname in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        assert p.supports(get_collective(cname), "gloo") is False
        assert get_precision("fp8_e5m2:block32").supports(get_collective(cname), "gloo") is True
