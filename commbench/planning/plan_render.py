"""Rendering a plan: ``plan.csv``, ``plan.md`` and ``plan.html`` with their two figures, and the console table.

Views of the frame :func:`commbench.planning.plan.plan` returns (its rows and ``df.attrs``: the options that do not
exist, the assumptions); nothing here prices anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from commbench.planning.pricing import COLUMNS

MEM_PARTS = (
    ("mem_params_bytes", "parameters"),
    ("mem_grads_bytes", "gradients"),
    ("mem_master_bytes", "fp32 master weights"),
    ("mem_optim_bytes", "optimizer states"),
    ("mem_comm_buffers_bytes", "comm buffers"),
    ("mem_activations_bytes", "activations"),
)


def _label(df: pd.DataFrame) -> list[str]:
    return [f"#{r} {s} {p}" for r, s, p in zip(df["rank"], df["strategy"], df["precision"], strict=True)]


def fig_memory(df: pd.DataFrame, device_memory: float | None) -> Any:
    """A stacked horizontal bar of memory per rank for each option (GB = 1e9 bytes)."""
    import matplotlib.pyplot as plt

    from commbench.views.plots import no_math

    fig, ax = plt.subplots(figsize=(9, 0.35 * len(df) + 1.6))
    labels = [no_math(s) for s in _label(df)]
    left = [0.0] * len(df)
    for col, name in MEM_PARTS:
        vals = [0.0 if pd.isna(v) else float(v) / 1e9 for v in df[col]]
        ax.barh(labels, vals, left=left, label=name)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    if device_memory:
        ax.axvline(device_memory / 1e9, color="k", ls="--", lw=1, label="device memory")
    ax.invert_yaxis()
    ax.set_xlabel("memory per rank (GB = 1e9 bytes)")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Memory per rank by option", fontsize=10)
    fig.tight_layout()
    return fig


def fig_step(df: pd.DataFrame) -> Any:
    """Step-time breakdown (compute, exposed and hidden communication); bytes intra/inter without times."""
    import matplotlib.pyplot as plt

    from commbench.views.plots import no_math

    fig, ax = plt.subplots(figsize=(9, 0.35 * len(df) + 1.6))
    labels = [no_math(s) for s in _label(df)]
    if df["comm_time_s"].notna().any():
        comp = df["compute_s"].fillna(0.0).to_numpy(float) * 1e3
        comm = df["comm_time_s"].fillna(0.0).to_numpy(float) * 1e3
        exposed = df["exposed_comm_s"].fillna(df["comm_time_s"]).fillna(0.0).to_numpy(float) * 1e3
        ax.barh(labels, comp, label="compute")
        ax.barh(labels, exposed, left=comp, label="exposed communication")
        ax.barh(labels, comm - exposed, left=comp + exposed, label="hidden communication (overlapped)", alpha=0.4)
        ax.set_xlabel("ms per step")
        ax.set_title("Step time breakdown (empty bars: the cost model lacks a key)", fontsize=10)
    else:
        a = df["comm_bytes_intra"].to_numpy(float) / 1e9
        e = df["comm_bytes_inter"].to_numpy(float) / 1e9
        ax.barh(labels, a, label="intra-node")
        ax.barh(labels, e, left=a, label="inter-node")
        ax.set_xlabel("bus bytes per rank per step (GB = 1e9)")
        ax.set_title("Communication per step (no cost model: no times)", fontsize=10)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def write_plan(df: pd.DataFrame, out: str | os.PathLike[str], device_memory: float | None = None) -> dict[str, Path]:
    """``out/plan.csv``, ``plan.md``, ``plan.html`` and ``plots/plan_*.png|svg``; returns the paths."""
    from commbench.views.plots import save_figure
    from commbench.views.render import render_html, render_markdown
    from commbench.views.tables import Table, frame_table

    d = Path(out)
    try:
        (d / "plots").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"output directory {d} cannot be created: {e.strerror or e}") from None
    paths = {"csv": d / "plan.csv", "md": d / "plan.md", "html": d / "plan.html"}
    df.to_csv(paths["csv"], index=False)
    figures = []
    if not df.empty:
        for name, fig, cap in (
            ("plan_memory", fig_memory(df, device_memory), "Memory per rank, stacked by kind, per option"),
            ("plan_step", fig_step(df), "Step time: compute, exposed and hidden communication per option"),
        ):
            saved = save_figure(fig, d / "plots", name)
            figures.append((name, cap, saved["png"], saved.get("svg")))
            paths[name] = saved["png"]
    view = df.copy()
    for c in [c for c in view.columns if c.startswith("mem_")]:
        view[c.replace("_bytes", "_GB")] = view.pop(c) / 1e9
    for c in ("comm_bytes_per_step", "comm_bytes_intra", "comm_bytes_inter"):
        view[c.replace("_bytes", "_GB")] = view.pop(c) / 1e9
    shown = ["rank", "strategy", "precision", "world_size", "fits", "mem_total_GB", "mem_model_state_GB",
             "mem_params_GB", "mem_grads_GB", "mem_master_GB", "mem_optim_GB", "mem_comm_buffers_GB",
             "mem_activations_GB", "comm_GB_per_step", "comm_GB_intra", "comm_GB_inter", "comm_time_s",
             "exposed_comm_s", "step_time_s", "tokens_per_s", "comm_model"]  # fmt: skip
    view = view[[c for c in shown if c in view.columns]]
    tables = [frame_table("plan", "Options, ranked", view, "GB = 1e9 bytes; per rank and per step")]
    skipped = df.attrs.get("skipped") or {}
    if skipped:
        tables.append(Table("skipped", "Options that do not exist", ["option", "why"], [[k, v] for k, v in skipped.items()]))
    tables.append(Table("assumptions", "Assumptions", ["assumption"], [[a] for a in df.attrs.get("assumptions", [])]))
    tables.append(Table("columns", "Columns of plan.csv", ["column", "meaning"], [[k, v] for k, v in COLUMNS.items()]))
    sections = [("summary", "Plan", tables)]
    title = "commbench plan"
    if not df.empty:
        r = df.iloc[0]
        title += f": {r['params']:.3g} parameters on {r['nodes']} node(s) x {r['gpus_per_node']} ranks"
    paths["html"].write_text(render_html(title, sections, figures, None), encoding="utf-8")
    paths["md"].write_text(render_markdown(title, sections, figures, None, d), encoding="utf-8")
    return paths


def format_plan(df: pd.DataFrame) -> str:
    """A short console table of the ranked options."""
    if df.empty:
        return "# no option"
    view = pd.DataFrame(
        {
            "rank": df["rank"],
            "option": df["strategy"] + "/" + df["precision"],
            "fits": df["fits"].map(lambda v: "" if v is None else ("yes" if v else "NO")),
            "mem_GB": df["mem_total_bytes"] / 1e9,
            "comm_GB": df["comm_bytes_per_step"] / 1e9,
            "inter_GB": df["comm_bytes_inter"] / 1e9,
            "comm_ms": df["comm_time_s"] * 1e3,
            "step_ms": df["step_time_s"] * 1e3,
            "tokens/s": df["tokens_per_s"],
        }
    )
    return view.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-")


__all__ = ["MEM_PARTS", "fig_memory", "fig_step", "format_plan", "write_plan"]
