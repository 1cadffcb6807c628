"""Extension recipes, from this file alone: a test-only codec (symmetric int8, one scale per chunk) and a
test-only collective (broadcast from rank 0) run through the chunked algorithm, the sweep's point path and the
asynchronous DDP codec hook on a 2-rank gloo world; the hook byte formulas against nccl-tests arithmetic."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist

from commbench.measure.codec import Codec, register_codec
from commbench.measure.collectives import COLLECTIVES, Collective, Layout, register_collective
from tests.distutil import run_in_world

N = 2


class ToyInt8(Codec):
    """x ~= q * s, q = round(x / s) in [-127, 127], s = amax / 127 (float32), one scale per chunk."""

    name = "toy_int8"
    description = "fp32 as int8 with one absmax scale per chunk (test only)"

    def code_bytes(self, numel: int) -> int:
        return numel

    def num_scales(self, numel: int) -> int:
        return 1

    def encode(self, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
        amax = x.abs().max() if x.numel() else torch.zeros(())
        s = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
        scales.copy_(s.reshape(1))
        codes.view(torch.int8).copy_(torch.round(x / s).clamp_(-127, 127))

    def decode(self, codes: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, accumulate: bool = False) -> None:
        v = codes.view(torch.int8).float() * scales[0]
        out.add_(v) if accumulate else out.copy_(v)

    def error_bound(self, abs_sum: torch.Tensor, contributions: int, encodings: int) -> torch.Tensor:
        # Half a step per encoding, the step at most 2 * A / 127 (A = max abs_sum covers every chunk's amax).
        a = torch.as_tensor(abs_sum, dtype=torch.float64)
        step = 2 * float(a.max()) / 127 if a.numel() else 0.0
        return contributions * step + encodings * step + 1e-6 * a


def _toy_codec(option: str | None) -> Codec:
    if option is not None:
        raise ValueError(f"toy_int8 takes no option, got {option!r}")
    return ToyInt8()


class ToyBroadcast(Collective):
    """Broadcast from rank 0 (nccl-tests broadcast_perf: size = buffer, bus factor 1)."""

    name = "toy_broadcast"
    redop = "none"
    reduces = False
    nccl_tests_name = "broadcast_perf"
    size_convention = "buffer"
    bus_factor_formula = "1"
    order = 100

    def bus_factor(self, n: int) -> float:
        return 1.0

    def round_total(self, total: int, n: int) -> int:
        return total

    def layout(self, total: int, n: int) -> Layout:
        return Layout(total=total, input_numel=total, output_numel=total, count=total)

    def run(
        self, inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None, async_op: bool = False
    ) -> Any:
        out.copy_(inp)
        return dist.broadcast(out, src=0, group=group, async_op=async_op)

    def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
        return inputs[0]

    def supports_chunked(self) -> bool:
        return True

    def chunked_op(self, codec: Codec, layout: Layout, group: Any, device: torch.device) -> Any:
        return _ChunkedBroadcast(self, codec, layout.input_numel, group, device)


class _ChunkedBroadcast:
    """Composed from the chunked module's pieces: encode one chunk, move its wire, decode."""

    has_codec = True

    def __init__(self, coll: Collective, codec: Codec, m: int, group: Any, device: torch.device) -> None:
        from commbench.measure.chunked import ChunkWire

        self.coll, self.group = coll, group
        self.x = torch.empty(m, dtype=torch.float32, device=device)
        self.y = torch.empty(m, dtype=torch.float32, device=device)
        self.send, self.recv = ChunkWire(codec, 1, m, device), ChunkWire(codec, 1, m, device)
        self.wire_bytes = self.recv.total_bytes()

    def load(self, x: torch.Tensor) -> None:
        self.x.copy_(x)

    def encode(self) -> None:
        self.send.encode(0, self.x)

    def comm(self) -> None:
        from commbench.measure.chunked import exchange

        exchange(self.coll, self.send, self.recv, self.group, async_op=False)

    def decode(self) -> None:
        self.recv.decode(0, self.y)

    def result(self) -> torch.Tensor:
        return self.y


# The recipes: one call each, at import (spawned ranks import this module too).
register_codec("toy_int8", _toy_codec, impl="toy_bytes")
register_collective(ToyBroadcast())


# --------------------------------------------------------------------------------------------------------
# References, written from the definitions (not from commbench's code)


def _ref_int8(x: torch.Tensor) -> torch.Tensor:
    amax = float(x.abs().max())
    s = torch.tensor(amax, dtype=torch.float32) / 127 if amax > 0 else torch.tensor(1.0)
    return torch.round(x / s).clamp(-127, 127) * s


def _ref_chunked(coll: str, xs: list[torch.Tensor], rank: int) -> torch.Tensor:
    n, total = len(xs), xs[0].numel()
    if coll == "all_gather":
        return torch.cat([_ref_int8(x) for x in xs])
    m = -(-total // n)
    pad = [torch.cat([x, torch.zeros(n * m - total)]) for x in xs]
    if coll == "all_to_all":
        return torch.cat([_ref_int8(p[rank * m : (rank + 1) * m]) for p in pad])

    def owned(i: int) -> torch.Tensor:
        acc = _ref_int8(pad[0][i * m : (i + 1) * m])
        for p in pad[1:]:
            acc = acc + _ref_int8(p[i * m : (i + 1) * m])
        return acc

    if coll == "reduce_scatter":
        return owned(rank)
    return torch.cat([_ref_int8(owned(i)) for i in range(n)])[:total]


class _Bucket:
    """What the codec hook reads of a dist.GradBucket."""

    def __init__(self, i: int, t: torch.Tensor, last: bool = False) -> None:
        self.i, self.t, self.last = i, t, last

    def buffer(self) -> torch.Tensor:
        return self.t

    def index(self) -> int:
        return self.i

    def is_last(self) -> bool:
        return self.last


def _world(rank: int, n: int) -> dict[str, Any]:
    from commbench.cluster.launch import Dist, WorldInfo
    from commbench.core.suite import SuiteConfig, TimingConfig
    from commbench.measure.collectives import get_collective
    from commbench.measure.precision import get_precision
    from commbench.measure.sweep import Sweep
    from commbench.training.comm import CommCounter
    from commbench.training.hooks import codec_hook, codec_hook_bytes
    from tests.test_fp8_collectives import _ref_collective

    out: dict[str, Any] = {"mismatch": [], "bound": []}
    prec = get_precision("toy_int8")
    for cname, total in (
        ("all_gather", 2 * 500),
        ("reduce_scatter", 2 * 500),
        ("all_reduce", 1001),
        ("all_to_all", 1000),
    ):
        coll = get_collective(cname)
        layout = coll.layout(coll.round_total(total, n), n)
        xs = [torch.randn(layout.input_numel, generator=torch.Generator().manual_seed(10 + r)) for r in range(n)]
        op = prec.make_op(coll, layout, None, torch.device("cpu"))
        op.load(xs[rank])
        op.encode()
        op.comm()
        op.decode()
        got = op.result()
        out["mismatch"].append((cname, int((got != _ref_chunked(cname, xs, rank)).sum())))
        ref = coll.reference([x.double() for x in xs], rank)
        bound = torch.as_tensor(prec.error_bound(coll, coll.reference([x.double().abs() for x in xs], rank), n))
        out["bound"].append((cname, int(((got.double() - ref).abs() > bound).sum())))

    # The toy collective through the sweep's point path, at a native and two codec precisions.
    suite = SuiteConfig(
        collectives=["toy_broadcast"], precisions=["fp32", "toy_int8", "fp8_e4m3"], min_bytes=4096, max_bytes=4096,
        timing=TimingConfig(warmup=1, min_time_s=0.001, min_iters=1, repeats=2, max_iters=4),
    )  # fmt: skip
    d = Dist(
        info=WorldInfo(rank, n, rank, n, "127.0.0.1", 0, "local"), backend="gloo", device=torch.device("cpu"),
        host="h", hosts=("h",) * n, threads=1,
    )  # fmt: skip
    sweep = Sweep(suite, d)
    rows = [r for g in sweep.groups() for _, r in sweep.run_group(g)]
    out["rows"] = [
        {
            k: getattr(r, k)
            for k in ("collective", "precision", "impl", "wire_bytes", "wrong", "algbw_gbps", "busbw_gbps")
        }
        for r in rows
    ]
    out["ordered_last"] = list(COLLECTIVES)[-1]

    # The asynchronous codec hook: three buckets launched back to back, then waited; bit-exact per bucket.
    hook = codec_hook("fp8_e4m3")
    sizes = [1001, 64, 4096]
    mine = [torch.randn(s, generator=torch.Generator().manual_seed(100 * s + rank)) for s in sizes]
    every = [[torch.randn(s, generator=torch.Generator().manual_seed(100 * s + r)) for r in range(n)] for s in sizes]
    with CommCounter() as counter:
        futs = [hook(None, _Bucket(i, t.clone(), i == len(mine) - 1)) for i, t in enumerate(mine)]  # type: ignore[arg-type]
        results = [f.wait() for f in futs]
    out["hook_mismatch"] = [
        int((res != _ref_collective("all_reduce", [x / n for x in xs], rank, "e4m3", "tensor", 0)).sum())
        for res, xs in zip(results, every, strict=True)
    ]
    out["hook_bytes"] = (counter.snapshot(), codec_hook_bytes("fp8_e4m3", sizes, n))
    # A real DDP model with several buckets, through the toy codec's hook.
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02)
    ddp.register_comm_hook(None, codec_hook("toy_int8"))
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank))
    ddp(x).square().sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    plain = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    plain.load_state_dict(model.state_dict())
    plain(x).square().sum().backward()
    local = torch.cat([p.grad.flatten() for p in plain.parameters()])
    dist.all_reduce(local)
    local /= n
    out["ddp_rel_err"] = float((grads - local).norm() / local.norm())
    return out


@pytest.fixture(scope="module")
def world() -> list[dict[str, Any]]:
    return run_in_world(_world, nproc=N, timeout=150)


@pytest.mark.timeout(160)
def test_toy_codec_through_the_chunked_algorithm(world: list[dict[str, Any]]) -> None:
    for res in world:
        assert all(k == 0 for _, k in res["mismatch"]), res["mismatch"]
        assert all(k == 0 for _, k in res["bound"]), res["bound"]


@pytest.mark.timeout(160)
def test_toy_collective_through_the_sweep(world: list[dict[str, Any]]) -> None:
    rows = world[0]["rows"]
    assert [(r["precision"], r["impl"]) for r in rows] == [
        ("fp32", "native"),
        ("toy_int8", "toy_bytes"),
        ("fp8_e4m3", "fp8_bytes"),
    ]
    m = 4096 // 4
    # wire bytes: the buffer (broadcast size) plus one fp32 scale for the codecs
    assert [r["wire_bytes"] for r in rows] == [4 * m, m + 4, m + 4]
    for r in rows:
        assert r["collective"] == "toy_broadcast" and r["wrong"] == 0
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"])  # bus factor 1
    assert world[0]["ordered_last"] == "toy_broadcast"
    assert ToyBroadcast().description == "buffer; 1"


@pytest.mark.timeout(160)
def test_async_codec_hook_bit_exact_and_ddp_close(world: list[dict[str, Any]]) -> None:
    for res in world:
        assert res["hook_mismatch"] == [0, 0, 0]
        measured, formula = res["hook_bytes"]
        assert measured == pytest.approx(formula) and set(measured) == set(formula)
        assert res["ddp_rel_err"] < 0.05  # int8: half a step of amax/127 per element, twice


def test_hook_bytes_follow_nccl_tests_formulas() -> None:
    from commbench.training.hooks import cast_hook_bytes, codec_hook_bytes

    n, numels = 3, [1000, 7]
    h = (n - 1) / n
    chunks = sum(math.ceil(k / n) * n for k in numels)
    want = {"all_to_all:uint8": h * chunks, "all_gather:uint8": h * chunks,
            "all_to_all:float": h * n * 4 * 2, "all_gather:float": h * n * 4 * 2}  # fmt: skip
    assert codec_hook_bytes("fp8_e4m3", numels, n) == pytest.approx(want)
    blocks = sum(n * math.ceil(math.ceil(k / n) / 32) for k in numels)
    got = codec_hook_bytes("fp8_e5m2:block32", numels, n)
    assert got["all_gather:float"] == pytest.approx(h * 4 * blocks)
    assert codec_hook_bytes("toy_int8", numels, n)["all_to_all:float"] == pytest.approx(h * n * 4 * 2)
    assert cast_hook_bytes(1000, n, torch.bfloat16) == {"all_reduce:bfloat16": 2 * h * 1000 * 2}
    assert codec_hook_bytes("fp8_e4m3", numels, 1) == {} and cast_hook_bytes(10, 1, torch.float16) == {}
    with pytest.raises(ValueError, match="fp8_e4m3"):
        codec_hook_bytes("int3", numels, n)
