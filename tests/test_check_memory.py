"""Cheap references (issue 22, item 5): the accumulated float64 references against sums and concatenations
written out here, one generation of the references per group however many precisions it has, inputs made in
blocks with the values of the whole-tensor definitions, results compared slice by slice with the statistics of
whole-tensor comparisons, no full-size float64 temporary in a group's check, and a memory estimate that counts
every contender (``fp32_chunked`` included)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.distutil import run_in_world

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


def _inputs(n: int, numel: int) -> list[torch.Tensor]:
    return [torch.randn(numel, generator=torch.Generator().manual_seed(100 + r), dtype=torch.float64) for r in range(n)]


def _source(xs: list[torch.Tensor], made: list[int] | None = None, step: int = 5) -> Any:
    """A block source over given inputs (odd blocks of ``step``), recording which ranks are made."""

    def source(r: int, lo: int, hi: int) -> Any:
        if made is not None:
            made.append(r)
        for s in range(lo, hi, step):
            yield s, xs[r][s : min(s + step, hi)].clone()

    return source


def _expected(cname: str, xs: list[torch.Tensor], rank: int) -> torch.Tensor:
    """nccl-tests' definitions, written out element by element over the ranks (float64, left to right)."""
    n = len(xs)
    if cname == "all_reduce":
        out = torch.zeros_like(xs[0])
        for x in xs:
            out = out + x
        return out
    m = xs[0].numel() // n
    if cname == "reduce_scatter":
        out = torch.zeros(m, dtype=torch.float64)
        for x in xs:
            out = out + x[rank * m : (rank + 1) * m]
        return out
    if cname == "all_gather":
        return torch.tensor([float(v) for x in xs for v in x], dtype=torch.float64)
    assert cname == "all_to_all"
    return torch.tensor([float(v) for x in xs for v in x[rank * m : (rank + 1) * m]], dtype=torch.float64)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("cname", COLLS)
def test_references_equal_float64_sums_written_out(cname: str, n: int) -> None:
    from commbench.measure.check import references
    from commbench.measure.collectives import get_collective

    coll = get_collective(cname)
    layout = coll.layout(coll.round_total(4 * 6 * n, n), n)
    xs = _inputs(n, layout.input_numel)
    made: list[int] = []
    for rank in range(n):
        made.clear()
        d = SimpleNamespace(rank=rank, world_size=n, device=torch.device("cpu"))
        refs = references(d, coll, layout, _source(xs, made), (torch.bfloat16, torch.float32), True)  # type: ignore[arg-type]
        assert sorted(made) == list(range(n))  # each rank's input made once (in blocks), this rank's own included
        want = _expected(cname, xs, rank)
        assert refs.exact.shape == (layout.output_numel,)
        # a sum of 2 or 3 float64 terms has one rounding order: equal to the bit
        assert torch.equal(refs.exact, want)
        assert refs.abs is not None and torch.equal(refs.abs, _expected(cname, [x.abs() for x in xs], rank))
        bf = _expected(cname, [x.to(torch.bfloat16).double() for x in xs], rank)
        assert torch.equal(refs.given[torch.bfloat16], bf) and not torch.equal(bf, want)
        assert torch.equal(refs.given[torch.float32], _expected(cname, [x.float().double() for x in xs], rank))


def test_load_inputs_gives_each_op_its_dtype_of_the_rank_input() -> None:
    from commbench.measure.payloads import load_inputs
    from commbench.measure.precision import get_precision

    xs = _inputs(2, 101)
    got: dict[str, torch.Tensor] = {}

    class Op:
        def __init__(self, name: str) -> None:
            self.name = name

        def load(self, x: torch.Tensor) -> None:
            got[self.name] = x.clone()

    ops = [(get_precision(p), Op(p)) for p in ("fp32", "bf16", "fp16", "fp8_e4m3")]
    load_inputs(ops, _source(xs, step=7), 1, 101, torch.device("cpu"))  # type: ignore[arg-type]
    for p, want in (
        ("fp32", torch.float32),
        ("bf16", torch.bfloat16),
        ("fp16", torch.float16),
        ("fp8_e4m3", torch.float32),
    ):
        assert got[p].dtype == want and torch.equal(got[p], xs[1].to(want)), p


@pytest.mark.parametrize("kind", ["normal", "gradient", "outliers"])
def test_payload_blocks_are_the_payload(kind: str) -> None:
    """Blocks of any multiple of 16, any range, tails under 16 and sizes under 16: the whole tensor's values."""
    from commbench.measure.payloads import payload, payload_blocks

    for numel in (3, 16, 31, 160, 1003, 4096 + 9):
        whole = payload(kind, numel, 77)
        for block in (16, 64, 1024):
            for lo, hi in ((0, numel), (numel // 3, numel), (1, numel // 2 + 1), (numel - 1, numel)):
                parts = list(payload_blocks(kind, numel, 77, lo, hi, block))
                assert [s for s, _ in parts] == sorted(s for s, _ in parts)
                cat = torch.cat([x for _, x in parts])
                assert torch.equal(cat, whole[lo:hi]), (numel, block, lo, hi)
                assert all(x.numel() < block + 16 for _, x in parts)  # never the whole tensor at once
    if kind == "outliers":
        assert bool((payload(kind, 4096, 77).abs() > 100).any())  # the mask's draws are in the blocks too


def _exact_written_out(numel: int, rank: int) -> torch.Tensor:
    """exact_inputs' definition, element by element."""
    fine = (0, 1, 0, 1, 0, 2, 0, 2, 1, 2, 1)
    out = []
    for i in range(numel):
        v = (7 * i + 3 * rank) % 5 - 2
        if rank == 0:
            v = 2 * (v + 1)
        out.append(float(v * 2 ** ((3 * i) // numel + fine[(i // 16) % 11])))
    return torch.tensor(out, dtype=torch.float64)


def test_exact_inputs_and_blocks_follow_the_definition() -> None:
    from commbench.measure.payloads import exact_blocks, exact_inputs

    for numel, rank in ((1, 0), (7, 1), (880, 2), (1000, 0), (2663, 3)):
        want = _exact_written_out(numel, rank)
        assert torch.equal(exact_inputs(numel, rank), want), (numel, rank)
        lo = numel // 3
        got = torch.cat([x for _, x in exact_blocks(numel, rank, lo, numel, block=97)])
        assert torch.equal(got, want[lo:]), (numel, rank)


class _MaxBound:
    """A precision whose tolerance depends on each element and on the largest one (as native fp8's does)."""

    def check_tolerance(self, coll: Any, abs_sum: torch.Tensor, n: int) -> torch.Tensor:
        return abs_sum * 1e-3 + float(abs_sum.max()) * 1e-4


def test_sliced_comparisons_give_the_whole_tensor_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    import commbench.measure.check as check
    from commbench.measure.collectives import get_collective

    ar = get_collective("all_reduce")  # a sum: the op adds no tolerance of its own

    g = torch.Generator().manual_seed(5)
    o = 1000
    exact = torch.randn(o, generator=g, dtype=torch.float64)
    abs_sum = exact.abs() * 2
    given = exact + torch.randn(o, generator=g, dtype=torch.float64) * 1e-6
    got = (exact + torch.randn(o, generator=g, dtype=torch.float64) * 1e-5).float()
    got[[3, 500, 999]] += 1.0  # three elements beyond any bound
    # whole-tensor definitions
    bound = _MaxBound().check_tolerance(None, abs_sum, 2)
    want_wrong = int((~((got.double() - exact).abs() <= bound)).sum())
    d = got.double() - exact
    c = got.double() - given
    want = (float((d * d).sum()), float(d.abs().max()), float((c * c).sum()))
    assert want_wrong == 3
    for slice_ in (7, 128, 1 << 20):
        monkeypatch.setattr(check, "_SLICE", slice_)
        assert check._count_wrong(_MaxBound(), ar, 2, got, exact, abs_sum) == (3, float(bound.max()))  # type: ignore[arg-type]
        sq, mx, sqc = check._errors(got, exact, given)
        assert mx == want[1]  # the largest error: the same to the bit
        assert sq == pytest.approx(want[0], rel=1e-13) and sqc == pytest.approx(want[2], rel=1e-13)  # summation order
        assert check._sum_sq(exact) == pytest.approx(float((exact * exact).sum()), rel=1e-13)
    nan = got.clone()
    nan[700] = float("nan")
    assert check._count_wrong(_MaxBound(), ar, 2, nan, exact, abs_sum)[0] == 4  # type: ignore[arg-type]  # NaN: wrong
    assert check._errors(nan, exact, given) == (float("inf"),) * 3


def test_a_collective_the_rule_misreads_keeps_its_own_reference() -> None:
    """A broadcast has all_to_all's shapes (input = output): the shape rule would misread it; the small check
    finds that and the collective's own reference is used."""
    from commbench.measure.check import references
    from commbench.measure.collectives import AllToAll, get_collective

    class Broadcast(AllToAll):
        name = "toy_broadcast_h4"

        def reference(self, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
            return inputs[0].clone()

    coll = Broadcast()
    n = 3
    layout = get_collective("all_to_all").layout(48, n)
    xs = _inputs(n, layout.input_numel)
    for rank in range(n):
        d = SimpleNamespace(rank=rank, world_size=n, device=torch.device("cpu"))
        refs = references(d, coll, layout, _source(xs))  # type: ignore[arg-type]
        assert torch.equal(refs.exact, xs[0])


def test_memory_estimate_counts_fp32_chunked_and_references() -> None:
    from commbench.core.suite import SuiteConfig
    from commbench.measure.check import check_bytes
    from commbench.measure.collectives import get_collective
    from commbench.measure.footprint import point_memory
    from commbench.measure.precision import get_precision

    n, size = 2, 1 << 20
    coll = get_collective("all_reduce")
    layout = coll.layout(coll.round_total(size // 4, n), n)
    suite = SuiteConfig(collectives=["all_reduce"], precisions=["fp32", "fp8_e4m3"], min_bytes=size, max_bytes=size)
    ((_, ops, refs),) = point_memory(suite, n, "gloo")
    one = {p: get_precision(p).buffer_bytes(coll, layout, n) for p in ("fp32", "fp8_e4m3", "fp32_chunked")}
    assert one["fp32_chunked"] > 0
    assert ops == one["fp32"] + one["fp8_e4m3"] + one["fp32_chunked"]  # the sweep adds fp32_chunked: counted
    # references: 262144 float64 elements in and out (less than one block); one input dtype (float32) among
    # the contenders. Each pass holds two expected outputs (exact and |x|, or exact and "as given") and three
    # block-sized temporaries (a block with two views, or a result slice with its bound and difference): here
    # a block is the whole tensor, 5 tensors in all.
    e = 262144
    assert refs == check_bytes(coll, layout, n, 1, True) == 8 * 5 * e
    assert check_bytes(coll, layout, n, 2, False) == 8 * 5 * e  # two dtypes: two passes one after the other
    big = coll.layout(coll.round_total((1 << 30) // 4, n), n)  # 2**28 elements: blocks of 2**20
    assert check_bytes(coll, big, n, 1, True) == 8 * (2 * 2**28 + 3 * 2**20)
    # without a codec precision no fp32_chunked joins
    plain = SuiteConfig(collectives=["all_reduce"], precisions=["fp32", "bf16"], min_bytes=size, max_bytes=size)
    ((_, ops2, _),) = point_memory(plain, n, "gloo")
    assert ops2 == one["fp32"] + get_precision("bf16").buffer_bytes(coll, layout, n)


def _world(rank: int, n: int) -> dict[str, Any]:
    import commbench.measure.payloads as payloads
    from commbench.cluster.launch import Dist, WorldInfo
    from commbench.core.suite import SuiteConfig, TimingConfig
    from commbench.measure.sweep import Sweep

    calls: dict[str, list[int]] = {"payload": [], "exact": []}
    real_payload, real_exact = payloads.payload_blocks, payloads.exact_blocks

    def payload(kind: str, numel: int, seed: int, *a: Any, **k: Any) -> Any:
        calls["payload"].append(numel)
        return real_payload(kind, numel, seed, *a, **k)

    def exact(numel: int, r: int, *a: Any, **k: Any) -> Any:
        calls["exact"].append(r)
        return real_exact(numel, r, *a, **k)

    payloads.payload_blocks, payloads.exact_blocks = payload, exact  # type: ignore[assignment]
    d = Dist(
        info=WorldInfo(rank, n, rank, n, "127.0.0.1", 0, "local"), backend="gloo", device=torch.device("cpu"),
        host="h", hosts=("h",) * n, threads=1,
    )  # fmt: skip
    suite = SuiteConfig(
        collectives=["all_reduce", "all_gather"], precisions=["fp32", "bf16", "fp8_e4m3", "fp8_e5m2:block32"],
        min_bytes=1 << 14, max_bytes=1 << 14,
        timing=TimingConfig(warmup=1, min_time_s=0.0005, min_iters=1, repeats=2, max_iters=2, passes=2),
    )  # fmt: skip
    sweep = Sweep(suite, d)
    out: dict[str, Any] = {"groups": []}
    for g in sweep.groups():
        calls["payload"].clear(), calls["exact"].clear()
        state = sweep.sample_group(g, None, 0)
        first = {k: list(v) for k, v in calls.items()}
        calls["payload"].clear(), calls["exact"].clear()
        state = sweep.sample_group(g, state, 1)
        second = {k: list(v) for k, v in calls.items()}
        rows, _ = sweep.finish_group(g, state)
        out["groups"].append(
            {"collective": g.collective.name, "precisions": [r.precision for _, r in rows], "first": first,
             "second": second, "wrong": [r.wrong for _, r in rows], "rel_err": [r.rel_err for _, r in rows]}
        )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def world() -> list[dict[str, Any]]:
    return run_in_world(_world, nproc=3, timeout=300)


def test_references_made_once_per_group(world: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(world):
        for g in out["groups"]:
            # 4 or 5 contenders (all_reduce adds fp32_chunked), and still each rank's inputs made once
            assert len(g["precisions"]) == (5 if g["collective"] == "all_reduce" else 4)
            assert "fp32_chunked" in g["precisions"] or g["collective"] != "all_reduce"
            # the check makes every rank's inputs once for the references, and this rank's once more to load the ops
            assert sorted(g["first"]["exact"]) == sorted([0, 1, 2, rank]), (rank, g)
            # the error passes make each rank's payload once per input dtype (float32 and bfloat16 here, for 4 or
            # 5 precisions) and this rank's once per dtype to load its ops; the timing makes this rank's once more
            assert len(g["first"]["payload"]) == (3 + 1) * 2 + 1, (rank, g)
            # a later pass regenerates this rank's own payload once, for every contender's timing
            assert g["second"] == {"payload": g["second"]["payload"], "exact": []} and len(g["second"]["payload"]) == 1
            assert g["wrong"] == [0] * len(g["precisions"])
            assert all(0 < e < 0.2 for e in g["rel_err"])

    def stats(out: dict[str, Any]) -> list[Any]:
        return [(g["precisions"], g["wrong"], g["rel_err"]) for g in out["groups"]]

    assert stats(world[0]) == stats(world[1]) == stats(world[2])  # the statistics are the world's


def _big_float64_world(rank: int, n: int) -> dict[str, Any]:
    """Every float64 tensor of more than a block that one group's check allocates, by the op that made it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import commbench.measure.check as check
    import commbench.measure.payloads as payloads
    from commbench.cluster.launch import Dist, WorldInfo
    from commbench.core.suite import SuiteConfig
    from commbench.measure.collectives import get_collective
    from commbench.measure.sweep import GroupView, Sweep, contenders

    check._SLICE, payloads.BLOCK = 1000, 1024  # type: ignore[misc]  # many blocks and slices at a small size
    limit = 4 * 1024  # a block and its slack (a tail under 16, two periods of the check pattern): far below 24000
    d = Dist(
        info=WorldInfo(rank, n, rank, n, "127.0.0.1", 0, "local"), backend="gloo", device=torch.device("cpu"),
        host="h", hosts=("h",) * n, threads=1,
    )  # fmt: skip
    suite = SuiteConfig(collectives=["all_reduce"], precisions=["fp32", "bf16", "fp8_e4m3"], min_bytes=1, max_bytes=1)
    made: list[tuple[str, int]] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if not func.is_view and not func._schema.is_mutable:
                for t in out if isinstance(out, (list, tuple)) else [out]:
                    if isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.numel() > limit:
                        made.append((str(func), t.numel()))
            return out

    sweep = Sweep(suite, d)
    sg = sweep.subgroup("world")
    coll = get_collective("all_reduce")
    fp32_bytes = 4 * 12000 * n
    layout = sweep.layout(coll, fp32_bytes, n)
    assert layout is not None
    ops = [(p, p.make_op(coll, layout, sg.pg, d.device)) for p in contenders(suite.precisions, coll, "gloo")]
    with Record():
        checks = check.check_group(GroupView(d, sg), suite, coll, layout, ops, fp32_bytes)  # type: ignore[arg-type]
    return {"made": made, "numel": layout.output_numel, "wrong": [c.wrong for c in checks],
            "rel_err": [c.rel_err for c in checks], "names": [p.name for p, _ in ops]}  # fmt: skip


def test_a_group_check_allocates_no_full_size_float64_temporary() -> None:
    """The only float64 tensors larger than a block are the expectations themselves (empty, then filled): the
    check's exact and |x| ones, the error pass's exact and one "as given" per input dtype (float32, bfloat16);
    no whole input, no float64 copy of a result, no full-size bound or difference."""
    for out in run_in_world(_big_float64_world, nproc=2, timeout=300):
        assert out["names"] == ["fp32", "bf16", "fp8_e4m3", "fp32_chunked"]
        assert out["made"] == [("aten.empty.memory_format", out["numel"])] * 5, out["made"]
        assert out["wrong"] == [0, 0, 0, 0] and all(0 < e < 0.2 for e in out["rel_err"])
