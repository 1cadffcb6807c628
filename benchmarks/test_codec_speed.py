"""Codec speed (pytest-benchmark): fp8 encode and decode of each format/scaling at 1, 16 and 64 MiB of fp32,
next to the bf16 cast round trip (what ``bf16_compress`` pays) of the same tensor.

    python -m pytest benchmarks/test_codec_speed.py -s              # full table + the ratio lines
    python -m pytest benchmarks/test_codec_speed.py -s -k ratio     # only the 64 MiB ratios (~20 s)

Target: fp8 encode+decode of 64 MiB <= 1.5x the bf16 round trip, same machine, same thread count. The ratio
test times both interleaved (median of rounds, so machine noise hits both alike), prints one line per
variant and threads setting, and stores the ratios in the benchmark's ``extra_info`` (see --benchmark-json).
No assertion on time: speed is reported, not tested.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import pytest
import torch

from commbench.measure import fp8

MIB = 1 << 20
VARIANTS = [
    ("e4m3", "tensor"),
    ("e4m3", "block"),
    ("e4m3", "none"),
    ("e5m2", "tensor"),
    ("e5m2", "block"),
    ("e5m2", "none"),
]
SIZES = [1, 16, 64]


def _input(mib: int) -> torch.Tensor:
    return torch.randn(mib * MIB // 4, generator=torch.Generator().manual_seed(mib))


@pytest.mark.parametrize("mib", SIZES, ids=[f"{s}MiB" for s in SIZES])
@pytest.mark.parametrize(("fmt", "scaling"), VARIANTS, ids=[f"{f}-{s}" for f, s in VARIANTS])
@pytest.mark.parametrize("phase", ["encode", "decode"])
def test_fp8(benchmark, phase: str, fmt: str, scaling: str, mib: int) -> None:  # type: ignore[no-untyped-def]
    x = _input(mib)
    q, s = fp8.quantize(x, fmt, scaling)
    y = torch.empty_like(x)
    benchmark.group = f"{phase} {mib} MiB"
    benchmark.extra_info["codec_path"] = fp8.kernel_status()
    if phase == "encode":
        benchmark(fp8.quantize, x, fmt, scaling, out=(q, s))
    else:
        benchmark(fp8.dequantize, q, s, fmt, scaling, out=y)


@pytest.mark.parametrize("mib", SIZES, ids=[f"{s}MiB" for s in SIZES])
@pytest.mark.parametrize("phase", ["encode", "decode"])
def test_bf16_cast(benchmark, phase: str, mib: int) -> None:  # type: ignore[no-untyped-def]
    x = _input(mib)
    b = x.to(torch.bfloat16)
    y = torch.empty_like(x)
    benchmark.group = f"{phase} {mib} MiB"
    benchmark(b.copy_ if phase == "encode" else y.copy_, x if phase == "encode" else b)


def _median_pair(a: Callable[[], object], b: Callable[[], object], rounds: int) -> tuple[float, float]:
    ta: list[float] = []
    tb: list[float] = []
    a(), b()  # warm-up (and the kernel build on first use)
    for _ in range(rounds):
        for fn, acc in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def test_ratio_fp8_roundtrip_vs_bf16_64mib(benchmark, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    x = _input(64)
    y = torch.empty_like(x)
    b = torch.empty(x.numel(), dtype=torch.bfloat16)

    def bf16() -> None:
        b.copy_(x)
        y.copy_(b)

    before = torch.get_num_threads()
    lines = [f"codec path: {fp8.kernel_status()}; 64 MiB fp32 = {x.numel()} elements"]
    try:
        for threads in sorted({1, before}):
            torch.set_num_threads(threads)
            for fmt, scaling in VARIANTS:
                q, s = fp8.quantize(x, fmt, scaling)

                def roundtrip(fmt: str = fmt, scaling: str = scaling, q: torch.Tensor = q, s: torch.Tensor = s) -> None:
                    fp8.quantize(x, fmt, scaling, out=(q, s))
                    fp8.dequantize(q, s, fmt, scaling, out=y)

                t8, t16 = _median_pair(roundtrip, bf16, rounds=15)
                key = f"{fmt}:{scaling}@{threads}t"
                benchmark.extra_info[key] = t8 / t16
                lines.append(
                    f"threads={threads} fp8 {fmt}:{scaling:<6} enc+dec {t8 * 1e3:7.2f} ms  bf16 round trip "
                    f"{t16 * 1e3:6.2f} ms  ratio {t8 / t16:5.2f} (target <= 1.5)"
                )
    finally:
        torch.set_num_threads(before)
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    # The benchmark fixture itself records the default variant's round trip.
    q, s = fp8.quantize(x, "e4m3", "tensor")
    benchmark.group = "ratio"
    benchmark.pedantic(
        lambda: (fp8.quantize(x, "e4m3", "tensor", out=(q, s)), fp8.dequantize(q, s, "e4m3", "tensor", out=y)), rounds=5
    )


def _real_bytes(fn: Callable[[], object], nominal: int, numel: int) -> tuple[float, str]:
    """Bytes per element ``fn`` really reads and writes (``fused.moved_bytes``: dispatched ops and the fused
    graphs' inputs and outputs); the C kernel is one pass invisible to a dispatch mode: its nominal bytes."""
    from commbench.measure.fused import moved_bytes

    got = sum(moved_bytes(fn))
    return (got / numel, "counted") if got else (float(nominal), "one pass (C kernel)")


def test_bandwidth_credited_with_real_bytes(benchmark, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """Encode and decode of 64 MiB as a fraction of the copy bandwidth, crediting the bytes each path really
    moves (an eager encode moves 25 B per element, not the 5 a single pass would): the fraction of memory
    bandwidth the codec uses, next to the nominal 5 B figure (what ``gpu_check``'s ``codec_speed`` credited)."""
    x = _input(64)
    n = x.numel()
    y = torch.empty_like(x)
    copy_s, _ = _median_pair(lambda: y.copy_(x), lambda: None, rounds=9)
    copy_gbps = 8 * n / copy_s / 1e9
    lines = [f"codec path: {fp8.kernel_status()}; copy {copy_gbps:.1f} GB/s (8 B per element)"]
    for fmt, scaling in VARIANTS:
        q, s = fp8.quantize(x, fmt, scaling)

        def enc(fmt: str = fmt, scaling: str = scaling, q: torch.Tensor = q, s: torch.Tensor = s) -> None:
            fp8.quantize(x, fmt, scaling, out=(q, s))

        def dec(fmt: str = fmt, scaling: str = scaling, q: torch.Tensor = q, s: torch.Tensor = s) -> None:
            fp8.dequantize(q, s, fmt, scaling, out=y)

        te, td = _median_pair(enc, dec, rounds=7)
        be, how = _real_bytes(enc, 5, n)
        bd, _ = _real_bytes(dec, 5, n)
        real = (be + bd) * n / (te + td) / 1e9
        nominal = 10 * n / (te + td) / 1e9
        benchmark.extra_info[f"{fmt}:{scaling}"] = {"encode_B": be, "decode_B": bd, "fraction": real / copy_gbps}
        lines.append(
            f"{fmt}:{scaling:<6} encode {be:5.1f} B + decode {bd:5.1f} B per element ({how}): {real:6.1f} GB/s = "
            f"{real / copy_gbps:4.2f} of copy bandwidth; nominal 10 B: {nominal / copy_gbps:4.2f}"
        )
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    benchmark.group = "bandwidth"
    benchmark.pedantic(lambda: fp8.quantize(x, "e4m3", "tensor"), rounds=3)
