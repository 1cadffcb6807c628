"""Pricing one plan option: memory per rank, bus bytes per step and their intra/inter-node split, and the predicted
communication and step time, asked of the training strategy objects (:mod:`commbench.planning.options`) and of a
fitted cost model (:mod:`commbench.planning.costmodel`).

Nothing here restates a strategy's formula; this module adds what the strategies do not own, each stated where it
is computed:

* activations (when ``layers``, ``hidden``, ``seq`` and ``micro_batch`` are given): Korthikanti et al. 2022
  ("Reducing Activation Recomputation in Large Transformer Models", eq. 2, no tensor/sequence parallelism,
  no recomputation): ``s*b*h*(34 + 5*a*s/h)`` bytes per layer with 16-bit activations, times the layers;
  scaled by itemsize/2 for fp32 compute. Embedding, logits and the loss are left out.
* comm buffers: one in-flight call per "op:dtype" (its nccl-tests size: an FSDP unit gathered, a DDP bucket
  in its wire dtype); an upper bound where a collective works in place, NCCL's own buffers excluded.
* the split of bus bytes between intra- and inter-node links, asked of the group kind
  (:func:`commbench.planning.costmodel.inter_node_share`): a flat ring over ``nodes x gpus_per_node`` ranks placed
  node by node crosses nodes on ``nodes`` of its ``N`` hops, so per rank on average ``1/g`` of the bytes go
  inter-node and ``(g-1)/g`` intra-node (zero inter-node bytes on one node); a group within a node is all intra,
  one rank per node all inter.
* time, from a fitted :class:`commbench.planning.costmodel.CostModel`: each "op:dtype" is priced by the fit of
  (op, the precision the registry runs natively in that dtype, group) as ``calls`` calls of equal size (DDP: one
  per bucket; FSDP: one per unit; a resharded unit's two all-gathers count as one call of twice the size: one
  latency short). A DDP gradient hook's bytes are priced as the all_reduce of the hook's wire precision (the sweep
  measures the same chunked algorithm for a codec, encode and decode included). A group is priced by its own
  kind's fit, else by any fit that measured the same link (across nodes: a ``world`` fit across nodes, any ranks
  per node, or the ``inter`` fit; within a node: the ``intra`` fit or a ``world`` fit on one node), with ``n`` all
  its ranks; HSDP's replica groups (one per local rank) share each node link, ``1/g`` each. Both by
  :func:`commbench.planning.costmodel.link_sharing` and ``CostModel.predict(nodes=, concurrent=)``: the cost
  model's "Layouts" rule, the one the layout benchmark checks. Where the model lacks the key, ``comm_model`` says
  so and the time stays empty.
* overlap: communication hides behind ``overlap`` (default 2/3, the backward pass's share of 6*Psi flops per
  token: 4 of 6) of the compute time; ``exposed = max(0, comm - overlap * compute)``; ``step = compute +
  exposed``. Compute is ``--compute-ms`` or ``6 * Psi * seq * micro_batch / (tflops * 1e12 * mfu)``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from commbench.measure.groups import GROUP_KINDS, get_group_kind
from commbench.measure.precision import get_precision, precision_names
from commbench.planning.costmodel import CostModel, Fit, inter_node_share, link_sharing, measure_command
from commbench.planning.options import GroupBytes, PlanStrategy, Shape, StateParts, pieces
from commbench.training.comm import bus_factor
from commbench.training.policies import Policy
from commbench.training.strategies import ModelState, default_bucket_numels

OVERLAP = 2.0 / 3.0
"""Default fraction of the compute time communication can hide behind (the backward pass: 4 of 6 Psi flops)."""
KORTHIKANTI_PER_LAYER = (34.0, 5.0)
"""Korthikanti et al. 2022, eq. 2: activation bytes per layer = s*b*h*(34 + 5*a*s/h) with 16-bit activations."""


def native_precision(dtype: str) -> str | None:
    """The sweep precision whose collective runs in the nccl-tests dtype ``dtype`` ("float", "bfloat16") on a tensor
    already in it (no codec), asked of the precision registry; None when no registered precision does."""
    for name in precision_names():
        try:
            p = get_precision(name)
        except ValueError:  # a precision that needs an option is no native dtype
            continue
        if p.input_dtype_name == p.wire_dtype_name and p.nccl_type == dtype:
            return p.name
    return None


# ----------------------------------------------------------------------------------------------- time
@dataclass(slots=True)
class _Priced:
    time_s: float = 0.0
    low_s: float = 0.0
    high_s: float = 0.0
    codec_s: float = 0.0
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extrapolated: bool = False


def _measured_across(f: Fit) -> bool:
    """Whether a fit measured node links (``Fit.crosses_nodes``). A version-1 model file does not record it: its
    group kind says, on its runs' nodes (any ranks per node: the file does not keep them; 2 gives every kind a group
    of two ranks or more)."""
    c = f.crosses_nodes
    return bool(c) if c is not None else link_sharing(f.group, max(f.nodes), 2) > 0


def _group_for(
    model: CostModel, coll: str, prec: str, level: str, nodes: int, gpus_per_node: int
) -> tuple[str | None, str]:
    """Which fitted group prices a call of a group of kind ``level``; (None, why) when the model has none. The
    level's own fit first, then any other kind's fit (in the registry's order) that measured the same link as
    this level does (the cost model's "Layouts": a ``world`` fit across nodes prices an ``inter`` group, a ``world``
    fit on one node an ``intra`` group, and the reverse)."""
    fits = model.fits
    kind = get_group_kind(level)
    across = link_sharing(level, nodes, gpus_per_node) > 0  # the group kind says whether it crosses node links
    for grp in (level, *(k for k in GROUP_KINDS if k != level)):
        f = fits.get((coll, prec, grp))
        if f is None or _measured_across(f) != across:
            continue
        # the whole world on one node is what a group within the node measured: no note
        same = grp == level or (kind.whole_world and not across)
        return grp, "" if same else f"{coll}/{prec}: {level} priced by the {grp} fit"
    have = sorted("/".join(k) for k in fits if k[:2] == (coll, prec)) or ["none"]
    where = f"across {nodes} nodes" if kind.whole_world and across else f"({level})"
    return None, f"no model for {coll}/{prec} {where}; fitted: {', '.join(have)}"


def _price(model: CostModel, g: GroupBytes, nodes: int, gpus_per_node: int) -> _Priced:
    out = _Priced()
    if g.n < 2:
        return out
    # the layout rule of the cost model (its "Layouts"): groups of this level sharing each node link
    share = link_sharing(g.level, nodes, gpus_per_node)
    layout: dict[str, Any] = {"nodes": nodes if share else 1, "concurrent": max(share, 1)}
    rest = dict(g.by_op)
    calls_keys: list[tuple[str, str, dict[str, float]]] = []
    if g.hook is not None:
        hook_bytes = g.hook.comm_bytes(psi=g.hook_psi, world_size=g.n, bucket_numels=default_bucket_numels(g.hook_psi))
        for k, v in hook_bytes.items():
            rest[k] = rest.get(k, 0.0) - v
        calls_keys.append(("all_reduce", g.hook.wire, {"fp32_bytes": 4.0 * g.hook_psi}))
    for key, bus in rest.items():
        if bus <= 1e-9 * max(sum(g.by_op.values()), 1.0):
            continue
        op, dtype = key.split(":", 1)
        prec = native_precision(dtype)
        if prec is None:
            out.missing.append(f"no precision runs {op} in {dtype}")
            continue
        f = bus_factor(op, g.n)
        calls_keys.append((op, prec, {"nbytes": bus / f if f else 0.0}))
    for coll, prec, size in calls_keys:
        grp, note = _group_for(model, coll, prec, g.level, nodes, gpus_per_node)
        per_call: dict[str, Any] = {k: v / g.calls for k, v in size.items()}
        if grp is None:  # named with the command that measures it (issue 25)
            hint = measure_command(coll, prec, g.level, nodes=nodes, gpus_per_node=gpus_per_node, **per_call)
            out.missing.append(f"{note}; {hint}")
            continue
        if note:
            out.notes.append(note)
        p = model.predict(coll, prec, world_size=g.n, group=grp, **layout, **per_call)
        out.time_s += p.total_s * g.calls
        out.low_s += p.total_low_s * g.calls  # summed as if fully correlated: the wider, honest interval
        out.high_s += p.total_high_s * g.calls
        out.codec_s += (p.encode_s + p.decode_s) * g.calls
        out.extrapolated |= p.extrapolated
        # a price read off the measured points has no warning; a fitted one says why and how far it reaches
        out.notes.extend(f"{coll}/{prec}/{grp}: {x}" for x in p.warnings)
    return out


# ----------------------------------------------------------------------------------------------- memory, bytes
def activation_bytes(shape: Shape, elem_bytes: float) -> float:
    """Korthikanti et al. 2022 eq. 2 (no recomputation, no tensor parallelism) times the layers; NaN when the
    shape is incomplete."""
    s, b, h, layers = shape.seq, shape.micro_batch, shape.hidden, shape.layers
    if not (s and b and h and layers):
        return math.nan
    a = shape.heads or max(h // 128, 1)
    c34, c5 = KORTHIKANTI_PER_LAYER
    return layers * s * b * h * (c34 + c5 * a * s / h) * elem_bytes / 2.0


def comm_buffer_bytes(strat: PlanStrategy, policy: Policy, shape: Shape) -> float:
    """One in-flight call per group and "op:dtype" of the largest piece (bucket or unit): its nccl-tests size,
    asked of the same formulas as the bytes per step, for a layout of that piece alone gathered once."""
    largest = max(pieces(policy, shape.layout(), shape.world_size) or [int(shape.psi)])
    if largest <= 0:
        return 0.0
    out = 0.0
    for g in strat.groups(policy, replace(shape, psi=float(largest), piece=True)):
        for key, v in g.by_op.items():
            f = bus_factor(key.split(":", 1)[0], g.n)
            out += v / f if f else 0.0
    return out


def _split(level: str, gpus_per_node: int, nodes: int, total: float) -> tuple[float, float]:
    """(intra, inter) bytes of ``total`` bus bytes per rank of a group of kind ``level`` (see the module
    docstring)."""
    inter = total * inter_node_share(level, nodes, gpus_per_node)
    return total - inter, inter


def compute_time(shape: Shape, compute_ms: float | None, tflops: float | None, mfu: float | None) -> tuple[float, float]:
    """(compute seconds per step, tokens per step over all ranks); NaN where not given."""
    compute_s = math.nan
    if compute_ms is not None:
        compute_s = compute_ms / 1e3
    elif tflops is not None and mfu is not None:
        compute_s = 6.0 * shape.psi * (shape.seq or 0) * (shape.micro_batch or 0) / (tflops * 1e12 * mfu)
    tokens = shape.world_size * shape.seq * shape.micro_batch if shape.seq and shape.micro_batch else math.nan
    return compute_s, tokens


# ----------------------------------------------------------------------------------------------- one row
COLUMNS = {
    "rank": "rank (fits first, then step time, comm time, memory)",
    "strategy": "plan strategy",
    "precision": "plan precision",
    "world_size": "ranks (nodes x gpus per node)",
    "nodes": "nodes",
    "gpus_per_node": "ranks per node",
    "params": "parameters, Psi",
    "mem_params_bytes": "parameters per rank (working copies included), bytes",
    "mem_grads_bytes": "gradients per rank at the peak, bytes",
    "mem_master_bytes": "fp32 master weights per rank, bytes",
    "mem_optim_bytes": "optimizer moments per rank, bytes",
    "mem_model_state_bytes": "model state per rank at the step's peak (the strategy's state_bytes), bytes",
    "mem_comm_buffers_bytes": "one in-flight call per op:dtype, bytes",
    "mem_activations_bytes": "activations (Korthikanti et al. 2022), bytes; empty without the shape",
    "mem_total_bytes": "model state + comm buffers + activations, bytes",
    "fits": "mem_total_bytes <= device memory (empty without --device-memory)",
    "comm_bytes_per_step": "bus bytes per rank per step (nccl-tests definitions)",
    "comm_bytes_intra": "of which over intra-node links (per rank, average)",
    "comm_bytes_inter": "of which over inter-node links (per rank, average)",
    "comm_by_op": 'bus bytes per step by "group/op:dtype", JSON',
    "comm_time_s": "predicted communication time per step (encode/decode included), s",
    "comm_time_low_s": "95 % interval low, s",
    "comm_time_high_s": "95 % interval high, s",
    "codec_time_s": "of which encode + decode, s",
    "comm_extrapolated": "a priced call lies outside the model's fitted range",
    "comm_model": "what priced the communication, or what the model lacks",
    "compute_s": "compute time per step, s",
    "exposed_comm_s": "communication not hidden behind compute, s",
    "step_time_s": "compute + exposed communication, s",
    "tokens_per_s": "tokens per second over all ranks",
    "policy": "the composed training policy (sharding / gradient hook)",
}
"""plan.csv columns and their meaning (units in the text)."""


def price_option(
    strat: PlanStrategy, names: tuple[str, str], policy: Policy, shape: Shape, parts: StateParts,
    act_elem_bytes: float, cost: CostModel | None, compute_s: float, tokens: float, overlap: float,
    device_memory: float | None,
) -> dict[str, Any]:  # fmt: skip
    """One plan.csv row (:data:`COLUMNS`) of one option: memory, bytes and, with ``cost``, the times."""
    state = parts.state

    def sb(p: float = 0.0, g: float = 0.0, k: float = 0.0) -> float:
        return strat.state_bytes(policy, shape, ModelState(p, g, k))

    # Components asked of the same formula one at a time; the part present with no state at all (ZeRO-2's
    # unsharded working parameters) counts as parameters, so the components add up to the peak.
    base = sb()
    model_state = strat.state_bytes(policy, shape, state)
    groups = strat.groups(policy, shape)
    by_op: dict[str, float] = {}
    intra = inter = 0.0
    for g in groups:
        for key, v in g.by_op.items():
            by_op[f"{g.level}/{key}"] = v
            a, e = _split(g.level, shape.gpus_per_node, shape.nodes, v)
            intra, inter = intra + a, inter + e
    buffers = comm_buffer_bytes(strat, policy, shape)
    act = activation_bytes(shape, act_elem_bytes)
    total = model_state + buffers + (0.0 if math.isnan(act) else act)
    row: dict[str, Any] = {
        "strategy": names[0],
        "precision": names[1],
        "world_size": shape.world_size,
        "nodes": shape.nodes,
        "gpus_per_node": shape.gpus_per_node,
        "params": shape.psi,
        "mem_params_bytes": sb(p=state.param_bytes),
        "mem_grads_bytes": sb(g=state.grad_bytes) - base,
        "mem_master_bytes": sb(k=parts.master) - base,
        "mem_optim_bytes": sb(k=parts.moments) - base,
        "mem_model_state_bytes": model_state,
        "mem_comm_buffers_bytes": buffers,
        "mem_activations_bytes": act,
        "mem_total_bytes": total,
        "fits": (total <= device_memory) if device_memory else None,
        "comm_bytes_per_step": intra + inter,
        "comm_bytes_intra": intra,
        "comm_bytes_inter": inter,
        "comm_by_op": json.dumps(by_op, sort_keys=True),
        "comm_time_s": math.nan,
        "comm_time_low_s": math.nan,
        "comm_time_high_s": math.nan,
        "codec_time_s": math.nan,
        "comm_extrapolated": None,
        "comm_model": "no cost model given: memory and bytes only",
        "compute_s": compute_s,
        "exposed_comm_s": math.nan,
        "step_time_s": math.nan,
        "tokens_per_s": math.nan,
        "policy": f"{type(policy.sharding).__name__} / {type(policy.grad_comm).__name__}",
    }
    if cost is not None:
        priced = [_price(cost, g, shape.nodes, shape.gpus_per_node) for g in groups]
        missing = [m for p in priced for m in p.missing]
        notes = [m for p in priced for m in p.notes]
        row["comm_extrapolated"] = any(p.extrapolated for p in priced)
        if missing:
            row["comm_model"] = "; ".join(dict.fromkeys(missing))
        else:
            t = sum(p.time_s for p in priced)
            row.update(
                comm_time_s=t,
                comm_time_low_s=sum(p.low_s for p in priced),
                comm_time_high_s=sum(p.high_s for p in priced),
                codec_time_s=sum(p.codec_s for p in priced),
                comm_model="; ".join(dict.fromkeys([*notes, _timing_note(cost)])),
            )
            if not math.isnan(compute_s):
                exposed = max(0.0, t - overlap * compute_s)
                row.update(exposed_comm_s=exposed, step_time_s=compute_s + exposed)
                row["tokens_per_s"] = tokens / row["step_time_s"] if row["step_time_s"] > 0 else math.nan
    return row


def _timing_note(cost: CostModel) -> str:
    """How the model's points were timed: a stream of ops (nccl-tests) or one op after compute (a step's)."""
    modes = sorted({f.timing_mode for f in cost.fits.values()})
    how = {"stream": "back-to-back ops", "isolated": "ops issued after compute"}
    return "fitted to " + " and ".join(f"{how.get(m, m)} ({m} timing)" for m in modes)


__all__ = [
    "COLUMNS", "KORTHIKANTI_PER_LAYER", "OVERLAP", "activation_bytes", "comm_buffer_bytes", "compute_time",
    "native_precision", "price_option",
]  # fmt: skip
