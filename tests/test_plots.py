"""Figures from a real small run (and from fabricated runs for training and edge cases).

Checks that what is drawn is the run's data (compared with the CSV read independently by pandas),
that axes are what the issue asks (log-2 size axis with human labels, log-log latency, log error),
that titles state backend, world layout and host, and that PNG and SVG files are written.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from commbench.core.units import human_bytes, human_rate, human_time
from commbench.views import plots
from tests.views_util import fabricate_run, fabricate_training, real_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def xy(line: Line2D) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)


@pytest.fixture(scope="session")
def real_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_run(tmp_path_factory.getbasetemp() / "views")


@pytest.fixture(scope="module")
def fabricated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fabricate_run(tmp_path_factory.mktemp("fab") / "run", host="node$1$_a")


def test_human_size_labels() -> None:
    # 1024-based, as nccl-tests and commbench's size strings
    assert [plots.human_size(v) for v in (8, 1024, 1536, 65536, 2**20, 3 * 2**30)] == [
        "8B",
        "1K",
        "1.5K",
        "64K",
        "1M",
        "3G",
    ]
    # for people: IEC names, 1024-based, 3 significant digits
    assert [human_bytes(v) for v in (8, 1024, 1536, 65536, 1.5e6, 3 * 2**30)] == [
        "8 B", "1 KiB", "1.5 KiB", "64 KiB", "1.43 MiB", "3 GiB",
    ]  # fmt: skip
    assert [human_time(v) for v in (0.5, 453.2, 14663.0, 1.2e6)] == ["0.5 µs", "453 µs", "14.7 ms", "1.2 s"]
    assert [human_rate(v) for v in (0.00226, 0.5, 1.234, 123.4)] == ["2.26 MB/s", "500 MB/s", "1.23 GB/s", "123 GB/s"]


@pytest.mark.timeout(180)
def test_busbw_lines_are_the_runs_points(real_run_dir: Path) -> None:
    run = plots.load_run(real_run_dir)
    csv = pd.read_csv(real_run_dir / "results.csv")
    fig = plots.fig_busbw(run)
    assert fig is not None
    try:
        title = fig.get_suptitle()
        meta = json.loads((real_run_dir / "metadata.json").read_text())
        assert meta["backend"] in title and f"{meta['world_size']} ranks" in title and meta["host"] in title
        assert f"{meta['nodes']} node(s)" in title
        axes = [ax for ax in fig.axes if ax.get_visible()]
        assert [ax.get_title() for ax in axes] == ["all_reduce", "all_gather"]
        for ax in axes:
            assert ax.get_xscale() == "log" and getattr(ax.xaxis.get_transform(), "base", None) == 2
            labels = [t.get_text() for t in ax.get_xticklabels()]
            assert "1 KiB" in labels and "64 KiB" in labels
            # log y (small sizes are not flattened against the axis), ticks in human units
            assert ax.get_yscale() == "log"
            yl = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
            assert yl and all(t.endswith(("MB/s", "GB/s")) for t in yl), yl
            # the interval is a shaded band between busbw_ci_low and busbw_ci_high
            assert ax.collections, "no confidence band"
            for line in ax.get_lines():
                prec = str(line.get_label()).split()[0]
                ref = csv[(csv["collective"] == ax.get_title()) & (csv["precision"] == prec)].sort_values("size_bytes")
                x, y = xy(line)
                np.testing.assert_allclose(x, ref["size_bytes"].to_numpy())
                np.testing.assert_allclose(y, ref["busbw_gbps"].to_numpy())
            assert {ln.get_label() for ln in ax.get_lines()} == {"fp32", "bf16"}
    finally:
        plt.close(fig)


@pytest.mark.timeout(180)
def test_latency_is_log_log_and_error_is_log_y(real_run_dir: Path) -> None:
    run = plots.load_run(real_run_dir)
    lat, err = plots.fig_latency(run), plots.fig_error(run)
    assert lat is not None and err is not None
    try:
        for ax in lat.axes:
            assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        csv = pd.read_csv(real_run_dir / "results.csv")
        payloads = sorted(csv["payload"].unique())
        axes = [ax for ax in err.axes if ax.get_visible()]
        assert len(axes) == 2 * len(payloads)  # collective x payload panels
        for ax in axes:
            assert ax.get_yscale() == "log"
            coll, payload = ax.get_title().split(" / ")
            for line in ax.get_lines():
                # dashed companions (label "_comm", out of the legend) draw comm_rel_err; solid lines rel_err
                col = "comm_rel_err" if line.get_label() == "_comm" else "rel_err"
                if col == "comm_rel_err":
                    continue  # which precision a companion belongs to is its colour, checked in the error-plot test
                ref = csv[(csv["collective"] == coll) & (csv["payload"] == payload)]
                ref = ref[(ref["precision"] == line.get_label()) & (ref[col] > 0)].sort_values("fp32_bytes")
                np.testing.assert_allclose(xy(line)[1], ref[col].to_numpy())
    finally:
        plt.close(lat)
        plt.close(err)


@pytest.mark.timeout(180)
def test_write_plots_png_and_svg(real_run_dir: Path, tmp_path: Path) -> None:
    run = plots.load_run(real_run_dir)
    written = plots.write_plots(run, tmp_path)
    # a run without training draws the four collective figures only
    assert set(written) == {"busbw", "effective_bw", "latency", "error"}
    for paths in written.values():
        assert paths["png"].read_bytes()[:8] == PNG_MAGIC
        root = ET.parse(paths["svg"]).getroot()
        assert root.tag.endswith("svg")


def test_effective_marks_crossover_at_the_formula_size(fabricated: Path) -> None:
    run = plots.load_run(fabricated)
    df = pd.read_csv(fabricated / "results.csv")
    # independent crossover from the fabricated numbers: smallest size from which fp8 stays ahead
    d = df[(df["collective"] == "all_reduce") & (df["payload"] == "normal")]
    ref = d[d["precision"] == "fp32"].set_index("fp32_bytes")["effective_gbps"]
    mine = d[d["precision"] == "fp8_e4m3"].set_index("fp32_bytes")["effective_gbps"]
    sizes = sorted(ref.index)
    expect = next(s for i, s in enumerate(sizes) if all(mine[t] > ref[t] for t in sizes[i:]))
    fig = plots.fig_effective(run)
    assert fig is not None
    try:
        ax = next(a for a in fig.axes if a.get_title() == "all_reduce")
        # a star on the fp8 curve at the crossover size, no text drawn over the data
        stars = [xy(ln) for ln in ax.get_lines() if ln.get_marker() == "*"]
        assert [float(x[0]) for x, _ in stars] == [expect]
        assert float(stars[0][1][0]) == pytest.approx(float(mine[expect]))
        assert not ax.texts
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert f"fp8_e4m3 (crossover: all_reduce {human_bytes(expect)}" in " ".join(legend)
    finally:
        plt.close(fig)


def test_training_figures(fabricated: Path) -> None:
    run = plots.load_run(fabricated)
    run.training = run.training.assign(peak_mem_kind="cpu_heap")  # what the runner writes on CPU
    summary, steps = fabricate_training()
    bars = plots.fig_training_bars(run)
    stacked = plots.fig_training_bytes(run)
    curves = plots.fig_training_curves(run)
    assert bars is not None and stacked is not None and curves is not None
    try:
        # stacked bytes: each policy's bar total is the sum of its comm_by_op entries (MiB)
        ax = stacked.axes[0]
        totals = np.zeros(len(summary))
        for patch in ax.patches:
            assert isinstance(patch, Rectangle)
            totals[round(patch.get_x() + patch.get_width() / 2)] += patch.get_height()
        expect = [sum(json.loads(s).values()) / 2**20 for s in summary["comm_by_op"]]
        np.testing.assert_allclose(totals, expect)
        # step-time bars are the p50 in ms
        heights = [p.get_height() for p in bars.axes[0].patches if isinstance(p, Rectangle)]
        np.testing.assert_allclose(heights, summary["step_time_us_p50"].to_numpy() / 1e3)
        # the bars and the expected markers fit under the y limit
        tallest = max(max(totals), float(np.nanmax(summary["comm_bytes_expected"].to_numpy() / 2**20)))
        assert ax.get_ylim()[1] > tallest
        # drift curves: one per policy, each the difference from fp32's loss at the same step; fp32 is zero
        lines = curves.axes[0].get_lines()
        assert [ln.get_label() for ln in lines] == ["fp32 (reference)", "bf16", "fp8_e4m3"]
        ref = steps[steps.policy == "fp32"]["loss"].to_numpy()
        for line, pol in zip(lines, ["fp32", "bf16", "fp8_e4m3"], strict=True):
            expect = steps[steps.policy == pol]["loss"].to_numpy() - ref
            np.testing.assert_allclose(np.asarray(line.get_ydata(), dtype=float), expect)
        # the memory panel says what was measured, in words, not the raw kind label
        text = bars.axes[1].get_ylabel() + bars.axes[1].get_title(loc="left")
        assert "[" not in bars.axes[1].get_ylabel() and "MiB" in bars.axes[1].get_ylabel()
        assert "cpu_heap" not in text and "heap" in text
    finally:
        for f in (bars, stacked, curves):
            plt.close(f)


def test_dollar_in_host_is_not_mathtext(fabricated: Path, tmp_path: Path) -> None:
    run = plots.load_run(fabricated)
    written = plots.write_plots(run, tmp_path, formats=("png",))
    assert len(written) == 7
    fig = plots.fig_busbw(run)
    assert fig is not None
    assert "node$1$_a" in fig.get_suptitle()
    plt.close(fig)


def test_training_only_and_empty_runs_draw_what_exists(tmp_path: Path) -> None:
    t = plots.load_run(fabricate_run(tmp_path / "t", results=False))
    assert {n for n, b in plots.FIGURES.items() if b(t) is not None} == {
        "training_time_mem",
        "training_bytes",
        "training_curves",
    }
    plt.close("all")
    e = plots.load_run(fabricate_run(tmp_path / "e", results=False, training=False))
    assert plots.write_plots(e, tmp_path / "p") == {}


def test_missing_run_dir_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        plots.load_run(tmp_path / "nope")


def test_error_plot_keeps_coinciding_lines_and_draws_comm_error(tmp_path: Path) -> None:
    """Two precisions with the same error stay told apart (own marker, own width); the communication's own
    error (comm_rel_err, when a run has it) is drawn dashed; one legend below the panels, none inside."""
    from commbench.store.results import write_table

    run_dir = fabricate_run(tmp_path / "run", training=False, payloads=("normal",))
    df = pd.read_csv(run_dir / "results.csv")
    twin = df[df["precision"] == "bf16"].assign(precision="bf16_twin")  # the same errors as bf16
    df = pd.concat([df, twin], ignore_index=True)
    df["comm_rel_err"] = np.where(df["precision"] == "fp32", 0.0, df["rel_err"] / 10)
    write_table(run_dir, "results", df)
    fig = plots.fig_error(plots.load_run(run_dir))
    assert fig is not None
    try:
        ax = fig.axes[0]
        solid = {ln.get_label(): ln for ln in ax.get_lines() if ln.get_linestyle() == "-"}
        dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        a, b = solid["bf16"], solid["bf16_twin"]
        np.testing.assert_allclose(xy(a)[1], xy(b)[1])  # they coincide...
        assert a.get_marker() != b.get_marker() and a.get_linewidth() != b.get_linewidth()  # ...and stay visible
        # dashed: comm_rel_err of each precision whose value is > 0 (lossless fp32 has none on a log axis)
        assert len(dashed) == 3
        for ln in dashed:
            assert np.all(xy(ln)[1] > 0)
        got = sorted(float(v) for ln in dashed for v in xy(ln)[1])
        ref = df[(df["collective"] == ax.get_title().split(" / ")[0]) & (df["comm_rel_err"] > 0)]
        np.testing.assert_allclose(got, sorted(ref["comm_rel_err"].to_numpy()))
        assert all(a.get_legend() is None for a in fig.axes) and len(fig.legends) == 1
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert "dashed: error the communication adds" in legend
    finally:
        plt.close(fig)
