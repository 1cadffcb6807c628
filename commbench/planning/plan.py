"""Capacity planning: memory per rank, bytes per step and predicted time of a training configuration.

``plan(params=7e9, nodes=8, gpus_per_node=8, ...)`` crosses strategies (ddp, zero1, zero2, zero3, fsdp,
hsdp) with precisions (fp32, bf16, fp8), prices each option that exists and returns one ranked row per option;
:func:`commbench.planning.plan_render.write_plan` writes ``plan.csv``, ``plan.md`` and ``plan.html``. The CLI is
``python -m commbench plan``.

One source. Model-state memory and bytes per step are asked of the training strategy objects
(``training/strategies.py`` through a ``training.policies.Policy``), the same formulas the training runs
report as ``model_state_bytes`` and ``comm_bytes_expected``; nothing here restates them. The options and the
model-state layout of each precision are :mod:`commbench.planning.options`; what an option costs (activations,
comm buffers, the intra/inter-node split, the time from a fitted cost model, overlap with compute) is
:mod:`commbench.planning.pricing`, each rule stated there. This module validates the input, builds the grid of
options and ranks them: options that fit the device memory first, then by step time, communication time and
memory.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from commbench.measure.precision import torch_dtype
from commbench.planning.activations import ATTENTIONS, RECOMPUTES
from commbench.planning.compute import GPU, GPUS, KERNEL_RANGE
from commbench.planning.costmodel import CostModel
from commbench.planning.options import (
    OPTIMIZERS,
    PRECISIONS,
    STRATEGIES,
    TORCH_ADAMW,
    FlatStrategy,
    Optimizer,
    PlanStrategy,
    Shape,
    StateParts,
    check_choices,
)
from commbench.planning.presets import MODELS, model_shape
from commbench.planning.pricing import COLUMNS, StatedLinks, compute_time, price_option
from commbench.planning.steptime import HEADROOM
from commbench.training.policies import Policy


def plan(
    *,
    params: float | None = None,
    model_preset: str | None = None,
    nodes: int = 1,
    gpus_per_node: int = 8,
    strategies: Sequence[str] = tuple(STRATEGIES),
    precisions: Sequence[str] = tuple(PRECISIONS),
    optimizer: str = "adam",
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    ffn: int | None = None,
    vocab: int | None = None,
    seq: int | None = None,
    micro_batch: int | None = None,
    attention: str = "flash",
    recompute: str = "none",
    gated_mlp: bool | None = None,
    norm_params: int | None = None,
    biases: bool | None = None,
    tied_embeddings: bool | None = None,
    gpu: str | None = None,
    device_memory: float | None = None,
    compute_ms: float | None = None,
    tflops: float | None = None,
    mfu: float | None = None,
    overlap: float | None = None,
    model: CostModel | str | os.PathLike[str] | None = None,
    policies: Sequence[Policy] | None = None,
    parts: StateParts = TORCH_ADAMW,
    kernel_efficiency: float | None = None,
    headroom: float = HEADROOM,
) -> pd.DataFrame:
    """One ranked row per (strategy, precision): memory per rank, bytes per step, predicted time.

    The model: ``params`` (Psi) and/or a shape, from ``model_preset`` (:data:`commbench.planning.presets.MODELS`)
    with any field overridden (``layers``, ``hidden``, ``heads``, ``kv_heads``, ``ffn``, ``vocab``, ``seq``; and the
    kind: ``gated_mlp``, ``norm_params``, ``biases``, ``tied_embeddings``), or given whole. ``gpu`` (:data:`commbench.planning.compute.GPUS`) fills ``device_memory``, ``gpus_per_node`` and,
    with ``mfu``, ``tflops`` where they are not given, and prices communication from its stated link bandwidths
    when no cost model is given. ``model``: a fitted CostModel, a model.json or a run directory (fitted here); with
    neither, memory and bytes only. Bytes are per rank and per step (nccl-tests bus bytes). Options that do not
    exist (fp8 gradient communication on FSDP) are listed in ``df.attrs["skipped"]``; ValueError when none is left.
    ``policies``: plan these training policies instead of strategies x precisions (see :func:`plan_policies`;
    ``parts`` is their model state). ``overlap`` None: each strategy's overlap model. ValueError for bad input.

    Compute (issue 32: each cost once): FLOPs at ``kernel_efficiency`` of the peak (default: the GPU preset's), then
    the exposed communication is added; or ``mfu``, end to end: the step is the FLOPs at that MFU and nothing is
    added; or a measured ``compute_ms``. An option fits when its memory is at most the device memory less
    ``headroom`` (a fraction). A call the cost model lacks is priced from the GPU preset's links when ``gpu`` is given.
    """
    gpu_obj = _gpu(gpu)
    if kernel_efficiency is not None and not (isinstance(kernel_efficiency, (int, float)) and 0 < kernel_efficiency <= 1):
        raise ValueError(f"kernel_efficiency must be in (0, 1], got {kernel_efficiency!r}")
    if kernel_efficiency is not None and (mfu is not None or compute_ms is not None):
        raise ValueError("give one of kernel_efficiency, mfu (end to end) or compute_ms")
    if not (isinstance(headroom, (int, float)) and 0 <= headroom < 1):
        raise ValueError(f"headroom must be a fraction in [0, 1), got {headroom!r}")
    end_to_end = mfu is not None
    if gpu_obj is not None:
        device_memory = device_memory if device_memory is not None else gpu_obj.memory_bytes
        shaped = model_preset is not None or layers is not None
        if mfu is None and kernel_efficiency is None and compute_ms is None and (shaped or tflops is not None):
            kernel_efficiency = gpu_obj.kernel_efficiency[1]  # stated in the assumptions, --kernel-efficiency
        if (mfu is not None or kernel_efficiency is not None) and tflops is None and compute_ms is None:
            tflops = gpu_obj.peak("bfloat16") / 1e12  # the dense bf16 peak for every option: stated
    fraction = mfu if mfu is not None else kernel_efficiency
    shape, opt = _validate(
        params, nodes, gpus_per_node, strategies, precisions, optimizer, layers, hidden, heads, seq, micro_batch,
        device_memory, compute_ms, tflops, fraction, overlap,
        model_fields={"model_preset": model_preset, "kv_heads": kv_heads, "ffn": ffn, "vocab": vocab},
        attention=attention, recompute=recompute,
        kinds={"gated_mlp": gated_mlp, "norm_params": norm_params, "biases": biases, "tied_embeddings": tied_embeddings},
    )  # fmt: skip
    cost: CostModel | StatedLinks | None = load_model(model)
    links = StatedLinks(gpu_obj.nvlink_gbps, gpu_obj.network_gbps, gpu_obj.source) if gpu_obj is not None else None
    if cost is None:
        cost = links
    compute_s, tokens = compute_time(shape, compute_ms, tflops, fraction)
    skipped: dict[str, str] = {}
    options = _policy_options(policies, parts) if policies is not None else _grid(strategies, precisions, opt, skipped)
    if not options:
        why = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        raise ValueError(f"no option left to plan ({why}); choose other --strategies or --precisions")
    peak = tflops * 1e12 if tflops is not None else None
    scale = (1.0, 1.0)  # the kernel efficiency's range in the interval (none for a measured or end-to-end time)
    if kernel_efficiency is not None and not end_to_end:
        k = float(kernel_efficiency)
        scale = (k / min(k + KERNEL_RANGE, 1.0), k / max(k - KERNEL_RANGE, 0.01))
    rows = [
        price_option(strat, names, policy, shape, state, elem, cost, compute_s, tokens, overlap, device_memory,
                     headroom=headroom, end_to_end=end_to_end, fallback=links, peak_flops=peak, compute_scale=scale)
        for strat, names, policy, state, elem in options
    ]  # fmt: skip
    df = _rank(pd.DataFrame(rows, columns=list(COLUMNS)))
    df.attrs["skipped"] = skipped
    df.attrs["device_memory"] = device_memory
    df.attrs["assumptions"] = assumptions(shape, opt, overlap, cost, compute_ms, tflops, fraction, end_to_end)
    if device_memory:
        df.attrs["assumptions"].append(
            f"Memory: fits when at most {device_memory * (1 - headroom) / 1e9:.1f} GB: the device's "
            f"{device_memory / 1e9:.1f} GB less {headroom:.0%} headroom (allocator, NCCL buffers, CUDA context; "
            "--headroom).")  # fmt: skip
    return df


def _gpu(name: str | None) -> GPU | None:
    if name is None:
        return None
    if name not in GPUS:
        raise ValueError(f"unknown gpu {name!r}; valid: {', '.join(GPUS)}")
    return GPUS[name]


_Option = tuple[PlanStrategy, tuple[str, str], Policy, StateParts, float]
"""(strategy, (strategy name, precision name), policy, model-state parts, activation bytes per element)."""


def _grid(strategies: Sequence[str], precisions: Sequence[str], opt: Optimizer, skipped: dict[str, str]) -> list[_Option]:
    """Every (strategy, precision) that exists; those that do not go to `skipped` with the reason."""
    out: list[_Option] = []
    for sname in strategies:
        strat = STRATEGIES[sname]
        for pname in precisions:
            prec = PRECISIONS[pname]
            try:
                policy = strat.policy(prec)
            except ValueError as e:
                skipped[f"{sname}/{pname}"] = str(e)
                continue
            parts = StateParts(prec.param_bytes, prec.grad_bytes, prec.master_bytes, opt.moment_bytes)
            out.append((strat, (sname, pname), policy, parts, prec.activation_bytes))
    return out


def _policy_options(policies: Sequence[Policy], parts: StateParts) -> list[_Option]:
    """The training policies themselves, flat over all ranks, each named by its gradient-communication dtype."""
    out: list[_Option] = []
    for p in policies:
        # compute dtype: autocast's, or the sharding's own (FSDP's param dtype); activations are kept in it
        names = (p.autocast_name, *p.sharding.grad_dtype_names())
        elem = min([torch_dtype(d).itemsize for d in names if d is not None] or [4])
        out.append((FlatStrategy(p.name, p.description, None), (p.name, p.comm_dtype), p, parts, elem))
    return out



def plan_policies(policies: Sequence[Policy], **options: Any) -> pd.DataFrame:
    """The plan of training policies themselves (``training.policies``), flat over all ranks, with the model
    state they keep (``parts=``, default: torch's, :data:`TORCH_ADAMW`): what the training suite measured, at
    any scale. ``strategy`` is the policy name and ``precision`` its gradient-communication dtype; the other
    keywords are :func:`plan`'s."""
    return plan(policies=policies, **options)


def _rank(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return df
    key = pd.DataFrame(
        {
            "fit": df["fits"].map(lambda v: 0 if v is True else (2 if v is False else 1)),
            "step": df["step_time_s"].fillna(math.inf),
            "comm": df["comm_time_s"].fillna(math.inf),
            "mem": df["mem_total_bytes"],
        }
    )
    order = key.sort_values(["fit", "step", "comm", "mem"], kind="stable").index
    df = df.loc[order].reset_index(drop=True)
    df["rank"] = range(1, len(df) + 1)
    return df


def assumptions(
    shape: Shape, opt: Optimizer, overlap: float | None, cost: CostModel | StatedLinks | None,
    compute_ms: float | None, tflops: float | None, mfu: float | None, end_to_end: bool = False,
) -> list[str]:  # fmt: skip
    """The stated assumptions of a plan, one line each (plan.md and plan.html print them)."""
    out = [f"Psi = {shape.psi:.4g} parameters on {shape.nodes} node(s) x {shape.gpus_per_node} ranks; {opt.description}."]
    if shape.model is not None:
        m = shape.model
        out.append(
            f"Model: {m.name} ({m.source}): {m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.kv_heads} kv), "
            f"ffn {m.ffn}, vocab {m.vocab}, seq {shape.seq}, micro-batch {shape.micro_batch}."
        )
    out += [
        "Model state: the training strategies' state_bytes (ZeRO, Rajbhandari et al. 2020); fp32 keeps "
        "(P, G, K) = (4, 4, moments), bf16/fp8 keep (2, 2, 4 master + moments).",
        "Bytes: the strategies' comm_bytes, nccl-tests bus bytes per rank per step; a flat ring over nodes sends "
        "1/gpus_per_node of them inter-node. zero1 is DeepSpeed's partitioned ZeRO-1 (reduce-scatter + all-gather); "
        "zero1_torch is torch's ZeroRedundancyOptimizer (all-reduce + fp32 broadcast).",
    ]
    if shape.layers:
        out.append(
            f"FSDP units: {shape.layers} layers + the root (one unit per layer); DDP buckets: 1 MiB then 25 MiB of "
            "gradients in their own dtype (torch's defaults)."
        )
    else:
        out.append(
            "FSDP units: one unit of Psi for the bytes; comm buffers of DeepSpeed's ZeRO-3 prefetch bucket (5e7 "
            "elements) - give --model-preset or --layers for per-layer units."
        )
    if shape.model is not None and shape.seq and shape.micro_batch:
        out.append(
            f"Activations: Megatron-LM theoretical_memory_usage.py / Korthikanti et al. 2022, attention "
            f"{shape.attention.name} ({shape.attention.description}), recompute {shape.recompute.name}, "
            "with the embedding and logits terms."
        )
    else:
        out.append("Activations: not counted (give --model-preset, or the full shape with --micro-batch).")
    if compute_ms is not None:
        out.append(f"Compute: {compute_ms:g} ms per step (given).")
    elif tflops is not None and mfu is not None:
        flops = "6*Psi + 12*L*h*s" if shape.model is not None else "6*Psi"
        if end_to_end:
            out.append(f"Compute: ({flops}) FLOPs per token x seq x micro_batch / ({tflops:g} TFLOP/s x end-to-end MFU "
                       f"{mfu:g}): the whole step; communication is reported, not added.")  # fmt: skip
        else:
            out.append(f"Compute: ({flops}) FLOPs per token x seq x micro_batch / ({tflops:g} TFLOP/s x kernel "
                       f"efficiency {mfu:g}); exposed communication added.")  # fmt: skip
    else:
        out.append("Compute: not given (--compute-ms, --kernel-efficiency or --mfu with --tflops or --gpu): no step time.")
    if overlap is None:
        out.append(
            "Overlap, per strategy: gradient all-reduce / reduce-scatter behind the backward pass (4/6 of compute), "
            "re-gathered parameters behind each micro-batch, ZeRO-1's parameter all-gather / broadcast exposed."
        )
    else:
        out.append(
            f"Overlap: communication hides behind {overlap:.2f} of the compute time; exposed = max(0, comm - "
            f"{overlap:.2f} x compute)."
        )
    if cost is None:
        out.append("Time: no cost model (give --model model.json or a run directory, or --gpu for stated bandwidths).")
    elif isinstance(cost, StatedLinks):
        out.append(f"Time: {cost.describe()}.")
    else:
        out.append(f"Time: cost model fitted on {', '.join(cost.sources) or 'frames'} (commbench.planning.costmodel).")
    return out


# ----------------------------------------------------------------------------------------------- input
def _int_or_none(name: str, v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return v


MAX_PARAMS = 1e15
"""Larger Psi is refused: a quadrillion parameters is past any cluster's memory (an absurd value is a typo)."""


def _validate(
    params: float | None, nodes: int, gpus_per_node: int, strategies: Sequence[str], precisions: Sequence[str],
    optimizer: str, layers: int | None, hidden: int | None, heads: int | None, seq: int | None,
    micro_batch: int | None, device_memory: float | None, compute_ms: float | None, tflops: float | None,
    mfu: float | None, overlap: float | None, model_fields: dict[str, Any] | None = None, attention: str = "flash",
    recompute: str = "none", kinds: dict[str, Any] | None = None,
) -> tuple[Shape, Optimizer]:  # fmt: skip
    fields = dict(model_fields or {})
    preset = fields.pop("model_preset", None)
    for name, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        _int_or_none(name, v)
    for name, dim in (("layers", layers), ("hidden", hidden), ("heads", heads), ("seq", seq),
                      ("micro_batch", micro_batch), *fields.items()):  # fmt: skip
        _int_or_none(name, dim)
    shape_model = model_shape(preset, layers=layers, hidden=hidden, heads=heads, seq=seq, **fields, **(kinds or {}))
    if params is None:
        if shape_model is None:
            raise ValueError("give --params (e.g. 7e9) or a model: --model-preset " + " | ".join(MODELS))
        params = float(shape_model.params)
    if isinstance(params, bool) or not isinstance(params, (int, float)) or not (math.isfinite(params) and params >= 1):
        raise ValueError(f"params must be a positive number of parameters (e.g. 7e9), got {params!r}")
    if params > MAX_PARAMS:
        raise ValueError(f"params={params:g} is more than {MAX_PARAMS:g} parameters: not a model any cluster holds")
    check_choices(
        strategies=strategies, precisions=precisions, optimizer=optimizer, attention=attention, recompute=recompute
    )
    for name, x in (("device_memory", device_memory), ("compute_ms", compute_ms), ("tflops", tflops)):
        if x is not None and not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0):
            raise ValueError(f"{name} must be a positive number, got {x!r}")
    if mfu is not None and not (isinstance(mfu, (int, float)) and 0 < mfu <= 1):
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")
    if compute_ms is not None and (tflops is not None or mfu is not None):
        raise ValueError("give either compute_ms or tflops with mfu, not both")
    if (tflops is None) != (mfu is None):
        raise ValueError("tflops needs a kernel efficiency or an MFU, and they need tflops (or a --gpu preset): "
                         "compute = FLOPs per token x tokens / (tflops*1e12*fraction)")  # fmt: skip
    if shape_model is not None:
        seq, micro_batch = shape_model.seq, micro_batch or 1
    if tflops is not None and not (seq and micro_batch):
        raise ValueError("tflops/mfu need seq and micro_batch (tokens per step)")
    if shape_model is None and (seq or micro_batch) and tflops is None and compute_ms is None:
        given = " and ".join(f"--{n}" for n, v in (("seq", seq), ("micro-batch", micro_batch)) if v)
        raise ValueError(
            f"{given} alone is not used: activations need a model shape (--model-preset, or --layers --hidden "
            "--heads --ffn --vocab --seq) and tokens per second need --tflops with --mfu or --compute-ms"
        )
    if overlap is not None and not (isinstance(overlap, (int, float)) and 0 <= overlap <= 1):
        raise ValueError(f"overlap must be in [0, 1], got {overlap!r}")
    if hidden and heads and hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    m = shape_model
    shape = Shape(
        float(params), nodes, gpus_per_node, m.layers if m else layers, m.hidden if m else hidden,
        m.heads if m else heads, seq, micro_batch, model=m,
        unit_numel=m.layer_params if m else None,
        attention=ATTENTIONS[attention], recompute=RECOMPUTES[recompute],
    )  # fmt: skip
    return shape, OPTIMIZERS[optimizer]


def load_model(model: CostModel | str | os.PathLike[str] | None) -> CostModel | None:
    """The cost model given: as is, fitted to a run directory, or read from a model.json."""
    from commbench.planning.costmodel_io import read_model
    from commbench.planning.fitting import fit

    if model is None or isinstance(model, CostModel):
        return model
    p = Path(model)
    if p.is_dir():
        return fit([p])
    if not p.exists():
        raise ValueError(f"cost model {str(p)!r} does not exist (give a model.json from `commbench fit` or a run directory)")
    return read_model(p)


__all__ = ["MAX_PARAMS", "assumptions", "plan", "plan_policies"]
