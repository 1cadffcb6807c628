"""Native fp8 never kills a run (issue 22, item 3): the probe runs once per (dtype, group) on every rank, its
outcome is agreed (any rank failing fails all), and a failed probe skips the precision everywhere with a note in
the console, the sweep's record for the metadata and the report, while the other precisions' rows complete.

Native fp8 needs NCCL; on gloo its static gate (``native_fp8_backend`` / ``_static_refusal``) is patched open
and the probe's collective (``_try_native``) replaced by an injected answer per rank."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest
import torch

from tests.distutil import run_in_world

PRECS = ["fp32", "bf16", "fp8_e4m3_native", "fp8_e4m3_native:block128", "fp8_e5m2_native"]


def _world(rank: int, n: int, fail_static: bool) -> dict[str, Any]:
    import commbench.measure.fp8_ops as ops
    from commbench.cluster.launch import Dist, WorldInfo
    from commbench.core.suite import SuiteConfig, TimingConfig
    from commbench.measure.sweep import Sweep

    probes: list[str] = []

    def try_native(dtype: torch.dtype, group: Any, device: Any) -> str | None:
        probes.append(str(dtype))
        return "injected refusal on rank 1" if rank == 1 else None

    ops.native_fp8_backend = lambda backend: True  # type: ignore[assignment]
    if fail_static:
        ops._static_refusal = lambda backend, device=None: "injected static refusal" if rank == 1 else None  # type: ignore[assignment]
    else:
        ops._static_refusal = lambda backend, device=None: None  # type: ignore[assignment]
    ops._try_native = try_native  # type: ignore[assignment]
    d = Dist(
        info=WorldInfo(rank, n, rank, n, "127.0.0.1", 0, "local"), backend="gloo", device=torch.device("cpu"),
        host="h", hosts=("h",) * n, threads=1,
    )  # fmt: skip
    suite = SuiteConfig(
        collectives=["all_reduce", "reduce_scatter", "all_gather"], precisions=PRECS, min_bytes=1 << 12,
        max_bytes=1 << 14, factor=4, timing=TimingConfig(warmup=1, min_time_s=0.0005, min_iters=1, repeats=2, max_iters=2),
    )  # fmt: skip
    sweep = Sweep(suite, d)
    planned = [(g.collective.name, g.fp32_bytes, [pt.precision.name for _, pt in g.points]) for g in sweep.groups()]
    printed = io.StringIO()
    rows = []
    with contextlib.redirect_stdout(printed):
        for g in sweep.groups():
            rows += [(r.collective, r.fp32_bytes, r.precision, r.wrong) for _, r in sweep.run_group(g)]
    import pandas as pd

    from commbench.views.findings import pitfalls
    from commbench.views.rundata import RunData

    notes = pitfalls(RunData(run_dir=None, results=pd.DataFrame(), metadata={"skipped": sweep.unavailable}))  # type: ignore[arg-type]
    return {"planned": planned, "rows": rows, "printed": printed.getvalue(), "unavailable": sweep.unavailable,
            "probes": probes, "notes": notes}  # fmt: skip


@pytest.fixture(scope="module", params=[False, True], ids=["probe_fails_on_rank1", "static_gate_fails_on_rank1"])
def world(request: pytest.FixtureRequest) -> tuple[bool, list[dict[str, Any]]]:
    return request.param, run_in_world(_world, nproc=2, timeout=300, fail_static=request.param)


def test_refused_on_one_rank_skipped_on_both_and_run_completes(world: tuple[bool, list[dict[str, Any]]]) -> None:
    fail_static, outs = world
    for out in outs:
        # the grid planned the native precisions for the reducing collectives (the gate was open) ...
        assert any("fp8_e4m3_native" in p for c, _, p in out["planned"] if c == "all_reduce")
        assert not any("fp8_e4m3_native" in p for c, _, p in out["planned"] if c == "all_gather")
        # ... every other point completed, with its rows, and no native row on either rank
        want = {(c, s, p) for c, s, ps in out["planned"] for p in ps if "native" not in p}
        assert {(c, s, p) for c, s, p, _ in out["rows"]} == want
        assert all(w == 0 for *_, w in out["rows"])
        assert {(e["precision"], e["collective"], e["group"]) for e in out["unavailable"]} == {
            (p, c, "world") for p in PRECS if "native" in p for c in ("all_reduce", "reduce_scatter")
        }
        why = "injected static refusal" if fail_static else "injected refusal on rank 1"
        for e in out["unavailable"]:
            assert "native fp8 all_reduce" in e["reason"] and "rank(s) 1: " + why in e["reason"]
        # probed once per fp8 dtype (e4m3 and its block128 option share it, every size and collective too);
        # with the static gate shut on one rank, no rank enters the fp8 all_reduce at all
        assert out["probes"] == ([] if fail_static else ["torch.float8_e4m3fn", "torch.float8_e5m2"])
    assert outs[0]["unavailable"] == outs[1]["unavailable"]
    # the note is printed once per (precision, collective, group), by rank 0 only
    lines = [ln for ln in outs[0]["printed"].splitlines() if ln.startswith("# skipped")]
    assert len(lines) == 6 and any(ln.startswith("# skipped all_reduce x fp8_e4m3_native: native fp8") for ln in lines)
    assert "# skipped" not in outs[1]["printed"]
    # and the report says it among its pitfalls
    assert sum("fp8_e5m2_native: skipped, native fp8 all_reduce" in s for s in outs[0]["notes"]) == 2


def test_native_gate_shut_on_gloo_and_cpu() -> None:
    from commbench.measure.collectives import get_collective
    from commbench.measure.fp8_ops import _static_refusal, native_fp8_available
    from commbench.measure.precision import get_precision

    assert native_fp8_available("gloo") is False
    assert "backend nccl" in (_static_refusal("gloo") or "")
    if not torch.cuda.is_available():
        assert native_fp8_available("nccl") is False and "CUDA" in (_static_refusal("nccl") or "")
    p = get_precision("fp8_e4m3_native")
    assert not p.supports(get_collective("all_reduce"), "gloo")
