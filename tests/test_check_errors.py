"""The check inputs, ``comm_rel_err`` (the error the communication adds) and the absence of host
synchronisations in the timed phases (what a CUDA graph capture, ``-G``, also needs), on one spawned 2-rank gloo
world, for the four ring collectives and the rooted and point-to-point ones.

References: torch's own casts for exactness; a lossless collective must add exactly 0; a device-to-host read
is ``aten._local_scalar_dense`` (``.item()``, ``bool()``, ``float()``) or ``aten.nonzero`` (boolean indexing),
which a TorchDispatchMode sees on CPU as it would on a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.distutil import run_in_world

FP8 = ["fp8_e4m3", "fp8_e4m3:block32", "fp8_e4m3:none", "fp8_e5m2", "fp8_e5m2:block128", "fp8_e5m2:none"]
ALL = ["fp32", "fp16", "bf16", "fp16_compress", "bf16_compress", *FP8]
COLLS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
ROOTED = ["broadcast", "reduce", "gather", "scatter", "sendrecv", "pp_sendrecv"]
"""The collectives of issue 33, with root 1 (not the default), at the precisions of each kind."""
ROOTED_PRECS = ["fp32", "bf16", "bf16_compress", "fp8_e4m3", "fp8_e5m2:block128", "fp8_e4m3:none"]
PAIRS = [(p, c) for p in ALL for c in COLLS] + [(p, c) for p in ROOTED_PRECS for c in ROOTED]


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_exact_inputs_exact_in_every_format_with_distinct_chunk_scales(n: int) -> None:
    from commbench.measure.payloads import exact_inputs

    numel = 16 * 64
    xs = [exact_inputs(numel, r) for r in range(n)]
    total = torch.stack(xs).sum(0)
    for x in [*xs, total]:
        for dt in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float16, torch.bfloat16):
            assert torch.equal(x.to(dt).to(torch.float64), x), dt
    assert bool((total != 0).any()) and bool((total != -total).any())  # a negated or zeroed sum shows
    # every per-destination chunk of rank 1 has another power-of-two scale than its neighbour somewhere,
    # and rank 0 another one than rank 1 (a rotated or misapplied scale shows)
    m = numel // n

    def scale_exp(t: torch.Tensor) -> int:
        return int(torch.ceil(torch.log2(t.abs().max() / 448.0)))

    exps = [scale_exp(xs[1][i * m : (i + 1) * m]) for i in range(n)]
    assert len(set(exps)) > 1
    assert scale_exp(xs[0]) != scale_exp(xs[1])
    blocks = {scale_exp(xs[1][i : i + 32]) for i in range(0, numel, 32)}
    assert len(blocks) > 1


def test_native_fp8_scale_pieces_match_per_element_index() -> None:
    from commbench.measure.fp8_ops import _scale_pieces

    for start, n, run in [(0, 10, 4), (3, 10, 4), (5, 3, 8), (0, 8, 8), (7, 100, 16), (64, 64, 128)]:
        idx = torch.empty(n, dtype=torch.long)
        for lo, hi, block, k in _scale_pieces(start, n, run):
            idx[lo:hi] = torch.arange(block, block + k).repeat_interleave(run) if k else block
        assert torch.equal(idx, torch.arange(start, start + n) // run)


def _world(rank: int, n: int) -> dict[str, Any]:
    from torch.utils._python_dispatch import TorchDispatchMode

    from commbench.cluster.launch import Dist, WorldInfo
    from commbench.core.suite import SuiteConfig
    from commbench.measure import fp8
    from commbench.measure.check import check_point
    from commbench.measure.collectives import get_collective
    from commbench.measure.precision import get_precision

    d = Dist(
        info=WorldInfo(rank, n, rank, n, "127.0.0.1", 0, "local"), backend="gloo", device=torch.device("cpu"),
        host="h", hosts=("h",) * n, threads=1,
    )  # fmt: skip
    suite = SuiteConfig(collectives=COLLS + ROOTED, precisions=ALL)
    out: dict[str, Any] = {"err": {}, "sync": []}
    total = 3 * 4096
    def points() -> Any:
        """(precision name, collective name, precision, collective, layout, a fresh op) over PAIRS."""
        for pname, cname in PAIRS:
            prec = get_precision(pname)
            coll = get_collective(cname).configured(root=1)
            layout = coll.layout(coll.round_total(total, n), n)
            yield pname, cname, prec, coll, layout, prec.make_op(coll, layout, None, d.device)

    for pname, cname, prec, coll, layout, op in points():
        chk = check_point(d, suite, coll, prec, layout, op, total * 4)
        out["err"][(pname, cname)] = (chk.rel_err, chk.comm_rel_err, chk.wrong)

    forbidden = {
        torch.ops.aten._local_scalar_dense.default,
        torch.ops.aten.is_nonzero.default,
        torch.ops.aten.nonzero.default,
        torch.ops.aten.item.default,
    }

    masked = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default}

    class NoHostSync(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func in forbidden:
                self.seen.append(str(func))
            elif func in masked and any(i is not None and i.dtype == torch.bool for i in args[1]):
                self.seen.append(f"{func} with a boolean mask (nonzero on a GPU)")
            return func(*args, **(kwargs or {}))

    from commbench.cli.orchestrate import agree_fp8_codec

    out["agreed"] = agree_fp8_codec(d)
    fp8.use_kernel(rank == 0)  # rank 1 falls back to the torch codec
    try:
        agree_fp8_codec(d)
    except ValueError as e:
        out["disagree"] = str(e)
    fp8.use_kernel(True)

    control = NoHostSync()
    with control:  # the mode must see what it is meant to catch
        bool(torch.ones(2).sum() > 1), torch.ones(1).item(), torch.arange(4)[torch.arange(4) > 1]
    out["control"] = sorted(set(control.seen))

    x = torch.randn(total, generator=torch.Generator().manual_seed(rank))
    x[5] = float("inf")  # non-finite values take no other (synchronising) path
    x[7] = float("nan")
    for kernel in (True, False):
        fp8.use_kernel(kernel)
        for pname, cname, prec, _, layout, op in points():
            op.load(x[: layout.input_numel].to(prec.input_dtype))
            op.encode(), op.comm(), op.decode()  # warm: first-call costs are not timed either
            mode = NoHostSync()
            with mode:
                for _ in range(2):
                    op.encode()
                    op.comm()
                    op.decode()
            if mode.seen:
                out["sync"].append((kernel, pname, cname, sorted(set(mode.seen))))
    fp8.use_kernel(True)
    return out


@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    return run_in_world(_world, nproc=2, timeout=600)[0]


def test_comm_rel_err_zero_for_lossless_collectives(world: dict[str, Any]) -> None:
    err = world["err"]
    moving = [(p, c) for p in ("fp32", "fp16", "bf16") for c in ("all_gather", "all_to_all")]
    moving += [(p, c) for p in ("fp32", "bf16") for c in ROOTED if c != "reduce"]
    for p, c in moving:
        rel, comm, wrong = err[(p, c)]
        assert comm == 0.0, (p, c)  # moving bytes adds nothing
        assert wrong == 0
    assert err[("fp32", "reduce")][1] < 1e-6  # a reduction at the root adds fp32 rounding only
    # the total error of fp32 is the input rounding alone (float64 payload -> float32), not 0
    assert 0 < err[("fp32", "all_gather")][0] < 1e-7
    # a reduction in fp32 adds fp32 rounding, far below the input rounding of bf16
    assert err[("fp32", "all_reduce")][1] < 1e-6


def test_comm_rel_err_separates_native_from_cast(world: dict[str, Any]) -> None:
    err = world["err"]
    for c in COLLS + ROOTED:
        native_comm = err[("bf16", c)][1]
        cast_total = err[("bf16_compress", c)][0]
        assert native_comm < cast_total, c
        # the cast's loss happens on the way: its comm_rel_err is its total (its input is fp32)
        assert err[("bf16_compress", c)][1] == pytest.approx(cast_total, rel=0.05)
    for p, c in PAIRS:
        if p.startswith("fp8"):
            rel, comm, wrong = err[(p, c)]
            assert wrong == 0 and comm > 0 and comm == pytest.approx(rel, rel=0.05), (p, c)


def test_no_host_sync_in_timed_phases(world: dict[str, Any]) -> None:
    assert any("_local_scalar_dense" in s for s in world["control"]) and any("boolean mask" in s for s in world["control"])
    assert world["sync"] == []


def test_fp8_codec_recorded_and_ranks_must_agree(world: dict[str, Any]) -> None:
    assert world["agreed"].startswith(("kernel (", "torch ("))
    msg = world.get("disagree", "")
    assert "ranks disagree on the fp8 codec" in msg and "rank(s) 1: torch (" in msg and "\n" not in msg
