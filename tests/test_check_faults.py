"""Faults injected into the received wire buffers must show as ``wrong > 0``.

Each case runs the sweep's correctness pass (:func:`commbench.measure.check.check_point`) with a hook that edits the
bytes the op received, between ``comm`` and ``decode``: one flipped code bit, every scale x1.1 or x0.8, two
chunks' codes swapped (scales left in place: a misrouted chunk), scales rotated between chunks, one chunk
zeroed, every sign bit flipped (a negated result). Every fp8 precision (e4m3/e5m2 x tensor/block/none) and the
cast precisions, every collective, at 2, 3 and 4 ranks (8 too in the printed table; one spawned world per size
runs every case).

The expectations are independent of the code under test: a fault that changes what arrives must change the
result, and the check inputs are exact in every format, so the unfaulted run must give 0 wrong. Two cases
cannot change the result by arithmetic alone and are asserted to stay 0: a scale fault where no scale travels
(``none`` scaling, casts), and swapping two whole contributions of a sum that carries no scales.

The collectives of issue 33 (broadcast, reduce, gather, scatter, sendrecv, pp_sendrecv, with the root on the last
rank) and the reduction ops max and prod run the same faults in one more world of 3 ranks.

``python -m tests.test_check_faults`` prints the table of what each fault gave at each world size.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
import torch

from tests.distutil import run_in_world

FP8 = ["fp8_e4m3", "fp8_e4m3:block32", "fp8_e4m3:none", "fp8_e5m2", "fp8_e5m2:block128", "fp8_e5m2:none"]
CAST = ["fp16_compress", "bf16_compress"]
COLLS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
TOTAL = 8 * 3 * 64  # elements: a multiple of every world size tested (no padding, equal chunks)
WORLDS = [2, 3, 4, 8]
"""The sizes of the printed table (``python -m tests.test_check_faults``); the test runs those of 2 to 4 ranks (8
ranks on a 2-core CI machine take 40 s: the table shows them)."""
TEST_WORLDS = [n for n in WORLDS if n <= 4]
NA = -1
"""Table entry of a fault that has nothing to act on (a scale fault where no scale travels)."""


def _scaled(chunks: list, fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Replace every chunk's travelling scales by ``fn(scales)``; False when no scale travels."""
    if any(c.scales is None for c in chunks):
        return False
    for c in chunks:
        vals = c.scales.clone().view(torch.float32)
        c.scales.copy_(fn(vals).view(torch.uint8))
    return True


def _flip_bit(chunks: list) -> bool:
    # byte 0 of a little-endian element holds its lowest mantissa bit (fp8, fp16 and bf16 alike)
    chunks[0].codes[0:1].bitwise_xor_(1)
    return True


def _swap(chunks: list) -> bool:
    if len(chunks) < 2:  # one chunk (a broadcast's or a send's codec wire): nothing to swap it with
        return False
    a, b = chunks[0].codes, chunks[1].codes
    k = min(a.numel(), b.numel())
    tmp = a[:k].clone()
    a[:k].copy_(b[:k])
    b[:k].copy_(tmp)
    return True


def _rotate_scales(chunks: list) -> bool:
    if len(chunks) < 2 or any(c.scales is None for c in chunks):
        return False
    saved = [c.scales.clone() for c in chunks]
    for i, c in enumerate(chunks):
        c.scales.copy_(saved[(i + 1) % len(chunks)])
    return True


def _zero(chunks: list) -> bool:
    chunks[0].codes.zero_()
    return True


def _negate(chunks: list) -> bool:
    for c in chunks:
        # the sign bit is the top bit of an element's last (most significant) byte
        c.codes.view(-1, c.element_bytes)[:, -1].bitwise_xor_(0x80)
    return True


FAULTS: dict[str, Callable[[list], bool]] = {
    "flip_bit": _flip_bit,
    "scale_x1.1": lambda ch: _scaled(ch, lambda s: s * 1.1),
    "scale_x0.8": lambda ch: _scaled(ch, lambda s: s * 0.8),
    "swap_chunks": _swap,
    "rotate_scales": _rotate_scales,
    "zero_chunk": _zero,
    "negate": _negate,
}


NOOP = -2
"""Table entry of a fault that cannot change the result (and gave 0 wrong): two whole contributions of a sum
swapped where no scale travels."""


def _world(
    rank: int, n: int, colls: list[str] = COLLS, precs: list[str] = FP8 + CAST, root: int = 0, redop: str = "sum"
) -> dict[tuple[str, str, str], int]:
    from commbench.cluster.launch import Dist, WorldInfo
    from commbench.core.suite import SuiteConfig
    from commbench.measure.check import check_point
    from commbench.measure.collectives import get_collective
    from commbench.measure.precision import get_precision

    assert sys.byteorder == "little"
    d = Dist(
        info=WorldInfo(rank, n, rank, n, "127.0.0.1", 0, "local"),
        backend="gloo",
        device=torch.device("cpu"),
        host="h",
        hosts=("h",) * n,
        threads=1,
    )
    suite = SuiteConfig(collectives=colls, precisions=precs)
    out: dict[tuple[str, str, str], int] = {}
    for pname in precs:
        prec = get_precision(pname)
        for cname in colls:
            coll = get_collective(cname).configured(root=root, op=redop)
            layout = coll.layout(coll.round_total(TOTAL, n), n)
            op = prec.make_op(coll, layout, None, d.device)
            for fault, fn in {"none": None, **FAULTS}.items():
                seen: dict[str, bool] = {"applied": True, "scales": True}

                def hook(o: object, fn: Callable[[list], bool] | None = fn, seen: dict[str, bool] = seen) -> None:
                    chunks = o.received()  # type: ignore[attr-defined]
                    seen["scales"] = chunks[0].scales is not None
                    if fn is not None:
                        seen["applied"] = fn(chunks)

                chk = check_point(d, suite, coll, prec, layout, op, TOTAL * 4, after_comm=hook)
                noop = fault == "swap_chunks" and coll.reduces and not seen["scales"]
                if not seen["applied"]:
                    out[(pname, cname, fault)] = NA if chk.wrong == 0 else chk.wrong
                elif noop:
                    out[(pname, cname, fault)] = NOOP if chk.wrong == 0 else chk.wrong
                else:
                    out[(pname, cname, fault)] = chk.wrong
    return out


_cache: dict[int, dict[tuple[str, str, str], int]] = {}


def _results(n: int) -> dict[tuple[str, str, str], int]:
    if n not in _cache:
        _cache[n] = run_in_world(_world, nproc=n, timeout=900)[0]
    return _cache[n]


@pytest.mark.parametrize("n", TEST_WORLDS)
def test_fault_injected_into_wire_is_counted_wrong(n: int) -> None:
    res = _results(n)
    missed = []
    for (prec, coll, fault), wrong in res.items():
        if fault == "none":
            assert wrong == 0, f"{prec} {coll} without a fault at {n} ranks: {wrong} wrong"
        elif wrong == 0:
            missed.append(f"{prec} {coll} {fault}")
    assert not missed, f"faults not detected at {n} ranks: {missed}"
    # scale faults act wherever scales travel
    for prec in FP8:
        if not prec.endswith(":none"):
            assert all(res[(prec, c, "scale_x1.1")] > 0 for c in COLLS)
    print("\n" + fault_table({n: res}))


ROOTED = ["broadcast", "reduce", "gather", "scatter", "sendrecv", "pp_sendrecv"]
"""The collectives of issue 33, with the root on the last rank (not the default 0), so a root read as 0 shows."""
ROOTED_PRECS = ["fp32", "bf16_compress", "fp8_e4m3", "fp8_e5m2:block32", "fp8_e4m3:none"]
REDUCING = ["all_reduce", "reduce_scatter", "reduce"]
OPS = ["max", "prod"]
"""Reduction ops other than sum, on the native and cast precisions (codecs sum only)."""


def _world_rooted(rank: int, n: int) -> dict[tuple[str, str, str], int]:
    """One spawned world for the rooted and point-to-point collectives and for the other reduction ops."""
    out = _world(rank, n, ROOTED, ROOTED_PRECS, root=n - 1)
    for op in OPS:
        got = _world(rank, n, REDUCING, ["fp32", "bf16_compress"], root=n - 1, redop=op)
        out.update({(p, f"{c}:{op}", f): w for (p, c, f), w in got.items()})
    return out


_rooted_cache: dict[int, dict[tuple[str, str, str], int]] = {}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [3])  # 3 ranks: a root that is neither 0 nor 1, a pipeline chain of two pairs
def test_fault_in_rooted_and_p2p_collectives_is_counted_wrong(n: int) -> None:
    if n not in _rooted_cache:
        _rooted_cache[n] = run_in_world(_world_rooted, nproc=n, timeout=280)[0]
    res = _rooted_cache[n]
    assert {c for _, c, _ in res} == set(ROOTED) | {f"{c}:{op}" for c in REDUCING for op in OPS}
    clean = {k: w for k, w in res.items() if k[2] == "none" and w != 0}
    assert not clean, f"wrong elements without a fault at {n} ranks: {clean}"
    missed = [k for k, w in res.items() if k[2] != "none" and w == 0]
    assert not missed, f"faults not detected at {n} ranks: {missed}"
    # the faults every wire can carry act on every collective: one flipped bit, a zeroed chunk, every sign
    for fault in ("flip_bit", "zero_chunk", "negate"):
        assert all(w > 0 for (p, c, f), w in res.items() if f == fault)
    # a scale that travels is read: every scaled fp8 codec's scale fault is counted on every collective
    assert all(res[(p, c, "scale_x1.1")] > 0 for p in ("fp8_e4m3", "fp8_e5m2:block32") for c in ROOTED)
    print("\n" + fault_table({n: res}))


def fault_table(results: dict[int, dict[tuple[str, str, str], int]]) -> str:
    """wrong per (precision, collective, fault) and world size; '-' where the fault has nothing to act on
    (no scale travels), 'no-op' where it cannot change the result."""
    sizes = sorted(results)
    keys = sorted({k for r in results.values() for k in r}, key=lambda k: (k[0], k[1], k[2]))
    head = f"{'precision':<18} {'collective':<15} {'fault':<14}" + "".join(f" {'n=' + str(s):>7}" for s in sizes)
    lines = [head]
    for k in keys:
        cells = []
        for s in sizes:
            w = results[s].get(k)
            text = {NA: "-", NOOP: "no-op", None: ""}.get(w, str(w))
            cells.append(f" {text:>7}")
        lines.append(f"{k[0]:<18} {k[1]:<15} {k[2]:<14}" + "".join(cells))
    return "\n".join(lines)


if __name__ == "__main__":
    print(fault_table({n: _results(n) for n in WORLDS}))
