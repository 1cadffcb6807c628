"""The 3-D search: for a model and one or more GPU counts (or a target throughput), every TP x PP x DP x data-parallel
strategy x precision, with the rules that rule each out, ranked by tokens per second.

Layout (Megatron-LM's rank order, TP fastest, then DP, then PP): a TP group is ``tp`` consecutive ranks, inside one
node (``tp`` divides the GPUs per node); a DP group takes every ``tp``-th rank of a stage, so it spans
``ceil(tp*dp/g)`` nodes with ``tp`` DP groups sharing each node's links; PP stages are ``tp*dp`` ranks apart.

Rules, each a reason in the ``ruled_out`` column: heads and kv heads divisible by TP (Megatron splits attention by
heads and query groups); layers divisible by PP; the global batch (``global_batch_tokens``) holds at least one
micro-batch per DP rank; the memory of the most loaded rank fits the device; HSDP only without TP and PP (its
shard group is the node); fp8 gradient communication only through DDP's hook (the plan precisions' rule).

Per option, asked of the objects that own each figure:

* model state, comm buffers and the DP bytes: the plan strategy (:mod:`commbench.planning.options`) on the most
  loaded stage's shard of Psi (Megatron-LM ``theoretical_memory_usage.py``: ``(L*layer/pp + embedding)/tp``, the
  output layer too when untied on one stage), with one FSDP unit per layer of that stage;
* activations: :mod:`commbench.planning.activations` (sequence parallel with TP, ``m`` micro-batches in flight);
* TP bytes: :class:`commbench.training.tensor_parallel.TensorParallel` (Megatron: 4 all-reduces of b*s*h per layer
  per micro-batch; with sequence parallelism the same volume as all-gather + reduce-scatter), ``m`` micro-batches,
  the stage's layers; exposed (no TP overlap);
* PP bytes: :class:`commbench.training.pipeline_parallel.PipelineParallel` (b*s*h forward and b*s*h backward per
  stage boundary per micro-batch, Narayanan et al. 2021), a middle stage's rank sending both, in the activation
  dtype; exposed;
* compute: :mod:`commbench.planning.compute` at the stated MFU, ``(m + pp - 1)`` micro-batch times per step, so the
  pipeline bubble is ``(pp-1)/(m+pp-1)`` of it (1F1B, no interleaving);
* time: each group's bytes priced by the cost model (``--model``) or the GPU preset's stated link bandwidths
  (:class:`commbench.planning.pricing.StatedLinks`), with the strategy's overlap model
  (:class:`commbench.planning.options.Overlap`); the parameter all-gathers of a strategy that re-gathers every
  micro-batch count ``m`` times.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from commbench.planning.activations import ATTENTIONS, RECOMPUTES, activation_bytes
from commbench.planning.compute import DEFAULT_MFU, GPU, GPUS, compute_seconds
from commbench.planning.costmodel import CostModel
from commbench.planning.options import (
    OPTIMIZERS,
    PRECISIONS,
    STRATEGIES,
    GroupBytes,
    HybridStrategy,
    PlanPrecision,
    Shape,
    StateParts,
    check_choices,
)
from commbench.planning.presets import MODELS, ModelShape, model_shape
from commbench.planning.pricing import (
    StatedLinks,
    comm_buffer_bytes,
    price_group,
    split_by_link,
    step_flops_per_token,
    time_columns,
)
from commbench.training.strategies import BF16, FP32, Layout

GLOBAL_BATCH_TOKENS = 4 * 2**20
"""Default tokens per optimizer step (about Llama 2's 4M-token batch, Touvron et al. 2023, section 2.2)."""
MAX_GPUS = 2**17
"""The largest GPU count a target search tries."""

SEARCH_COLUMNS = {
    "rank": "rank: options that fit, by tokens/s; then those ruled out",
    "gpus": "GPUs",
    "nodes": "nodes",
    "tp": "tensor-parallel degree (within a node)",
    "pp": "pipeline stages",
    "dp": "data-parallel degree",
    "strategy": "data-parallel strategy (plan strategy)",
    "precision": "plan precision",
    "micro_batch": "samples per micro-batch",
    "microbatches": "micro-batches per step and DP rank (gradient accumulation)",
    "tokens_per_step": "tokens per optimizer step (dp x m x b x s)",
    "ruled_out": "the rule that rules the option out (empty: it is an option)",
    "mem_model_state_bytes": "model state per rank (most loaded stage), bytes",
    "mem_comm_buffers_bytes": "comm buffers per rank, bytes",
    "mem_activations_bytes": "activations per rank (first stage), bytes",
    "mem_total_bytes": "total per rank, bytes",
    "comm_tp_bytes": "TP bus bytes per rank per step (intra-node), bytes",
    "comm_pp_bytes": "PP bytes a middle stage's rank sends per step, bytes",
    "comm_dp_intra_bytes": "DP bus bytes per rank per step over intra-node links",
    "comm_dp_inter_bytes": "DP bus bytes per rank per step over inter-node links",
    "comm_by_op": 'bus bytes per step by "group/op:dtype", JSON',
    "comm_time_s": "communication per step, s",
    "comm_time_low_s": "its interval, low, s",
    "comm_time_high_s": "its interval, high, s",
    "comm_model": "what priced the communication (or what the cost model lacks; extrapolation warnings)",
    "comm_extrapolated": "a priced call lies outside the cost model's fitted range",
    "comm_warned": "the pricing warns (fitted beyond the measured points, extrapolated, a fit missing its points)",
    "compute_s": "compute per step (bubble included), s",
    "bubble_fraction": "pipeline bubble, (pp-1)/(m+pp-1)",
    "exposed_comm_s": "communication not hidden behind compute, s",
    "step_time_s": "step time, s",
    "step_time_low_s": "step time at the comm interval's low end, s",
    "step_time_high_s": "step time at the comm interval's high end, s",
    "tokens_per_s": "tokens per second",
    "tokens_per_s_low": "tokens per second at the step time's high end",
    "tokens_per_s_high": "tokens per second at the step time's low end",
}
"""search.csv columns."""


@dataclass(frozen=True, slots=True)
class Setting:
    """What a search is run on: the model, GPU, MFU, batch and the recompute/attention choices."""

    model: ModelShape
    gpu: GPU
    mfu: float
    micro_batch: int
    global_batch_tokens: int
    attention: str
    recompute: str
    optimizer: str
    device_memory: float


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _powers_of_two(limit: int) -> list[int]:
    out, k = [], 1
    while k <= limit:
        out.append(k)
        k *= 2
    return out


def _stage_psi(m: ModelShape, tp: int, pp: int) -> float:
    """Parameters on the most loaded (first) stage's rank (Megatron-LM ``theoretical_memory_usage.py``)."""
    block = m.layers * m.layer_params + m.norm_params * m.hidden
    out = block / pp + m.embedding_params
    if not m.tied_embeddings and pp == 1:
        out += m.embedding_params
    return out / tp


def _tp_bytes(m: ModelShape, tp: int, pp: int, tokens: int, prec: PlanPrecision, microbatches: int) -> dict[str, float]:
    """TP bus bytes per rank per step, asked of TensorParallel for the stage's layers and the micro-batches."""
    if tp < 2:
        return {}
    from commbench.training.tensor_parallel import COLWISE, ROWWISE, TensorParallel

    act = BF16 if prec.param_bytes < 4 else FP32
    per_layer = ((COLWISE, m.hidden), (ROWWISE, m.hidden), (COLWISE, m.hidden), (ROWWISE, m.hidden))
    layout = Layout(activations=per_layer * (m.layers // pp), tokens=tokens)
    one = TensorParallel(act_dtype_name=act, grad_dtype_name=act).comm_bytes(psi=0.0, world_size=tp, layout=layout)
    return {k: v * microbatches for k, v in one.items()}


def _pp_bytes(m: ModelShape, pp: int, tokens: int, prec: PlanPrecision, microbatches: int) -> dict[str, float]:
    """Bytes a middle stage's rank sends per step (b*s*h forward and b*s*h backward per micro-batch; the ends send
    one direction), asked of PipelineParallel for one pipeline of ``pp`` stages."""
    if pp < 2:
        return {}
    from commbench.training.pipeline_parallel import PipelineParallel
    from commbench.training.strategies import World

    act = BF16 if prec.param_bytes < 4 else FP32
    pipe = PipelineParallel(pp=pp, microbatches=microbatches, act_dtype_name=act)
    world = World(0.0, pp, layout=PipelineParallel.layout(tokens=tokens, hidden=m.hidden))
    out: dict[str, float] = {}
    for part in pipe.send_bytes_of_rank(1 if pp > 2 else 0, world).values():
        for k, v in part.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _option(
    s: Setting, gpus: int, tp: int, pp: int, sname: str, pname: str, cost: CostModel | StatedLinks,
) -> dict[str, Any]:  # fmt: skip
    m, g = s.model, min(s.gpu.gpus_per_node, gpus)
    nodes = max(gpus // g, 1)
    dp = gpus // (tp * pp)
    strat, prec = STRATEGIES[sname], PRECISIONS[pname]
    tokens = s.micro_batch * m.seq
    microbatches = s.global_batch_tokens // (dp * tokens) if dp * tokens else 0
    row: dict[str, Any] = {
        "gpus": gpus, "nodes": nodes, "tp": tp, "pp": pp, "dp": dp, "strategy": sname, "precision": pname,
        "micro_batch": s.micro_batch, "microbatches": microbatches, "tokens_per_step": dp * microbatches * tokens,
        "ruled_out": "",
    }  # fmt: skip
    rules = [
        (tp > g, f"TP {tp} > {g} GPUs per node (a TP group stays within a node)"),
        (m.heads % tp != 0, f"heads {m.heads} not divisible by TP {tp}"),
        (m.kv_heads % tp != 0, f"kv heads {m.kv_heads} not divisible by TP {tp}"),
        (m.layers % pp != 0, f"layers {m.layers} not divisible by PP {pp}"),
        (microbatches < 1, f"global batch {s.global_batch_tokens} tokens < one micro-batch per DP rank "
                           f"({dp} x {tokens})"),
        (isinstance(strat, HybridStrategy) and (tp > 1 or pp > 1), "hsdp with TP or PP is not modelled"),
    ]  # fmt: skip
    for bad, why in rules:
        if bad:
            row["ruled_out"] = why
            return row
    try:
        policy = strat.policy(prec)
    except ValueError as err:
        row["ruled_out"] = str(err)
        return row
    opt = OPTIMIZERS[s.optimizer]
    parts = StateParts(prec.param_bytes, prec.grad_bytes, prec.master_bytes, opt.moment_bytes)
    psi = _stage_psi(m, tp, pp)
    hybrid = isinstance(strat, HybridStrategy)
    if hybrid:
        shape = Shape(psi, nodes, g, m.layers // pp, unit_numel=m.layer_params // tp, grad_bytes=prec.grad_bytes)
    else:
        shape = Shape(psi, 1, dp, m.layers // pp, unit_numel=m.layer_params // tp, grad_bytes=prec.grad_bytes)
    state = strat.state_bytes(policy, shape, parts.state)
    buffers = comm_buffer_bytes(strat, policy, shape)
    act = activation_bytes(
        seq=m.seq, micro_batch=s.micro_batch, hidden=m.hidden, ffn=m.ffn, heads=m.heads, layers=m.layers,
        vocab=m.vocab, tp=tp, pp=pp, microbatches=microbatches, attention=ATTENTIONS[s.attention],
        recompute=RECOMPUTES[s.recompute], elem_bytes=prec.activation_bytes,
    ).total  # fmt: skip
    total = state + buffers + act
    row.update(mem_model_state_bytes=state, mem_comm_buffers_bytes=buffers, mem_activations_bytes=act,
               mem_total_bytes=total)  # fmt: skip

    # the groups and where they sit
    span = -(-tp * dp // g) if tp * dp > g else 1
    groups: list[GroupBytes] = []
    dp_intra = dp_inter = 0.0
    for grp in _per_micro_batch_apart(strat.groups(policy, shape), strat.overlap, microbatches):
        by_op = grp.by_op
        if not hybrid:
            grp = replace(grp, nodes=span, concurrent=tp if span > 1 else 1)
            per_node = max(dp // span, 1)
            share = (1.0 / per_node) if span > 1 else 0.0
            for v in by_op.values():
                dp_inter += v * share
                dp_intra += v * (1 - share)
        else:
            for v in by_op.values():
                a, b = split_by_link(grp.level, g, nodes, v)
                dp_intra, dp_inter = dp_intra + a, dp_inter + b
        groups.append(grp)
    tp_b = _tp_bytes(m, tp, pp, tokens, prec, microbatches)
    pp_b = _pp_bytes(m, pp, tokens, prec, microbatches)
    if tp_b:
        groups.append(GroupBytes("tp", tp, tp_b, 4 * (m.layers // pp) * microbatches, nodes=1,
                                 window_ops={k: "exposed" for k in tp_b}))  # fmt: skip
    if pp_b:
        pp_nodes = 2 if tp * dp >= g else 1  # a boundary joins two stages: on two nodes once a stage fills one
        groups.append(GroupBytes("pp", 2, pp_b, 2 * microbatches, nodes=pp_nodes, concurrent=min(tp * dp, g),
                                 window_ops={k: "exposed" for k in pp_b}))  # fmt: skip
    by_op_all = {f"{grp.level}/{k}": v for grp in groups for k, v in grp.by_op.items()}
    row.update(
        comm_tp_bytes=sum(tp_b.values()), comm_pp_bytes=sum(pp_b.values()), comm_dp_intra_bytes=dp_intra,
        comm_dp_inter_bytes=dp_inter, comm_by_op=json.dumps(by_op_all, sort_keys=True),
    )  # fmt: skip

    full = Shape(float(m.params), nodes, g, m.layers, m.hidden, m.heads, m.seq, s.micro_batch, model=m,
                 recompute=RECOMPUTES[s.recompute])  # fmt: skip
    peak = s.gpu.peak(BF16 if prec.param_bytes < 4 else FP32)
    micro_s = compute_seconds(step_flops_per_token(full) * tokens / (tp * pp), peak, s.mfu)
    bubble_s = (pp - 1) * micro_s
    row.update(compute_s=micro_s * microbatches + bubble_s,
               bubble_fraction=(pp - 1) / (microbatches + pp - 1))  # fmt: skip
    priced = [price_group(cost, grp, nodes, g, strat.overlap.window) for grp in groups]
    t = time_columns(priced, cost, micro_s, microbatches, float(dp * microbatches * tokens), None, bubble_s)
    t.pop("codec_time_s", None)
    row.update(t)
    if "step_time_low_s" in t:
        row["tokens_per_s_low"] = row["tokens_per_step"] / t["step_time_high_s"]
        row["tokens_per_s_high"] = row["tokens_per_step"] / t["step_time_low_s"]
    if total > s.device_memory:
        row["ruled_out"] = f"does not fit: {total / 1e9:.1f} GB > {s.device_memory / 1e9:.1f} GB"
    return row


def _per_micro_batch_apart(groups: Sequence[GroupBytes], overlap: Any, microbatches: int) -> list[GroupBytes]:
    """The strategy's groups with the collectives repeated every micro-batch (``overlap.window(op) ==
    "micro_batch"``: FSDP/ZeRO-3's parameter all-gathers) in a group of their own, whose bytes and calls are both
    ``microbatches`` times one step's: a call keeps its size (what the cost model prices it at), only their number
    grows. The rest (and a DDP hook's bytes) stays once per step."""
    out: list[GroupBytes] = []
    for grp in groups:
        repeated = {k: v for k, v in grp.by_op.items() if overlap.window(k.split(":", 1)[0]) == "micro_batch"}
        once = {k: v for k, v in grp.by_op.items() if k not in repeated}
        if repeated and microbatches > 1:
            out.append(replace(grp, by_op={k: v * microbatches for k, v in repeated.items()},
                               calls=grp.calls * microbatches, hook=None, hook_psi=0.0, hook_bytes={},
                               calls_by_op={k: grp.calls_by_op.get(k, grp.calls) * microbatches for k in repeated}))  # fmt: skip
            if once:
                out.append(replace(grp, by_op=once))
        else:
            out.append(grp)
    return out


def search(
    *,
    model_preset: str | None = None,
    gpus: Sequence[int] | None = None,
    target_tokens_per_s: float | None = None,
    gpu: str = "h100",
    mfu: float = DEFAULT_MFU,
    strategies: Sequence[str] = tuple(STRATEGIES),
    precisions: Sequence[str] = ("bf16", "fp8"),
    optimizer: str = "adam",
    micro_batch: int = 1,
    global_batch_tokens: int = GLOBAL_BATCH_TOKENS,
    attention: str = "flash",
    recompute: str = "selective",
    device_memory: float | None = None,
    model: CostModel | str | os.PathLike[str] | None = None,
    tp: Sequence[int] | None = None,
    pp: Sequence[int] | None = None,
    **shape_fields: Any,
) -> pd.DataFrame:
    """Every option over the GPU counts ``gpus`` (or, with ``target_tokens_per_s``, powers of two of nodes until an
    option reaches the target), ranked: options that fit by tokens/s, then the others with the rule that rules each
    out. ``df.attrs``: "answer" (the first line to print), "per_count" (the best option per GPU count, one line
    each), "assumptions". ValueError for bad input."""
    from commbench.planning.plan import load_model

    shape = model_shape(model_preset, **shape_fields)
    if shape is None:
        raise ValueError(f"the search needs a model: --model-preset {' | '.join(MODELS)} (or the full shape)")
    if gpu not in GPUS:
        raise ValueError(f"unknown gpu {gpu!r}; valid: {', '.join(GPUS)}")
    g = GPUS[gpu]
    if not (isinstance(mfu, (int, float)) and 0 < mfu <= 1):
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")
    check_choices(
        strategies=strategies, precisions=precisions, optimizer=optimizer, attention=attention, recompute=recompute
    )
    if (gpus is None) == (target_tokens_per_s is None):
        raise ValueError("give either GPU counts (--gpus 64,128) or a target (--target-tokens-per-s), not both")
    if gpus is not None:
        for count in gpus:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"GPU counts must be integers >= 1, got {count!r}")
            if count > g.gpus_per_node and count % g.gpus_per_node:
                raise ValueError(f"{count} GPUs is not a whole number of {g.name} nodes ({g.gpus_per_node} GPUs each)")
    if target_tokens_per_s is not None and not (math.isfinite(target_tokens_per_s) and target_tokens_per_s > 0):
        raise ValueError(f"target tokens/s must be a positive number, got {target_tokens_per_s!r}")
    for name, v in (("micro_batch", micro_batch), ("global_batch_tokens", global_batch_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    loaded = load_model(model)
    cost: CostModel | StatedLinks = (
        loaded if loaded is not None else StatedLinks(g.nvlink_gbps, g.network_gbps, g.source)
    )
    setting = Setting(shape, g, float(mfu), micro_batch, global_batch_tokens, attention, recompute, optimizer,
                      float(device_memory or g.memory_bytes))  # fmt: skip
    tps = list(tp) if tp else _powers_of_two(g.gpus_per_node)
    pps = list(pp) if pp else [p for p in _powers_of_two(shape.layers) if p <= 16]

    def one_count(n: int) -> list[dict[str, Any]]:
        rows = []
        for t in tps:
            for p in pps:
                if n % (t * p):
                    continue
                for sname in strategies:
                    for pname in precisions:
                        rows.append(_option(setting, n, t, p, sname, pname, cost))
        return rows

    setting_note = (
        f"Searched: TP {', '.join(map(str, tps))} x PP {', '.join(map(str, pps))} x strategies "
        f"{', '.join(strategies)} x precisions {', '.join(precisions)} (--strategies, --precisions)."
    )
    rows: list[dict[str, Any]] = []
    counts = list(gpus) if gpus is not None else []
    reached = None
    if target_tokens_per_s is not None:
        best_at: dict[int, float] = {}

        def best(n: int) -> float:
            if n not in best_at:
                new = one_count(n)
                rows.extend(new)
                counts.append(n)
                best_at[n] = max((r.get("tokens_per_s", math.nan) for r in new if not r["ruled_out"]), default=math.nan)
            return best_at[n]

        # double the nodes until the target is reached, then bisect on whole nodes between the last two counts
        gpn, lo, n = g.gpus_per_node, 0, g.gpus_per_node
        while n <= MAX_GPUS and not best(n) >= target_tokens_per_s:
            lo, n = n, n * 2
        if n <= MAX_GPUS:
            hi = n
            while hi - lo > gpn and lo:
                mid = (lo + hi) // 2 // gpn * gpn
                if best(mid) >= target_tokens_per_s:
                    hi = mid
                else:
                    lo = mid
            reached = hi
        counts.sort()
    else:
        for n in counts:
            rows += one_count(n)
    df = pd.DataFrame(rows)
    for c in SEARCH_COLUMNS:
        if c not in df.columns:
            df[c] = math.nan
    df = _rank_search(df[list(SEARCH_COLUMNS)[1:]])
    df.attrs.update(_answers(df, setting, counts, target_tokens_per_s, reached, cost))
    df.attrs["assumptions"].append(setting_note)
    return df


def _rank_search(df: pd.DataFrame) -> pd.DataFrame:
    ok = df["ruled_out"] == ""
    speed = df["tokens_per_s"].astype(float).fillna(-1.0)
    key = pd.DataFrame({"out": (~ok).astype(int), "speed": -speed, "mem": df["mem_total_bytes"].astype(float)})
    order = key.sort_values(["out", "speed", "mem"], kind="stable").index
    df = df.loc[order].reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    return df


def describe_option(r: Any, s: Setting) -> str:
    """One option in a line: GPUs, the parallel layout, strategy, precision, the MFU assumed, memory, throughput."""
    iv = ""
    if not math.isnan(r.get("tokens_per_s_low", math.nan)):
        iv = f" ({r['tokens_per_s_low'] / 1e6:.3g}-{r['tokens_per_s_high'] / 1e6:.3g} M)"
    return (
        f"{r['gpus']} x {s.gpu.name.upper()}, TP {r['tp']} x PP {r['pp']} x DP {r['dp']}, {r['strategy']} "
        f"{r['precision']}, {s.mfu:.0%} MFU assumed: {r['tokens_per_s'] / 1e6:.3g} M tokens/s{iv}, "
        f"{r['mem_total_bytes'] / 1e9:.1f} GB per GPU, {r['microbatches']} micro-batches of {r['micro_batch']}, "
        f"bubble {r['bubble_fraction']:.0%}"
    )


def _answers(
    df: pd.DataFrame, s: Setting, counts: list[int], target: float | None, reached: int | None,
    cost: CostModel | StatedLinks,
) -> dict[str, Any]:  # fmt: skip
    fit = df[df["ruled_out"] == ""]
    ok = fit[fit["tokens_per_s"].notna()]
    per_count = []
    for n in counts:
        sub = ok[ok["gpus"] == n]
        unpriced = fit[fit["gpus"] == n]
        if sub.empty and not unpriced.empty:
            r = unpriced.iloc[0]
            per_count.append(
                f"{n} GPUs: {len(unpriced)} options fit (least memory: TP {r['tp']} x PP {r['pp']} x DP {r['dp']} "
                f"{r['strategy']} {r['precision']}, {r['mem_total_bytes'] / 1e9:.1f} GB) but none is priced: "
                f"{r['comm_model']}"
            )
        elif sub.empty:
            here = df[df["gpus"] == n]
            sized = here[here["mem_total_bytes"].notna()]
            if not sized.empty:  # the option closest to fitting says what rules this count out
                r = sized.loc[sized["mem_total_bytes"].astype(float).idxmin()]
                per_count.append(
                    f"{n} GPUs: no option; the least memory, TP {r['tp']} x PP {r['pp']} x DP {r['dp']} "
                    f"{r['strategy']} {r['precision']}: {r['ruled_out']}"
                )
            else:
                why = here["ruled_out"].value_counts()
                per_count.append(f"{n} GPUs: no option ({'; '.join(f'{k}: {v}' for k, v in why.head(3).items())})")
        else:
            per_count.append(f"{n} GPUs: {describe_option(sub.iloc[0], s)}")
    name = s.model.name
    if ok.empty and not fit.empty:
        answer = (
            f"{name}: {len(fit)} options fit on {', '.join(map(str, counts))} x {s.gpu.name.upper()}, none priced "
            f"(the cost model lacks a collective: see comm_model; or drop --model for stated bandwidths)"
        )
    elif ok.empty:
        answer = f"{name}: no option fits on {', '.join(map(str, counts))} x {s.gpu.name.upper()} (see ruled_out)"
    elif target is not None:
        if reached is None:
            answer = (f"{name} at {target / 1e6:.3g} M tokens/s: not reached up to {max(counts)} GPUs; best: "
                      f"{describe_option(ok.iloc[0], s)}")  # fmt: skip
        else:
            best = ok[ok["gpus"] == reached].iloc[0]
            answer = f"{name} at {target / 1e6:.3g} M tokens/s: {describe_option(best, s)}"
    else:
        answer = f"{name}: {describe_option(ok.iloc[0], s)}"
    how = cost.describe() if isinstance(cost, StatedLinks) else "communication priced by the fitted cost model"
    m = s.model
    assumptions = [
        f"Model: {m.name} ({m.source}), Psi = {m.params:.4g}; seq {m.seq}; global batch {s.global_batch_tokens} "
        f"tokens; optimizer {OPTIMIZERS[s.optimizer].description}.",
        f"GPU: {s.gpu.name} ({s.gpu.source}), {s.device_memory / 1e9:.1f} GB, {s.gpu.gpus_per_node} per node; "
        f"MFU {s.mfu:.0%} assumed (--mfu).",
        f"Activations: attention {s.attention}, recompute {s.recompute}, sequence parallel with TP "
        "(Megatron-LM theoretical_memory_usage.py / Korthikanti et al. 2022).",
        f"Time: {how}.",
        "Overlap: per strategy (DP gradient comm behind the last micro-batch's backward, re-gathered parameters "
        "behind each micro-batch); TP and PP communication exposed; 1F1B bubble (pp-1)/(m+pp-1).",
    ]
    return {"answer": answer, "per_count": per_count, "assumptions": assumptions, "setting": s}


__all__ = ["GLOBAL_BATCH_TOKENS", "SEARCH_COLUMNS", "Setting", "describe_option", "search"]
