"""The codec on CUDA against the CPU: special-value inputs, bit-for-bit comparison of codes, scales and decoded values, and the copy-bandwidth fraction of encode + decode, timed with CUDA events."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from gpu_steps.constants import CODEC_BLOCK, CODEC_CASES
from gpu_steps.report import StepReport

if TYPE_CHECKING:
    import torch


@dataclass
class CodecResult:
    """Codes, scales and decoded values of one encode + decode, on the CPU."""

    codes: torch.Tensor
    scales: torch.Tensor
    decoded: torch.Tensor


def special_values(n: int, seed: int, block: int = CODEC_BLOCK) -> torch.Tensor:
    """float32 data that reaches every branch of the codec: magnitudes spread over 2**-140..2**120 (tiny scales
    clamp, float32 subnormals, fp8 subnormals after scaling), NaN, +-inf, +-0, the formats' max and their
    rounding seams, an all-zero, an all-NaN and an inf-only block, and a last block shorter than ``block``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-40, 40, (n,), generator=g).float())
    specials = torch.tensor(
        [math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-40, -3e-42, 1.4e-45, 1.2e-38, 3.4e38, -3.4e38,
         448.0, 464.0, 480.0, -448.0, 57344.0, 61440.0, 65536.0, 2.0**-9, 2.0**-10, 2.0**-16, 2.0**-17],
        dtype=torch.float32,
    )  # fmt: skip
    idx = torch.randint(0, n, (n // 50,), generator=g)
    x[idx] = specials[torch.randint(0, len(specials), (len(idx),), generator=g)]
    x[: len(specials)] = specials
    if n >= 5 * block:
        x[block : 2 * block] = 0.0
        x[2 * block : 3 * block] = math.nan
        x[3 * block : 4 * block] = 0.0
        x[3 * block + 7] = -math.inf
        x[4 * block : 5 * block] *= 2.0**-100  # a block of tiny values: its scale clamps at 2**-126
    return x.contiguous()


def codec_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    """Named CPU float32 inputs for the bit-exact comparison."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    return {
        "mixed": special_values(2**20 + 77, seed),
        "tiny": (torch.rand(4099, generator=g) * 2.0**-130).contiguous(),
        "huge": (torch.randn(4099, generator=g) * 2.0**120).contiguous(),
        # lengths past the fused codec's amax split with a tail, as the others: one compiled graph serves them all
        "zeros": torch.zeros(4101),
        "nan": torch.full((4103,), math.nan),
    }


def codec_roundtrip(x: torch.Tensor, fmt: str, scaling: str, block: int, device: torch.device) -> CodecResult:
    """Encode ``x`` (on ``device``) with :func:`commbench.measure.fp8.quantize`, decode it, bring all three to the CPU."""
    from commbench.measure import fp8

    xd = x.to(device)
    q, s = fp8.quantize(xd, fmt, scaling, block)
    d = fp8.dequantize(q, s, fmt, scaling, block)
    return CodecResult(q.cpu(), s.cpu(), d.cpu())


def codec_decode_all(fmt: str, scaling: str, block: int, device: torch.device, seed: int = 0) -> CodecResult:
    """Decode every code (each of the 256 many times over) with random power-of-two scales, accumulating into
    a random float32 tensor as the reduce-scatter does: the decode path on its own."""
    import torch

    from commbench.measure import fp8

    g = torch.Generator().manual_seed(seed + 2)
    n = 256 * 41 + 5
    codes = torch.arange(n, dtype=torch.int64).remainder(256).to(torch.uint8)
    ns = fp8.num_scales(n, scaling, block)
    scales = torch.exp2(torch.randint(-20, 20, (ns,), generator=g).float()) if scaling != "none" else torch.ones(ns)
    base = torch.randn(n, generator=g)
    plain = fp8.dequantize(codes.to(device), scales.to(device), fmt, scaling, block)
    acc = base.to(device).clone()
    fp8.dequantize(codes.to(device), scales.to(device), fmt, scaling, block, out=acc, accumulate=True)
    return CodecResult(codes, scales, torch.cat([plain.cpu(), acc.cpu()]))


def bits_of(t: torch.Tensor) -> torch.Tensor:
    import torch

    return t.contiguous().view(torch.int32)


def _nan_codes_in_both(a: CodecResult, b: CodecResult) -> torch.Tensor | None:
    """Where both results hold a NaN code (their decoded values are NaN), when codes and decoded values align."""
    import torch

    if not (a.codes.shape == b.codes.shape == a.decoded.shape == b.decoded.shape):
        return None
    return torch.isnan(a.decoded) & torch.isnan(b.decoded)


def nan_code_differences(a: CodecResult, b: CodecResult) -> int:
    """Elements both results encode as NaN, with different NaN codes (the sign of a NaN: the C kernel keeps a
    NaN input's sign, the vectorised torch path does not promise it). Reported, not failed: a NaN's sign
    carries no value, and both decode to NaN."""
    both = _nan_codes_in_both(a, b)
    return 0 if both is None else int((both & (a.codes != b.codes)).sum())


def compare_codec(a: CodecResult, b: CodecResult) -> list[str]:
    """What differs between two results, one item per kind: codes bit for bit (any NaN code matching any NaN
    code: :func:`nan_code_differences`), scales bit for bit, decoded values bit for bit where not NaN, and the
    NaN positions."""
    import torch

    out = []
    for what, x, y in (("codes", a.codes, b.codes), ("scales", a.scales, b.scales)):
        if x.shape != y.shape:
            out.append(f"{what}: shape {tuple(x.shape)} vs {tuple(y.shape)}")
            continue
        diff = (x != y) if x.dtype == torch.uint8 else (bits_of(x) != bits_of(y))
        nan_both = _nan_codes_in_both(a, b) if what == "codes" else None
        if nan_both is not None:
            diff &= ~nan_both
        if bool(diff.any()):
            i = int(diff.nonzero()[0, 0])
            out.append(
                f"{what}: {int(diff.sum())} of {x.numel()} differ (first at {i}: {x[i].item()} vs {y[i].item()})"
            )
    if a.decoded.shape != b.decoded.shape:
        out.append(f"decoded: shape {tuple(a.decoded.shape)} vs {tuple(b.decoded.shape)}")
        return out
    na, nb = torch.isnan(a.decoded), torch.isnan(b.decoded)
    if not torch.equal(na, nb):
        out.append(f"decoded: NaN at {int((na != nb).sum())} positions of one and not the other")
    both = ~(na | nb)
    diff = both & (bits_of(a.decoded) != bits_of(b.decoded))
    if bool(diff.any()):
        i = int(diff.nonzero()[0, 0])
        out.append(
            f"decoded: {int(diff.sum())} of {a.decoded.numel()} differ "
            f"(first at {i}: {a.decoded[i].item()!r} vs {b.decoded[i].item()!r})"
        )
    return out


def codec_exact_cases(
    rep: StepReport,
    make_a: Callable[[Callable[[], CodecResult]], CodecResult],
    make_b: Callable[[Callable[[], CodecResult]], CodecResult],
    device_a: torch.device,
    device_b: torch.device,
    labels: tuple[str, str],
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Every format x scaling on every input, encoded and decoded by path A and path B, bit for bit.

    ``make_a(thunk)`` runs ``thunk`` under path A's conditions (the kernel switched on, say) and returns its
    result; ``device_a`` is where path A's tensors live."""
    inputs = codec_inputs() if inputs is None else inputs
    cases, nan_codes = 0, 0
    for fmt, scaling in CODEC_CASES:
        for name, x in inputs.items():
            a = make_a(partial(codec_roundtrip, x, fmt, scaling, CODEC_BLOCK, device_a))
            b = make_b(partial(codec_roundtrip, x, fmt, scaling, CODEC_BLOCK, device_b))
            for d in compare_codec(a, b):
                rep.fail(f"{fmt} {scaling} on {name} ({x.numel()} elements), {labels[0]} vs {labels[1]}: {d}")
            nan_codes += nan_code_differences(a, b)
            cases += 1
        a = make_a(partial(codec_decode_all, fmt, scaling, CODEC_BLOCK, device_a))
        b = make_b(partial(codec_decode_all, fmt, scaling, CODEC_BLOCK, device_b))
        for d in compare_codec(a, b):
            rep.fail(f"{fmt} {scaling} decode of every code, {labels[0]} vs {labels[1]}: {d}")
        cases += 1
    rep.fig("cases", cases)
    rep.fig("elements_per_case", {k: v.numel() for k, v in inputs.items()})
    rep.fig("nan_codes_differing_in_sign", nan_codes)


def copy_fraction(
    encode_s: float, decode_s: float, copy_s: float, numel: int, moved: tuple[float, float] | None = None
) -> dict[str, float]:
    """Encode and decode throughput against the device copy, bytes read plus written. ``fraction``: the work
    done, the 5 bytes per element an encode must move (read 4, write 1: fp32 -> fp8) and the 5 a decode must
    (read 1, write 4), over the copy's 8, so a path that moves more is slower by as much. ``bandwidth_fraction``
    (with ``moved``: the bytes per element the code path really reads and writes to encode and to decode,
    ``fused.moved_bytes``): how close those bytes come to the copy's bandwidth."""
    copy_gbps = 8 * numel / copy_s / 1e9
    enc_gbps = 5 * numel / encode_s / 1e9
    dec_gbps = 5 * numel / decode_s / 1e9
    both_gbps = 10 * numel / (encode_s + decode_s) / 1e9
    out = {
        "copy_gbps": copy_gbps,
        "encode_gbps": enc_gbps,
        "decode_gbps": dec_gbps,
        "encode_decode_gbps": both_gbps,
        "fraction": both_gbps / copy_gbps,
    }
    if moved is not None:
        out["moved_b_per_element"] = moved[0] + moved[1]
        out["bandwidth_fraction"] = (moved[0] + moved[1]) * numel / (encode_s + decode_s) / 1e9 / copy_gbps
    return out


def time_cuda(fn: Callable[[], Any], reps: int = 10, trials: int = 3, warmup: int = 3) -> tuple[float, float]:
    """(seconds per call of ``fn`` on the current stream by CUDA events, seconds of its first call by the host
    clock). Per call: the best of ``trials`` means over ``reps`` back-to-back calls, after ``warmup`` calls
    (first-call costs: allocation, compilation, which the second figure shows)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3 / reps)
    return best, first
