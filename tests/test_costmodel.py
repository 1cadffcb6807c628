"""The fitted cost model against independent references: hand-computed ring/tree formulas, synthetic points drawn
from known alpha and beta, and exact predictions computed here from those parameters (never from the model's own
earlier output)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from commbench.measure.groups import GROUP_KINDS, GroupKind, register_group_kind
from commbench.planning import costmodel as cm
from commbench.planning.costmodel_io import SCHEMA_VERSION, model_to_dict, read_model, write_model
from commbench.planning.fitting import fit, main_fit, nnls2
from commbench.store.results import RunWriter

ALPHA = 40e-6  # s per latency step
BETA = 1.0 / 5e9  # s per byte: 5 GB/s bus bandwidth
SIZES = [2**k for k in range(16, 27, 2)]  # 64 KiB .. 64 MiB
WORLDS = [2, 4, 8]


def ring_time(coll: str, n: int, size: float, alpha: float = ALPHA, beta: float = BETA) -> float:
    # Written out per collective (not via cm.ALGORITHMS) so the test is an independent reference.
    if coll == "all_reduce":
        return alpha * 2 * (n - 1) + size * beta * 2 * (n - 1) / n
    return alpha * (n - 1) + size * beta * (n - 1) / n


def synth(
    coll: str = "all_reduce",
    precision: str = "fp32",
    *,
    worlds: list[int] = WORLDS,
    sizes: list[int] = SIZES,
    noise: float = 0.0,
    ci_rel: float | None = 0.02,
    seed: int = 0,
    wire_ratio: float = 1.0,
    encode: tuple[float, float] | None = None,
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for n in worlds:
        for s in sizes:
            wire = s * wire_ratio
            t = ring_time(coll, n, wire) * math.exp(noise * rng.standard_normal())
            row = {
                "collective": coll, "precision": precision, "impl": "native", "backend": "gloo",
                "world_size": n, "nodes": 1, "size_bytes": wire, "fp32_bytes": s, "time_us": t * 1e6,
                "encode_us": 0.0, "decode_us": 0.0, "cv": 0.1, "samples": 10,
            }  # fmt: skip
            if encode is not None:
                e = (coll == "all_gather" and 1.0 / n) or 1.0
                row["encode_us"] = encode[0] + encode[1] * s * e
            if ci_rel is not None:
                row["time_ci_low_us"] = t * 1e6 * (1 - ci_rel)
                row["time_ci_high_us"] = t * 1e6 * (1 + ci_rel)
            rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------ formulas
def test_ring_formulas_match_nccl_tests_bus_factors() -> None:
    ring = cm.ALGORITHMS["ring"]
    # nccl-tests busbw factors (DESIGN "Numbers"): all_reduce 2(n-1)/n, all_gather/reduce_scatter/all_to_all (n-1)/n
    assert ring.bandwidth_factor("all_reduce", 8) == pytest.approx(1.75)
    assert ring.bandwidth_factor("all_gather", 4) == pytest.approx(0.75)
    assert ring.bandwidth_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert ring.bandwidth_factor("all_to_all", 3) == pytest.approx(2 / 3)
    assert ring.bandwidth_factor("broadcast", 8) == 1.0
    assert ring.latency_steps("all_reduce", 8) == 14
    assert ring.latency_steps("all_gather", 8) == 7
    tree = cm.ALGORITHMS["tree"]
    assert tree.latency_steps("all_reduce", 8) == pytest.approx(6.0)  # 2 log2(8)
    assert tree.bandwidth_factor("all_reduce", 8) == 2.0
    assert tree.latency_steps("all_gather", 8) == 7  # falls back to ring


# ------------------------------------------------------------------------------------------------ recovery
@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_recovers_alpha_beta_from_noisy_points(coll: str) -> None:
    model = fit(synth(coll, noise=0.03, ci_rel=0.03 * 1.96))
    f = model.get(coll, "fp32")
    assert f.alpha_s == pytest.approx(ALPHA, rel=0.10)
    assert f.beta_s_per_byte == pytest.approx(BETA, rel=0.03)
    assert f.busbw_gbps == pytest.approx(5.0, rel=0.03)
    assert f.weighting == "ci"
    assert f.r2_log > 0.99
    assert f.comm.n_points == len(WORLDS) * len(SIZES)
    assert f.world_sizes == (2, 4, 8)
    assert (f.min_bytes, f.max_bytes) == (2**16, 2**26)


def test_noise_free_points_are_exact_and_residuals_kept() -> None:
    model = fit(synth("all_reduce", ci_rel=None))
    f = model.get("all_reduce", "fp32")
    assert f.alpha_s == pytest.approx(ALPHA, rel=1e-9)
    assert f.beta_s_per_byte == pytest.approx(BETA, rel=1e-9)
    assert f.weighting == "cv"  # no CI columns: falls back to cv
    r = model.residuals[model.residuals["term"] == "comm"]
    assert len(r) == 18
    assert np.allclose(r["ratio"], 1.0)
    assert abs(f.worst_rel_residual) < 1e-9


def test_prediction_at_new_world_size_follows_the_formula() -> None:
    model = fit(synth("all_reduce", ci_rel=None))
    for n, size in ((6, 2**22), (16, 2**24), (3, 2**20)):
        p = model.predict("all_reduce", "fp32", world_size=n, nbytes=size)
        assert p.time_s == pytest.approx(ring_time("all_reduce", n, size), rel=1e-9)
        assert p.total_s == pytest.approx(p.time_s)
        assert p.low_s <= p.time_s <= p.high_s


def test_interval_covers_truth_and_shrinks_with_less_noise() -> None:
    wide = fit(synth("all_gather", noise=0.10, ci_rel=0.2, seed=1)).predict(
        "all_gather", "fp32", world_size=4, nbytes=2**22
    )
    narrow = fit(synth("all_gather", noise=0.01, ci_rel=0.02, seed=1)).predict(
        "all_gather", "fp32", world_size=4, nbytes=2**22
    )
    truth = ring_time("all_gather", 4, 2**22)
    assert wide.low_s <= truth <= wide.high_s
    assert narrow.low_s <= truth <= narrow.high_s
    assert (narrow.high_s - narrow.low_s) < (wide.high_s - wide.low_s) / 3


def test_non_negative_parameters() -> None:
    # Pure bandwidth data with noise: unconstrained LS may give alpha < 0; the bound holds it at 0.
    df = synth("all_reduce", noise=0.05, ci_rel=0.1, seed=3)
    df["time_us"] = df["size_bytes"] * BETA * 2 * (df["world_size"] - 1) / df["world_size"] * 1e6
    df.loc[df["size_bytes"] == 2**16, "time_us"] *= 0.5  # pull the small-size end below the line
    f = fit(df).get("all_reduce", "fp32")
    assert f.alpha_s == 0.0 and f.comm.free == (False, True)
    assert f.beta_s_per_byte > 0
    lf = nnls2(np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]), np.array([3.0, 2.0, 1.0]), np.ones(3),
                  sigma_is_absolute=False)  # fmt: skip
    assert lf.params[1] == 0.0 and lf.params[0] == pytest.approx(2.0)  # decreasing data: slope clamped, mean left


# ------------------------------------------------------------------------------------------------ weights
def test_outlier_with_wide_ci_barely_moves_the_fit() -> None:
    base = synth("all_reduce", ci_rel=0.02)
    bad = base.copy()
    i = bad.index[(bad["world_size"] == 4) & (bad["size_bytes"] == 2**22)][0]
    bad.loc[i, "time_us"] *= 5.0
    wide = bad.copy()
    wide.loc[i, "time_ci_low_us"] = 0.0
    wide.loc[i, "time_ci_high_us"] = bad.loc[i, "time_us"] * 20
    f_wide = fit(wide).get("all_reduce", "fp32")
    f_narrow = fit(bad).get("all_reduce", "fp32")  # the outlier claims a +-2 % interval
    moved_wide = abs(f_wide.beta_s_per_byte / BETA - 1)
    moved_narrow = abs(f_narrow.beta_s_per_byte / BETA - 1)
    assert moved_wide < 1e-3 and f_wide.alpha_s == pytest.approx(ALPHA, rel=1e-3)
    assert moved_narrow > 0.01 and moved_narrow > 20 * moved_wide
    assert "4M n=4" in f_narrow.worst_where


def test_relative_weighting_when_no_uncertainty_columns() -> None:
    df = synth("all_reduce", ci_rel=None, noise=0.02).drop(columns=["cv", "samples"])
    f = fit(df).get("all_reduce", "fp32")
    assert f.weighting == "relative"
    assert f.beta_s_per_byte == pytest.approx(BETA, rel=0.05)


# ------------------------------------------------------------------------------------------------ extrapolation
def test_extrapolation_flags_say_which() -> None:
    model = fit(synth("all_reduce", worlds=[2, 4], ci_rel=None))
    inside = model.predict("all_reduce", "fp32", world_size=4, nbytes=2**20)  # a measured point prices itself
    assert not inside.extrapolated and inside.source == "measured" and not inside.warnings
    assert inside.reason == "measured at 1M (n=4 on 1 node)"
    interp = model.predict("all_reduce", "fp32", world_size=3, nbytes=2**20)
    assert not interp.extrapolated and "interpolated" in interp.reason and "world size 3" in interp.reason
    # n=3 was not measured: the nearest world's points (n=4) scaled by the ring formula, exact on exact points
    assert interp.source == "scaled" and interp.warnings[0].startswith(
        "n=3 was not measured: the n=4 on 1 node points (measured at 1M) scaled by the ring formula"
    )
    assert interp.time_s == pytest.approx(ring_time("all_reduce", 3, 2**20), rel=1e-9)
    big = model.predict("all_reduce", "fp32", world_size=4, nbytes=2**30)
    assert big.extrapolated and "size" in big.reason and "world size" not in big.reason
    small = model.predict("all_reduce", "fp32", world_size=2, nbytes=1024)
    assert small.extrapolated and "size 1024" in small.reason
    wide = model.predict("all_reduce", "fp32", world_size=64, nbytes=2**20)
    assert wide.extrapolated and "world size 64 outside the fitted 2,4" in wide.reason
    assert wide.source == "scaled" and "world size 64 outside the fitted 2,4 (ring formula)" in wide.warnings
    assert big.source == "fitted" and "size 1G outside the measured 64K..64M" in big.warnings[0]
    both = model.predict("all_reduce", "fp32", world_size=64, nbytes=2**30)
    assert both.extrapolated and "size" in both.reason and "world size 64" in both.reason


# ------------------------------------------------------------------------------------------------ sizes, codec
def test_fp32_bytes_and_wire_bytes_for_bf16() -> None:
    model = fit(synth("all_reduce", "bf16", wire_ratio=0.5, ci_rel=None))
    f = model.get("all_reduce", "bf16")
    assert f.wire_per_fp32 == 0.5
    a = model.predict("all_reduce", "bf16", world_size=4, fp32_bytes=2**22)
    b = model.predict("all_reduce", "bf16", world_size=4, nbytes=2**21)
    assert a.time_s == pytest.approx(b.time_s) and a.wire_bytes == 2**21 and b.fp32_bytes == 2**22
    assert a.time_s == pytest.approx(ring_time("all_reduce", 4, 2**21), rel=1e-9)


def test_codec_cost_per_byte_scaled_by_shard() -> None:
    c0, c1 = 15.0, 2e-4  # us, us per fp32 byte encoded
    model = fit(synth("all_gather", "fp8", ci_rel=None, wire_ratio=0.25, encode=(c0, c1)))
    f = model.get("all_gather", "fp8")
    assert f.encode is not None and f.decode is None
    assert f.encode.params[0] * 1e6 == pytest.approx(c0, rel=1e-6)
    assert f.encode.params[1] * 1e6 == pytest.approx(c1, rel=1e-6)
    p = model.predict("all_gather", "fp8", world_size=16, fp32_bytes=2**24)
    assert p.encode_s == pytest.approx((c0 + c1 * 2**24 / 16) * 1e-6, rel=1e-6)  # a rank encodes its 1/n shard
    assert p.total_s == pytest.approx(p.encode_s + p.time_s)
    assert p.total_low_s <= p.total_s <= p.total_high_s


# ------------------------------------------------------------------------------------------------ groups
def test_groups_fitted_separately() -> None:
    intra = synth("all_reduce", worlds=[2, 4], ci_rel=None).assign(group="intra")
    inter = synth("all_reduce", worlds=[2, 4], ci_rel=None).assign(group="inter")
    inter["time_us"] *= 10
    inter["group_size"] = inter["world_size"]
    inter["world_size"] = inter["world_size"] * 4
    model = fit([intra, inter])
    assert model.get("all_reduce", "fp32", "intra").alpha_s == pytest.approx(ALPHA, rel=1e-9)
    fi = model.get("all_reduce", "fp32", "inter")
    assert fi.alpha_s == pytest.approx(10 * ALPHA, rel=1e-9)
    assert fi.world_sizes == (2, 4)  # group_size, not world_size
    with pytest.raises(ValueError, match="no model for all_reduce/fp32/world"):
        model.predict("all_reduce", "fp32", world_size=4, nbytes=2**20)


# ------------------------------------------------------------------------------------------------ layouts
def link_points(nodes_list: list[int], gpn: int, group: str, share: int, coll: str = "all_reduce") -> pd.DataFrame:
    """Noise-free points of ``group`` on nodes x gpn ranks whose rings cross a link of BETA per byte shared by
    ``share`` groups: time = ALPHA*A(n) + share*S*BETA*B(n), n the group's ranks (one per node here)."""
    rows = []
    for nodes in nodes_list:
        for s in SIZES:
            n = nodes  # one rank per node in each group
            t = ring_time(coll, n, s, beta=share * BETA)
            rows.append({"collective": coll, "precision": "fp32", "backend": "gloo", "world_size": nodes * gpn,
                         "nodes": nodes, "group": group, "group_size": n, "size_bytes": s, "fp32_bytes": s,
                         "time_us": t * 1e6})  # fmt: skip
    return pd.DataFrame(rows)


def test_link_sharing_counts_the_groups_crossing_a_node_link() -> None:
    assert cm.link_sharing("world", 2, 2) == 1  # one ring: ranks of a node contiguous, one crossing each way
    assert cm.link_sharing("world", 3, 1) == 1
    assert cm.link_sharing("inter", 2, 2) == 2  # one group per local rank, each crossing every node's link
    assert cm.link_sharing("inter", 8, 8) == 8
    assert cm.link_sharing("intra", 4, 2) == 0  # within a node: no node link
    assert cm.link_sharing("world", 1, 8) == 0


def test_inter_node_share_is_the_ring_hops_between_nodes() -> None:
    # a flat ring over 4 nodes x 8 ranks placed node by node crosses nodes on 4 of its 32 hops
    assert cm.inter_node_share("world", 4, 8) == pytest.approx(4 / 32)
    assert cm.inter_node_share("world", 3, 1) == 1.0  # one rank per node: every hop crosses
    assert cm.inter_node_share("world", 1, 8) == 0.0
    assert cm.inter_node_share("intra", 4, 8) == 0.0
    assert cm.inter_node_share("inter", 4, 8) == 1.0


class _Parity(GroupKind):
    """Even ranks and odd ranks: a kind the cost model has never heard of."""

    name = "parity"
    description = "even ranks, odd ranks"

    def partition(self, hosts: Sequence[str]) -> list[list[int]]:
        return [list(range(0, len(hosts), 2)), list(range(1, len(hosts), 2))]


def test_a_new_group_kind_needs_nothing_in_the_cost_model() -> None:
    register_group_kind(_Parity())
    try:
        # 2 nodes x 4 ranks (hosts 0 0 0 0 1 1 1 1): [0, 2, 4, 6] and [1, 3, 5, 7] both span the two nodes, and
        # each ring (0->2->4->6->0) crosses nodes on 2 of its 4 hops
        assert cm.link_sharing("parity", 2, 4) == 2
        assert cm.inter_node_share("parity", 2, 4) == 0.5
        assert cm.link_sharing("parity", 1, 4) == 0 and cm.inter_node_share("parity", 1, 4) == 0.0
        model = fit(synth("all_gather", ci_rel=None, worlds=[2, 4]).assign(group="parity"))
        assert model.get("all_gather", "fp32", "parity").alpha_s == pytest.approx(ALPHA, rel=1e-9)
    finally:
        GROUP_KINDS.unregister("parity")


def test_one_rank_per_node_fit_predicts_other_layouts_by_the_link_rule() -> None:
    model = fit(link_points([2, 3], 1, "world", 1))
    f = model.get("all_reduce", "fp32")
    assert f.link_shares == (1,) and f.crosses_nodes is True
    s = 4 * 2**20
    # flat ring over 4 nodes x 2 ranks: n = 8, the node link carries S*2(n-1)/n each way at BETA per byte
    w = model.predict("all_reduce", "fp32", world_size=8, nbytes=s, nodes=4)
    assert w.time_s == pytest.approx(ALPHA * 14 + s * BETA * 14 / 8, rel=1e-9)
    assert w.extrapolated and "world size 8 outside" in w.reason
    # 2 concurrent inter groups of 2 nodes (2 x 2 layout): each gets half the link
    i = model.predict("all_reduce", "fp32", world_size=2, nbytes=s, nodes=2, concurrent=2)
    assert i.time_s == pytest.approx(ALPHA * 2 + 2 * s * BETA * 1.0, rel=1e-9)
    assert i.extrapolated and "shared by 2 group(s), fitted 1..1" in i.reason
    same = model.predict("all_reduce", "fp32", world_size=3, nbytes=s, nodes=3)
    assert not same.extrapolated and same.time_s == pytest.approx(ring_time("all_reduce", 3, s), rel=1e-9)
    one = model.predict("all_reduce", "fp32", world_size=2, nbytes=s, nodes=1, concurrent=4)
    assert one.time_s == pytest.approx(ring_time("all_reduce", 2, s), rel=1e-9)  # within a node: nothing shared
    assert one.extrapolated and "fitted across nodes, predicting within one node: another link" in one.reason


def test_fit_of_concurrent_inter_groups_is_per_link_byte() -> None:
    # inter groups on 2 and 4 nodes x 2 ranks: two groups share each node's link
    model = fit(link_points([2, 4], 2, "inter", 2, coll="all_gather"))
    f = model.get("all_gather", "fp32", "inter")
    assert f.link_shares == (2,) and f.world_sizes == (2, 4)
    assert f.beta_s_per_byte == pytest.approx(BETA, rel=1e-9) and f.alpha_s == pytest.approx(ALPHA, rel=1e-9)
    s = 2**24
    alone = model.predict("all_gather", "fp32", world_size=4, nbytes=s, group="inter", nodes=4)
    assert alone.time_s == pytest.approx(ALPHA * 3 + s * BETA * 3 / 4, rel=1e-9)
    eight = model.predict("all_gather", "fp32", world_size=4, nbytes=s, group="inter", nodes=4, concurrent=8)
    assert eight.time_s == pytest.approx(ALPHA * 3 + 8 * s * BETA * 3 / 4, rel=1e-9)
    # points within one node keep their beta (no link to share)
    intra = fit(synth("all_gather", ci_rel=None, worlds=[2, 4]).assign(group="intra", nodes=2))
    assert intra.get("all_gather", "fp32", "intra").link_shares == (0,)
    assert intra.get("all_gather", "fp32", "intra").beta_s_per_byte == pytest.approx(BETA, rel=1e-9)


def test_layout_arguments_checked() -> None:
    model = fit(link_points([2, 3], 1, "world", 1))
    with pytest.raises(ValueError, match=r"concurrent must be an integer >= 1"):
        model.predict("all_reduce", "fp32", world_size=2, nbytes=2**20, concurrent=0)
    with pytest.raises(ValueError, match=r"nodes must be an integer in 1..world_size \(2\), got 3"):
        model.predict("all_reduce", "fp32", world_size=2, nbytes=2**20, nodes=3)


# ------------------------------------------------------------------------------------------------ JSON
def test_json_round_trip(tmp_path: Path) -> None:
    model = fit([synth("all_reduce", noise=0.05, seed=2), synth("all_gather", "fp8", encode=(5.0, 1e-4)),
                    link_points([2, 4], 2, "inter", 2)])  # fmt: skip
    p = write_model(model, tmp_path / "m.json")
    back = read_model(p)
    assert set(back.fits) == set(model.fits)
    assert back.get("all_reduce", "fp32", "inter").link_shares == (2,)
    for key in model.fits:
        a = model.predict(key[0], key[1], world_size=6, nbytes=3e6, group=key[2], concurrent=3)
        b = back.predict(key[0], key[1], world_size=6, nbytes=3e6, group=key[2], concurrent=3)
        assert a == b
    assert len(back.residuals) == len(model.residuals)
    assert np.allclose(back.residuals["ratio"].astype(float), model.residuals["ratio"].astype(float))
    assert json.loads(p.read_text())["schema_version"] == SCHEMA_VERSION


def test_bad_json_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read cost model"):
        read_model(tmp_path / "missing.json")
    (tmp_path / "a.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        read_model(tmp_path / "a.json")
    (tmp_path / "b.json").write_text('{"fits": []}')
    with pytest.raises(ValueError, match="not a commbench cost model"):
        read_model(tmp_path / "b.json")
    d = model_to_dict(fit(synth()))
    (tmp_path / "c.json").write_text(json.dumps({**d, "schema_version": 99}))
    with pytest.raises(ValueError, match="schema version 99"):
        read_model(tmp_path / "c.json")
    del d["fits"][0]["comm"]
    (tmp_path / "d.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="malformed.*comm"):
        read_model(tmp_path / "d.json")


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_inputs_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="at least one"):
        fit([])
    with pytest.raises(ValueError, match="lacks column.*time_us"):
        fit(synth().drop(columns=["time_us"]))
    with pytest.raises(ValueError, match="unknown group"):
        fit(synth().assign(group="rack"))
    with pytest.raises(ValueError, match="unknown algorithm"):
        fit(synth(), algorithm="bcube")
    mixed = synth()
    mixed.loc[0, "backend"] = "nccl"
    with pytest.raises(ValueError, match="several backends"):
        fit(mixed)
    model = fit(synth(sizes=[2**20], worlds=[2, 4]))
    assert "1 distinct size" in model.skipped["all_reduce/fp32/world"]
    with pytest.raises(ValueError, match="no model for all_reduce/fp32/world: .*distinct size"):
        model.predict("all_reduce", "fp32", world_size=2, nbytes=2**20)
    good = fit(synth())
    with pytest.raises(ValueError, match="exactly one of nbytes"):
        good.predict("all_reduce", "fp32", world_size=2)
    with pytest.raises(ValueError, match="exactly one of nbytes"):
        good.predict("all_reduce", "fp32", world_size=2, nbytes=1, fp32_bytes=1)
    with pytest.raises(ValueError, match="world_size must be an integer >= 2"):
        good.predict("all_reduce", "fp32", world_size=1, nbytes=2**20)
    with pytest.raises(ValueError, match="positive number of bytes"):
        good.predict("all_reduce", "fp32", world_size=2, nbytes=0)
    with pytest.raises(ValueError, match="fitted: all_reduce/fp32/world"):
        good.predict("all_gather", "fp32", world_size=2, nbytes=2**20)


# ------------------------------------------------------------------------------------------------ run dirs
def _run_dir(path: Path, df: pd.DataFrame) -> Path:
    w = RunWriter(path)
    w.write_metadata({"schema_version": 1})
    w.add_rows("results", df.to_dict("records"))
    return path


def test_main_fit_from_run_dirs(tmp_path: Path) -> None:
    d2 = _run_dir(tmp_path / "n2", synth("reduce_scatter", worlds=[2], ci_rel=None))
    d4 = _run_dir(tmp_path / "n4", synth("reduce_scatter", worlds=[4], ci_rel=None))
    text = main_fit([d2, d4], tmp_path / "out" / "model.json")
    assert "reduce_scatter" in text and "2,4" in text and "5.000" in text  # busbw GB/s
    model = read_model(tmp_path / "out" / "model.json")
    p = model.predict("reduce_scatter", "fp32", world_size=3, nbytes=2**23)
    assert p.time_s == pytest.approx(ring_time("reduce_scatter", 3, 2**23), rel=1e-6)
    assert set(model.residuals["source"]) == {str(d2), str(d4)}


def test_timing_mode_is_kept_and_never_mixed(tmp_path: Path) -> None:
    # A fit of isolated-mode points says so (and in its JSON); runs without the column are stream; mixing refuses.
    iso = synth("all_reduce").assign(timing_mode="isolated")
    model = fit([iso, synth("all_gather")])
    assert model.get("all_reduce", "fp32", "world").timing_mode == "isolated"
    assert model.get("all_gather", "fp32", "world").timing_mode == "stream"
    back = read_model(write_model(model, tmp_path / "m.json"))
    assert back.get("all_reduce", "fp32", "world").timing_mode == "isolated"
    old = json.loads((tmp_path / "m.json").read_text())
    for f in old["fits"] if isinstance(old["fits"], list) else old["fits"].values():
        f.pop("timing_mode")
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert read_model(tmp_path / "old.json").get("all_reduce", "fp32", "world").timing_mode == "stream"
    with pytest.raises(ValueError, match=r"all_reduce/fp32/world: points timed in several modes \(isolated, stream\)"):
        fit([iso, synth("all_reduce", seed=1)])
