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

from commbench.core.units import human_bytes, human_rate
from commbench.store.nccl_import import import_nccl_tests
from commbench.views import render, report
from commbench.views.rundata import load_run
from commbench.views.tables import gain_table

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
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
    # the suite, last, as TOML that reads back to the suite in metadata.json (not a one-line JSON dump)
    toml_block = md.split("## Suite (resolved)", 1)[1].split("```toml\n", 1)[1].split("\n```", 1)[0]
    back = tomllib.loads(toml_block)
    for k, v in meta["suite"].items():
        if v is not None and not isinstance(v, dict):
            assert back[k] == v, k
    assert "collectives = [&#34;all_reduce&#34;, &#34;all_gather&#34;]" in html
    # the peak busbw table: max busbw per collective x precision (human units), read from the CSV independently
    normal = csv[csv["payload"] == csv["payload"].iloc[0]]
    for (coll, prec), g in normal.groupby(["collective", "precision"]):
        peak = g["busbw_gbps"].max()
        assert f"{human_rate(float(peak))} @ " in md, (coll, prec)
    # the order a reader needs: the answer first, how it was measured last
    heads = [ln for ln in md.splitlines() if ln.startswith("## ")]
    assert heads == ["## Findings", "## Figures", "## Tables", "## Full tables", "## Metadata", "## Suite (resolved)"]
    assert "&gt;" not in "\n".join(ln for ln in md.splitlines() if ln.startswith("#"))
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
    full = md.split("### All collective points", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
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
        # human units: the median step time in ms (3 significant digits), bytes per step in KiB/MiB
        ms = float(r["step_time_us_p50"]) / 1e3
        assert f"| {float(f'{ms:.3g}'):g} ms [" in line or f"| {float(f'{ms:.3g}'):g} ms |" in line, line
        assert f"| {human_bytes(float(r['comm_bytes_per_step']))} (" in line
        # the bytes-by-dtype breakdown adds up to the measured bytes per step
        assert sum(json.loads(r["comm_by_op"]).values()) == pytest.approx(r["comm_bytes_per_step"])
    assert "### Training steps (training_steps.csv)" in md
    section = md.split("### Training steps", 1)[1].split("\n## ", 1)[0]
    assert sum(1 for ln in section.splitlines() if ln.startswith("| ")) == len(steps) + 1


def test_hostile_metadata_is_escaped(tmp_path: Path) -> None:
    # no training rows: the hostile strings live in the metadata and the collectives' rows (fewer figures to draw)
    run = fabricate_run(
        tmp_path / "<b>run</b>", host=HOSTILE, training=False, meta_extra={"device_name": "<img src=x onerror=alert(1)>"}
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
    table = gain_table(df)
    assert table is not None
    d = df[(df["collective"] == "all_reduce") & (df["payload"] == "normal")]
    big = d["fp32_bytes"].max()
    eff = d[d["fp32_bytes"] == big].set_index("precision")["effective_gbps"]
    row = next(r for r in table.rows if r[:3] == ["all_reduce", "normal", "fp8_e4m3"])
    # a fabricated run has no paired intervals: the effective-bandwidth ratio, and no verdict
    assert row[3] == f"{eff['fp8_e4m3'] / eff['fp32']:.2f}×" and row[4] == ""


def test_missing_run_dir(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        report.write_report(tmp_path / "nope")


def test_a_figure_registered_here_appears_in_the_report(tmp_path: Path) -> None:
    """ARCHITECTURE.md's "add a plot" recipe: one `FIGURES.register` call, from this file alone."""
    import matplotlib.pyplot as plt

    from commbench.views import plots
    from commbench.views.rundata import RunData

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
        out = report.write_report(fabricate_run(tmp_path / "run", training=False))  # the toy figure is the collectives'
        empty = report.write_report(fabricate_run(tmp_path / "empty", results=False, training=False))
    finally:
        plots.FIGURES.unregister("toy_points")
    html, md = out["html"].read_text(), out["md"].read_text()
    assert out["toy_points.png"].read_bytes()[:8] == PNG_MAGIC
    assert out["toy_points.svg"].is_file()
    figure_ids = [a.get("id") for tag, a in tags(html) if tag == "figure"]
    assert figure_ids[-1] == "fig-toy_points"  # registered last, drawn last
    assert caption in html
    assert f"![{render.md_escape(caption)}](plots/toy_points.png)" in md
    # a builder that returns None leaves no file and no figure behind
    assert "toy_points.png" not in empty and caption not in empty["html"].read_text()
    assert "toy_points" not in plots.FIGURES


def test_a_figure_name_is_registered_once() -> None:
    from commbench.views import plots

    with pytest.raises(ValueError, match="already registered"):
        plots.FIGURES.register("busbw", "again")(lambda run: None)


# --------------------------------------------------------------------------- findings from intervals

SIZES = (1024, 16384, 262144, 1 << 20, 4 << 20)
HALF = 0.10
"""Every fabricated speed-up gets the interval [g * (1 - HALF), g * (1 + HALF)]: significant iff it excludes 1."""


def interval_run(run_dir: Path) -> Path:
    """A fabricated run whose rows carry paired speed-ups with intervals, written in the results schema.

    Timings follow fabricate_rows' closed forms (fp32: 20 + f/2000 us; fp8: 44 + 3f/8000 us), so fp8 wins
    significantly from 1 MiB on. bf16 all_reduce is made a native precision that is slower in the collective
    itself (1.5x fp32's time, no encode/decode), as gloo's 16-bit reductions are.
    """
    from commbench.store.results import crossover, write_table
    from tests.views_util import fabricate_training

    fabricate_run(run_dir, payloads=("normal",), collectives=("all_reduce", "all_gather"), sizes=SIZES, training=False)
    df = pd.read_csv(run_dir / "results.csv")
    fp32 = df[df["precision"] == "fp32"].set_index(["collective", "fp32_bytes"])
    slow = (df["collective"] == "all_reduce") & (df["precision"] == "bf16")
    base = [fp32.loc[(c, f), "total_us"] for c, f in zip(df["collective"], df["fp32_bytes"], strict=True)]
    df.loc[slow, ["encode_us", "decode_us"]] = 0.0
    df.loc[slow, "comm_us"] = df.loc[slow, "time_us"] = [1.5 * b for b, s in zip(base, slow, strict=True) if s]
    df.loc[slow, "total_us"] = df.loc[slow, "comm_us"]
    df["effective_gbps"] = df["fp32_bytes"] / df["total_us"] / 1e3
    df["gain_vs_fp32"] = [b / t for b, t in zip(base, df["total_us"], strict=True)]
    df["gain_ci_low"], df["gain_ci_high"] = df["gain_vs_fp32"] * (1 - HALF), df["gain_vs_fp32"] * (1 + HALF)
    df["gain_significant"] = (df["gain_ci_low"] > 1) | (df["gain_ci_high"] < 1)
    split = (df["collective"] == "all_reduce") & (df["precision"] == "fp8_e4m3")
    df.loc[split, ["algo_gain", "algo_gain_ci_low", "algo_gain_ci_high"]] = (0.5, 0.45, 0.55)
    df.loc[split, "precision_gain"] = df.loc[split, "gain_vs_fp32"] / 0.5
    df.loc[split, "precision_gain_ci_low"] = df.loc[split, "precision_gain"] * (1 - HALF)
    df.loc[split, "precision_gain_ci_high"] = df.loc[split, "precision_gain"] * (1 + HALF)
    df["noisy"] = [i < 3 for i in range(len(df))]
    fp32_rows = df["precision"] == "fp32"
    df.loc[fp32_rows, ["gain_ci_low", "gain_ci_high", "gain_significant"]] = (1.0, 1.0, False)
    write_table(run_dir, "results", df)
    write_table(run_dir, "crossover", pd.DataFrame(crossover(df)))
    summary, steps = fabricate_training()
    summary["speedup_ci_low"] = [1.0, 1.1, 0.9]  # fp32, bf16 (1.25x: significant), fp8_e4m3 (1.43x: not)
    summary["speedup_ci_high"] = [1.0, 1.4, 1.8]
    write_table(run_dir, "training", summary)
    write_table(run_dir, "training_steps", steps)
    return run_dir


def totals(f: int) -> dict[str, float]:
    """fabricate_rows' closed forms (total = 2 * encode + comm), with bf16 all_reduce as set above."""
    fp32 = 20 + f / 2000
    fp8 = 2 * (2 + f / 8e3) + 20 + (f / 4 + 4) / 2000
    return {"fp32": fp32, "fp8_e4m3": fp8, "bf16": 1.5 * fp32}


def ci(g: float) -> str:
    return f"{g:.2f}× [{g * (1 - HALF):.2f}–{g * (1 + HALF):.2f}]"


def test_findings_state_only_significant_results(tmp_path: Path) -> None:
    run = interval_run(tmp_path / "run")
    out = report.write_report(run)
    md = out["md"].read_text()
    findings = md.split("## Findings", 1)[1].split("## Figures", 1)[0]
    # fp8: the smallest size from which every larger size has g * 0.9 > 1, from the closed forms
    gains = {f: totals(f)["fp32"] / totals(f)["fp8_e4m3"] for f in SIZES}
    cross = next(f for i, f in enumerate(SIZES) if all(gains[s] * (1 - HALF) > 1 for s in SIZES[i:]))
    assert SIZES[0] < cross < SIZES[-1]  # the fabricated timings have a crossover inside the range
    big, at = SIZES[-1], human_bytes(cross)
    below = SIZES[SIZES.index(cross) - 1]
    if gains[below] * (1 + HALF) < 1:  # fp32 significantly faster just below: the crossover is located
        tail = f"; at {human_bytes(below)} fp32 is significantly faster."
    else:
        losses = [f for f in SIZES if f < cross and gains[f] * (1 + HALF) < 1]
        tail = f" (the crossover lies between {human_bytes(losses[-1])} and {at})." if losses else ""
    assert f"fp8_e4m3 all_reduce is faster than fp32 from {at}: {ci(gains[big])} at 4 MiB{tail}" in findings
    # bf16 all_reduce: fp32 is significantly faster at the largest size: said, with its interval
    assert "bf16 does not pay for all_reduce in the measured range (1 KiB – 4 MiB)" in findings
    assert f"(speed-up {ci(1 / 1.5)})" in findings
    # the algorithm / precision split of fp8 all_reduce at the largest size
    pg = gains[big] / 0.5
    assert (
        f"Of fp8_e4m3's {ci(gains[big])} on all_reduce at 4 MiB, 0.50× [0.45–0.55] comes from the chunked "
        f"all_to_all algorithm and {pg:.2f}× [{pg * 0.9:.2f}–{pg * 1.1:.2f}] from fewer bytes." in findings
    )
    # training: bf16's interval excludes 1, fp8_e4m3's does not
    assert "Training: bf16 steps are 1.25× [1.10–1.40] faster than fp32." in findings
    assert "no significant step-time difference from fp32 for fp8_e4m3" in findings
    assert "fp8_e4m3 steps are" not in findings
    n = len(pd.read_csv(run / "results.csv"))
    assert f"3 of {n} points are noisy" in findings
    # the pitfall names the cause that applies: a native precision has no encode/decode to blame
    pit = next(ln for ln in md.splitlines() if ln.startswith("- all_reduce bf16: slower than fp32"))
    assert "collective itself is slower" in pit and "encode" not in pit.split(":", 2)[2]


def test_tables_show_intervals_and_a_winner_only_when_significant(tmp_path: Path) -> None:
    run = load_run(interval_run(tmp_path / "run"))
    tables = {t.key: t for t in report.build_tables(run)["summary"]}
    best = [r for r in tables["best-precision"].rows if r[0] == "all_reduce"]
    # fp8 wins where its interval lies above 1 (g * 0.9 > 1), and nowhere else
    g = {f: totals(f)["fp32"] / totals(f)["fp8_e4m3"] for f in SIZES}
    wins = [f for f in SIZES if g[f] * (1 - HALF) > 1]
    assert best[-1] == ["all_reduce", f"{human_bytes(wins[0])} – 4 MiB", "fp8_e4m3", ci(g[wins[0]])]
    assert all(r[2] != "fp8_e4m3" for r in best[:-1])
    gain = next(r for r in tables["gain"].rows if r[:3] == ["all_reduce", "normal", "bf16"])
    assert gain[3:5] == [ci(1 / 1.5), "slower"]
    ag = next(r for r in tables["gain"].rows if r[:3] == ["all_gather", "normal", "bf16"])
    bf = totals(SIZES[-1])["fp32"] / (2 * (2 + SIZES[-1] / 8e3) + 20 + SIZES[-1] / 2 / 2000)
    assert ag[3:5] == [ci(bf), "no significant difference"]
    cx = next(r for r in tables["crossover"].rows if r[:2] == ["all_reduce", "fp8_e4m3"])
    losses = [f for f in SIZES if f < wins[0] and g[f] * (1 + HALF) < 1]
    where = f"faster from {human_bytes(wins[0])}"
    if not (losses and losses[-1] == SIZES[SIZES.index(wins[0]) - 1]):
        where += (
            f"; crossover between {human_bytes(losses[-1])} and {human_bytes(wins[0])}"
            if losses
            else "; crossover at or below it (no significant loss below)"
        )
    assert cx[2:] == [where, ci(g[SIZES[-1]])]
    train = {r[0]: r for r in tables["training-gain"].rows}
    assert train["bf16"][2:4] == ["1.25× [1.10–1.40]", "faster"]
    assert train["fp8_e4m3"][3] == "no significant difference"
    assert train["bf16"][1].startswith("8 ms")  # 10 ms x 0.8, in ms


def test_markdown_escapes_without_entities_in_headings() -> None:
    # '>' opens no HTML tag: readable as is; '<' and '&' become entities; '|' cannot split a cell
    assert render.md_escape("ratio > 1 | <b> & co") == "ratio > 1 \\| &lt;b> &amp; co"


TOY_PLUGIN = """
import matplotlib.pyplot as plt

from commbench.views import plots


@plots.FIGURES.register("plugin_points", "Points per collective, drawn by a plugin module.")
def plugin_points(run):
    if run.results.empty:
        return None
    fig, ax = plt.subplots()
    counts = run.results["collective"].value_counts()
    ax.bar(list(counts.index), list(counts.values))
    return fig
"""

VIEW_PROCESS = """
import sys
from pathlib import Path

import commbench.views.compare
import commbench.views.report

print("torch.distributed imported:", "torch.distributed" in sys.modules)
out = commbench.views.report.write_report(Path(sys.argv[1]))
print("figures:", " ".join(sorted(k for k in out if k.endswith(".png"))))
"""


@pytest.mark.timeout(180)
def test_a_plugins_figure_is_drawn_and_views_import_no_torch_distributed(tmp_path: Path) -> None:
    """A figure registered by a plugin module (``COMMBENCH_PLUGINS``, what ``--plugin`` sets) is drawn by the report
    in a fresh process, and loading the views pulls in no torch.distributed."""
    import os
    import subprocess
    import sys

    (tmp_path / "toy_figure_plugin.py").write_text(TOY_PLUGIN)
    run = fabricate_run(tmp_path / "run", training=False)  # the plugin's figure is drawn from the collectives' rows
    env = {**os.environ, "COMMBENCH_PLUGINS": "toy_figure_plugin"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", VIEW_PROCESS, str(run)], env=env, capture_output=True, text=True, timeout=170
    )
    assert done.returncode == 0, done.stderr
    assert "torch.distributed imported: False" in done.stdout
    assert "plugin_points.png" in done.stdout
    html = (run / "report.html").read_text()
    assert 'id="fig-plugin_points"' in html and "drawn by a plugin module" in html
