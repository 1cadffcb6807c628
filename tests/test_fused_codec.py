"""The fused fp8 codec (``torch.compile`` graphs, :mod:`commbench.measure.fused`) on CPU through inductor's C++
backend: bit for bit the eager codec on every wire shape that has its own code path (whole and short blocks,
misaligned and aligned scale bytes, unscaled, specials), sizes sharing a graph, the bytes per element, the fallback
when compiling fails.

Compiling costs seconds per graph, so the graphs are compiled once for the module (``wires``): 11 graphs, about 25 s
with a warm inductor cache (under /tmp) and up to 2-3 minutes cold on a loaded 2-core machine; those tests are
marked slow."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from commbench.measure import fp8, fused
from commbench.measure.chunked import ChunkWire
from commbench.measure.codec import get_codec
from tests.test_codec_launches import special_rows
from tests.test_fp8_codec import same_floats

CPU = torch.device("cpu")
CASES = [  # (codec, packed, n, m): short last block + misaligned packed scales; aligned; unscaled
    ("fp8_e4m3:block7", True, 3, 1030),
    ("fp8_e5m2", True, 2, 2 * fused._AMAX_SPLIT + 16),  # a split whole-row amax with a tail; scale bytes
    # float-aligned in the packed wire: read in place
    ("fp8_e4m3:none", False, 2, 64),
]

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler")


def _wire_results(name: str, packed: bool, n: int, m: int) -> dict[str, torch.Tensor]:
    """Everything a wire produces: its bytes after encoding, the decoded chunks, their fp32 sum, and the
    single-tensor API (quantize / dequantize) on the first chunk."""
    w = ChunkWire(get_codec(name), n, m, CPU, packed)
    x = special_rows(n, m, seed=n * 100 + m)
    w.encode_chunks(x.flatten())
    dec, red = torch.empty(n * m), torch.empty(m)
    w.decode_chunks(dec)
    w.decode_chunks(red, reduce=True)
    out = {"wire": torch.cat([b.flatten() for b in w.buffers()]).clone(), "decoded": dec, "reduced": red}
    if (name, packed, n, m) == CASES[0]:  # two graphs more: the single-tensor API once
        codec: Any = get_codec(name)
        q, s = fp8.quantize(x[0].contiguous(), codec.fmt, codec.scaling.name, codec.block)
        out.update(q=q, s=s, y=fp8.dequantize(q, s, codec.fmt, codec.scaling.name, codec.block))
    return out


@pytest.fixture(scope="module")
def wires() -> Iterator[dict[str, Any]]:
    fp8.use_kernel(False)
    try:
        fp8.use_fused(False)
        eager = {c: _wire_results(*c) for c in CASES}
        fp8.use_fused(True)
        got = {c: _wire_results(*c) for c in CASES}
        graphs = len(fused.COMPILE_S)
        again = {c: _wire_results(*c) for c in CASES}  # cached graphs: nothing compiles again
        yield {
            "eager": eager, "fused": got, "again": again, "graphs": graphs, "graphs_after": len(fused.COMPILE_S),
            "report": fp8.compile_report(),
        }  # fmt: skip
    finally:
        fp8.use_fused(None)
        fp8.use_kernel(True)


@needs_cxx
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{'packed' if c[1] else 'split'}-{c[2]}x{c[3]}" for c in CASES])
def test_fused_is_bit_identical_to_eager(wires: dict[str, Any], case: tuple[str, bool, int, int]) -> None:
    assert wires["report"]["fallback"] is None, wires["report"]  # the fused path really ran
    for what, want in wires["eager"][case].items():
        for got in (wires["fused"][case][what], wires["again"][case][what]):
            # codes and scales to the bit; decoded floats to the bit but any NaN for any NaN (a sum of NaNs
            # keeps one payload or another)
            assert same_floats(got, want) if want.is_floating_point() else torch.equal(got, want), (case, what)


@needs_cxx
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_compile_per_shape_and_reported(wires: dict[str, Any]) -> None:
    # per case: encode, decode, reducing decode of the wire; quantize and dequantize of one chunk once
    assert wires["graphs"] == 3 * len(CASES) + 2, wires["graphs"]
    assert wires["graphs_after"] == wires["graphs"]  # the second pass compiled nothing
    assert wires["report"]["graphs"] == wires["graphs"] and wires["report"]["compile_s"] > 0


@needs_cxx
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sizes_share_a_graph(wires: dict[str, Any]) -> None:
    """The graphs take their sizes as symbols: another chunk size of the same layout compiles nothing, and gives
    the eager bits."""
    name, packed, n, _ = CASES[1]
    fp8.use_kernel(False)
    try:
        fp8.use_fused(True)
        sizes = (256, 1024, fused._AMAX_SPLIT, 3 * fused._AMAX_SPLIT + 16)  # whole-row amax: short, split, tail
        got = {m: _wire_results(name, packed, n, m) for m in sizes}
        compiled = len(fused.COMPILE_S)
        fp8.use_fused(False)
        want = {m: _wire_results(name, packed, n, m) for m in sizes}
    finally:
        fp8.use_fused(None)
        fp8.use_kernel(True)
    assert compiled == 3, fused.COMPILE_S  # encode, decode, reducing decode: once for the four sizes
    for m in got:
        for what in want[m]:
            assert (
                same_floats(got[m][what], want[m][what])
                if want[m][what].is_floating_point()
                else torch.equal(got[m][what], want[m][what])
            ), (m, what)


@needs_cxx
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fused_bytes_meet_the_targets(wires: dict[str, Any]) -> None:
    """Bytes read + written per element (the graphs' inputs and outputs, ``fused.moved_bytes``): encode 4 + 4 + 1
    (tensor scaling reads the row twice), decode 1 + 4, decode and sum of n chunks 1 + 4 / n, each plus 4 bytes
    per scale; the eager path moves 25 to encode (the targets: <= 10 and <= 5)."""
    name, packed, n, m = CASES[1]
    w = ChunkWire(get_codec(name), n, m, CPU, packed)
    x, y, acc = torch.randn(n * m), torch.empty(n * m), torch.empty(m)
    calls = (lambda: w.encode_chunks(x), lambda: w.decode_chunks(y), lambda: w.decode_chunks(acc, reduce=True))
    fp8.use_kernel(False)
    try:
        fp8.use_fused(True)
        for fn in calls:
            fn()
        fused_b = [sum(fused.moved_bytes(fn)) for fn in calls]
        fp8.use_fused(False)
        eager_b = [sum(fused.moved_bytes(fn)) for fn in calls]
    finally:
        fp8.use_fused(None)
        fp8.use_kernel(True)
    scales = 4 * n  # one float32 scale per chunk (tensor scaling)
    # x read twice (the whole-row amax, then the cast); scales written by the graph, then copied to the wire
    assert fused_b[0] == 9 * n * m + 3 * scales
    assert fused_b[1] == 5 * n * m + scales
    assert fused_b[2] == n * m + 4 * m + scales
    assert fused_b[0] / (n * m) <= 10 < eager_b[0] / (n * m) and fused_b[1] / (n * m) <= 5 + 0.05


def test_compile_failure_falls_back_to_eager_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*a: Any, **k: Any) -> Any:
        def run(*args: Any) -> None:
            raise RuntimeError("no compiler today\nsecond line")

        return run

    x = special_rows(2, 100, seed=1)[0].contiguous()
    fp8.use_kernel(False)
    try:
        fp8.use_fused(False)
        want = fp8.quantize(x, "e4m3", "block", 16)
        fp8.use_fused(True)
        monkeypatch.setattr(torch, "compile", broken)
        got = [fp8.quantize(x, "e4m3", "block", 16) for _ in range(3)]
        report = fp8.compile_report()
        info = fp8.codec_info(CPU)
    finally:
        fp8.use_fused(None)
        fp8.use_kernel(True)
    for q, s in got:
        assert torch.equal(q, want[0]) and torch.equal(s, want[1])
    err = capsys.readouterr().err
    assert err.count("fused fp8 codec unavailable") == 1 and "no compiler today" in err and "second line" not in err
    assert report["fallback"] is not None and "RuntimeError" in str(report["fallback"])
    assert report["graphs"] == 0 and info.startswith("torch (")


def test_path_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU: the C kernel first, fused graphs only when asked for; COMMBENCH_FP8_FUSED=0 turns them off; CUDA
    without Triton gives the reason."""
    try:
        fp8.use_fused(None)
        monkeypatch.delenv(fused.ENV, raising=False)
        assert not fp8.fused_on(CPU)  # the default on CPU
        monkeypatch.setenv(fused.ENV, "1")
        assert fp8.fused_on(CPU) == (fused.unavailable_reason(CPU) is None)
        monkeypatch.setenv(fused.ENV, "0")
        assert not fp8.fused_on(CPU) and fused.unavailable_reason(CPU) == f"disabled by {fused.ENV}=0"
        monkeypatch.delenv(fused.ENV)
        import builtins

        real_import = builtins.__import__

        def no_triton(name: str, *a: Any, **k: Any) -> Any:
            if name == "triton":
                raise ImportError("no triton")
            return real_import(name, *a, **k)

        fused.reset()
        monkeypatch.setattr(builtins, "__import__", no_triton)
        assert "Triton" in str(fused.unavailable_reason(torch.device("cuda", 0)))
    finally:
        fused.reset()
        fp8.use_fused(None)


def test_graph_inputs_are_tensors_and_their_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every graph of every format x scaling takes only its tensors and their sizes, strides and offsets as inputs: an int the graph
    reads from a closure (the format's exponent, a block length) would be a symbol under ``dynamic=True``, on
    Triton a 64-bit kernel argument that turned the scale's integer arithmetic 64-bit and failed to compile
    ("Cannot bitcast data-type of size 64 to data-type of size 32", seen on an H200). Traced here with a backend
    that records the placeholders and runs the graph as it is (no inductor), so it costs no compile."""
    seen: list[tuple[str, str]] = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                src = node.meta["grapharg"].source.name
                seen.append((type(node.meta["example_value"]).__name__, src() if callable(src) else src))
        return gm

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **k: real(fn, backend=recording, **k))
    fused.reset()
    fp8.use_kernel(False)
    try:
        fp8.use_fused(True)
        for name in ("fp8_e4m3", "fp8_e5m2:block32", "fp8_e4m3:none"):
            n, m = 2, fused._AMAX_SPLIT + 40
            w = ChunkWire(get_codec(name), n, m, CPU, True)
            w.encode_chunks(special_rows(n, m, seed=3).flatten())
            w.decode_chunks(torch.empty(n * m))
            w.decode_chunks(torch.empty(m), reduce=True)
        compiled = len(fused.COMPILE_S)
    finally:
        fused.reset()
        fp8.use_fused(None)
        fp8.use_kernel(True)
    assert compiled == 9 and seen, (compiled, seen)
    tensor_facts = (".size()", ".stride()", ".storage_offset()")
    loose = [(kind, src) for kind, src in seen if kind != "FakeTensor" and not any(t in src for t in tensor_facts)]
    assert not loose, loose
