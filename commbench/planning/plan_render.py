"""Rendering a plan: ``plan.csv``, ``plan.md`` and ``plan.html`` with their two figures, and the console table.

Views of the frame :func:`commbench.planning.plan.plan` returns (its rows and ``df.attrs``: the options that do not
exist, the assumptions), and of :func:`commbench.planning.search.search`'s (``search.csv``, ``search.md``,
``search.html``: the answer first); nothing here prices anything. Every time is shown with its interval, and every
warning the pricing left in ``comm_model`` (an extrapolation, a key the cost model lacks) is printed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from commbench.planning.layout_plan import fmt_gb, fmt_rate, fmt_time
from commbench.planning.layout_render import console_frame, format_rows, output_paths, table_lines, width, wrap
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
        exposed = df["comm_exposed_s"].fillna(df["comm_time_s"]).fillna(0.0).to_numpy(float) * 1e3
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

    paths = output_paths(out, "plan")
    d = paths["csv"].parent
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
             "comm_time_low_s", "comm_time_high_s", "comm_exposed_s", "step_time_s", "step_time_low_s",
             "step_time_high_s", "tokens_per_s", "comm_model"]  # fmt: skip
    view = view[[c for c in shown if c in view.columns]]
    tables = [Table("answer", "Answer", ["answer"], [[answer_line(df)]])]
    warn = warnings(df)
    if warn:
        tables.append(Table("warnings", "Warnings", ["option", "warning"], warn))
    tables.append(frame_table("plan", "Options, ranked", view, "GB = 1e9 bytes; per rank and per step"))
    skipped = df.attrs.get("skipped") or {}
    if skipped:
        tables.append(Table("skipped", "Options that do not exist", ["option", "why"], [[k, v] for k, v in skipped.items()]))
    tables.append(Table("assumptions", "Assumptions", ["assumption"], [[a] for a in df.attrs.get("assumptions", [])]))
    tables.append(Table("columns", "Columns of plan.csv", ["column", "meaning"], [[k, v] for k, v in COLUMNS.items()]))
    sections = [("summary", "Plan", tables)]
    title = "commbench plan"
    if not df.empty:
        r = df.iloc[0]
        title += f": {fmt_count(r['params'])} parameters on {r['nodes']} node(s) x {r['gpus_per_node']} ranks"
    paths["html"].write_text(render_html(title, sections, figures, None), encoding="utf-8")
    paths["md"].write_text(render_markdown(title, sections, figures, None, d), encoding="utf-8")
    return paths


def fmt_count(v: float) -> str:
    """A count without an exponent: ``175B``, ``6.74B``, ``125M``."""
    for unit, k in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= k:
            return f"{v / k:.3g}{unit}"
    return f"{v:.3g}"


def answer_line(df: pd.DataFrame) -> str:
    """The plan's answer in one line: the first-ranked option with its memory and, when priced, its step time and
    interval."""
    if df.empty:
        return "no option"
    r = df.iloc[0]
    fits = "" if r["fits"] is None else (", fits" if r["fits"] else ", does NOT fit")
    out = (
        f"{fmt_count(r['params'])} parameters on {r['nodes']} x {r['gpus_per_node']} ranks: {r['strategy']} "
        f"{r['precision']}, {r['mem_total_bytes'] / 1e9:.3g} GB per rank{fits}"
    )
    if pd.notna(r["step_time_s"]):
        out += (
            f", step {fmt_time(r['step_time_s'])} ({fmt_time(r['step_time_low_s'])}-"
            f"{fmt_time(r['step_time_high_s'])})"
        )
        if pd.notna(r["tokens_per_s"]):
            out += f", {fmt_rate(r['tokens_per_s'])} tokens/s"
    elif pd.notna(r["comm_time_s"]):
        out += (f", comm {fmt_time(r['comm_time_s'])} ({fmt_time(r['comm_time_low_s'])}-"
                f"{fmt_time(r['comm_time_high_s'])})")  # fmt: skip
    else:
        out += " (ranked by memory: no time)"
    return out


def warnings(df: pd.DataFrame) -> list[list[str]]:
    """(option, warning) of every option whose communication is extrapolated or unpriced."""
    out = []
    for _, r in df.iterrows():
        warned = r.get("comm_warned") is True or r["comm_extrapolated"] is True
        priced = r["comm_extrapolated"] is not None  # None: no cost model was given, nothing to warn about
        if warned or (priced and pd.isna(r["comm_time_s"]) and r["comm_model"]):
            out.append([f"{r['strategy']}/{r['precision']}", str(r["comm_model"])])
    return out


FLAT_CONSOLE = (("rank", 1), ("option", 1), ("fits", 1), ("mem", 1), ("step", 1), ("tokens/s", 2), ("comm", 2),
                ("comm 95%", 3), ("comm bytes", 4), ("inter-node", 5))  # fmt: skip
"""The flat plan's console columns and their priority (1 kept longest on a narrow terminal)."""


def format_plan(df: pd.DataFrame, cols: int | None = None) -> str:
    """The answer line, a short console table of the ranked options, then the warnings: times with their units,
    sizes in GB, no line wider than the terminal."""
    if df.empty:
        return "# no option"
    cols = cols or width()

    def gb(v: float) -> str:
        return "-" if pd.isna(v) else fmt_gb(float(v))

    view = pd.DataFrame(
        {
            "rank": df["rank"].astype(str),
            "option": df["strategy"] + "/" + df["precision"],
            "fits": df["fits"].map(lambda v: "" if v is None else ("yes" if v else "NO")),
            "mem": [gb(v) for v in df["mem_total_bytes"]],
            "step": [fmt_time(float(v)) for v in df["step_time_s"]],
            "tokens/s": [fmt_rate(float(v)) for v in df["tokens_per_s"]],
            "comm": [fmt_time(float(v)) for v in df["comm_time_s"]],
            "comm 95%": [f"{fmt_time(float(a))}-{fmt_time(float(b))}" if pd.notna(a) else "-"
                         for a, b in zip(df["comm_time_low_s"], df["comm_time_high_s"], strict=True)],
            "comm bytes": [gb(v) for v in df["comm_bytes_per_step"]],
            "inter-node": [gb(v) for v in df["comm_bytes_inter"]],
        }
    )  # fmt: skip
    lines = [*wrap(answer_line(df), cols), *table_lines(view, cols, FLAT_CONSOLE)]
    for opt, w in warnings(df):
        lines += wrap(f"# {opt}: {w}", cols)
    return "\n".join(lines)


def fig_search(df: pd.DataFrame) -> Any | None:
    """Tokens/s of the best option per GPU count, with its interval and its layout; None when nothing is priced."""
    ok = df[(df["ruled_out"] == "") & df["tokens_per_s"].notna()]
    if ok.empty:
        return None
    import matplotlib.pyplot as plt

    best = ok.loc[ok.groupby("gpus")["tokens_per_s"].idxmax()].sort_values("gpus")
    fig, ax = plt.subplots(figsize=(8, 4))
    y = best["tokens_per_s"].to_numpy(float) / 1e6
    lo = y - best["tokens_per_s_low"].to_numpy(float) / 1e6
    hi = best["tokens_per_s_high"].to_numpy(float) / 1e6 - y
    ax.errorbar(best["gpus"], y, yerr=[lo, hi], marker="o", capsize=3)
    for x, v, r in zip(best["gpus"], y, best.itertuples(), strict=True):
        ax.annotate(f"TP{r.tp} PP{r.pp} DP{r.dp}\n{r.strategy} {r.precision}", (x, v), fontsize=7,
                    textcoords="offset points", xytext=(4, -18))  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("M tokens/s (best option, interval)")
    ax.set_title("Throughput of the best option per GPU count", fontsize=10)
    fig.tight_layout()
    return fig


def write_search(df: pd.DataFrame, out: str | os.PathLike[str]) -> dict[str, Path]:
    """``out/search.csv`` (every column), ``search.md``, ``search.html``: the answer, the best per GPU count, the
    options that fit (units in every cell), what ruled the rest out, the assumptions; returns the paths."""
    from commbench.planning.search import SEARCH_COLUMNS
    from commbench.views.render import render_html, render_markdown
    from commbench.views.tables import Table

    paths = output_paths(out, "search")
    d = paths["csv"].parent
    df.to_csv(paths["csv"], index=False)
    ok = df[df["ruled_out"] == ""].head(200)
    out_rows = df[df["ruled_out"] != ""]
    reasons = out_rows["ruled_out"].value_counts().head(20)
    view = console_frame(ok) if not ok.empty else pd.DataFrame()
    tables = [
        Table("answer", "Answer", ["answer"], [[df.attrs.get("answer", "")]]),
        Table("per_count", "Best option per GPU count", ["best"], [[x] for x in df.attrs.get("per_count", [])]),
        Table("options", "Options that fit, by tokens/s (the first 200; all in search.csv)", list(view.columns),
              view.values.tolist(), "GB = 1e9 bytes, per GPU; times per optimizer step"),
        Table("ruled_out", "Ruled out, by rule", ["rule", "layouts"], [[k, str(v)] for k, v in reasons.items()]),
        Table("assumptions", "Assumptions", ["assumption"], [[a] for a in df.attrs.get("assumptions", [])]),
        Table("columns", "Columns of search.csv", ["column", "meaning"], [[k, v] for k, v in SEARCH_COLUMNS.items()]),
    ]  # fmt: skip
    sections = [("summary", "Search", tables)]  # the template puts the figures in "summary"
    title = "commbench plan: search over layouts"
    figures = []
    fig = fig_search(df)
    if fig is not None:
        from commbench.views.plots import save_figure

        saved = save_figure(fig, d / "plots", "search_best")
        figures.append(("search_best", "Tokens/s of the best option per GPU count", saved["png"], saved.get("svg")))
        paths["search_best"] = saved["png"]
    paths["html"].write_text(render_html(title, sections, figures, None), encoding="utf-8")
    paths["md"].write_text(render_markdown(title, sections, figures, None, d), encoding="utf-8")
    return paths


def format_search(df: pd.DataFrame, top: int = 12, cols: int | None = None) -> str:
    """The console view: the answer first, the best per GPU count, the top options, what ruled the rest out; no
    line wider than the terminal."""
    cols = cols or width()
    lines = wrap(df.attrs.get("answer", ""), cols)
    for x in df.attrs.get("per_count", []):
        lines += wrap(f"  {x}", cols)
    ok = df[df["ruled_out"] == ""].head(top)
    if not ok.empty:
        lines += format_rows(ok, cols)
    out = df[df["ruled_out"] != ""]
    if not out.empty:
        reasons = out["ruled_out"].str.replace(r"\d+(\.\d+)? GB > .*", "N GB > usable", regex=True).value_counts()
        text = f"# {len(out)} ruled out: " + "; ".join(f"{k} ({v})" for k, v in reasons.head(6).items())
        lines += wrap(text, cols)
    return "\n".join(lines)


__all__ = [
    "MEM_PARTS", "answer_line", "fig_memory", "fig_search", "fig_step", "format_plan", "format_search", "warnings",
    "write_plan", "write_search",
]  # fmt: skip
