"""The run report: one self-contained report.html (figures embedded), a report.md and plots/.

`write_report` loads the run, asks `commbench.views.findings` what to state, the table modules for its tables
(grouped by `build_tables`), `commbench.views.plots` for its figures (plugins' figures included), renders both
documents through `commbench.views.render` and writes them. The report reads run directories only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from commbench.core import plugins
from commbench.store.results import atomic_write_text
from commbench.views import plots
from commbench.views.findings import findings, pitfalls
from commbench.views.metadata_tables import metadata_table, nodes_table, suite_text, topology_tables
from commbench.views.render import render_html, render_markdown, report_title
from commbench.views.rundata import RunData, load_run, reference_precisions
from commbench.views.tables import (
    Table,
    best_precision_table,
    crossover_table,
    frame_table,
    gain_table,
    peak_busbw_table,
)
from commbench.views.training_tables import (
    training_bf16_fp16_table,
    training_gain_table,
    training_parallelism_table,
)

__all__ = ["FULL_RESULT_COLUMNS", "build_tables", "write_report"]

FULL_RESULT_COLUMNS = [
    "collective",
    "precision",
    "impl",
    "placement",
    "redop",
    "payload",
    "size_bytes",
    "count",
    "dtype",
    "time_us",
    "algbw_gbps",
    "busbw_gbps",
    "wrong",
    "fp32_bytes",
    "encode_us",
    "comm_us",
    "decode_us",
    "total_us",
    "effective_gbps",
    "rel_err",
    "max_abs_err",
    "cv",
    "time_us_max",
]


def build_tables(run: RunData) -> dict[str, list[Table]]:
    """The report's tables, grouped: 'metadata', 'summary' and 'full'."""
    df = run.results
    summary = [
        t
        for t in (
            best_precision_table(df, reference_precisions(run)),
            crossover_table(run),
            gain_table(df, reference_precisions(run)),
            training_gain_table(run.training),
            training_parallelism_table(run.training, run.training_steps),
            training_bf16_fp16_table(run.training),
            peak_busbw_table(df),
        )
        if t is not None
    ]
    full: list[Table] = []
    if not df.empty:
        cols = [c for c in FULL_RESULT_COLUMNS if c in df.columns and not df[c].isna().all()]
        sort = [c for c in ("collective", "precision", "payload", "size_bytes") if c in df.columns]
        full.append(
            frame_table(
                "results",
                "All collective points (nccl-tests columns first: size, count, type, time, algbw, busbw, #wrong)",
                df.sort_values(sort)[cols],
                "As in results.csv: sizes in bytes, times in microseconds, bandwidths in GB/s (1e9 bytes/s).",
            )
        )
    if not run.training.empty:
        full.append(frame_table("training", "Training summary (training.csv)", run.training))
    if not run.training_steps.empty:
        full.append(frame_table("training-steps", "Training steps (training_steps.csv)", run.training_steps))
    meta = metadata_table(run.metadata)
    meta.rows.insert(0, ["run directory", str(run.run_dir)])
    nodes = nodes_table(run.metadata)
    return {
        "metadata": [meta, *([nodes] if nodes else []), *topology_tables(run.metadata)],
        "summary": summary,
        "full": full,
    }


def write_report(
    run_dir: Path, out_dir: Path | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, Path]:
    """Write report.html, report.md and plots/*.png|svg for a run into out_dir (default: run_dir).

    Returns {"html": ..., "md": ..., "<figure>.png": ..., "<figure>.svg": ...}.
    Raises ValueError (commbench.store.results.RunDirError) for a directory that is not a run.
    """
    run = load_run(Path(run_dir))
    out = Path(out_dir) if out_dir is not None else Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    # figures a plugin registers are drawn too; builtins=False: the built-in figures are plots' own, and the
    # other built-ins (collectives, policies) import torch, which a view never needs
    plugins.load(builtins=False)
    written = plots.write_plots(run, out / "plots", progress=progress)
    if progress is not None:
        progress("tables and findings")
    figures = [(name, plots.FIGURES[name].caption, paths["png"], paths.get("svg")) for name, paths in written.items()]
    tables = build_tables(run)
    # the answer first (findings, figures, tables), how it was measured last
    sections = [
        ("summary", "Tables", tables["summary"]),
        ("full", "Full tables", tables["full"]),
        ("metadata", "Metadata", tables["metadata"]),
    ]
    suite = run.metadata.get("suite")
    suite_toml = suite_text(suite) if isinstance(suite, dict) else ""
    found = pitfalls(run)
    if run.results.empty and run.training.empty:
        found.insert(0, "This run directory holds no collective results and no training results yet.")
    said = findings(run)
    title = report_title(run.metadata)
    html_path = out / "report.html"
    md_path = out / "report.md"
    banner = []
    if run.metadata.get("end_time") is None:
        # metadata.json gets its end_time when the run completes: without it the rows are a partial run
        banner.append(
            f"Unfinished run: started {run.metadata.get('start_time', '?')} and never completed (no end time in "
            f"metadata.json); the tables hold the points finished so far. Continue it with `commbench run --resume {run_dir}`."
        )
    partial = run.metadata.get("partial")
    if isinstance(partial, dict):  # the sweep stopped early (commbench.cli.sweep_run.mark_partial)
        banner.append(
            f"Partial run ({partial.get('reason', 'stopped')}): {partial.get('final_points', '?')} point(s) finished, "
            f"{partial.get('provisional_points', '?')} provisional (rows marked partial: the estimate from "
            f"{partial.get('fewest_passes_done', '?')} or more of {partial.get('passes', '?')} passes)."
        )
    elif "partial" in run.results.columns and bool(run.results["partial"].eq(True).any()):  # a stop that wrote no why
        banner.append(
            f"Partial run: {int(run.results['partial'].eq(True).sum())} point(s) provisional (rows marked partial: "
            "the estimate from the passes measured before the run stopped)."
        )
    # atomic: a report open in a browser or read by a script is the old one or the new one, never half of one
    atomic_write_text(html_path, render_html(title, sections, figures, found, banner, findings=said, suite=suite_toml))
    atomic_write_text(
        md_path, render_markdown(title, sections, figures, found, out, banner, findings=said, suite=suite_toml)
    )
    result: dict[str, Path] = {"html": html_path, "md": md_path}
    for name, paths in written.items():
        for f, p in paths.items():
            result[f"{name}.{f}"] = p
    return result
