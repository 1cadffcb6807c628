"""`commbench plan` against published end-to-end training runs (issue 32, item 7).

    python benchmarks/bench_plan_published.py [--runs ID,ID] [--no-calibration]

Each run of ``benchmarks/data/published_runs.toml`` (Megatron-LM 2021 Table 1 and its ZeRO-3 comparison, Korthikanti
et al. 2022, BLOOM 176B, Llama 3 405B Table 4, MLPerf v3.0/v3.1/v4.1 GPT-3, Megatron-Core on H100, torchtitan and
MosaicML MPT under FSDP, MT-NLG 530B, NVIDIA's DGX Cloud Benchmarking recipes on H100; sources and assumptions in
the file and in docs/validation.md) is priced as a user would price it: ``commbench plan --tp T --pp P --dp D
--cp C --vpp V --micro-batch B --global-batch N --recompute R --gpu G --nodes N --gpus-per-node 8 --layers ...
--out DIR``, run in-process through :func:`commbench.cli.main` with the CLI's own defaults, and its ``plan.csv`` is
read back.

The figure compared is the step time (equivalently tokens/s): each source's printed throughput is turned into the
step time it implies with that source's own FLOP count (``reference`` in the data file), so that the plan's own
FLOP convention does not enter; the ratio printed is predicted/published throughput (published step time over
predicted), with whether the published step time lies inside the plan's [step_time_low_s, step_time_high_s].

Calibration: at most one constant per GPU kind, the plan's ``--kernel-efficiency``, solved so that the plan
reproduces the step time of one named run (``[calibration]`` in the data file); every other run is held out and
marked so. The table is printed twice: with the preset's default kernel efficiency, then calibrated. Last: the
median and max |error| of the held-out runs and each published ranking (PTD-P vs ZeRO-3 as GPUs grow at a fixed
batch, selective vs full recompute, ...) with whether the plan orders the pair the same way.

A flag the plan does not have yet is reported per run in one line (the run is skipped), and so is a plan that
fails: the script stays useful while the planner is being built. Figures: benchmarks/results/ (section "Issue 32:
plan vs published training runs").
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, published as tomli (a dependency there)
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's commbench, installed or not

DATA = ROOT / "benchmarks" / "data" / "published_runs.toml"

Run = dict[str, Any]

FIELDS: dict[str, type | tuple[type, ...]] = {
    "id": str, "source": str, "row": str, "quote": str, "layers": int, "hidden": int, "heads": int,
    "kv_heads": int, "ffn": int, "vocab": int, "seq": int, "mlp": str, "norm": str, "biases": bool,
    "tied_embeddings": bool, "position": str, "gpu": str, "nodes": int, "gpus_per_node": int, "tp": int,
    "pp": int, "cp": int, "dp": int, "vpp": int, "micro_batch": int, "global_batch": int, "recompute": str,
    "sequence_parallel": bool, "strategy": str, "precision": str, "reference": str, "assumed": list, "notes": str,
}  # fmt: skip
"""Every run's fields and their TOML types (the published_* figures vary per source)."""

CHOICES = {
    "mlp": ("gelu", "swiglu"), "norm": ("layernorm", "rmsnorm"), "position": ("learned", "none"),
    "recompute": ("none", "selective", "full"), "strategy": ("ddp", "zero1", "zero2", "zero3", "fsdp"),
    "precision": ("bf16", "fp32"),
    "reference": ("step_time", "megatron_eq3", "model_tflops", "model_mfu", "palm_mfu", "tokens_per_gpu"),
}  # fmt: skip

OPTIONAL_CHOICES = {"attention": ("eager", "flash"), "cp_comm": ("ring", "all_gather")}
"""Optional run fields with their values (absent: the plan's default, flash and ring)."""

# --------------------------------------------------------------------------------------------- the data file


def load(path: Path = DATA) -> dict[str, Any]:
    """The data file: ``run`` (list of runs), ``ranking``, ``calibration`` (GPU kind -> run id), ``sources``."""
    with path.open("rb") as f:
        return tomllib.load(f)


def gpus(run: Run) -> int:
    """GPUs of the run (nodes x GPUs per node)."""
    return int(run["nodes"]) * int(run["gpus_per_node"])


def params(run: Run) -> float:
    """Parameters of the run's shape: per layer attention 2h^2 (q, o) + 2h^2 kv/heads (k, v), MLP 2 h ffn (GeLU)
    or 3 h ffn (SwiGLU), two norms (2h each for LayerNorm, h for RMSNorm), biases (q/k/v/o and the MLP's) when
    the run has them; a final norm; the embedding V h, twice when untied; learned positions s h."""
    h, f, kvh = run["hidden"], run["ffn"], run["hidden"] * run["kv_heads"] / run["heads"]
    norm = 2 * h if run["norm"] == "layernorm" else h
    gated = run["mlp"] == "swiglu"
    layer = 2 * h * h + 2 * h * kvh + (3 if gated else 2) * h * f + 2 * norm
    if run["biases"]:
        layer += h + 2 * kvh + h + f * (2 if gated else 1) + h
    emb = run["vocab"] * h * (1 if run["tied_embeddings"] else 2)
    pos = run["seq"] * h if run["position"] == "learned" else 0
    return float(run["layers"] * layer + norm + emb + pos)


def eq3_flops(run: Run) -> float:
    """Narayanan et al. 2021, Eq. 3: FLOPs of one step with full recompute, 96 B s l h^2 (1 + s/(6h) + V/(16 l h))."""
    b, s, l, h, v = run["global_batch"], run["seq"], run["layers"], run["hidden"], run["vocab"]  # noqa: E741
    return 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h))


def model_flops(run: Run) -> float:
    """Korthikanti et al. 2022, section 6: model FLOPs of one step (no recompute), 72 B s l h^2 (1 + s/(6h) +
    V/(12 l h))."""
    b, s, l, h, v = run["global_batch"], run["seq"], run["layers"], run["hidden"], run["vocab"]  # noqa: E741
    return 72.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h))


def palm_flops(run: Run) -> float:
    """Chowdhery et al. 2022 (PaLM), appendix B: model FLOPs of one step, tokens x (6 N + 12 l h s)."""
    tokens = run["global_batch"] * run["seq"]
    return tokens * (6.0 * params(run) + 12.0 * run["layers"] * run["hidden"] * run["seq"])


def work(run: Run) -> float:
    """FLOPs of one step in the convention of the run's source (model FLOPs where it prints a time)."""
    by = {"megatron_eq3": eq3_flops, "palm_mfu": palm_flops, "model_tflops": model_flops, "model_mfu": model_flops,
          "step_time": model_flops, "tokens_per_gpu": palm_flops}  # fmt: skip
    return by[run["reference"]](run)


def published_step_time(run: Run) -> float:
    """The step time the run's printed figure implies, seconds (module docstring)."""
    if run["reference"] == "step_time":
        return float(run["published_step_time_s"])
    if run["reference"] == "model_mfu":
        return work(run) / (float(run["published_mfu"]) * float(run["published_peak_tflops"]) * 1e12 * gpus(run))
    if run["reference"] == "tokens_per_gpu":
        return run["global_batch"] * run["seq"] / (float(run["published_tokens_per_s_per_gpu"]) * gpus(run))
    return work(run) / (float(run["published_tflops_per_gpu"]) * 1e12 * gpus(run))


def per_gpu_rate(run: Run, step_time_s: float) -> float:
    """FLOP/s per GPU at ``step_time_s`` in the source's convention: what a published ranking compares."""
    return work(run) / (step_time_s * gpus(run))


def validate(data: dict[str, Any]) -> list[str]:
    """Every problem of the data file, one line each (empty: none)."""
    bad: list[str] = []
    runs = data.get("run", [])
    ids = [r.get("id") for r in runs]
    bad += [f"duplicate run id {i!r}" for i in sorted({i for i in ids if ids.count(i) > 1})]
    for r in runs:
        rid = r.get("id", "?")
        typed = [f"{rid}: {k} missing or not {getattr(t, '__name__', t)}" for k, t in FIELDS.items()
                 if not isinstance(r.get(k), t) or (t is int and isinstance(r.get(k), bool))]  # fmt: skip
        if typed:
            bad += typed
            continue
        bad += [f"{rid}: {k}={r[k]!r} not one of {', '.join(v)}" for k, v in CHOICES.items() if r[k] not in v]
        bad += [f"{rid}: assumed names unknown field {a!r}" for a in r["assumed"] if a not in r]
        for key in ("tp_comm_overlap", "fp8_gemms", "overlap_param_gather", "fp8_param_gather"):
            if not isinstance(r.get(key, False), bool):
                bad.append(f"{rid}: {key} not bool")
        bad += [f"{rid}: {key}={r[key]!r} not one of {', '.join(v)}" for key, v in OPTIONAL_CHOICES.items()
                if key in r and r[key] not in v]
        if r["source"] not in data.get("sources", {}):
            bad.append(f"{rid}: unknown source {r['source']!r}")
        if r["tp"] * r["pp"] * r["cp"] * r["dp"] != gpus(r):
            bad.append(f"{rid}: tp*pp*cp*dp = {r['tp'] * r['pp'] * r['cp'] * r['dp']} != {gpus(r)} GPUs")
        if r["heads"] % r["tp"] or r["hidden"] % r["heads"] or r["heads"] % r["kv_heads"]:
            bad.append(f"{rid}: tp={r['tp']}, heads={r['heads']}, kv_heads={r['kv_heads']} do not divide")
        if r["global_batch"] % (r["dp"] * r["micro_batch"]):
            bad.append(f"{rid}: global batch {r['global_batch']} not a multiple of dp x micro-batch")
        if r["pp"] > r["layers"]:
            bad.append(f"{rid}: pp={r['pp']} > {r['layers']} layers")
        needs = {"step_time": ("published_step_time_s",), "model_mfu": ("published_mfu", "published_peak_tflops"),
                 "tokens_per_gpu": ("published_tokens_per_s_per_gpu",)}
        for need in needs.get(r["reference"], ("published_tflops_per_gpu",)):
            if not isinstance(r.get(need), float) or r[need] <= 0:
                bad.append(f"{rid}: reference {r['reference']} needs a positive float {need}")
    known = set(ids)
    for k in data.get("ranking", []):
        bad += [
            f"ranking {k.get('id')}: unknown run {k.get(s)!r}" for s in ("better", "worse") if k.get(s) not in known
        ]
    for kind, rid in data.get("calibration", {}).items():
        run = next((r for r in runs if r.get("id") == rid), None)
        if run is None or run.get("gpu") != kind:
            bad.append(f"calibration {kind}: {rid!r} is not a run on {kind}")
    return bad


# --------------------------------------------------------------------------------------------- the plan CLI

REQUIRED = ("--tp", "--pp", "--dp", "--cp", "--vpp", "--micro-batch", "--global-batch", "--recompute", "--gpu",
            "--nodes", "--gpus-per-node", "--layers", "--hidden", "--heads", "--kv-heads", "--ffn", "--vocab",
            "--seq", "--mlp", "--norm", "--out")  # fmt: skip
"""The flags of issue 32's fixed-layout mode every run needs."""


def plan_flags() -> set[str]:
    """The option strings ``commbench plan`` accepts now (read off the CLI's own parser)."""
    from commbench.cli import build_parser

    for action in build_parser(suite_defaults=False)._actions:
        if isinstance(action, argparse._SubParsersAction) and "plan" in action.choices:
            return set(action.choices["plan"]._option_string_actions)
    return set()


def plan_argv(
    run: Run, out: Path, flags: set[str], kernel_efficiency: float | None = None
) -> tuple[list[str], list[str]]:
    """(argv of ``commbench plan`` for the run, the flags it needs that ``flags`` lacks). Optional flags
    (``--sequence-parallel``, ``--tp-comm-overlap``) are passed only where the plan has them; the strategy and
    precision go to ``--strategy``/``--precision`` or, without those, to ``--strategies``/``--precisions``."""
    argv = ["plan"]
    for flag in REQUIRED[:-1]:  # --tp 8 ... --norm layernorm: each flag names the run's field
        argv += [flag, str(run[flag[2:].replace("-", "_")])]
    needed = list(REQUIRED)
    for flag, on in (("--biases", run["biases"]), ("--tied-embeddings", run["tied_embeddings"])):
        if on:
            argv.append(flag)
            needed.append(flag)
    for flag, on in (
        ("--sequence-parallel", run["sequence_parallel"]),
        ("--tp-comm-overlap", run.get("tp_comm_overlap")),
        ("--fp8-gemms", run.get("fp8_gemms")),
        ("--overlap-param-gather", run.get("overlap_param_gather")),
        ("--fp8-param-gather", run.get("fp8_param_gather")),
    ):
        if on and flag in flags:  # optional: a plan without the flag prices the run without it
            argv.append(flag)
    for one, many, key in (("--strategy", "--strategies", "strategy"), ("--precision", "--precisions", "precision")):
        flag = one if one in flags else many
        argv += [flag, run[key]]
        needed.append(flag)
    for flag, key in (("--attention", "attention"), ("--cp-comm", "cp_comm")):
        if run.get(key):
            argv += [flag, run[key]]
            needed.append(flag)
    if kernel_efficiency is not None:
        argv += ["--kernel-efficiency", f"{kernel_efficiency:.6g}"]
        needed.append("--kernel-efficiency")
    argv += ["--out", str(out)]
    return argv, [f for f in dict.fromkeys(needed) if f not in flags]


@dataclass(frozen=True, slots=True)
class Priced:
    """The plan's row for one run."""

    step_time_s: float
    low_s: float
    high_s: float
    tflops_per_gpu: float
    mfu: float
    fits: str
    bubble_frac: float = math.nan
    """The plan's pipeline bubble, a fraction of the step (NaN: the plan has no such column)."""
    comm_exposed_s: float = math.nan
    """Communication no compute hides, s (NaN: no such column)."""


def pick_row(rows: list[dict[str, str]], run: Run) -> tuple[dict[str, str] | None, str]:
    """The plan.csv row of the run's layout (columns the CSV has are matched; a row must remain), with a note when
    more than one row matches (the first is taken)."""
    want = {"tp": run["tp"], "pp": run["pp"], "dp": run["dp"], "cp": run["cp"], "vpp": run["vpp"],
            "micro_batch": run["micro_batch"], "strategy": run["strategy"], "precision": run["precision"]}  # fmt: skip
    match = [r for r in rows if all(str(v) == r[k] for k, v in want.items() if k in r and r[k] != "")]
    if not match:
        return None, f"plan.csv has no row for tp={run['tp']} pp={run['pp']} dp={run['dp']} {run['strategy']}"
    return match[0], ("" if len(match) == 1 else f"{len(match)} plan.csv rows match; the first is used")


def read_priced(csv_path: Path, run: Run) -> Priced | str:
    """The run's plan.csv row as :class:`Priced`, or the reason it cannot be read."""
    with csv_path.open(newline="") as f:
        row, note = pick_row(list(csv.DictReader(f)), run)
    if row is None:
        return note
    cols = ("step_time_s", "step_time_low_s", "step_time_high_s", "tflops_per_gpu", "mfu")
    missing = [c for c in cols if c not in row]
    if missing:
        return f"plan.csv lacks {', '.join(missing)}"
    try:
        vals = [float(row[c]) for c in cols]
    except ValueError:
        return f"plan.csv has no number in {', '.join(c for c in cols if not _is_number(row[c]))}"
    extra = [float(row[c]) if _is_number(row.get(c, "")) else math.nan for c in ("bubble_frac", "comm_exposed_s")]
    return Priced(vals[0], vals[1], vals[2], vals[3], vals[4], row.get("fits", ""), extra[0], extra[1])


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def price(run: Run, flags: set[str], kernel_efficiency: float | None = None) -> Priced | str:
    """Run ``commbench plan`` for the run in-process; its row, or one line saying why there is none."""
    with tempfile.TemporaryDirectory(prefix="commbench-published-") as tmp:
        argv, missing = plan_argv(run, Path(tmp) / "plan", flags, kernel_efficiency)
        if missing:
            return f"plan lacks {' '.join(missing)}"
        from commbench.cli import main

        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(argv)
        except SystemExit as e:  # argparse on a value it refuses
            rc = e.code if isinstance(e.code, int) else 2
        except Exception as e:  # noqa: BLE001 - a planner being built may fail anywhere; say how, go on
            return f"plan failed: {type(e).__name__}: {e}"
        csv_path = Path(tmp) / "plan" / "plan.csv"
        if rc == 1 and csv_path.exists():  # priced, but it does not fit: the step time is still the plan's
            return read_priced(csv_path, run)
        if rc != 0:
            lines = [ln for ln in (err.getvalue() + out.getvalue()).splitlines() if ln.strip()]
            said = [ln for ln in lines if ln.startswith("commbench")] or lines
            return f"plan exit {rc}: {said[-1] if said else '(no message)'}"
        return read_priced(csv_path, run) if csv_path.exists() else "plan wrote no plan.csv"


# ------------------------------------------------------------------------------------------ calibration


def calibrate(
    step_time: Callable[[float], float],
    target_s: float,
    k0: float = 0.5,
    tol: float = 1e-3,
    lo: float = 0.02,
    hi: float = 1.0,
    max_calls: int = 12,
) -> float:
    """The kernel efficiency k in [lo, hi] at which ``step_time(k)`` equals ``target_s`` (relative ``tol``):
    secant steps in 1/k (exact in two calls when the step time is compute/k + a part that k does not change),
    kept inside the bracket. ValueError when no k in [lo, hi] reaches the target."""
    t_lo, t_hi = step_time(lo), step_time(hi)
    if not min(t_lo, t_hi) <= target_s <= max(t_lo, t_hi):
        raise ValueError(
            f"no kernel efficiency in [{lo}, {hi}] gives {target_s:.4g} s (plan: {t_hi:.4g}..{t_lo:.4g} s)"
        )
    pts = [(1.0 / hi, t_hi), (1.0 / lo, t_lo)]
    x = 1.0 / k0
    for _ in range(max_calls):
        t = step_time(1.0 / x)
        if abs(t / target_s - 1.0) <= tol:
            return 1.0 / x
        pts.append((x, t))
        below = max((p for p in pts if p[1] <= target_s), key=lambda p: p[1])
        above = min((p for p in pts if p[1] >= target_s), key=lambda p: p[1])
        if above[1] == below[1]:
            return 1.0 / above[0]
        x = below[0] + (target_s - below[1]) * (above[0] - below[0]) / (above[1] - below[1])
    return 1.0 / x


# -------------------------------------------------------------------------------------------------- report


@dataclass(frozen=True, slots=True)
class Outcome:
    """One run priced (or not) under one kernel-efficiency setting."""

    run: Run
    role: str
    """calibration | held out | default."""
    published_s: float
    priced: Priced | str

    @property
    def ratio(self) -> float | None:
        """Predicted / published throughput (published step time over predicted)."""
        return self.published_s / self.priced.step_time_s if isinstance(self.priced, Priced) else None

    @property
    def inside(self) -> bool | None:
        """The published step time lies in the plan's interval."""
        if not isinstance(self.priced, Priced):
            return None
        return self.priced.low_s <= self.published_s <= self.priced.high_s


def summary(outcomes: Sequence[Outcome]) -> dict[str, float | int]:
    """Median and max |ratio - 1| of the held-out (or default) runs that were priced, the count within 10 % and
    20 %, inside the interval, and priced of all."""
    errs = [abs(o.ratio - 1.0) for o in outcomes if o.ratio is not None and o.role != "calibration"]
    ins = [o.inside for o in outcomes if o.inside is not None and o.role != "calibration"]
    return {
        "priced": len(errs), "of": sum(o.role != "calibration" for o in outcomes),
        "median_abs_err": statistics.median(errs) if errs else math.nan, "max_abs_err": max(errs, default=math.nan),
        "within_10": sum(e <= 0.10 for e in errs), "within_20": sum(e <= 0.20 for e in errs), "inside": sum(ins),
    }  # fmt: skip


def published_holds(data: dict[str, Any], ranking: dict[str, str]) -> bool:
    """The sources' own figures give ``better`` a higher per-GPU throughput than ``worse``."""
    runs = {r["id"]: r for r in data["run"]}
    b, w = runs[ranking["better"]], runs[ranking["worse"]]
    return per_gpu_rate(b, published_step_time(b)) > per_gpu_rate(w, published_step_time(w))


def rankings(data: dict[str, Any], outcomes: Sequence[Outcome]) -> list[tuple[str, str, bool, bool | None]]:
    """Per published ranking whose two runs are among ``outcomes``: (id, claim, the published figures order it so,
    the plan orders it the same way, or None where a run was not priced). Per-GPU throughput in the source's
    convention (:func:`ranking_ratios`)."""
    claims = {k["id"]: k["claim"] for k in data.get("ranking", [])}
    return [(rid, claims[rid], published > 1.0, None if plan is None else plan > 1.0)
            for rid, (published, plan) in ranking_ratios(data, outcomes).items()]  # fmt: skip


def ranking_ratios(data: dict[str, Any], outcomes: Sequence[Outcome]) -> dict[str, tuple[float, float | None]]:
    """Per ranking whose two runs are among ``outcomes``: how many times the better run's per-GPU throughput is
    the worse one's, as published and as the plan prices it (None where a run was not priced): the size of a
    gain (FP8 over BF16, PTD-P over ZeRO-3), not only its sign."""
    by_id = {o.run["id"]: o for o in outcomes}
    out: dict[str, tuple[float, float | None]] = {}
    for k in data.get("ranking", []):
        ob, ow = by_id.get(k["better"]), by_id.get(k["worse"])
        if ob is None or ow is None:
            continue
        b, w = ob.run, ow.run
        published = per_gpu_rate(b, published_step_time(b)) / per_gpu_rate(w, published_step_time(w))
        plan = None
        if isinstance(ob.priced, Priced) and isinstance(ow.priced, Priced):
            plan = per_gpu_rate(b, ob.priced.step_time_s) / per_gpu_rate(w, ow.priced.step_time_s)
        out[k["id"]] = (published, plan)
    return out


def layout(run: Run) -> str:
    """TP x CP x PP(xVPP) x DP, micro-batch, global batch, recompute, strategy: one short cell."""
    pp = f"{run['pp']}v{run['vpp']}" if run["vpp"] > 1 else str(run["pp"])
    return (f"{run['tp']}x{run['cp']}x{pp}x{run['dp']} b{run['micro_batch']} B{run['global_batch']} "
            f"{run['recompute']} {run['strategy']}")  # fmt: skip


def fmt_s(t: float) -> str:
    """Seconds with 4 significant digits."""
    return f"{t:.4g} s"


def table(outcomes: Sequence[Outcome], k_by_gpu: dict[str, float | None]) -> list[str]:
    """The per-run Markdown table."""
    lines = ["| run | GPUs | TPxCPxPPxDP, b, B | role | kernel eff. | published step | predicted step [low, high] "
             "| throughput pred/pub | inside | plan: TFLOP/s, MFU, bubble, exposed comm |", "|" + "---|" * 10]  # fmt: skip
    for o in outcomes:
        r = o.run
        k = k_by_gpu.get(r["gpu"])
        kcell = "default" if k is None else ("none" if math.isnan(k) else f"{k:.3f}")
        head = f"| {r['id']} | {gpus(r)} | {layout(r)} | {o.role} | {kcell} | {fmt_s(o.published_s)} |"
        if isinstance(o.priced, Priced):
            p = o.priced
            inside = ("yes" if o.inside else "no") + (" (does not fit)" if p.fits == "False" else "")
            plan = f"{p.tflops_per_gpu:.1f}, {p.mfu:.3f}, {p.bubble_frac:.1%}, {fmt_s(p.comm_exposed_s)}"
            lines.append(f"{head} {fmt_s(p.step_time_s)} [{p.low_s:.4g}, {p.high_s:.4g}] | {o.ratio:.3f} | {inside} | "
                         f"{plan} |")  # fmt: skip
        else:
            lines.append(f"{head} not priced: {o.priced} | | | |")
    return lines


def report(data: dict[str, Any], outcomes: Sequence[Outcome], k_by_gpu: dict[str, float | None], title: str) -> str:
    """One setting's table, its summary and the rankings, as Markdown."""
    s = summary(outcomes)
    lines = [f"### {title}", "", *table(outcomes, k_by_gpu), ""]
    who = "Held out" if any(o.role != "default" for o in outcomes) else "All runs"
    if s["priced"]:
        lines.append(f"{who}: {s['priced']} of {s['of']} runs priced; median |error| {s['median_abs_err']:.1%}, "
                     f"max {s['max_abs_err']:.1%}; within 10 %: {s['within_10']}, within 20 %: {s['within_20']}; "
                     f"published inside the interval: {s['inside']}.")  # fmt: skip
    else:
        lines.append(f"{who}: none of {s['of']} runs priced.")
    ranked = rankings(data, outcomes)
    if not ranked:
        return "\n".join([*lines, "", "No published ranking among these runs."])
    ratios = ranking_ratios(data, outcomes)
    lines += ["", "| ranking | published | plan: same order | better/worse per GPU: published, plan |", "|---|---|---|---|"]
    for rid, claim, published, same in ranked:
        cell = "not priced" if same is None else ("yes" if same else "**no**")
        pub_x, plan_x = ratios[rid]
        times = f"x{pub_x:.2f}, " + ("-" if plan_x is None else f"x{plan_x:.2f}")
        lines.append(f"| {rid}: {claim} | {'holds' if published else 'does not hold'} | {cell} | {times} |")
    return "\n".join(lines)


Pricer = Callable[[Run, set[str], float | None], Priced | str]
"""(run, the plan's flags, kernel efficiency or None) -> its priced row or why not: :func:`price`, or a fake."""


def evaluate(
    data: dict[str, Any], runs: Sequence[Run], flags: set[str], calibrated: bool, pricer: Pricer = price
) -> tuple[list[Outcome], dict[str, float | None], list[str]]:
    """Price every run (default kernel efficiency, or calibrated per GPU kind): the outcomes, the kernel
    efficiency used per GPU kind (None: the preset's default), and one line per calibration."""
    k_by_gpu: dict[str, float | None] = {r["gpu"]: None for r in runs}
    notes: list[str] = []
    by_id = {r["id"]: r for r in data["run"]}
    if calibrated:
        for kind in k_by_gpu:
            cid = data.get("calibration", {}).get(kind)
            if cid is None:
                notes.append(f"{kind}: no calibration run named; its runs use the preset's default")
                continue
            crun = by_id[cid]

            def step(k: float, crun: Run = crun) -> float:
                p = pricer(crun, flags, k)
                if isinstance(p, str):
                    raise ValueError(p)
                return p.step_time_s

            try:
                k_by_gpu[kind] = calibrate(step, published_step_time(crun))
                notes.append(f"{kind}: kernel efficiency {k_by_gpu[kind]:.4f} from {cid}")
            except ValueError as e:
                notes.append(f"{kind}: not calibrated on {cid}: {e}")
                k_by_gpu[kind] = math.nan
    outcomes = []
    for r in runs:
        k = k_by_gpu[r["gpu"]]
        if k is not None and math.isnan(k):
            priced: Priced | str = "not calibrated (see above)"
        else:
            priced = pricer(r, flags, k)
        role = (
            "default"
            if not calibrated
            else ("calibration" if data["calibration"].get(r["gpu"]) == r["id"] else "held out")
        )
        outcomes.append(Outcome(r, role, published_step_time(r), priced))
    return outcomes, k_by_gpu, notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", help="comma-separated run ids (default: all)")
    ap.add_argument("--no-calibration", action="store_true", help="only the preset's default kernel efficiency")
    args = ap.parse_args(argv)
    data = load()
    problems = validate(data)
    if problems:
        print("\n".join(f"data file: {p}" for p in problems), file=sys.stderr)
        return 2
    runs = data["run"]
    if args.runs:
        want = args.runs.split(",")
        unknown = [w for w in want if w not in {r["id"] for r in runs}]
        if unknown:
            print(f"unknown run id(s) {', '.join(unknown)}; valid: {', '.join(r['id'] for r in runs)}", file=sys.stderr)
            return 2
        runs = [r for r in runs if r["id"] in want]
    try:
        flags = plan_flags()
    except Exception as e:  # noqa: BLE001 - the CLI itself may be mid-rewrite
        flags = set()
        print(f"# the plan CLI could not be read: {type(e).__name__}: {e}")
    t0 = time.perf_counter()
    print(f"# {len(runs)} published runs; plan flags missing for the fixed-layout mode: "
          f"{' '.join(f for f in (*REQUIRED, '--kernel-efficiency') if f not in flags) or 'none'}")  # fmt: skip
    settings = [(False, "Preset default kernel efficiency (uncalibrated)")]
    if not args.no_calibration:
        settings.append((True, "Calibrated: one kernel efficiency per GPU kind, every other run held out"))
    for calibrated, title in settings:
        outcomes, k_by_gpu, notes = evaluate(data, runs, flags, calibrated)
        print()
        for n in notes:
            print(f"# calibration: {n}")
        print(report(data, outcomes, k_by_gpu, title))
    print(f"\n# {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
