"""The step time of one parallel layout, counting each cost once: compute at the kernel efficiency, then only what no
compute hides (issue 32).

``step = compute + stage imbalance + bubble + exposed communication + optimizer``, each term a column:

* **compute**: the stage's hardware FLOPs (:mod:`commbench.planning.layout`: forward, backward, recompute; attention
  and logits included) over ``peak x kernel efficiency``, per GPU (divided by TP and CP), ``m`` micro-batches,
  plus the non-matmul kernels (norms, dropout, softmax, activation functions, residuals), memory-bound: the
  activations a layer writes (Korthikanti et al. 2022's count; eager attention's scores, none with flash), written
  and read once per pass at the HBM bandwidth (80 %; 100-50 % in the interval), and the loss over the vocabulary on
  the last stage (:data:`LOSS_BYTES_PER_LOGIT` per logit); with ``fp8_gemms`` the projections and MLP run at the
  float8 peak; ``compute_s`` is the mean stage's,
  ``imbalance_s`` what the slowest stage adds (``m`` times the difference).
* **bubble**: 1F1B idles ``(p-1)`` micro-batch times of the slowest stage (its compute and its exposed
  per-micro-batch communication), interleaved ``(p-1)/v`` (Narayanan et al. 2021, section 2.2); ``bubble_frac``
  is ``(p-1)/(v*m)``, the bubble over the ideal compute.
* **exposed communication**: every call priced by :class:`commbench.planning.calls.Pricer`, then exposed as
  :func:`exposure` decides, once per collective and with its reason (``comm_exposure``): the slowest stage's
  per-layer and per-micro-batch calls ``m`` times, the per-step ones once.
* **optimizer**: the step reads and writes its state at the HBM bandwidth: ``2*(master + moments) + grad + param``
  bytes per parameter it updates (its shard where the strategy shards the optimizer).

Outputs, never inputs: MFU = model FLOPs (3 passes, no recomputation) per step / (step x GPUs x peak); TFLOP/s per
GPU = hardware FLOPs (recomputation included, as Megatron-LM's formula counts them) / (step x GPUs).
``--mfu`` is end to end instead: the step time is model FLOPs / (GPUs x peak x MFU) and nothing is added (the other
terms are still reported).

The interval (``step_time_low_s``/``_high_s``): the step re-priced at the kernel efficiency's high and low ends
together with every call's fast and slow end (link efficiency, latency; a cost model's own interval). It does not
cover: the FLOPs formula itself, kernels other than matrix multiplies (norms, softmax, optimizer launches), stragglers,
failures and restarts, data loading, NCCL algorithms other than the ring (tree, NVLS), congestion between jobs.

Memory per GPU (the most loaded of the first, the last and the fullest middle stage): model state asked of the plan
strategy's training objects for the stage's parameters (Megatron-LM ``theoretical_memory_usage.py``: layers, the
embedding on the first stage, the output layer (or a tied copy) and final norm on the last, all over TP; sharded
over DP x CP), activations (:mod:`commbench.planning.activations` per layer, ``min(m, p - i)`` micro-batches in
flight on stage ``i``, the interleaving factor, sequence over CP), and the comm buffers of the calls in flight
(two gathered units while one is prefetched; two DDP buckets). It fits when it is at most the device memory less
the headroom (``--headroom``, :data:`HEADROOM`: allocator caching and fragmentation, NCCL's buffers, the CUDA
context).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from commbench.planning.activations import ATTENTIONS, RECOMPUTES
from commbench.planning.calls import Call, CallPrice, Pricer, placement
from commbench.planning.compute import GPU
from commbench.planning.layout import (
    LayerFlops,
    Parallel,
    bubble_fraction,
    interleave_memory_factor,
    layer_flops,
    stage_split,
)
from commbench.planning.options import DPSchedule, Optimizer, PlanPrecision, PlanStrategy, Shape
from commbench.planning.presets import ModelShape
from commbench.training.strategies import DDP_BUCKET_CAP_BYTES, ModelState

MEGATRON_BUCKET = (40_000_000, 1_000_000)
"""Megatron-LM's DDP / distributed-optimizer bucket: ``max(40M, 1M x DP)`` parameters (megatron/core/distributed,
``bucket_size`` default), so that a bucket's ring latency stays small against its bytes at scale."""
CP_COMMS = ("ring", "all_gather")
"""How context parallelism exchanges K/V (:attr:`Setup.cp_comm`)."""
LOSS_BYTES_PER_LOGIT = 52.0
"""HBM bytes the cross-entropy moves per logit (``b*s*V/t`` of them per micro-batch), Megatron-LM
``core/tensor_parallel/cross_entropy.py`` on ``logits.float()``: forward the fp32 cast (2 read + 4 written), the max
(4), the subtraction (4 + 4), the exp (4 + 4), the sum (4), the normalisation in place (4 + 4); backward the scale
by the loss gradient (4 + 4) and the cast back to bf16 (4 + 2)."""
HEADROOM = 0.10
"""Default fraction of device memory kept free (allocator caching and fragmentation, NCCL buffers, CUDA context)."""


CallPriceZero = CallPrice(0.0, 0.0, 0.0, "none")


@dataclass(frozen=True, slots=True)
class Setup:
    """What a layout is priced on besides the layout: model, GPU, strategy, precision and the compute rule."""

    model: ModelShape
    gpu: GPU
    gpus_per_node: int
    strategy: PlanStrategy
    strategy_name: str
    precision: PlanPrecision
    precision_name: str
    optimizer: Optimizer
    kernel_efficiency: tuple[float, float, float]
    """(low, default, high) fraction of peak the matrix multiplies reach."""
    mfu: float | None = None
    """End-to-end MFU (``--mfu``): the step time is model FLOPs at it, nothing added."""
    compute_ms: float | None = None
    """Measured compute per step and GPU (``--compute-ms``): replaces the FLOPs' time."""
    overlap: float | None = None
    """``--overlap x``: every collective hides behind x of the compute of its window."""
    device_memory: float = 80e9
    headroom: float = HEADROOM
    attention: str = "flash"
    source_compute: str = ""
    tp_comm_overlap: bool = False
    """Megatron-LM's ``--tp-comm-overlap`` (Transformer Engine's userbuffers): TP's all-gathers and reduce-scatters
    are split and pipelined with the matmuls next to them, so they hide behind the layer's compute."""
    fp8_gemms: bool = False
    """Transformer Engine's FP8 linear layers (``--fp8-gemms``; NVIDIA's MLPerf GPT-3 configs, ``FP8=True``): the
    layers' projections and MLP run at the GPU's float8 peak, at the same kernel efficiency; the attention core
    (TE's fused attention in bf16) and the output layer (not a TE layer) stay at the bf16 peak."""
    cp_comm: str = "ring"
    """How context parallelism exchanges K/V (``--cp-comm``): ``ring`` (Megatron-LM's ring attention, the next
    block sent while the current one is computed) or ``all_gather`` (Llama 3, section 3.3.2: K and V all-gathered
    before the attention core, "exposed in the critical path"; their gradients reduce-scattered in backward)."""
    overlap_param_gather: bool = False
    """Megatron-Core's ``--overlap-param-gather`` (Apex DistributedFusedAdam's ``overlap_param_sync``, FSDP's
    prefetch): the parameter all-gather after the optimizer step runs bucket by bucket during the next step's first
    forward, so only what exceeds that forward (and at least the first bucket) is exposed."""
    fp8_param_gather: bool = False
    """Megatron-Core's ``--fp8-param-gather`` (NeMo's ``fp8_params``; with ``fp8_gemms``): the compute weights are
    Transformer Engine FP8 tensors, one byte each, so they are held and all-gathered at one byte per parameter (the
    master copy and the moments stay fp32 in the optimizer; TE's cached FP8 transposes are counted in neither case)."""


@dataclass(slots=True)
class _Exposed:
    """Exposed seconds at the three ends, and the reasons."""

    per_mb: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    per_layer: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    per_step: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    total_comm: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    reasons: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def exposure(kind: str, comm: float, window: float, overlap: float | None) -> tuple[float, str]:
    """The one place exposure is decided: (exposed seconds of ``comm`` behind ``window`` seconds of compute, why).

    * ``tp``: the TP collectives sit between the matrix multiplies that need them: all exposed (Megatron-LM without
      ``--tp-comm-overlap``); ``tp_overlap`` (with it): what exceeds the layer's compute;
    * ``pp``: 1F1B's sends and receives block the schedule: exposed;
    * ``cp``: ring attention sends the next K/V block while the current one is computed: hidden behind the
      layer's attention core;
    * ``cp_all_gather``: all-gather context parallelism (``--cp-comm all_gather``): exposed;
    * ``fsdp_fwd`` / ``fsdp_bwd``: the next layer's gather (and in backward the current layer's reduce-scatter)
      is prefetched behind the current layer's compute only, so what exceeds that compute is exposed;
    * ``fsdp_root``: the first unit's gather has no compute before it, its last reduce-scatter none after it;
    * ``dp_grads``: DDP's buckets reduce behind the last micro-batch's backward; the last bucket after it;
    * ``param_gather``: after the optimizer step, before the next forward: exposed; with
      ``--overlap-param-gather``, gathered during the next step's first forward (:func:`dp_exposure`);
    * ``zero3_serial``: a strategy whose per-layer calls are not prefetched (``DPSchedule.overlapped`` False:
      DeepSpeed ZeRO-3 as Narayanan et al. 2021 measured it, section 5.2): exposed.

    ``overlap`` (``--overlap x``) replaces the rule: every collective hides behind x of its window."""
    if overlap is not None:
        return max(0.0, comm - overlap * window), f"--overlap {overlap:g}: behind {overlap:.0%} of its window"
    if kind in ("tp", "pp", "param_gather", "fsdp_root", "zero3_serial", "cp_all_gather"):
        why = {"tp": "between the matmuls that need it", "pp": "1F1B sends and receives block the schedule",
               "cp_all_gather": "K/V gathered before the attention core that needs them (Llama 3, 3.3.2)",
               "param_gather": "after the optimizer step, before the next forward",
               "fsdp_root": "the first gather and last reduce-scatter have no compute to hide behind",
               "zero3_serial": "DeepSpeed ZeRO-3's gathers and reduce-scatters on the critical path"}[kind]  # fmt: skip
        return comm, f"exposed: {why}"
    return max(0.0, comm - window), {
        "tp_overlap": "--tp-comm-overlap: pipelined with the layer's matmuls",
        "cp": "hidden behind the layer's attention core",
        "fsdp_fwd": "next layer's gather behind this layer's forward",
        "fsdp_bwd": "gather + reduce-scatter behind this layer's backward",
    }.get(kind, "behind its window")


def dp_exposure(
    total: float, edge_bucket: float, window: float, overlap: float | None,
    why: str = "buckets behind the last micro-batch's backward; the last after it",
) -> tuple[float, str]:  # fmt: skip
    """Bucketed data-parallel calls behind a window of compute: what exceeds it, and at least the bucket at its edge.
    The ``dp_grads`` rule of :func:`exposure` (the last micro-batch's backward; the last bucket starts when it ends),
    and with ``--overlap-param-gather`` the parameter gather's (the next first forward; it waits for the first)."""
    if overlap is not None:
        return exposure("dp", total, window, overlap)
    return max(edge_bucket, total - window), why


def _stage_params(m: ModelShape, split: tuple[int, ...], i: int) -> float:
    """Parameters held by stage ``i`` (before TP): its layers, the embedding on the first, the output layer (or its
    tied copy) and the final norm on the last."""
    out = split[i] * _layer_params(m)
    if i == 0:
        out += m.embedding_params
    if i == len(split) - 1:
        out += m.norm_params * m.hidden
        if not m.tied_embeddings or len(split) > 1:
            out += m.embedding_params
    return float(out)


@functools.lru_cache(maxsize=256)
def _layer_params(m: ModelShape) -> int:
    return m.layer_params


@functools.lru_cache(maxsize=4096)
def _largest_stage(m: ModelShape, split: tuple[int, ...]) -> float:
    """Parameters of the stage holding the most (before TP)."""
    return max(_stage_params(m, split, i) for i in range(len(split)))


def price_layout(s: Setup, p: Parallel, pricer: Pricer) -> dict[str, Any]:
    """One row of a layout's price (:data:`commbench.planning.layout_plan.LAYOUT_COLUMNS`)."""
    m, g, prec = s.model, s.gpu, s.precision
    f = layer_flops(m)
    split = stage_split(m, p, f)
    mbs, v, pp = p.microbatches, p.vpp, p.pp
    tokens_mb = p.micro_batch * m.seq
    peak = g.peak("bfloat16" if prec.param_bytes < 4 else "float32")
    per_gpu = tokens_mb / (p.tp * p.cp)
    layer_hw = f.layer_passes(p.recompute, ATTENTIONS[s.attention])
    head_hw = 3.0 * f.logits  # the logits, on the last stage
    total_hw = m.layers * layer_hw + head_hw
    hw_step = total_hw * tokens_mb * mbs * p.dp  # hardware FLOPs of the whole step
    model_step = f.model_per_token(m.layers) * tokens_mb * mbs * p.dp
    effs = _efficiencies(s, total_hw / pp, per_gpu, mbs, peak)
    fp8 = _fp8_factor(s, p, f, layer_hw, peak)

    ex = _comm(s, p, f, split, pricer, per_gpu, peak / fp8, effs)
    traffic = _layer_traffic(s, p)
    casts = _fp8_cast_bytes(s, p)
    # passes over the layer's activations (flash attention's recompute of QK^T stays inside its kernel)
    passes = f.layer_passes(p.recompute, ATTENTIONS["eager"]) / f.layer
    # the slowest stage is the fullest of the others or the last (it adds the logits): two candidates, any pp
    fullest = max(split[:-1]) if pp > 1 else 0
    times = []
    for k in range(3):
        hbm = g.hbm_gbps * 1e9 * (1.0, 0.8, 0.5)[k]
        elementwise = (passes * traffic + casts) / hbm if s.compute_ms is None else 0.0
        per_layer_c = layer_hw * fp8 * per_gpu / (peak * effs[k]) + elementwise
        head_c = head_hw * per_gpu / (peak * effs[k])
        if s.compute_ms is None:  # the loss over the vocabulary, memory-bound, on the last stage
            head_c += LOSS_BYTES_PER_LOGIT * per_gpu * m.vocab / hbm
        stages = [(split[-1] * per_layer_c + head_c, split[-1])]
        if pp > 1:
            stages.append((fullest * per_layer_c, fullest))
        c_max, n_max = max(stages, key=lambda t: t[0] + t[1] * ex.per_layer[k])
        stage_t = c_max + n_max * ex.per_layer[k] + ex.per_mb[k]
        mean_c = (m.layers * per_layer_c + head_c) / pp
        opt = _optimizer_s(s, p, m, split, k)
        fill = (pp - 1) / v  # the fill and drain idle the slowest stage for this many of its micro-batch times
        exposed = mbs * (n_max * ex.per_layer[k] + ex.per_mb[k]) + ex.per_step[k]
        times.append({
            "compute_s": mbs * mean_c, "imbalance_s": mbs * (c_max - mean_c), "bubble_s": fill * stage_t,
            "comm_exposed_s": exposed, "optimizer_s": opt,
        })  # fmt: skip
    steps = [sum(t.values()) for t in times]
    mid = times[1]
    step, low, high = steps[1], steps[0], steps[2]
    if s.mfu is not None:  # end to end: nothing added
        step = low = high = model_step / (p.gpus * peak * s.mfu)
    mem = _memory(s, p, split)
    usable = s.device_memory * (1.0 - s.headroom)
    tokens_step = p.global_batch * m.seq
    row: dict[str, Any] = {
        "tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "vpp": p.vpp, "micro_batch": p.micro_batch,
        "global_batch": p.global_batch, "microbatches": mbs, "strategy": s.strategy_name,
        "precision": s.precision_name, "recompute": p.recompute.name, "gpus": p.gpus,
        "nodes": max(-(-p.gpus // s.gpus_per_node), 1), "pp_split": ",".join(map(str, split)),
        "fits": mem["total"] <= usable, "mem_total_bytes": mem["total"], "mem_headroom_bytes": usable - mem["total"],
        "mem_model_state_bytes": mem["state"], "mem_activations_bytes": mem["act"],
        "mem_comm_buffers_bytes": mem["buffers"], "step_time_s": step, "step_time_low_s": low,
        "step_time_high_s": high, "tokens_per_s": tokens_step / step, "tflops_per_gpu": hw_step / (step * p.gpus) / 1e12,
        "mfu": model_step / (step * p.gpus * peak), "bubble_frac": bubble_fraction(pp, v, mbs),
        "comm_exposed_s": mid["comm_exposed_s"], "comm_total_s": ex.total_comm[1], "compute_s": mid["compute_s"],
        "imbalance_s": mid["imbalance_s"], "bubble_s": mid["bubble_s"], "optimizer_s": mid["optimizer_s"],
        "kernel_efficiency": effs[1],
        "source_compute": s.source_compute,
        "source_tp": ex.sources.get("tp", ""), "source_pp": ex.sources.get("pp", ""),
        "source_cp": ex.sources.get("cp", ""), "source_dp": ex.sources.get("dp", ""),
        "comm_exposure": "; ".join(f"{k}: {v_}" for k, v_ in ex.reasons.items()),
    }  # fmt: skip
    return row


def _fp8_factor(s: Setup, p: Parallel, f: LayerFlops, layer_hw: float, peak: float) -> float:
    """The layer's compute time with FP8 GEMMs over its time at ``peak`` (1 without): the projections' and MLP's
    FLOPs at the float8 peak, the attention core's (every pass that runs it) at ``peak``."""
    if not s.fp8_gemms:
        return 1.0
    core = f.core * (1.0 + ATTENTIONS[s.attention].backward_core
                     + (0.0 if p.recompute.keeps_layer and p.recompute.keeps_scores else 1.0))
    return (core + (layer_hw - core) * peak / s.gpu.peak("float8")) / layer_hw


def _efficiencies(s: Setup, mean_stage: float, per_gpu: float, mbs: int, peak: float) -> tuple[float, ...]:
    """Kernel efficiency at the interval's fast end, the point and the slow end; a measured ``compute_ms`` gives
    the one efficiency it implies (compute per step = the mean stage's FLOPs at it)."""
    lo, mid, hi = s.kernel_efficiency
    if s.compute_ms is not None:
        e = mbs * mean_stage * per_gpu / (peak * s.compute_ms / 1e3)
        return (e, e, e)
    return (hi, mid, lo)


def _comm(
    s: Setup, p: Parallel, f: LayerFlops, split: tuple[int, ...], pricer: Pricer, per_gpu: float, peak: float,
    effs: tuple[float, ...],
) -> _Exposed:  # fmt: skip
    """Every call of the layout, priced and exposed at the three ends."""
    m, gpn, sched = s.model, s.gpus_per_node, s.strategy.dp
    act_b = s.precision.activation_bytes
    wire = "bfloat16" if act_b < 4 else "float"
    ex = _Exposed()
    full = not p.recompute.keeps_layer
    rows = p.micro_batch * m.seq // p.cp  # tokens of a micro-batch on one CP rank

    def t_layer(k: int, passes: float) -> float:  # compute of one layer, ``passes`` forward-equivalents
        return passes * f.layer * per_gpu / (peak * effs[k])

    if p.tp > 1:  # per layer per micro-batch 2 all-reduces forward, 2 backward, 2 more with full recompute; with
        # SP each all-reduce is an all-gather + a reduce-scatter of the same tensor (Korthikanti et al. 2022, 4.2.2)
        nodes, conc = placement(p.tp, 1, gpn)
        size = rows * m.hidden * act_b
        if p.sp:
            ag = pricer.price(Call("all_gather", size, p.tp, nodes, conc, wire))
            rs = pricer.price(Call("reduce_scatter", size, p.tp, nodes, conc, wire))
        else:
            ag = pricer.price(Call("all_reduce", size, p.tp, nodes, conc, wire))
            rs = CallPriceZero
        pairs = 4 + (2 if full else 0)
        for k, (a, r) in enumerate(zip((ag.low, ag.mid, ag.high), (rs.low, rs.mid, rs.high), strict=True)):
            comm = pairs * (a + r)
            e, why = exposure("tp_overlap" if s.tp_comm_overlap else "tp", comm, t_layer(k, 3.0), s.overlap)
            ex.per_layer[k] += e
            ex.total_comm[k] += comm * sum(split) / len(split) * p.microbatches
        ex.reasons["tp"], ex.sources["tp"] = why, ag.source
    if p.cp > 1 and s.cp_comm == "all_gather":  # K/V gathered forward, their gradients reduce-scattered backward
        nodes, conc = placement(p.cp, p.tp, gpn)
        kv_all = p.cp * rows * 2 * m.hidden * m.kv_heads / m.heads * act_b / p.tp
        ag = pricer.price(Call("all_gather", kv_all, p.cp, nodes, conc, wire))
        rs = pricer.price(Call("reduce_scatter", kv_all, p.cp, nodes, conc, wire))
        regather = 1.0 if full else 0.0  # full recompute gathers again before the rerun forward
        for k, (a, r) in enumerate(zip((ag.low, ag.mid, ag.high), (rs.low, rs.mid, rs.high), strict=True)):
            comm = (1.0 + regather) * a + r
            e, why = exposure("cp_all_gather", comm, 0.0, s.overlap)
            ex.per_layer[k] += e
            ex.total_comm[k] += comm * sum(split) / len(split) * p.microbatches
        ex.reasons["cp"], ex.sources["cp"] = why, ag.source
    elif p.cp > 1:  # ring attention: cp-1 K/V blocks forward, K/V and their gradients backward
        nodes, conc = placement(p.cp, p.tp, gpn)
        kv = rows * 2 * m.hidden * m.kv_heads / m.heads * act_b / p.tp
        send = pricer.price(Call("send", kv, 2, 2 if nodes > 1 else 1, conc if nodes > 1 else 1, wire))
        core = f.core / f.layer
        for k, t in enumerate((send.low, send.mid, send.high)):
            fwd, bwd = (p.cp - 1) * t, 2 * (p.cp - 1) * t
            e1, why = exposure("cp", fwd, t_layer(k, core), s.overlap)
            e2, _ = exposure("cp", bwd, t_layer(k, 2 * core), s.overlap)
            ex.per_layer[k] += e1 + e2
            ex.total_comm[k] += (fwd + bwd) * sum(split) / len(split) * p.microbatches
        ex.reasons["cp"], ex.sources["cp"] = why, send.source
    if p.pp > 1:  # scatter-gather sends of b*s*h/t: forward and backward per chunk per micro-batch
        stride = p.tp * p.cp * p.dp
        across = stride >= gpn
        size = rows * m.hidden * act_b / p.tp
        send = pricer.price(Call("send", size, 2, 2 if across else 1, gpn if across else 1, wire))
        for k, t in enumerate((send.low, send.mid, send.high)):
            comm = 2 * p.vpp * t
            e, why = exposure("pp", comm, 0.0, s.overlap)
            ex.per_mb[k] += e
            ex.total_comm[k] += comm * p.microbatches
        ex.reasons["pp"], ex.sources["pp"] = why, send.source
    _dp_calls(s, p, f, split, pricer, sched, ex, t_layer)
    return ex


def _dp_calls(
    s: Setup, p: Parallel, f: LayerFlops, split: tuple[int, ...], pricer: Pricer, sched: DPSchedule, ex: _Exposed,
    t_layer: Any,
) -> None:  # fmt: skip
    """The data-parallel strategy's calls (its :class:`~commbench.planning.options.DPSchedule`) over DP x CP."""
    m, gpn, prec = s.model, s.gpus_per_node, s.precision
    n = p.dp * p.cp
    if n < 2:
        return
    pb = 4.0 if sched.gather_fp32 else _param_bytes(s)
    gb = prec.grad_bytes
    wire_p = "float" if pb >= 4 else "f8e4m3" if pb < 2 else "bfloat16"
    wire_g = "float" if gb >= 4 else "bfloat16"
    stage_psi = _largest_stage(m, split) / p.tp
    layer = _layer_params(m) / p.tp
    layers = max(split)
    bwd_passes = 2.0 + (0.0 if p.recompute.keeps_layer else 1.0)
    mbs = p.microbatches
    if sched.param_gather == "per_micro_batch":
        shard_n = min(n, gpn) if sched.hybrid else n
        nodes, conc = placement(shard_n, p.tp, gpn)

        def per_unit(op: str, elems: float, cap: int | None, nbytes: float, dtype: str) -> list[float]:
            calls = max(1, math.ceil(elems / cap)) if cap else 1
            c = pricer.price(Call(op, elems / calls * nbytes, shard_n, nodes, conc, dtype))
            ex.sources["dp"] = c.source
            return [calls * c.low, calls * c.mid, calls * c.high]

        ag = per_unit("all_gather", layer, sched.gather_elements, pb, wire_p)
        rs = per_unit("reduce_scatter", layer, sched.reduce_elements, gb, wire_g)
        root = stage_psi - layers * layer
        ag_root = per_unit("all_gather", root, sched.gather_elements, pb, wire_p) if root > 0 else [0.0] * 3
        rs_root = per_unit("reduce_scatter", root, sched.reduce_elements, gb, wire_g) if root > 0 else [0.0] * 3
        fwd_kind, bwd_kind = ("fsdp_fwd", "fsdp_bwd") if sched.overlapped else ("zero3_serial", "zero3_serial")
        for k in range(3):
            e_f, why_f = exposure(fwd_kind, ag[k], t_layer(k, 1.0), s.overlap)
            e_b, why_b = exposure(bwd_kind, ag[k] + rs[k], t_layer(k, bwd_passes), s.overlap)
            e_r, why_r = exposure("fsdp_root", ag[k] + ag_root[k] * 2 + rs_root[k], 0.0, s.overlap)
            ex.per_layer[k] += e_f + e_b
            ex.per_mb[k] += e_r
            ex.total_comm[k] += mbs * (layers * (2 * ag[k] + rs[k]) + 2 * ag_root[k] + rs_root[k])
        ex.reasons.update({fwd_kind: why_f, bwd_kind: why_b, "fsdp_root": why_r})
        if sched.hybrid and n > gpn:  # the gradient shard all-reduced across nodes once per step
            _bucketed(s, p, pricer, ex, "all_reduce", stage_psi / shard_n, gb, wire_g, n // shard_n, p.tp * shard_n,
                      t_layer, layers, bwd_passes, "dp_grads")  # fmt: skip
        return
    _bucketed(s, p, pricer, ex, sched.grad_op, stage_psi, gb, wire_g, n, p.tp, t_layer, layers, bwd_passes,
              "dp_grads", per_mb=sched.grads_every_micro_batch)  # fmt: skip
    if sched.param_gather == "after_step":
        _bucketed(s, p, pricer, ex, "all_gather", stage_psi, pb, wire_p, n, p.tp, t_layer, layers, bwd_passes,
                  "param_gather")  # fmt: skip


def _bucketed(
    s: Setup, p: Parallel, pricer: Pricer, ex: _Exposed, op: str, elems: float, nbytes: float, dtype: str, n: int,
    stride: int, t_layer: Any, layers: int, bwd_passes: float, kind: str, per_mb: bool = False,
) -> None:  # fmt: skip
    """``elems`` in Megatron-LM's DDP buckets (:data:`MEGATRON_BUCKET`) over a group of ``n`` ranks ``stride``
    apart: the gradient reduction behind the last micro-batch's backward (``dp_grads``; with ``per_mb`` behind every
    micro-batch's), or the parameter gather after the step (exposed)."""
    nodes, conc = placement(n, stride, s.gpus_per_node)
    cap = max(MEGATRON_BUCKET[0], MEGATRON_BUCKET[1] * n)
    buckets = max(1, math.ceil(elems / cap))
    c = pricer.price(Call(op, min(elems, cap) * nbytes, n, nodes, conc, dtype))
    ex.sources["dp"] = c.source
    for k, t in enumerate((c.low, c.mid, c.high)):
        total = buckets * t
        if kind == "param_gather":
            if s.overlap_param_gather:
                e, why = dp_exposure(total, t, layers * t_layer(k, 1.0), s.overlap,
                                     "gathered bucket by bucket during the next first forward (--overlap-param-gather)")
            else:
                e, why = exposure("param_gather", total, 0.0, s.overlap)
            ex.per_step[k] += e
        else:
            e, why = dp_exposure(total, t, layers * t_layer(k, bwd_passes), s.overlap)
            if per_mb:
                ex.per_mb[k] += e
            else:
                ex.per_step[k] += e
        ex.total_comm[k] += total * (p.microbatches if per_mb else 1)
    ex.reasons[kind if kind == "param_gather" else f"dp_{op}"] = why


def _param_bytes(s: Setup) -> float:
    """Bytes of one compute weight: the precision's, or one with ``fp8_param_gather``."""
    return 1.0 if s.fp8_param_gather else s.precision.param_bytes


def _fp8_cast_bytes(s: Setup, p: Parallel) -> float:
    """HBM bytes per GPU and micro-batch of one layer's FP8 casts (0 without ``fp8_gemms``): Transformer Engine's
    FP8 linear layers cast each input to FP8 with its transpose for the weight gradient (``cast_transpose``: 2 bytes
    read, 1 + 1 written per element), forward and in a full recompute's second forward, and each output gradient
    likewise in backward. Inputs per token: the QKV and fc1 layers' h (the whole sequence on every TP rank), the
    output projection's h/t and fc2's ffn/t; output gradients: QKV's h(1 + 2 kv/a)/t, the projection's h, fc1's
    ffn k/t (k = 2 gated), fc2's h. The weights' casts (once per step) are left out."""
    if not s.fp8_gemms:
        return 0.0
    m, t = s.model, p.tp
    rows = p.micro_batch * m.seq / p.cp
    inputs = 2.0 * m.hidden + m.hidden / t + m.ffn / t
    grads = m.hidden * (1.0 + 2.0 * m.kv_heads / m.heads) / t + 2.0 * m.hidden + m.ffn * (2 if m.gated_mlp else 1) / t
    forwards = 1.0 if p.recompute.keeps_layer else 2.0
    return 4.0 * rows * (forwards * inputs + grads)


def _layer_traffic(s: Setup, p: Parallel) -> float:
    """HBM bytes the non-matmul kernels of one layer's forward move per GPU and micro-batch: the activations the
    layer writes (Korthikanti et al. 2022's count, every tensor kept, the attention kernel's scores only when it
    keeps them), each written once and read once."""
    m = s.model
    keep = RECOMPUTES["none"]
    b = keep.layer_bytes(m.seq // p.cp, p.micro_batch, m.hidden, m.ffn, m.heads, p.tp, p.sp and p.tp > 1,
                         ATTENTIONS[s.attention])  # fmt: skip
    return 2.0 * b * s.precision.activation_bytes / 2.0


def _optimizer_s(s: Setup, p: Parallel, m: ModelShape, split: tuple[int, ...], k: int) -> float:
    """The optimizer step at the HBM bandwidth (module docstring); the interval at 100 %, 80 %, 50 % of it."""
    psi = _largest_stage(m, split) / p.tp
    if s.strategy.dp.shards_optimizer:  # over DP x CP; HSDP over its shard group within a node
        n = p.dp * p.cp
        psi /= min(n, s.gpus_per_node) if s.strategy.dp.hybrid else n
    prec, opt = s.precision, s.optimizer
    per = 2.0 * (prec.master_bytes + opt.moment_bytes) + prec.grad_bytes + _param_bytes(s)
    return psi * per / (s.gpu.hbm_gbps * 1e9 * (1.0, 0.8, 0.5)[k])


_STATE_CACHE: dict[tuple[Any, ...], float] = {}


def _memory(s: Setup, p: Parallel, split: tuple[int, ...]) -> dict[str, float]:
    """Memory per GPU of the most loaded stage (module docstring)."""
    m, prec, pp = s.model, s.precision, p.pp
    sched = s.strategy.dp
    n = p.dp * p.cp
    parts = ModelState(_param_bytes(s), prec.grad_bytes, prec.master_bytes + s.optimizer.moment_bytes)
    rec, att = p.recompute, ATTENTIONS[s.attention]
    seq = m.seq // p.cp
    per_layer = rec.layer_bytes(seq, p.micro_batch, m.hidden, m.ffn, m.heads, p.tp, p.sp and p.tp > 1, att)
    per_layer *= prec.activation_bytes / 2.0
    inter = interleave_memory_factor(pp, p.vpp)
    layer = _layer_params(m) / p.tp
    if sched.param_gather == "per_micro_batch":  # two units in flight (one computing, one prefetched) + a reduce
        unit = min(layer, sched.gather_elements or layer)
        buffers = 2 * unit * _param_bytes(s) + unit * prec.grad_bytes
    else:
        buffers = 2.0 * DDP_BUCKET_CAP_BYTES if n > 1 else 0.0
    candidates = {0, pp - 1} | ({max(range(1, pp - 1), key=split.__getitem__)} if pp > 2 else set())
    best: dict[str, float] = {"total": -1.0}
    for i in sorted(candidates):
        psi = _stage_params(m, split, i) / p.tp
        key = (s.strategy_name, s.precision_name, s.optimizer.name, psi, n, s.gpus_per_node, parts.param_bytes)
        state = _STATE_CACHE.get(key)
        if state is None:
            policy = s.strategy.policy(prec)
            shape = (Shape(psi, max(n // s.gpus_per_node, 1), min(n, s.gpus_per_node)) if sched.hybrid
                     else Shape(psi, 1, n))  # fmt: skip
            state = s.strategy.state_bytes(policy, shape, parts)
            _STATE_CACHE[key] = state
        in_flight = min(p.microbatches, pp - i) * (inter if i == 0 else 1.0)
        act = per_layer * split[i] * in_flight
        if i == 0:
            act += (8.0 * seq * p.micro_batch + seq * p.micro_batch * m.hidden * prec.activation_bytes / 2.0) \
                * min(p.microbatches, pp) / p.tp
        if i == pp - 1:
            act += 4.0 * seq * p.micro_batch * m.hidden * (1.0 + m.vocab / m.hidden) / p.tp
        total = state + act + buffers
        if total > best["total"]:
            best = {"total": total, "state": state, "act": act, "buffers": buffers}
    return best


__all__ = ["CP_COMMS", "HEADROOM", "Setup", "dp_exposure", "exposure", "price_layout"]
