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

from commbench import plots
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
            assert "1K" in labels and "64K" in labels
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
                ref = csv[(csv["collective"] == coll) & (csv["payload"] == payload)]
                ref = ref[(ref["precision"] == line.get_label()) & (ref["rel_err"] > 0)].sort_values("fp32_bytes")
                np.testing.assert_allclose(xy(line)[1], ref["rel_err"].to_numpy())
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
        vlines = [xy(ln)[0][0] for ln in ax.get_lines() if ln.get_linestyle() == ":"]
        assert vlines == [expect]
    finally:
        plt.close(fig)


def test_training_figures(fabricated: Path) -> None:
    run = plots.load_run(fabricated)
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
        # loss curves: one per policy, fp32 marked as the reference
        labels = [ln.get_label() for ln in curves.axes[0].get_lines()]
        assert labels == ["fp32 (reference)", "bf16", "fp8_e4m3"]
        fp32_loss = np.asarray(curves.axes[0].get_lines()[0].get_ydata(), dtype=float)
        np.testing.assert_allclose(fp32_loss, steps[steps.policy == "fp32"]["loss"].to_numpy())
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
