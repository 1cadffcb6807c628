"""Pricing from the measured points (issue 25, item 5): interpolation between a curve's points checked against values
computed here by hand, a published nccl-tests log of a real cluster priced at its own sizes (the log's numbers read
here from its text, independently of the importer), extrapolation that warns, the command named for a missing
measurement, and the model file keeping the points."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from commbench.planning.costmodel import RESIDUAL_WARN, measure_command
from commbench.planning.costmodel_io import model_from_dict, model_to_dict, read_model, write_model
from commbench.planning.fitting import fit
from commbench.planning.interpolate import Z95
from commbench.store.nccl_import import import_nccl_tests
from commbench.store.results import load

CLUSTERS = Path(__file__).parent / "data" / "clusters"
A3MEGA = CLUSTERS / "gcp_a3mega_2x8_h100_all_reduce.txt"
ROW_RE = re.compile(r"^\s*\d+\s+\d+\s+\w+\s+\w+\s+-?\d+\s")


def log_times_us(path: Path) -> dict[int, tuple[float, float]]:
    """size -> (out-of-place, in-place) time in us, read from the log's rows (columns 6 and 10 of nccl-tests)."""
    out = {}
    for ln in path.read_text().splitlines():
        if ROW_RE.match(ln):
            tok = ln.split()
            out[int(tok[0])] = (float(tok[5]), float(tok[9]))
    return out


def rows(sizes: list[int], times_us: list[float], ci_rel: float, n: int = 4) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "collective": "all_reduce", "precision": "fp32", "impl": "native", "backend": "gloo", "world_size": n,
            "nodes": 1, "size_bytes": sizes, "fp32_bytes": sizes, "time_us": times_us,
            "time_ci_low_us": [t * (1 - ci_rel) for t in times_us],
            "time_ci_high_us": [t * (1 + ci_rel) for t in times_us],
        }
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ by hand
def test_between_two_points_the_line_through_them_with_a_widened_interval() -> None:
    # A kinked curve (flat, then steep), as protocol switches make them; no alpha-beta line goes through it.
    sizes, t = [1024, 2048, 4096, 8192], [10.0, 10.0, 30.0, 50.0]
    model = fit(rows(sizes, t, ci_rel=0.1))
    p = model.predict("all_reduce", "fp32", world_size=4, nbytes=3072)
    assert p.source == "measured" and not p.warnings and not p.extrapolated
    assert "between the measured 2K and 4K" in p.reason
    assert p.time_s == pytest.approx(20e-6, rel=1e-12)  # 10 + (3072-2048)/(4096-2048) * (30-10)
    # leave-one-out: 2K from 1K and 4K (u = 1/3: 16.67 us), 4K from 2K and 8K (u = 1/3: 23.33 us)
    e2k = math.log(10.0 / (10.0 + (30.0 - 10.0) / 3))
    e4k = math.log(30.0 / (10.0 + (50.0 - 10.0) / 3))
    widen = Z95 * max(abs(e2k), abs(e4k)) * 1.0  # 4u(1-u) = 1 at mid-gap
    assert p.low_s == pytest.approx(20e-6 * 0.9 * math.exp(-widen), rel=1e-9)
    assert p.high_s == pytest.approx(20e-6 * 1.1 * math.exp(widen), rel=1e-9)
    assert (p.total_s, p.total_low_s, p.total_high_s) == (p.time_s, p.low_s, p.high_s)  # no codec
    # on a point: the point and its own interval, nothing widened
    q = model.predict("all_reduce", "fp32", world_size=4, nbytes=4096)
    assert (q.time_s, q.low_s, q.high_s) == pytest.approx((30e-6, 27e-6, 33e-6), rel=1e-12)
    assert q.reason == "measured at 4K (n=4 on 1 node)"


def test_a_curve_without_spread_takes_its_scatter_as_the_interval() -> None:
    # one row per size and no interval (an nccl-tests log with out-of-place times only): every price still has one
    sizes, t = [1024, 2048, 4096, 8192], [10.0, 10.0, 30.0, 50.0]
    df = rows(sizes, t, ci_rel=0.1).drop(columns=["time_ci_low_us", "time_ci_high_us"])
    p = fit(df).predict("all_reduce", "fp32", world_size=4, nbytes=2048)
    e2k = math.log(10.0 / (10.0 + (30.0 - 10.0) / 3))  # the inner points off their neighbours' line (as above)
    e4k = math.log(30.0 / (10.0 + (50.0 - 10.0) / 3))
    half = Z95 * math.sqrt((e2k**2 + e4k**2) / 2)
    assert p.time_s == pytest.approx(10e-6, rel=1e-12) and "no spread measured" in p.reason
    assert (p.low_s, p.high_s) == pytest.approx((10e-6 * math.exp(-half), 10e-6 * math.exp(half)), rel=1e-9)


def test_outside_the_points_the_fit_prices_and_warns() -> None:
    sizes, t = [1024, 2048, 4096, 8192], [10.0, 10.0, 30.0, 50.0]
    model = fit(rows(sizes, t, ci_rel=0.1))
    f = model.get("all_reduce", "fp32")
    big = model.predict("all_reduce", "fp32", world_size=4, nbytes=2**20)
    assert big.source == "fitted" and big.extrapolated
    # the fit's own formula: ring all_reduce on 4 ranks, 2(n-1) latency steps, 2(n-1)/n of the bytes
    assert big.time_s == pytest.approx(f.alpha_s * 6 + f.beta_s_per_byte * 2**20 * 1.5, rel=1e-12)
    assert (
        big.warnings[0]
        == "priced by the fitted ring model, not by measured points: size 1M outside the measured 1K..8K"
    )
    assert any("outside the fitted" in w for w in big.warnings)
    # another world size, inside the measured sizes: the n=4 points scaled by the ring formula's ratio, whose
    # bounds are those of pure latency (2(n-1) steps: 14/6) and pure bandwidth (2(n-1)/n: 1.75/1.5)
    other = model.predict("all_reduce", "fp32", world_size=8, nbytes=4096)
    ratio = (f.alpha_s * 14 + f.beta_s_per_byte * 4096 * 1.75) / (f.alpha_s * 6 + f.beta_s_per_byte * 4096 * 1.5)
    assert other.source == "scaled" and other.extrapolated  # a world size outside the measured ones
    assert other.time_s == pytest.approx(30e-6 * ratio, rel=1e-12)
    assert (other.low_s, other.high_s) == pytest.approx((27e-6 * 1.75 / 1.5, 33e-6 * 14 / 6), rel=1e-12)
    assert other.warnings[0].startswith(
        "n=8 was not measured: the n=4 on 1 node points (measured at 4K) scaled by the ring formula"
    )
    assert "world size 8 outside the fitted 4 (ring formula)" in other.warnings
    # the kink misses any line: worst residual of the fit, computed here from its parameters
    worst = max(
        abs(ti * 1e-6 / (f.alpha_s * 6 + f.beta_s_per_byte * s * 1.5) - 1) for s, ti in zip(sizes, t, strict=True)
    )
    assert worst > RESIDUAL_WARN
    assert any(w.startswith("the fit misses its own points by up to") for w in big.warnings)


def test_a_fit_within_its_residual_bound_does_not_warn_about_it() -> None:
    sizes = [2**k for k in range(10, 20, 2)]
    t = [40.0 * 6 + s * 1.5 / 5e3 for s in sizes]  # exact ring all_reduce on 4 ranks: alpha 40 us, 5 GB/s
    p = fit(rows(sizes, t, ci_rel=0.02)).predict("all_reduce", "fp32", world_size=4, nbytes=2**22)
    assert p.source == "fitted" and not any("misses its own points" in w for w in p.warnings)


# ------------------------------------------------------------------------------------------------ a real cluster
@pytest.fixture(scope="module")
def a3mega(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    run = tmp_path_factory.mktemp("a3mega") / "run"
    import_nccl_tests(A3MEGA, run)
    return load(run)


def test_a_published_log_is_priced_from_its_own_points(a3mega: pd.DataFrame) -> None:
    log = log_times_us(A3MEGA)
    assert len(log) == 31 and set(a3mega["world_size"]) == {16} and set(a3mega["nodes"]) == {2}
    model = fit(a3mega)
    for size, (oop, ip) in log.items():
        p = model.predict("all_reduce", "fp32", world_size=16, nbytes=size, nodes=2)
        assert p.source == "measured" and not p.warnings
        assert p.time_s == pytest.approx((oop + ip) / 2 * 1e-6, rel=1e-12)  # median of the two placements
        assert (p.low_s, p.high_s) == pytest.approx((min(oop, ip) * 1e-6, max(oop, ip) * 1e-6), rel=1e-12)
    # a DDP bucket of 25 MiB lies between the log's 16 MiB and 32 MiB rows: on the line through them
    lo, hi = (sum(log[2**24]) / 2, sum(log[2**25]) / 2)
    p = model.predict("all_reduce", "fp32", world_size=16, nbytes=25 * 2**20, nodes=2)
    assert p.time_s == pytest.approx((lo + (hi - lo) * (25 - 16) / (32 - 16)) * 1e-6, rel=1e-12)
    assert p.low_s < p.time_s < p.high_s


def test_held_out_sizes_of_a_real_log_beat_the_alpha_beta_fit(a3mega: pd.DataFrame) -> None:
    # fit on every other size (8 B, 32 B, ..., 8 GiB), price the sizes left out from the points kept
    log = log_times_us(A3MEGA)
    sizes = sorted(log)
    kept, held = sizes[::2], sizes[1::2]
    model = fit(a3mega[a3mega["size_bytes"].isin(kept)])
    f = model.get("all_reduce", "fp32")
    err_points, err_fit = [], []
    for s in held:
        truth = sum(log[s]) / 2 * 1e-6
        p = model.predict("all_reduce", "fp32", world_size=16, nbytes=s, nodes=2)
        assert p.source == "measured"
        err_points.append(abs(p.time_s / truth - 1))
        err_fit.append(abs((f.alpha_s * 30 + f.beta_s_per_byte * s * 30 / 16) / truth - 1))  # ring, n = 16
    assert np.median(err_points) < np.median(err_fit) and max(err_points) < max(err_fit)


def test_a_real_log_warns_outside_its_sizes_world_and_nodes(a3mega: pd.DataFrame) -> None:
    model = fit(a3mega)
    f = model.get("all_reduce", "fp32")
    big = model.predict("all_reduce", "fp32", world_size=16, nbytes=2**34, nodes=2)
    assert big.source == "fitted" and big.extrapolated
    assert "size 16G outside the measured 8..8G" in big.warnings[0]
    # 32 ranks on 4 nodes: the log's 16-rank points at that size, scaled by the ring formula (the per-node link
    # carries the same bus bytes per rank; latency steps 2(n-1), bandwidth factor 2(n-1)/n)
    log = log_times_us(A3MEGA)
    s = 2**25
    wider = model.predict("all_reduce", "fp32", world_size=32, nbytes=s, nodes=4)
    assert wider.source == "scaled" and wider.extrapolated
    assert wider.warnings[0].startswith(
        "n=32 on 4 nodes was not measured: the n=16 on 2 nodes points (measured at 32M) scaled by the ring formula"
    )
    assert any("world size 32 outside the fitted 16" in w for w in wider.warnings)
    ratio = (f.alpha_s * 62 + f.beta_s_per_byte * s * 62 / 32) / (f.alpha_s * 30 + f.beta_s_per_byte * s * 30 / 16)
    assert wider.time_s == pytest.approx(sum(log[s]) / 2 * 1e-6 * ratio, rel=1e-12)
    bw, lat = (62 / 32) / (30 / 16), 62 / 30
    assert (wider.low_s, wider.high_s) == pytest.approx((min(log[s]) * 1e-6 * bw, max(log[s]) * 1e-6 * lat), rel=1e-12)
    # the line misses the log's own points by far more than 20 % (computed from the log here): said where it prices
    worst = max(abs(sum(v) / 2e6 / (f.alpha_s * 30 + f.beta_s_per_byte * s * 30 / 16) - 1) for s, v in log.items())
    assert worst > RESIDUAL_WARN
    assert any("the fit misses its own points by up to" in w for w in big.warnings)
    assert "# warning all_reduce/fp32/world: the fit misses its own points by up to" in model.format_summary()


# ------------------------------------------------------------------------------------------------ missing
def test_a_missing_measurement_is_named_with_the_command_that_measures_it(a3mega: pd.DataFrame) -> None:
    model = fit(a3mega)
    msg = model.missing_measurement("all_reduce", "bf16", nodes=2, gpus_per_node=8, fp32_bytes=25 * 2**20)
    assert msg == (
        "no measurement of all_reduce/bf16 on the world group (the model has all_reduce/fp32/world); measure it: "
        "torchrun --nnodes 2 --nproc-per-node 8 -m commbench run --collectives all_reduce --precisions bf16 "
        "--groups world -b 8M -e 64M"
    )  # 25 MiB lies between 16 and 32 MiB: one power of two more each side
    # wire bytes of bf16 are half the fp32 tensor's: 1 MiB on the wire is the 2 MiB fp32 tensor run -b/-e take
    assert measure_command("all_reduce", "bf16", nbytes=2**20, gpus_per_node=2).endswith(
        "run --nproc 2 --collectives all_reduce --precisions bf16 --groups world -b 1M -e 4M"
    )
    # a collective commbench does not run (nccl-tests' hypercube): nccl-tests does, and its log imports
    b = model.missing_measurement("hypercube", "fp32", nodes=2, gpus_per_node=8)
    assert "commbench does not run hypercube" in b and "hypercube_perf -d float" in b
    assert "python -m commbench import nccl-tests LOG --out RUN_DIR" in b


# ------------------------------------------------------------------------------------------------ file
def test_the_model_file_keeps_the_points_and_an_old_file_says_it_has_none(tmp_path: Path) -> None:
    sizes, t = [1024, 2048, 4096, 8192], [10.0, 10.0, 30.0, 50.0]
    model = fit(rows(sizes, t, ci_rel=0.1))
    back = read_model(write_model(model, tmp_path / "m.json"))
    assert back.measured == model.measured and back.points_kept
    a = model.predict("all_reduce", "fp32", world_size=4, nbytes=3000)
    b = back.predict("all_reduce", "fp32", world_size=4, nbytes=3000)
    assert (a.time_s, a.low_s, a.high_s, a.source) == (b.time_s, b.low_s, b.high_s, b.source)
    d = model_to_dict(model)
    old = {k: v for k, v in d.items() if k != "measured"} | {"schema_version": 3}
    v3 = model_from_dict(json.loads(json.dumps(old)), "old.json")
    assert not v3.points_kept and not v3.measured
    p = v3.predict("all_reduce", "fp32", world_size=4, nbytes=3000)
    assert p.source == "fitted" and "keeps no measured points (cost-model schema < 4)" in p.warnings[0]
    bad = d | {"measured": [d["measured"][0] | {"sizes": [2.0, 1.0, 3.0, 4.0]}]}
    with pytest.raises(ValueError, match=r"^bad\.json is malformed: ValueError: a measured curve's sizes"):
        model_from_dict(bad, "bad.json")
