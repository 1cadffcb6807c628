"""The fixed-layout plan (``commbench plan --tp T --pp P --dp D ...``): exactly the layout given, priced by
:mod:`commbench.planning.steptime`, one row per strategy x precision; the input checked at the edge.

The model is a preset or a complete shape (``--layers --hidden --heads --ffn --vocab --seq``, ``--kv-heads``, the
kinds); the parameter count is derived from it and a ``--params`` more than :data:`PARAMS_TOLERANCE` away is an
error. The GPU count is ``nodes x gpus_per_node``, which ``tp*pp*dp*cp`` must equal (``--dp`` omitted: the quotient;
``--nodes`` omitted: what the layout needs). The global batch is ``--global-batch`` sequences or
``--global-batch-tokens`` (default :data:`commbench.planning.search.GLOBAL_BATCH_TOKENS`), rounded to whole
micro-batches per DP rank, said in one line (``df.attrs["notes"]``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pandas as pd

from commbench.planning.activations import RECOMPUTES
from commbench.planning.calls import Pricer
from commbench.planning.compute import CALIBRATION, GPU, GPUS, KERNEL_RANGE, check_fp8
from commbench.planning.costmodel import CostModel
from commbench.planning.layout import Parallel, check_layout, parse_split, round_batch
from commbench.planning.options import OPTIMIZERS, PRECISIONS, STRATEGIES, check_choices
from commbench.planning.presets import MODELS, ModelShape, model_shape
from commbench.planning.steptime import CP_COMMS, HEADROOM, Setup, price_layout

GLOBAL_BATCH_TOKENS = 4 * 2**20
"""Default tokens per optimizer step (about Llama 2's 4M-token batch, Touvron et al. 2023, section 2.2)."""
PARAMS_TOLERANCE = 0.05
"""A ``--params`` further than this from the shape's derived count is an error."""

LAYOUT_COLUMNS = {
    "rank": "rank: options that fit first, then by step time",
    "tp": "tensor-parallel degree", "pp": "pipeline stages", "dp": "data-parallel degree",
    "cp": "context-parallel degree", "vpp": "virtual stages per pipeline stage (interleaved 1F1B)",
    "micro_batch": "sequences per micro-batch", "global_batch": "sequences per optimizer step (after rounding)",
    "microbatches": "micro-batches per step and DP rank", "strategy": "data-parallel strategy",
    "precision": "plan precision", "recompute": "activation recompute", "gpus": "GPUs", "nodes": "nodes",
    "pp_split": "layers per pipeline stage",
    "fits": "mem_total_bytes <= device memory less the headroom",
    "mem_total_bytes": "memory per GPU, most loaded stage, bytes",
    "mem_headroom_bytes": "usable memory (device less headroom) minus mem_total_bytes, bytes (< 0: does not fit)",
    "mem_model_state_bytes": "parameters, gradients, master weights, optimizer state per GPU, bytes",
    "mem_activations_bytes": "activations per GPU (Korthikanti et al. 2022 per layer, in flight), bytes",
    "mem_comm_buffers_bytes": "gathered units / buckets in flight, bytes",
    "step_time_s": "step time, s (compute + imbalance + bubble + exposed comm + optimizer; --mfu: end to end)",
    "step_time_low_s": "interval fast end: kernel efficiency high, links and latency at their fast end, s",
    "step_time_high_s": "interval slow end, s",
    "tokens_per_s": "tokens per second over all GPUs",
    "tflops_per_gpu": "hardware TFLOP/s per GPU (recompute included, as Megatron-LM counts)",
    "mfu": "model FLOPs utilisation (3 passes, no recompute) of the dense peak, an output",
    "bubble_frac": "pipeline bubble over ideal compute, (p-1)/(v*m)",
    "comm_exposed_s": "communication no compute hides, s",
    "comm_total_s": "all communication of the step, hidden or not, s",
    "compute_s": "compute at the kernel efficiency (mean stage), s", "imbalance_s": "slowest stage's extra, s",
    "bubble_s": "pipeline bubble, s", "optimizer_s": "optimizer step at the HBM bandwidth, s",
    "kernel_efficiency": "fraction of peak the matrix multiplies reach (point estimate)",
    "source_compute": "what priced compute", "source_tp": "what priced TP calls", "source_pp": "what priced PP sends",
    "source_cp": "what priced CP sends", "source_dp": "what priced DP calls",
    "comm_exposure": "per collective: how much is exposed, and why",
}  # fmt: skip
"""plan.csv columns of a fixed-layout plan (and of the search, which adds its own)."""


def resolve_gpu(gpu: str, tflops: float | None = None) -> GPU:
    """The GPU preset, its peak replaced by ``tflops`` when given; ValueError for an unknown name."""
    if gpu not in GPUS:
        raise ValueError(f"unknown gpu {gpu!r}; valid: {', '.join(GPUS)}")
    g = GPUS[gpu]
    if tflops is not None:
        g = replace(g, peak_tflops=dict.fromkeys(g.peak_tflops, float(tflops)))
    return g


def efficiency(g: GPU, kernel_efficiency: float | None, compute_ms: float | None, mfu: float | None) -> tuple[
        tuple[float, float, float], str]:  # fmt: skip
    """(the kernel-efficiency range, what prices compute) for the three ways of stating compute."""
    given = [n for n, v in (("--kernel-efficiency", kernel_efficiency), ("--compute-ms", compute_ms),
                            ("--mfu", mfu)) if v is not None]  # fmt: skip
    if len(given) > 1:
        raise ValueError(f"give one of --kernel-efficiency, --compute-ms, --mfu (got {' and '.join(given)})")
    for name, v in (("--kernel-efficiency", kernel_efficiency), ("--mfu", mfu)):
        if v is not None and not (isinstance(v, (int, float)) and 0 < v <= 1):
            raise ValueError(f"{name} must be a fraction in (0, 1], got {v!r}")
    if kernel_efficiency is not None:  # the point given; the interval keeps the presets' width around it
        k = float(kernel_efficiency)
        lo, hi = max(k - KERNEL_RANGE, 0.01), min(k + KERNEL_RANGE, 1.0)
        return (lo, k, hi), f"FLOPs at kernel efficiency {k:g} (given; {lo:.2g}-{hi:.2g} in the interval)"
    if compute_ms is not None:
        return g.kernel_efficiency, f"measured compute {compute_ms:g} ms per step (given)"
    if mfu is not None:
        return g.kernel_efficiency, f"end-to-end MFU {mfu:g} (given): nothing added to it"
    lo, mid, hi = g.kernel_efficiency
    return g.kernel_efficiency, f"FLOPs at {g.name} kernel efficiency {mid:g} ({lo:g}-{hi:g}; {CALIBRATION[g.name]})"


def shape_of(model_preset: str | None, params: float | None, fields: dict[str, Any]) -> ModelShape:
    """The model shape and the ``--params`` check (module docstring)."""
    m = model_shape(model_preset, **fields)
    if m is None:
        raise ValueError("a layout needs a model: --model-preset " + " | ".join(MODELS) + ", or --layers --hidden "
                         "--heads --ffn --vocab --seq")  # fmt: skip
    if params is not None:
        if isinstance(params, bool) or not isinstance(params, (int, float)) or not (math.isfinite(params) and params > 0):
            raise ValueError(f"params must be a positive number of parameters (e.g. 7e9), got {params!r}")
        if abs(params - m.params) > PARAMS_TOLERANCE * m.params:
            raise ValueError(f"--params {params:.4g} disagrees with the shape's {m.params:.4g} parameters by more than "
                             f"{PARAMS_TOLERANCE:.0%} (drop --params, or fix the shape)")  # fmt: skip
    return m


def batch_of(m: ModelShape, dp: int, micro_batch: int, global_batch: int | None,
             global_batch_tokens: int | None, multiple: int = 1) -> tuple[int, str]:  # fmt: skip
    """The global batch in sequences, rounded to whole micro-batches, and the line saying so."""
    if global_batch is not None and global_batch_tokens is not None:
        raise ValueError("give --global-batch (sequences) or --global-batch-tokens, not both")
    note = ""
    if global_batch is None:
        tokens = global_batch_tokens if global_batch_tokens is not None else GLOBAL_BATCH_TOKENS
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"global_batch_tokens must be an integer >= 1, got {tokens!r}")
        global_batch = max(1, round(tokens / m.seq))
        if global_batch * m.seq != tokens:
            note = f"global batch {tokens} tokens = {global_batch} sequences of {m.seq}"
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch must be an integer >= 1 (sequences), got {global_batch!r}")
    used, why = round_batch(global_batch, dp, micro_batch, multiple)
    return used, "; ".join(x for x in (note, why) if x)


def plan_layout(
    *, model_preset: str | None = None, params: float | None = None, tp: int = 1, pp: int = 1, dp: int | None = None,
    cp: int = 1, vpp: int = 1, micro_batch: int = 1, global_batch: int | None = None,
    global_batch_tokens: int | None = None, recompute: str = "none", pp_split: str | Sequence[int] | None = None,
    sequence_parallel: bool = False, tp_comm_overlap: bool = False, fp8_gemms: bool = False, cp_comm: str = "ring",
    overlap_param_gather: bool = False, fp8_param_gather: bool = False,
    gpu: str = "h100", nodes: int | None = None, gpus_per_node: int | None = None,
    strategies: Sequence[str] = ("ddp",), precisions: Sequence[str] = ("bf16",), optimizer: str = "adam",
    attention: str = "flash", kernel_efficiency: float | None = None, compute_ms: float | None = None,
    mfu: float | None = None, tflops: float | None = None, overlap: float | None = None, headroom: float = HEADROOM,
    device_memory: float | None = None, model: CostModel | str | os.PathLike[str] | None = None, **shape_fields: Any,
) -> pd.DataFrame:  # fmt: skip
    """Price exactly one layout (module docstring): one row per strategy x precision, ranked; ``df.attrs``:
    ``answer`` (one line), ``notes`` (batch rounding), ``would_fit`` (when nothing fits, what would), ``assumptions``.
    ValueError (one line) for bad input."""
    from commbench.planning.plan import load_model

    m = shape_of(model_preset, params, shape_fields)
    g = resolve_gpu(gpu, tflops)
    check_choices(strategies=strategies, precisions=precisions, optimizer=optimizer, attention=attention,
                  recompute=recompute)  # fmt: skip
    if cp_comm not in CP_COMMS:
        raise ValueError(f"unknown cp_comm {cp_comm!r}; valid: {', '.join(CP_COMMS)}")
    check_fp8(g, fp8_gemms, fp8_param_gather)
    if overlap is not None and not (isinstance(overlap, (int, float)) and 0 <= overlap <= 1):
        raise ValueError(f"overlap must be in [0, 1], got {overlap!r}")
    if not (isinstance(headroom, (int, float)) and 0 <= headroom < 1):
        raise ValueError(f"headroom must be a fraction in [0, 1), got {headroom!r}")
    if device_memory is not None and not (math.isfinite(device_memory) and device_memory > 0):
        raise ValueError(f"device memory must be a positive number of bytes, got {device_memory!r}")
    gpn = gpus_per_node or g.gpus_per_node
    for name, v in (("tp", tp), ("pp", pp), ("cp", cp), ("gpus_per_node", gpn)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    check_layout(Parallel(tp, pp, 1, cp), m)  # the rules of the model's shape first (heads, layers, sequence)
    if dp is None:
        total = (nodes or 1) * gpn
        if total % (tp * pp * cp):
            raise ValueError(f"{total} GPUs are not a multiple of tp*pp*cp = {tp * pp * cp}: give --dp")
        dp = total // (tp * pp * cp)
    gpus = tp * pp * dp * cp
    if nodes is None:
        nodes = max(1, -(-gpus // gpn))
        if gpus < gpn:
            gpn = gpus
    check_layout(Parallel(tp, pp, dp, cp, vpp, micro_batch, dp * micro_batch * pp), m, nodes * gpn)
    gb, note = batch_of(m, dp, micro_batch, global_batch, global_batch_tokens, pp if vpp > 1 else 1)
    lay = Parallel(tp, pp, dp, cp, vpp, micro_batch, gb, RECOMPUTES[recompute], parse_split(pp_split),
                   bool(sequence_parallel))  # fmt: skip
    check_layout(lay, m, nodes * gpn)
    effs, src = efficiency(g, kernel_efficiency, compute_ms, mfu)
    cost = load_model(model)
    pricer = Pricer(g, gpn, cost)
    memory = float(device_memory or g.memory_bytes)
    rows, skipped = [], {}
    for sname in strategies:
        for pname in precisions:
            setup = Setup(m, g, gpn, STRATEGIES[sname], sname, PRECISIONS[pname], pname, OPTIMIZERS[optimizer],
                          effs, mfu, compute_ms, overlap, memory, headroom, attention, src, bool(tp_comm_overlap),
                          bool(fp8_gemms), cp_comm, bool(overlap_param_gather), bool(fp8_param_gather))  # fmt: skip
            try:
                rows.append(price_layout(setup, lay, pricer))
            except ValueError as e:  # fp8 gradient communication without a DDP hook, ...
                skipped[f"{sname}/{pname}"] = str(e)
    if not rows:
        raise ValueError("no option left: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    df = rank_rows(pd.DataFrame(rows))
    df.attrs.update(
        answer=answer(df, m, g, memory, headroom), notes=[note] if note else [], skipped=skipped,
        would_fit=would_fit(df, m, g, gpn, lay, effs, memory, headroom, pricer, optimizer) if not df["fits"].any()
        else "",
        assumptions=assumptions(m, g, src, memory, headroom, cost, overlap),
    )  # fmt: skip
    return df


def rank_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Options that fit first, then by step time; the columns in :data:`LAYOUT_COLUMNS` order, then any others."""
    key = pd.DataFrame({"out": (~df["fits"].astype(bool)).astype(int), "t": df["step_time_s"].astype(float)})
    df = df.loc[key.sort_values(["out", "t"], kind="stable").index].reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    cols = [c for c in LAYOUT_COLUMNS if c in df.columns] + [c for c in df.columns if c not in LAYOUT_COLUMNS]
    return df[cols]


def fmt_time(seconds: float) -> str:
    """A time with its unit: ``412 ms``, ``12.3 s``, ``2.5 min`` (never an exponent)."""
    if not math.isfinite(seconds):
        return "-"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"
    return f"{seconds:.3g} s" if seconds < 600 else f"{seconds / 60:.3g} min"


def fmt_rate(v: float) -> str:
    """A rate without an exponent: ``153 k``, ``1.53 M``."""
    if not math.isfinite(v):
        return "-"
    for unit, k in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= k:
            return f"{v / k:.3g} {unit}"
    return f"{v:.3g}"


def fmt_gb(nbytes: float) -> str:
    """Bytes as the device is labelled: GB = 1e9 bytes."""
    return f"{nbytes / 1e9:.1f} GB"


def layout_name(r: Any) -> str:
    """``TP 8 x PP 12 x DP 16`` (CP and virtual stages when used), the strategy and precision."""
    out = f"TP {r['tp']} x PP {r['pp']}" + (f" (v{r['vpp']})" if r["vpp"] > 1 else "") + f" x DP {r['dp']}"
    out += f" x CP {r['cp']}" if r["cp"] > 1 else ""
    return f"{out}, {r['strategy']} {r['precision']}, mb {r['micro_batch']}, recompute {r['recompute']}"


def answer(df: pd.DataFrame, m: ModelShape, g: GPU, memory: float, headroom: float) -> str:
    """The first-ranked row in one line."""
    r = df.iloc[0]
    fits = "fits" if r["fits"] else "does NOT fit"
    return (f"{m.name} on {r['gpus']} x {g.name.upper()}, {layout_name(r)}: step {fmt_time(r['step_time_s'])} "
            f"({fmt_time(r['step_time_low_s'])}-{fmt_time(r['step_time_high_s'])}), {fmt_rate(r['tokens_per_s'])} tokens/s, "
            f"{r['tflops_per_gpu']:.0f} TFLOP/s per GPU, MFU {r['mfu']:.0%}; {fmt_gb(r['mem_total_bytes'])} of "
            f"{fmt_gb(memory * (1 - headroom))} usable, {fits}")  # fmt: skip


def would_fit(
    df: pd.DataFrame, m: ModelShape, g: GPU, gpn: int, lay: Parallel, effs: tuple[float, float, float],
    memory: float, headroom: float, pricer: Pricer, optimizer: str,
) -> str:  # fmt: skip
    """One line: what would fit when nothing does (full recompute, a micro-batch of 1, a sharded optimizer or
    ZeRO-3, twice the DP ranks), each with its memory; or that none of those does."""
    r = df.iloc[0]
    sname, pname = str(r["strategy"]), str(r["precision"])
    tries: list[tuple[str, Parallel, str]] = []
    if lay.recompute.name != "full":
        tries.append(("--recompute full", replace(lay, recompute=RECOMPUTES["full"]), sname))
    if lay.micro_batch > 1:
        tries.append(("--micro-batch 1", replace(lay, micro_batch=1), sname))
    for other in ("zero1", "zero3"):
        if other != sname:
            tries.append((f"--strategies {other}", lay, other))
    tries.append((f"--dp {lay.dp * 2} (2x the GPUs)", replace(lay, dp=lay.dp * 2, global_batch=lay.global_batch * 2),
                  sname))  # fmt: skip
    found = []
    for flag, alt, strat in tries:
        setup = Setup(m, g, gpn, STRATEGIES[strat], strat, PRECISIONS[pname], pname, OPTIMIZERS[optimizer], effs,
                      device_memory=memory, headroom=headroom)  # fmt: skip
        try:
            row = price_layout(setup, alt, pricer)
        except ValueError:
            continue
        if row["fits"]:
            found.append(f"{flag} ({fmt_gb(row['mem_total_bytes'])})")
    usable = fmt_gb(memory * (1 - headroom))
    need = fmt_gb(float(r["mem_total_bytes"]))
    if not found:
        return f"no option fits ({need} > {usable} usable); none of recompute, micro-batch 1, ZeRO or 2x GPUs does"
    return f"no option fits ({need} > {usable} usable); would fit: {' or '.join(found)}"


def assumptions(m: ModelShape, g: GPU, src: str, memory: float, headroom: float, cost: CostModel | None,
                overlap: float | None) -> list[str]:  # fmt: skip
    """The stated assumptions, one line each."""
    return [
        f"Model: {m.name} ({m.source}): {m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.kv_heads} kv), ffn "
        f"{m.ffn} ({'SwiGLU' if m.gated_mlp else 'GeLU'}), vocab {m.vocab}, seq {m.seq}; {m.params:.4g} parameters.",
        f"GPU: {g.name} ({g.source}): {g.peak_tflops.get('bfloat16', 0):g} TFLOP/s bf16 dense, {fmt_gb(memory)}, "
        f"{headroom:.0%} kept free (--headroom).",
        f"Compute: {src}; FLOPs per layer and logits as Megatron-LM counts them (commbench.planning.layout).",
        "Communication: each call at its size, latency + bytes / bandwidth of the link it crosses; "
        + ("the cost model where it has the call, the GPU preset otherwise" if cost is not None
           else "from the GPU preset (NCCL's ring latency, datasheet links at 80 %)") + "; see the source_* columns.",
        "Exposure: per collective (comm_exposure)" + (f"; --overlap {overlap:g} for all" if overlap is not None else "")
        + "; the interval covers kernel efficiency, link efficiency and latency only (docs/analysis.md).",
    ]  # fmt: skip


__all__ = [
    "GLOBAL_BATCH_TOKENS", "LAYOUT_COLUMNS", "PARAMS_TOLERANCE", "answer", "assumptions", "batch_of", "efficiency",
    "fmt_gb", "fmt_rate", "fmt_time", "layout_name", "plan_layout", "rank_rows", "resolve_gpu", "shape_of", "would_fit",
]  # fmt: skip
