"""Comparing runs: two real small runs, ratio tables against pandas, fairness warnings, bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from commbench.store.nccl_import import import_nccl_tests
from commbench.views import compare
from commbench.views.tables import fmt
from tests.views_util import fabricate_run, real_run


@pytest.fixture(scope="session")
def real_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_run(tmp_path_factory.getbasetemp() / "views")


@pytest.fixture(scope="session")
def real_run_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_run(tmp_path_factory.getbasetemp() / "views", name="b")


@pytest.mark.timeout(240)
def test_compare_two_real_runs(real_run_dir: Path, real_run_b: Path, tmp_path: Path) -> None:
    out = compare.compare_runs([real_run_dir, real_run_b], ["A", "B"], tmp_path)
    assert {"html", "md", "compare_busbw.png", "compare_busbw.svg", "compare_latency.png"} <= set(out)
    md = out["md"].read_text()
    html = out["html"].read_text()
    assert "commbench comparison: A vs B" in html
    # same layout, versions and suite on one machine: nothing unfair to warn about
    assert compare.compare_warnings([real_run_dir, real_run_b], ["A", "B"]) == []
    assert "## Warnings" not in md
    # ratio rows against an independent pandas merge of the two results.csv
    a = pd.read_csv(real_run_dir / "results.csv")
    b = pd.read_csv(real_run_b / "results.csv")
    m = a.merge(b, on=["collective", "precision", "size_bytes"], suffixes=("_a", "_b"))
    assert len(m) == len(a)  # identical grids: every point aligns
    table = compare.ratio_table(
        compare.aligned([compare.load_run(real_run_dir), compare.load_run(real_run_b)], ["A", "B"]), ["A", "B"]
    )
    assert len(table.rows) == len(m)
    col_bus = table.columns.index("busbw B/A")
    col_time = table.columns.index("time B/A")
    for _, r in m.iterrows():
        row = next(
            row
            for row in table.rows
            if row[0] == r["collective"] and row[1] == r["precision"] and row[3] == compare.human_size(r["size_bytes"])
        )
        assert row[col_bus] == fmt(r["busbw_gbps_b"] / r["busbw_gbps_a"])
        assert row[col_time] == fmt(r["time_us_b"] / r["time_us_a"])
    # the summary uses the geometric mean of B/A over the aligned sizes
    g = m[(m["collective"] == "all_reduce") & (m["precision"] == "fp32")]
    gm = math.exp(sum(math.log(x) for x in g["busbw_gbps_b"] / g["busbw_gbps_a"]) / len(g))
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| all_reduce | fp32 | world | {len(g)} | "))
    assert float(line.split(" | ")[4]) == pytest.approx(gm, rel=1e-3)  # 4 significant digits shown


def test_warnings_for_unfair_comparisons(tmp_path: Path) -> None:
    a = fabricate_run(tmp_path / "a", training=False, meta_extra={"nccl_version": "2.21.5"})
    b = fabricate_run(
        tmp_path / "b",
        training=False,
        world=4,
        meta_extra={"torch_version": "2.99", "nccl_version": "2.27.3", "suite": {"name": "other"}},
    )
    warns = compare.compare_warnings([a, b])
    text = "\n".join(warns)
    for key in ("world_size (a=2, b=4)", "torch_version", "nccl_version (a=2.21.5, b=2.27.3)", "suite"):
        assert key in text
    assert "backend" not in text  # what is equal is not reported
    # unknown is not different: a run without NCCL (None) against one with it is no warning
    c = fabricate_run(tmp_path / "c", training=False, meta_extra={"nccl_version": None})
    assert not any("nccl_version" in w for w in compare.compare_warnings([a, c]))
    out = compare.compare_runs([a, b], None, tmp_path / "out")
    md = out["md"].read_text()
    assert "## Warnings" in md and "world\\_size" not in md and "world_size (a=2, b=4)" in md


def test_compare_with_imported_nccl_tests(tmp_path: Path) -> None:
    a = fabricate_run(
        tmp_path / "a",
        training=False,
        collectives=("all_reduce",),
        precisions=("fp32",),
        sizes=(1024, 4096, 16384, 65536),
    )
    b = import_nccl_tests(Path(__file__).parent / "data" / "nccl_all_reduce_float.txt", tmp_path / "b")
    warns = "\n".join(compare.compare_warnings([a, b], ["cpu", "h100"]))
    assert "backend (cpu=gloo, h100=nccl)" in warns and "imported from nccl-tests" in warns
    out = compare.compare_runs([a, b], ["cpu", "h100"], tmp_path / "out")
    # the four fp32 all_reduce sizes align (the import's in/out-of-place rows enter as their median)
    rows = [ln for ln in out["md"].read_text().splitlines() if ln.startswith("| all_reduce | fp32 | ")]
    assert len(rows) == 1 + 4 + 4  # summary row + 4 significance rows + 4 aligned points


def test_bad_input(tmp_path: Path) -> None:
    a = fabricate_run(tmp_path / "a", training=False)
    with pytest.raises(ValueError, match="at least 2 run directories"):
        compare.compare_runs([a], None, tmp_path / "o")
    with pytest.raises(ValueError, match="1 label\\(s\\) for 2 run"):
        compare.compare_runs([a, a], ["x"], tmp_path / "o")
    with pytest.raises(ValueError, match="distinct"):
        compare.compare_runs([a, a], ["x", "x"], tmp_path / "o")
    with pytest.raises(ValueError, match="does not exist"):
        compare.compare_runs([a, tmp_path / "missing"], None, tmp_path / "o")


def test_no_common_points_is_warned(tmp_path: Path) -> None:
    a = fabricate_run(tmp_path / "a", training=False, collectives=("all_reduce",))
    b = fabricate_run(tmp_path / "b", training=False, collectives=("all_gather",))
    assert any("no (collective, precision, size) point in common" in w for w in compare.compare_warnings([a, b]))
    out = compare.compare_runs([a, b], None, tmp_path / "o")
    assert not any(k.endswith(".png") for k in out)


def test_a_compare_figure_registered_here_appears_in_the_comparison(tmp_path: Path) -> None:
    """compare draws its own registry of figures (subject: the aligned runs), like the report."""
    import matplotlib.pyplot as plt

    a = fabricate_run(tmp_path / "a")
    b = fabricate_run(tmp_path / "b", host="node02")
    seen: list[list[str]] = []
    caption = "Toy overlay: how many points each pair of runs shares (registered by a test)."

    @compare.COMPARE_FIGURES.register("compare_toy", caption)
    def toy(c: compare.Comparison) -> plt.Figure:
        seen.append(list(c.labels))
        fig, ax = plt.subplots()
        ax.bar([0], [len(c.aligned)])
        return fig

    try:
        out = compare.compare_runs([a, b], ["A", "B"], tmp_path / "out")
    finally:
        compare.COMPARE_FIGURES.unregister("compare_toy")
    assert seen == [["A", "B"]]
    assert list(k for k in out if k.endswith(".png")) == ["compare_busbw.png", "compare_latency.png", "compare_toy.png"]
    assert caption in out["html"].read_text()
    assert "(plots/compare_toy.png)" in out["md"].read_text()


# --- significance (issue: the same question gives the same answer) ------------------------------------------


def _aligned(times_a: list[float], times_b: list[float], rel_ci: float) -> pd.DataFrame:
    rows = []
    for i, (ta, tb) in enumerate(zip(times_a, times_b, strict=True)):
        row: dict[str, object] = {"collective": "all_reduce", "precision": "fp32", "group": "world", "size_bytes": 1024 * 4**i}
        for lab, t in (("A", ta), ("B", tb)):
            row[f"time_us|{lab}"] = t
            row[f"time_ci_low_us|{lab}"] = t * (1 - rel_ci)
            row[f"time_ci_high_us|{lab}"] = t * (1 + rel_ci)
            row[f"busbw_gbps|{lab}"] = 1.0 / t
        rows.append(row)
    return pd.DataFrame(rows)


def test_ratio_frame_flags_a_real_slowdown_and_not_identical_runs() -> None:
    from commbench.views.compare import ratio_frame

    a = [100.0, 200.0, 400.0, 800.0]
    slow = ratio_frame(_aligned(a, [2 * t for t in a], 0.02), ["A", "B"])
    assert list(slow["verdict"]) == ["B slower"] * 4
    assert slow["time_ratio"].tolist() == pytest.approx([2.0] * 4)
    # the interval of a ratio of two ±2 % estimates: exp(±1.96 * sqrt(2) * se), se = log(1.02/0.98) / 3.92
    se = (math.log(1.02) - math.log(0.98)) / (2 * 1.959963984540054)
    assert slow["time_ratio_ci_high"].iloc[0] == pytest.approx(2.0 * math.exp(1.959963984540054 * math.sqrt(2) * se))
    same = ratio_frame(_aligned(a, a, 0.02), ["A", "B"])
    assert not same["significant"].any()
    assert set(same["verdict"]) == {"no significant difference"}


def test_ratio_frame_judges_many_ratios_together() -> None:
    from commbench.views.compare import ratio_frame

    # 40 points, B within +-3.5 % of A, each time with a +-2 % interval: a few ratios' marginal 95 % intervals
    # exclude 1 (|log ratio| > 1.96 * sqrt(2) * se), but none survives the adjustment for 40 comparisons;
    # one real 30 % slowdown among them still does.
    a = [100.0 * 1.5**i for i in range(40)]
    jitter = [1.0 + 0.035 * math.sin(7.0 * i) for i in range(40)]
    b = [t * j for t, j in zip(a, jitter, strict=True)]
    b[17] *= 1.3
    rf = ratio_frame(_aligned(a, b, 0.02), ["A", "B"])
    se = (math.log(1.02) - math.log(0.98)) / (2 * 1.959963984540054) * math.sqrt(2)
    marginal = sum(abs(math.log(j)) > 1.959963984540054 * se for j in jitter)
    assert marginal >= 2  # the example is not trivially quiet
    assert rf["significant"].tolist() == [i == 17 for i in range(40)]
    assert rf["verdict"].iloc[17] == "B slower" and int(rf["n_compared"].iloc[0]) == 40


def test_ratio_frame_without_intervals_gives_a_threshold_verdict() -> None:
    from commbench.views.compare import ratio_frame

    al = _aligned([100.0, 100.0], [150.0, 103.0], 0.02)
    al["time_ci_low_us|A"] = math.nan
    rf = ratio_frame(al, ["A", "B"])
    # no significance without an interval, but a verdict against the 5 % threshold, labelled as one
    assert rf["significant"].isna().all() and set(rf["basis"]) == {"threshold"}
    assert rf["verdict"].tolist() == ["B slower (threshold 5%, point estimates)", "within threshold (±5%, point estimates)"]
    assert rf["time_ratio"].tolist() == pytest.approx([1.5, 1.03])
    assert ratio_frame(al, ["A", "B"], threshold=0.6)["verdict"].iloc[0] == "within threshold (±60%, point estimates)"


# --- issue 26 item 6: busbw ratio and placements ---------------------------------------------------------------


def test_busbw_ratio_is_the_ratio_of_the_runs_busbw_and_placements_compare_apart(tmp_path: Path) -> None:
    """A 16-rank real log against an 8-rank run 10 % slower: the bus factors differ (2*15/16 vs 2*7/8), so busbw B/A
    is not 1/(time B/A); out-of-place and in-place are compared separately."""
    from tests import nccl_writers as w

    real = Path(__file__).parent / "data" / "nccl_real" / "gcp_a3mega_2node_16rank_all_reduce.txt"
    a = import_nccl_tests(real, tmp_path / "a16")
    ra = pd.read_csv(a / "results.csv")
    big = ra[(ra["size_bytes"] >= 1 << 20) & (ra["placement"] == "out-of-place")].sort_values("size_bytes")
    ms = []
    for size in big["size_bytes"]:
        t = {p: float(ra[(ra["size_bytes"] == size) & (ra["placement"] == p)]["time_us"].iloc[0]) * 1.1
             for p in ("out-of-place", "in-place")}  # fmt: skip
        ms.append(w.Measure(int(size), t))
    (tmp_path / "b8.txt").write_text(w.nccl_text("all_reduce", ms, w.Layout(procs=1, ngpus=8)))
    b = import_nccl_tests(tmp_path / "b8.txt", tmp_path / "b8")
    rb = pd.read_csv(b / "results.csv")
    assert "runs differ in world_size (A=16, B=8)" in "\n".join(compare.compare_warnings([a, b], ["A", "B"]))
    out = compare.compare_runs([a, b], ["A", "B"], tmp_path / "cmp")
    rf = pd.read_csv(out["csv"])
    assert set(rf["placement"]) == {"out-of-place", "in-place"} and len(rf) == 2 * len(ms)
    for _, r in rf.iterrows():
        sa = ra[(ra["size_bytes"] == r["size_bytes"]) & (ra["placement"] == r["placement"])].iloc[0]
        sb = rb[(rb["size_bytes"] == r["size_bytes"]) & (rb["placement"] == r["placement"])].iloc[0]
        assert r["busbw_ratio"] == pytest.approx(sb["busbw_gbps"] / sa["busbw_gbps"])
        assert r["time_ratio"] == pytest.approx(sb["time_us"] / sa["time_us"])
        # what busbw B/A should be from the formulas: (time A / time B) x (2*7/8) / (2*15/16)
        assert r["busbw_ratio"] == pytest.approx(sa["time_us"] / sb["time_us"] * (14 / 8) / (30 / 16), rel=0.01)
        assert abs(r["busbw_ratio"] - 1 / r["time_ratio"]) > 0.05
    md = out["md"].read_text()
    assert "| all_reduce | fp32 | world | out-of-place |" in md and "| all_reduce | fp32 | world | in-place |" in md


def test_import_against_a_run_without_placements_says_it_takes_the_median(tmp_path: Path) -> None:
    a = fabricate_run(tmp_path / "a", training=False, collectives=("all_reduce",), precisions=("fp32",),
                      sizes=(1024, 4096, 16384, 65536))  # fmt: skip
    b = import_nccl_tests(Path(__file__).parent / "data" / "nccl_all_reduce_float.txt", tmp_path / "b")
    warns = compare.compare_warnings([a, b], ["cpu", "h100"])
    assert any("h100 report out-of-place and in-place separately" in x and "median" in x for x in warns)
    al = compare.aligned([compare.load_run(a), compare.load_run(b)], ["cpu", "h100"])
    rb = pd.read_csv(b / "results.csv")
    for _, r in al.iterrows():
        both = rb[rb["size_bytes"] == r["size_bytes"]]["time_us"]
        assert r["time_us|h100"] == pytest.approx(both.median()) and r["placement"] == "-"
