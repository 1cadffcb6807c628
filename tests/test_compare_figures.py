"""compare's figures, read from the figure objects that are saved (issue 33 item 7, compare's half): log y axes
with at least three labelled ticks, a 95 % band per run and precision, legend entries whose line style, colour and
marker are the drawn lines', and every panel's y axis labelled."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from commbench.views.compare_figures import COMPARE_FIGURES, LINESTYLES, Comparison

LABELS = ["A", "B"]


def _aligned() -> pd.DataFrame:
    """Two collectives x two precisions x 6 sizes; B 1.3x slower; every time with a +-4 % interval. all_gather's
    times barely move with size (a latency-bound range of less than 2x: the case that used to get one y tick)."""
    rows = []
    for coll, slope in (("all_reduce", 1.0), ("all_gather", 0.01)):
        for prec, f in (("fp32", 1.0), ("bf16", 0.7)):
            for k in range(6):
                size = 1024 * 4**k
                row: dict[str, object] = {"collective": coll, "precision": prec, "group": "world", "size_bytes": size,
                                          "placement": "-"}  # fmt: skip
                for lab, s in (("A", 1.0), ("B", 1.3)):
                    t = (50.0 + slope * size / 1e3) * f * s
                    row |= {f"time_us|{lab}": t, f"time_ci_low_us|{lab}": 0.96 * t, f"time_ci_high_us|{lab}": 1.04 * t,
                            f"busbw_gbps|{lab}": size / t / 1e3}  # fmt: skip
                rows.append(row)
    return pd.DataFrame(rows)


def _labelled_major_ticks(fig: Figure, ax: object) -> list[str]:
    fig.canvas.draw()
    lo, hi = ax.get_ylim()  # type: ignore[attr-defined]
    return [t.get_text() for t in ax.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi]  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["compare_busbw", "compare_latency"])
def test_compare_figure_axes(name: str, tmp_path: Path) -> None:
    fig = COMPARE_FIGURES[name](Comparison(_aligned(), LABELS))
    assert fig is not None
    fig.savefig(tmp_path / f"{name}.png")  # the object that is saved, drawn once as it is
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["all_reduce", "all_gather"]
    for ax in axes:
        assert ax.get_yscale() == "log" and ax.get_xscale() == "log"
        assert ax.get_ylabel().strip(), "every panel's y axis is labelled"
        assert len(_labelled_major_ticks(fig, ax)) >= 3, (ax.get_title(), ax.get_ylim())
        lines = ax.get_lines()
        assert len(lines) == 2 * len(LABELS)  # precision x run
        for line in lines:  # line style = run, the same for every precision
            run = line.get_label().rsplit("[", 1)[1].rstrip("]")
            assert line.get_linestyle() == LINESTYLES[LABELS.index(run)]
        # one 95 % band per line, in the line's colour
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(bands) == len(lines)
        assert {tuple(b.get_facecolor()[0][:3]) for b in bands} == {tuple(_rgb(line.get_color())) for line in lines}
    # the legend's entries are the drawn lines: the same style, colour and marker under the same label
    (legend,) = fig.legends
    drawn = {line.get_label(): line for ax in axes for line in ax.get_lines()}
    texts = [t.get_text() for t in legend.get_texts()]
    assert sorted(texts) == sorted(drawn)
    for handle, text in zip(legend.legend_handles, texts, strict=True):
        line = drawn[text]
        assert handle.get_linestyle() == line.get_linestyle()  # type: ignore[union-attr]
        assert handle.get_color() == line.get_color() and handle.get_marker() == line.get_marker()  # type: ignore[union-attr]


def _rgb(colour: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return to_rgb(colour)


def test_busbw_band_comes_from_time_s_interval() -> None:
    # busbw = bytes / time: its band's ends are busbw * t / t_high and busbw * t / t_low
    al = _aligned()
    fig = COMPARE_FIGURES["compare_busbw"](Comparison(al, LABELS))
    assert fig is not None
    ax = fig.axes[0]
    band = next(c for c in ax.collections if isinstance(c, PolyCollection))
    ys = band.get_paths()[0].vertices[:, 1]
    g = al[(al["collective"] == "all_reduce") & (al["precision"] == "fp32")].sort_values("size_bytes")
    want_lo = g["busbw_gbps|A"] / 1.04
    want_hi = g["busbw_gbps|A"] / 0.96
    assert min(ys) == pytest.approx(min(want_lo)) and max(ys) == pytest.approx(max(want_hi))
