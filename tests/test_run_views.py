"""What a person reads of a run (issue 33 item 7): the console table (nccl-tests' size, the wire bytes apart, the
columns that fit, the legend) and the run figures' axes, read back from the figure objects (Agg), not by eye.

References: nccl-tests' table layout (``size count type redop root time algbw busbw #wrong``), the fabricated
run's own formula numbers (tests/views_util.py), and matplotlib's documented axes API.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from commbench.measure.console import PointPrinter
from commbench.measure.precision import get_precision
from commbench.measure.table import PIPED_WIDTH, terminal_width
from commbench.store.results import write_table
from commbench.views import plots
from tests.views_util import fabricate_run

NCCL_TESTS = ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"]


def _row(precision: str, dtype: str, wire: int, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "collective": "all_reduce", "backend": "gloo", "world_size": 2, "nodes": 1, "payload": "normal",
        "group": "world", "precision": precision, "dtype": dtype, "fp32_bytes": 4096, "size_bytes": wire,
        "count": 1024, "time_us": 2215.1, "algbw_gbps": wire / 2215.1e3, "busbw_gbps": wire / 2215.1e3, "wrong": 0,
        "time_ci_low_us": 2000.0, "time_ci_high_us": 2400.0, "noisy": True, "gain_vs_fp32": 1.0,
        "gain_significant": False, "encode_us": 0.0, "decode_us": 0.0, "effective_gbps": 0.0018, "rel_err": 3.6e-8,
        "link": "none: the group's ranks share one host", "link_gbps": math.nan, "link_util": math.nan,
    }  # fmt: skip
    base.update(kw)
    return base


ROWS = [_row("fp32", "float", 4096), _row("bf16", "bfloat16", 2048), _row("fp32_chunked", "uint8", 4096)]


def _table(width: int, rows: list[dict[str, object]], capsys: pytest.CaptureFixture[str]) -> list[str]:
    PointPrinter(width=width).rows(rows, "sum")
    return capsys.readouterr().out.splitlines()


def _cells(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    # the header is the line above the units line ("(B)" under size, "(us)" under time)
    i = next(i for i in range(len(lines) - 1) if lines[i + 1].startswith("#") and "(B)" in lines[i + 1] and "(us)" in lines[i + 1])
    return lines[i].lstrip("#").replace("vs fp32", "vs").split(), [ln.split() for ln in lines if not ln.startswith("#")]


@pytest.mark.parametrize("width", [80, 100, 132, 200])
def test_table_fits_the_terminal_and_keeps_nccl_tests_columns(width: int, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _table(width, ROWS, capsys)
    assert all(len(ln) < width for ln in lines), [ln for ln in lines if len(ln) >= width]
    heads, rows = _cells(lines)
    if width >= 100:  # nccl-tests' nine columns, in nccl-tests' order, then the precision
        assert heads[: len(NCCL_TESTS) + 1] == [*NCCL_TESTS, "precision"]
    else:  # narrower: only the constant root and redop (named in the block title), then count, go
        assert [h for h in NCCL_TESTS if h not in heads] == ["count", "redop", "root"]
        assert any("redop sum" in ln for ln in lines) and any("root -1" in ln for ln in lines)
    # the link of a group that crosses none is not a column of dashes
    assert "link" not in heads
    by = {r[heads.index("precision")]: dict(zip(heads, r, strict=True)) for r in rows}
    # size is the user's fp32 tensor for every precision (nccl-tests' size of a float run); wire is what moved
    assert {r["size"] for r in by.values()} == {"4096"}
    if "wire" in heads:
        assert (by["fp32"]["wire"], by["bf16"]["wire"]) == ("4096", "2048")
    assert ("wire" in heads) == (width >= 132) and ("±ci" in heads) == (width >= 108)


def test_extra_columns_go_before_nccl_tests_ones(capsys: pytest.CaptureFixture[str]) -> None:
    order = []
    for width in range(200, 60, -1):
        heads, _ = _cells(_table(width, ROWS, capsys))
        order += [h for h in ["dec_us", "enc_us", "rel_err", "eff_GB/s", "wire", "vs", "±ci", *NCCL_TESTS]
                  if h not in heads and h not in order]  # fmt: skip
    # commbench's columns (least useful first), then root, redop, count; size, type, time, bandwidths never
    assert order == ["dec_us", "enc_us", "rel_err", "eff_GB/s", "wire", "vs", "±ci", "root", "redop", "count"]


def test_columns_with_nothing_to_show_are_not_drawn(capsys: pytest.CaptureFixture[str]) -> None:
    no_fp32 = [_row("bf16", "bfloat16", 2048, gain_vs_fp32=math.nan, rel_err=math.nan)]
    heads, _ = _cells(_table(200, no_fp32, capsys))
    assert "vs" not in heads and "rel_err" not in heads and "±ci" in heads
    linked = [_row("fp32", "float", 4096, link="inter-node: 1 x 200 Mb/s", link_gbps=0.025, link_util=0.07)]
    lines = _table(100, linked, capsys)
    heads, rows = _cells(lines)
    assert heads[-1] == "link" and rows[0][-1] == "0.07" and all(len(ln) < 100 for ln in lines)


def test_legend_explains_the_columns_and_precisions_shown(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(ln.lstrip("# ") for ln in _table(132, ROWS, capsys) if ln.startswith("#"))
    text = " ".join(text.split())
    assert "size: nccl-tests' size of your tensor as fp32" in text and "wire: bytes the collective moved" in text
    assert "±ci:" in text and "rel_err:" not in text  # only the columns shown
    for name in ("fp32", "bf16", "fp32_chunked"):
        assert f"{name} = {' '.join(get_precision(name).description.split())}" in text
    # one size at a time: the precisions are explained once, above the header, not between rows
    PointPrinter(width=132).rows(ROWS, "sum")
    lines = capsys.readouterr().out.splitlines()
    assert [i for i, ln in enumerate(lines) if ln.startswith("# precisions")] < [
        i for i, ln in enumerate(lines) if not ln.startswith("#")
    ][:1]


def test_piped_output_has_a_sane_width(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    def no_terminal(fd: int = 1) -> os.terminal_size:
        raise OSError("not a terminal")

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(os, "get_terminal_size", no_terminal)
    assert terminal_width() == PIPED_WIDTH == 132
    monkeypatch.setenv("COLUMNS", "90")
    assert terminal_width() == 90


# ------------------------------------------------------------------------------------------------ figures
@pytest.fixture(scope="module")
def banded_run(tmp_path_factory: pytest.TempPathFactory) -> plots.RunData:
    """A fabricated run with 95 % intervals (±4 % of time) and a latency that barely moves with size (the issue's
    one-tick latency plot: every time within 20 % of the others)."""
    run_dir = fabricate_run(tmp_path_factory.mktemp("axes") / "run", payloads=("normal",))
    df = pd.read_csv(run_dir / "results.csv")
    df["time_us"] = 2200.0 + df["size_bytes"] / 1e3  # 2.2 ms .. 2.5 ms
    df["time_ci_low_us"], df["time_ci_high_us"] = df["time_us"] * 0.96, df["time_us"] * 1.04
    df["algbw_gbps"] = df["size_bytes"] / df["time_us"] / 1e3
    df["busbw_gbps"] = df["algbw_gbps"]
    df["busbw_ci_low_gbps"], df["busbw_ci_high_gbps"] = df["busbw_gbps"] / 1.04, df["busbw_gbps"] / 0.96
    df["effective_ci_low_gbps"], df["effective_ci_high_gbps"] = df["effective_gbps"] * 0.9, df["effective_gbps"] * 1.1
    write_table(run_dir, "results", df)
    return plots.load_run(run_dir)


def _visible(fig: Figure) -> list[plt.Axes]:
    return [ax for ax in fig.axes if ax.get_visible()]


def _log_ticks(ax: plt.Axes) -> list[str]:
    lo, hi = ax.get_ylim()
    locs = [v for v in ax.yaxis.get_majorticklocs() if lo <= v <= hi]
    fmt = ax.yaxis.get_major_formatter()
    return [t for t in (fmt(v, i) for i, v in enumerate(locs)) if t]


def test_run_figures_axes_ticks_bands_and_legends(banded_run: plots.RunData, tmp_path: Path) -> None:
    for name, spec in plots.FIGURES.items():
        fig = spec(banded_run)
        if fig is None:
            continue
        fig.canvas.draw()
        try:
            for ax in _visible(fig):
                assert ax.get_xlabel() and ax.get_ylabel(), (name, ax.get_title())
                if ax.get_yscale() == "log":
                    ticks = _log_ticks(ax)
                    assert len(ticks) >= 3, (name, ticks)
                    assert len(set(ticks)) == len(ticks), (name, ticks)  # labels tell the ticks apart
            if name in ("busbw", "latency", "effective_bw"):
                for ax in _visible(fig):
                    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
                    data = [ln for ln in ax.get_lines() if ln.get_marker() != "*"]
                    assert len(bands) == len(data) > 0, name
                    for line, band in zip(data, bands, strict=True):  # a band of the line's own colour
                        np.testing.assert_allclose(band.get_facecolor()[0][:3], plt.matplotlib.colors.to_rgb(line.get_color()))
            # the legend's entries are drawn like the lines they name
            drawn = {str(ln.get_label()): ln for ax in _visible(fig) for ln in ax.get_lines()}
            for legend in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
                for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True):
                    line = drawn.get(text.get_text())
                    if line is None or not isinstance(handle, Line2D):
                        continue
                    assert handle.get_linestyle() == line.get_linestyle(), (name, text.get_text())
                    assert handle.get_marker() == line.get_marker() and handle.get_color() == line.get_color()
        finally:
            plt.close(fig)
    latency = plots.fig_latency(banded_run)
    assert latency is not None
    try:  # the flat latency's panel spans its data: every point inside, ticks in time units
        ax = latency.axes[0]
        lo, hi = ax.get_ylim()
        ys = np.concatenate([np.asarray(ln.get_ydata(), float) for ln in ax.get_lines()])
        assert lo < ys.min() and ys.max() < hi and hi / lo >= 3 * 0.999
        assert all(t.endswith(("µs", "ms", "s")) for t in _log_ticks(ax))
    finally:
        plt.close(latency)


def test_report_progress_names_only_figures_drawn(tmp_path: Path) -> None:
    run = plots.load_run(fabricate_run(tmp_path / "run", training=False, payloads=("normal",)))
    said: list[str] = []
    written = plots.write_plots(run, tmp_path / "plots", formats=("png",), progress=said.append)
    assert [s.split(": ", 1)[1] for s in said] == list(written)  # no training figure line for a run without one
    assert not any("training" in s for s in said)
