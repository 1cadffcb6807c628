"""The run report (report.html + report.md): content from a real small run, self-containment,
escaping of hostile metadata, and the runs without collective or training tables, or imported."""

from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from commbench import report
from commbench.nccl_import import import_nccl_tests
from tests.views_util import fabricate_run, real_run, real_training_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOSTILE = "<script>alert('x')</script>|`$x$`&\"n1\""


@pytest.fixture(scope="session")
def real_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_run(tmp_path_factory.getbasetemp() / "views")


class Tags(HTMLParser):
    """Collects start tags with their attributes (stdlib parser: an independent reading of the page)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def tags(html: str) -> list[tuple[str, dict[str, str | None]]]:
    p = Tags()
    p.feed(html)
    return p.tags


@pytest.mark.timeout(180)
def test_report_from_real_run(real_run_dir: Path, tmp_path: Path) -> None:
    out = report.write_report(real_run_dir, tmp_path)
    html = out["html"].read_text()
    md = out["md"].read_text()
    meta = json.loads((real_run_dir / "metadata.json").read_text())
    csv = pd.read_csv(real_run_dir / "results.csv")
    # self-contained: every image is an embedded PNG, nothing is fetched from anywhere
    t = tags(html)
    imgs = [a["src"] or "" for tag, a in t if tag == "img"]
    pngs = sorted(k for k in out if k.endswith(".png"))
    assert len(imgs) == len(pngs) == 4
    for src in imgs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_MAGIC
    for tag, a in t:
        for attr in ("src", "href"):
            v = a.get(attr) or ""
            assert not re.match(r"(https?:)?//", v), f"<{tag} {attr}={v}> reaches the network"
    assert tag != "script" and "<script" not in html
    # metadata: versions, hardware, layout, suite, date
    for v in (meta["torch_version"], meta["host"], meta["start_time"], meta["backend"], meta["python_version"]):
        assert str(v) in html and str(v) in md
    assert '"collectives"' in html.replace("&#34;", '"')
    # the peak busbw table: max busbw per collective x precision, read from the CSV independently
    normal = csv[csv["payload"] == csv["payload"].iloc[0]]
    for (coll, prec), g in normal.groupby(["collective", "precision"]):
        peak = g["busbw_gbps"].max()
        assert f"{report.fmt(float(peak))} @ " in md, (coll, prec)
    # summary sections and the full table with every point
    for heading in (
        "Peak bus bandwidth",
        "Best precision per size range",
        "Crossover sizes",
        "Performance gain",
        "Pitfalls found",
        "All collective points",
    ):
        assert heading in html and heading in md
    full = md.split("### All collective points", 1)[1]
    assert sum(1 for ln in full.splitlines() if ln.startswith("| all_")) == len(csv)
    # files: plots in both formats next to the report
    for name in ("busbw", "effective_bw", "latency", "error"):
        assert (tmp_path / "plots" / f"{name}.png").is_file() and (tmp_path / "plots" / f"{name}.svg").is_file()
        assert f"plots/{name}.png" in md


@pytest.mark.timeout(240)
def test_report_from_real_training_run(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    run = real_training_run(tmp_path_factory.getbasetemp() / "views")
    out = report.write_report(run, tmp_path)
    training = pd.read_csv(run / "training.csv")
    steps = pd.read_csv(run / "training_steps.csv")
    assert {"training_time_mem.png", "training_bytes.png", "training_curves.png"} <= set(out)
    md = out["md"].read_text()
    assert "Training: gain and cost of each policy vs fp32" in md
    for _, r in training.iterrows():
        # the per-policy row carries the measured step time and bytes from training.csv
        line = next(ln for ln in md.splitlines() if ln.startswith(f"| {r['policy']} | "))
        assert f"| {report.fmt(float(r['step_time_us_p50']))} |" in line
        assert f"| {report.fmt(int(r['comm_bytes_per_step']))} |" in line
        # the bytes-by-dtype breakdown adds up to the measured bytes per step
        assert sum(json.loads(r["comm_by_op"]).values()) == pytest.approx(r["comm_bytes_per_step"])
    assert "### Training steps (training_steps.csv)" in md
    assert sum(1 for ln in md.split("### Training steps", 1)[1].splitlines() if ln.startswith("| ")) == len(steps) + 1


def test_hostile_metadata_is_escaped(tmp_path: Path) -> None:
    run = fabricate_run(
        tmp_path / "<b>run</b>", host=HOSTILE, meta_extra={"device_name": "<img src=x onerror=alert(1)>"}
    )
    out = report.write_report(run)
    html = out["html"].read_text()
    md = out["md"].read_text()
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "<b>run</b>" not in html and "&lt;b&gt;run&lt;/b&gt;" in html  # the directory name too
    assert "<b>run</b>" not in md
    assert "&lt;script&gt;alert(" in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    # only our own tags: no script tag and no event handler attribute made it into the page
    for tag, attrs in tags(html):
        assert tag != "script"
        assert not any(k.startswith("on") for k in attrs)
    assert "<script>" not in md and "<img src=x" not in md
    # a '|' in a cell is escaped so the Markdown table keeps its columns
    host_row = next(ln for ln in md.splitlines() if ln.startswith("| host |"))
    assert host_row.count(" | ") == 1 and "\\|" in host_row


def test_training_only_run(tmp_path: Path) -> None:
    out = report.write_report(fabricate_run(tmp_path / "run", results=False))
    html = out["html"].read_text()
    assert "Training: gain and cost of each policy" in html
    assert sorted(k for k in out if k.endswith(".png")) == [
        "training_bytes.png",
        "training_curves.png",
        "training_time_mem.png",
    ]
    assert "Peak bus bandwidth" not in html
    assert "training policy fp8_e4m3: loss drift 1%" in html  # the training warnings are pitfalls


def test_run_without_training_and_empty_run(tmp_path: Path) -> None:
    out = report.write_report(fabricate_run(tmp_path / "a", training=False))
    assert "Training" not in out["md"].read_text()
    empty = report.write_report(fabricate_run(tmp_path / "b", results=False, training=False))
    assert "no collective results and no training results" in empty["md"].read_text()


def test_imported_nccl_tests_run(tmp_path: Path) -> None:
    run = import_nccl_tests(Path(__file__).parent / "data" / "nccl_multi.txt", tmp_path / "run")
    out = report.write_report(run)
    md = out["md"].read_text()
    # no encode/decode/error columns -> no effective/error figures, but bandwidth and latency
    assert sorted(k for k in out if k.endswith(".png")) == ["busbw.png", "latency.png"]
    assert "placement=in-place" in md  # both placements are series
    assert "NVIDIA H100 80GB HBM3" in md and "2.27.3" in md


def test_gain_table_matches_formula(tmp_path: Path) -> None:
    run = fabricate_run(tmp_path / "run", training=False)
    df = pd.read_csv(run / "results.csv")
    table = report.gain_table(df)
    assert table is not None
    d = df[(df["collective"] == "all_reduce") & (df["payload"] == "normal")]
    big = d["fp32_bytes"].max()
    eff = d[d["fp32_bytes"] == big].set_index("precision")["effective_gbps"]
    row = next(r for r in table.rows if r[:3] == ["all_reduce", "normal", "fp8_e4m3"])
    assert row[3] == report.fmt(float(eff["fp8_e4m3"] / eff["fp32"]))


def test_missing_run_dir(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        report.write_report(tmp_path / "nope")


def test_a_figure_registered_here_appears_in_the_report(tmp_path: Path) -> None:
    """ARCHITECTURE.md's "add a plot" recipe: one `FIGURES.register` call, from this file alone."""
    import matplotlib.pyplot as plt

    from commbench import plots
    from commbench.rundata import RunData

    caption = "Toy figure: points measured per collective (registered by a test)."

    @plots.FIGURES.register("toy_points", caption)
    def toy_points(run: RunData) -> plt.Figure | None:
        if run.results.empty:
            return None
        fig, ax = plt.subplots()
        counts = run.results["collective"].value_counts()
        ax.bar(list(counts.index), list(counts.values))
        return fig

    try:
        out = report.write_report(fabricate_run(tmp_path / "run"))
        empty = report.write_report(fabricate_run(tmp_path / "empty", results=False, training=False))
    finally:
        plots.FIGURES.unregister("toy_points")
    html, md = out["html"].read_text(), out["md"].read_text()
    assert out["toy_points.png"].read_bytes()[:8] == PNG_MAGIC
    assert out["toy_points.svg"].is_file()
    figure_ids = [a.get("id") for tag, a in tags(html) if tag == "figure"]
    assert figure_ids[-1] == "fig-toy_points"  # registered last, drawn last
    assert caption in html
    assert f"![{report.md_escape(caption)}](plots/toy_points.png)" in md
    # a builder that returns None leaves no file and no figure behind
    assert "toy_points.png" not in empty and caption not in empty["html"].read_text()
    assert "toy_points" not in plots.FIGURES


def test_a_figure_name_is_registered_once() -> None:
    from commbench import plots

    with pytest.raises(ValueError, match="already registered"):
        plots.FIGURES.register("busbw", "again")(lambda run: None)
