"""Pricing one plan option: memory per rank, bus bytes per step and their intra/inter-node split, and the predicted
communication and step time, asked of the training strategy objects (:mod:`commbench.planning.options`) and of a
fitted cost model (:mod:`commbench.planning.costmodel`) or of stated link bandwidths (:class:`StatedLinks`).

Nothing here restates a strategy's formula; this module adds what the strategies do not own, each stated where it
is computed:

* activations (with a model shape, ``seq`` and ``micro_batch``): :mod:`commbench.planning.activations` (Megatron-LM's
  ``theoretical_memory_usage.py`` / Korthikanti et al. 2022 for the chosen attention kernel and recompute mode, with
  the embedding and logits terms), scaled by itemsize/2 for fp32 compute.
* comm buffers: one in-flight call per "op:dtype" of the largest piece (its nccl-tests size: an FSDP unit gathered,
  a DDP bucket in the gradient dtype); the parameter all-gather of a strategy that re-gathers every micro-batch
  counts twice (the unit computing and the one prefetched, as FSDP and DeepSpeed's ZeRO-3 prefetch do). Without
  ``layers`` a sharded strategy's pieces are DeepSpeed's default ZeRO-3 prefetch bucket
  (``stage3_prefetch_bucket_size`` = 5e7 elements), never the whole model. An upper bound where a collective works
  in place, NCCL's own buffers excluded.
* the split of bus bytes between intra- and inter-node links, asked of the group kind
  (:func:`commbench.planning.costmodel.inter_node_share`): a flat ring over ``nodes x gpus_per_node`` ranks placed
  node by node crosses nodes on ``nodes`` of its ``N`` hops, so per rank on average ``1/g`` of the bytes go
  inter-node and ``(g-1)/g`` intra-node (zero inter-node bytes on one node); a group within a node is all intra,
  one rank per node all inter.
* time, from a fitted :class:`commbench.planning.costmodel.CostModel`: each "op:dtype" is priced by the fit of
  (op, the precision the registry runs natively in that dtype, group) as calls of equal size (DDP: one per
  bucket; FSDP: one per unit and pass, so a unit resharded after forward is two all-gathers of its size,
  :func:`commbench.planning.options.unit_calls`). A DDP gradient hook's bytes are priced as the all_reduce of the hook's wire precision (the sweep
  measures the same chunked algorithm for a codec, encode and decode included). A group is priced by its own
  kind's fit, else by any fit that measured the same link (across nodes: a ``world`` fit across nodes, any ranks
  per node, or the ``inter`` fit; within a node: the ``intra`` fit or a ``world`` fit on one node), with ``n`` all
  its ranks; HSDP's replica groups (one per local rank) share each node link, ``1/g`` each. Both by
  :func:`commbench.planning.costmodel.link_sharing` and ``CostModel.predict(nodes=, concurrent=)``: the cost
  model's "Layouts" rule, the one the layout benchmark checks. Where the model lacks the key and a GPU preset is
  given, that call is priced from the preset's stated links and ``comm_model`` says so; without a preset it names
  what is missing and the time stays empty.
* time from stated bandwidths (no cost model, a GPU preset): a group within a node moves its bus bytes at the NVLink
  bandwidth; a group across nodes at the lesser of NVLink and the node's network bandwidth (``gpus_per_node`` NICs)
  shared by the ``c`` groups crossing it, plus NCCL's ring latency per call (:mod:`commbench.planning.ring`: a
  step per rank, so a ring over many ranks is not free; x0.5-x2 in the interval). The point estimate takes
  :data:`STATED_EFFICIENCY`'s middle fraction of the nominal bandwidth, the interval its ends: an assumption every
  plan states, to be replaced by a fit of the user's cluster (``commbench fit``, ``--model``).
* overlap, stated per strategy (:class:`commbench.planning.options.Overlap`): collectives in the ``backward``
  window hide behind the last micro-batch's backward (4/6 of its compute), those in the ``micro_batch`` window
  behind every micro-batch's compute, the rest is exposed; ``step = compute + exposed``. ``--overlap x`` replaces
  it by one window of ``x`` of the compute for every collective. Compute is ``--compute-ms`` or FLOPs per token
  (:mod:`commbench.planning.compute`: ``6*Psi + 12*L*h*s`` with a model shape, else ``6*Psi``) times the tokens of a
  micro-batch over ``tflops * mfu``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from commbench.measure.groups import GROUP_KINDS, get_group_kind
from commbench.measure.precision import get_precision, precision_names
from commbench.planning.activations import RECOMPUTES
from commbench.planning.activations import activation_bytes as _activations
from commbench.planning.compute import flops_per_token
from commbench.planning.costmodel import CostModel, Fit, inter_node_share, link_sharing, measure_command
from commbench.planning.options import BACKWARD_SHARE, GroupBytes, PlanStrategy, Shape, StateParts
from commbench.planning.ring import LATENCY_RANGE, PASSES, latency_s
from commbench.training.comm import bus_factor
from commbench.training.policies import Policy
from commbench.training.strategies import ModelState

OVERLAP = 2.0 / 3.0
"""The single overlap fraction of ``--overlap`` (the backward pass: 4 of 6 Psi flops); by default the plan uses the
per-strategy model instead (module docstring)."""
ZERO3_PREFETCH_ELEMENTS = 50_000_000
"""DeepSpeed's ``stage3_prefetch_bucket_size`` default (5e7 elements): a sharded strategy's call size when the
layers are unknown."""
STATED_EFFICIENCY = (0.5, 0.8, 1.0)
"""Fractions of a stated (datasheet) link bandwidth: interval low end, point estimate, high end. nccl-tests' bus
bandwidth reaches about 80 % of NVLink's nominal figure on one node; 50 % allows for contention and small calls."""
WINDOWS = ("backward", "micro_batch", "exposed")


@dataclass(frozen=True, slots=True)
class StatedLinks:
    """Link bandwidths taken from a datasheet, not measured: what prices communication without a cost model."""

    nvlink_gbps: float
    """Per GPU per direction within a node, GB/s."""
    network_gbps: float
    """Per GPU per direction across nodes, GB/s (one NIC per GPU)."""
    source: str

    def bandwidth(self, span_nodes: int, gpus_per_node: int, concurrent: int) -> float:
        """Bytes/s (nominal) for a ring's bus bytes: NVLink within a node; across nodes the lesser of NVLink and the
        node's network bandwidth shared by the ``concurrent`` groups crossing it."""
        if span_nodes <= 1:
            return self.nvlink_gbps * 1e9
        return min(self.nvlink_gbps, self.network_gbps * gpus_per_node / max(concurrent, 1)) * 1e9

    def describe(self) -> str:
        lo, mid, hi = STATED_EFFICIENCY
        return (
            f"unmeasured: stated bandwidths ({self.source}: NVLink {self.nvlink_gbps:g} GB/s, network "
            f"{self.network_gbps:g} GB/s per GPU) at {mid:.0%} ({lo:.0%}-{hi:.0%}), NCCL's ring latency per call; "
            "fit your cluster (commbench fit) and pass --model"
        )


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
class Priced:
    time_s: float = 0.0
    low_s: float = 0.0
    high_s: float = 0.0
    codec_s: float = 0.0
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extrapolated: bool = False
    windows: dict[str, list[float]] = field(default_factory=dict)
    """Overlap window -> [time, low, high] of the collectives in it."""
    sources: list[str] = field(default_factory=list)
    """What priced each call (``Prediction.source``: the measured points or the fitted model)."""
    warned: bool = False
    """A prediction warned (fitted beyond the measured points, extrapolated, a fit missing its own points)."""

    def add(self, window: str, t: float, lo: float, hi: float) -> None:
        self.time_s, self.low_s, self.high_s = self.time_s + t, self.low_s + lo, self.high_s + hi
        w = self.windows.setdefault(window, [0.0, 0.0, 0.0])
        w[0], w[1], w[2] = w[0] + t, w[1] + lo, w[2] + hi


def _measured_across(f: Fit) -> bool:
    """Whether a fit measured node links (``Fit.crosses_nodes``). A version-1 model file does not record it: its
    group kind says, on its runs' nodes (any ranks per node: the file does not keep them; 2 gives every kind a group
    of two ranks or more)."""
    c = f.crosses_nodes
    return bool(c) if c is not None else link_sharing(f.group, max(f.nodes), 2) > 0


def group_for(
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


def _placement(g: GroupBytes, nodes: int, gpus_per_node: int) -> tuple[int, int, int]:
    """(nodes the group spans, ranks per node it has, groups sharing each node link) of ``g``."""
    if g.nodes is not None:
        return g.nodes, max(g.n // max(g.nodes, 1), 1), g.concurrent
    share = link_sharing(g.level, nodes, gpus_per_node)
    return (nodes if share else 1), gpus_per_node, max(share, 1)


def _stated(
    links: StatedLinks, out: Priced, w: str, op: str, bus: float, calls: int, n: int, span: int, gpus_per_node: int,
    conc: int,
) -> None:  # fmt: skip
    """``bus`` bytes in ``calls`` calls of ``op`` at the stated bandwidth plus NCCL's ring latency per call."""
    bw = links.bandwidth(span, gpus_per_node, conc)
    lo, mid, hi = STATED_EFFICIENCY
    l_lo, l_mid, l_hi = LATENCY_RANGE
    lat = calls * latency_s(op, n, span) if op in PASSES else 0.0
    out.add(w, bus / (mid * bw) + l_mid * lat, bus / (hi * bw) + l_lo * lat, bus / (lo * bw) + l_hi * lat)


def price_group(
    model: CostModel | StatedLinks, g: GroupBytes, nodes: int, gpus_per_node: int, window: Any = None,
    fallback: StatedLinks | None = None,
) -> Priced:  # fmt: skip
    """The group's communication per step, by overlap window (``window(op) -> name``; None: all "exposed").
    ``fallback``: the GPU preset's links, for a call the cost model has no fit for."""
    out = Priced()
    if g.n < 2:
        return out

    def win(key: str) -> str:
        return g.window_ops.get(key) or (window(key.split(":", 1)[0]) if window else "exposed")

    span, _, conc = _placement(g, nodes, gpus_per_node)
    if isinstance(model, StatedLinks):
        for key, bus in g.by_op.items():
            op = key.split(":", 1)[0]
            _stated(model, out, win(key), op, bus, g.calls_by_op.get(key, g.calls), g.n, span, gpus_per_node, conc)
        return out
    # the layout rule of the cost model (its "Layouts"): groups of this level sharing each node link
    if g.nodes is not None:
        span, per_node, conc = _placement(g, nodes, gpus_per_node)
        level, lay_nodes, lay_g = ("world" if span > 1 else "intra"), span, per_node
        layout: dict[str, Any] = {"nodes": span, "concurrent": conc}
    else:
        share = link_sharing(g.level, nodes, gpus_per_node)
        level, lay_nodes, lay_g = g.level, nodes, gpus_per_node
        layout = {"nodes": nodes if share else 1, "concurrent": max(share, 1)}
    rest = dict(g.by_op)
    calls_keys: list[tuple[str, str, dict[str, float], str, int]] = []
    if g.hook is not None:
        for k, v in g.hook_bytes.items():
            rest[k] = rest.get(k, 0.0) - v
        calls_keys.append(("all_reduce", g.hook.wire, {"fp32_bytes": 4.0 * g.hook_psi}, win("all_reduce:hook"), g.calls))
    for key, bus in rest.items():
        if bus <= 1e-9 * max(sum(g.by_op.values()), 1.0):
            continue
        op, dtype = key.split(":", 1)
        prec = native_precision(dtype)
        if prec is None:
            out.missing.append(f"no precision runs {op} in {dtype}")
            continue
        f = bus_factor(op, g.n)
        calls_keys.append((op, prec, {"nbytes": bus / f if f else 0.0}, win(key), g.calls_by_op.get(key, g.calls)))
    for coll, prec, size, w, calls in calls_keys:
        grp, note = group_for(model, coll, prec, level, lay_nodes, lay_g)
        per_call: dict[str, Any] = {k: v / calls for k, v in size.items()}
        if grp is None and fallback is not None and "nbytes" in size:  # the preset's links, said so (issue 32)
            _stated(fallback, out, w, coll, size["nbytes"] * bus_factor(coll, g.n), calls, g.n, span, gpus_per_node,
                    conc)  # fmt: skip
            out.notes.append(f"{note}: priced from the GPU preset's links instead")
            out.sources.append("preset")
            continue
        if grp is None:  # named with the command that measures it (issue 25)
            hint = measure_command(coll, prec, level, nodes=nodes, gpus_per_node=gpus_per_node, **per_call)
            out.missing.append(f"{note}; {hint}")
            continue
        if note:
            out.notes.append(note)
        p = model.predict(coll, prec, world_size=g.n, group=grp, **layout, **per_call)
        # summed as if fully correlated: the wider, honest interval
        out.add(w, p.total_s * calls, p.total_low_s * calls, p.total_high_s * calls)
        out.codec_s += (p.encode_s + p.decode_s) * calls
        out.extrapolated |= p.extrapolated
        # a price read off the measured points has no warning; a fitted one says why and how far it reaches
        out.notes.extend(f"{coll}/{prec}/{grp}: {x}" for x in p.warnings)
        out.warned |= bool(p.warnings)
        out.sources.append(p.source)
    return out


def exposed_comm(windows: dict[str, float], micro_s: float, microbatches: int = 1) -> float:
    """Communication not hidden behind compute (module docstring): ``backward`` behind the last micro-batch's
    backward, ``micro_batch`` behind all micro-batches' compute left, ``exposed`` all of it."""
    bwd, mb, ex = (windows.get(w, 0.0) for w in WINDOWS)
    hidden_b = min(bwd, BACKWARD_SHARE * micro_s)
    hidden_m = min(mb, max(microbatches * micro_s - hidden_b, 0.0))
    return ex + (bwd - hidden_b) + (mb - hidden_m)


# ----------------------------------------------------------------------------------------------- memory, bytes
def activation_bytes(shape: Shape, elem_bytes: float, tp: int = 1, pp: int = 1, microbatches: int = 1) -> float:
    """Activations per rank of the shape's model (:mod:`commbench.planning.activations`); NaN without a model
    shape, ``seq`` and ``micro_batch``."""
    m = shape.model
    if m is None or not (shape.seq and shape.micro_batch):
        return math.nan
    return _activations(
        seq=shape.seq, micro_batch=shape.micro_batch, hidden=m.hidden, ffn=m.ffn, heads=m.heads, layers=m.layers,
        vocab=m.vocab, tp=tp, pp=pp, microbatches=microbatches, attention=shape.attention,
        recompute=shape.recompute, elem_bytes=elem_bytes,
    ).total  # fmt: skip


def comm_buffer_bytes(strat: PlanStrategy, policy: Policy, shape: Shape) -> float:
    """One in-flight call per group and "op:dtype" of the largest piece (bucket or unit): its nccl-tests size,
    asked of the same formulas as the bytes per step, for a layout of that piece alone gathered once; a parameter
    all-gather repeated every micro-batch twice (computing + prefetched). Without layers, a sharded strategy's piece
    is DeepSpeed's prefetch bucket (:data:`ZERO3_PREFETCH_ELEMENTS`)."""
    largest = strat.largest_piece(policy, shape)
    if not shape.layers and not shape.piece and shape.layout().units == () and largest == int(shape.psi):
        largest = min(largest, ZERO3_PREFETCH_ELEMENTS)
    if largest <= 0:
        return 0.0
    out = 0.0
    for g in strat.groups(policy, replace(shape, psi=float(largest), piece=True)):
        for key, v in g.by_op.items():
            op = key.split(":", 1)[0]
            f = bus_factor(op, g.n)
            copies = 2 if strat.overlap.window(op) == "micro_batch" else 1
            out += copies * v / f if f else 0.0
    return out


def split_by_link(level: str, gpus_per_node: int, nodes: int, total: float) -> tuple[float, float]:
    """(intra, inter) bytes of ``total`` bus bytes per rank of a group of kind ``level`` (see the module
    docstring)."""
    inter = total * inter_node_share(level, nodes, gpus_per_node)
    return total - inter, inter


def step_flops_per_token(shape: Shape) -> float:
    """Model FLOPs per token (``6*Psi + 12*L*h*s`` with a model shape, else ``6*Psi``) times the recompute's extra
    forward (full: 8 of 6)."""
    m = shape.model
    base = flops_per_token(shape.psi, m.layers, m.hidden, shape.seq or 0) if m is not None else 6.0 * shape.psi
    extra = shape.recompute.extra_forward * (base / 3.0)  # one forward = 1/3 of forward + backward
    return base + extra


def compute_time(shape: Shape, compute_ms: float | None, tflops: float | None, mfu: float | None) -> tuple[float, float]:
    """(compute seconds per step, tokens per step over all ranks); NaN where not given."""
    compute_s = math.nan
    if compute_ms is not None:
        compute_s = compute_ms / 1e3
    elif tflops is not None and mfu is not None:
        compute_s = step_flops_per_token(shape) * (shape.seq or 0) * (shape.micro_batch or 0) / (tflops * 1e12 * mfu)
    tokens = shape.world_size * shape.seq * shape.micro_batch if shape.seq and shape.micro_batch else math.nan
    return compute_s, tokens


# ----------------------------------------------------------------------------------------------- one row
COLUMNS = {
    "rank": "rank (fits first, then step time, comm time, memory)",
    "strategy": "plan strategy",
    "precision": "plan precision",
    "tp": "tensor-parallel degree (1: the flat plan)",
    "pp": "pipeline stages (1)",
    "dp": "data-parallel degree (all ranks)",
    "cp": "context-parallel degree (1)",
    "vpp": "virtual stages (1)",
    "micro_batch": "sequences per micro-batch and rank (empty without a model shape)",
    "global_batch": "sequences per step over all ranks (one micro-batch each)",
    "recompute": "activation recompute",
    "world_size": "ranks (nodes x gpus per node)",
    "nodes": "nodes",
    "gpus_per_node": "ranks per node",
    "params": "parameters, Psi",
    "mem_params_bytes": "parameters per rank (working copies included), bytes",
    "mem_grads_bytes": "gradients per rank at the peak, bytes",
    "mem_master_bytes": "fp32 master weights per rank, bytes",
    "mem_optim_bytes": "optimizer moments per rank, bytes",
    "mem_model_state_bytes": "model state per rank at the step's peak (the strategy's state_bytes), bytes",
    "mem_comm_buffers_bytes": "one in-flight call per op:dtype (prefetched all-gathers twice), bytes",
    "mem_activations_bytes": "activations (Megatron-LM / Korthikanti et al. 2022), bytes; empty without the shape",
    "mem_total_bytes": "model state + comm buffers + activations, bytes",
    "fits": "mem_total_bytes <= device memory less the headroom (empty without --device-memory or --gpu)",
    "mem_headroom_bytes": "usable memory (device less --headroom) minus mem_total_bytes, bytes",
    "comm_bytes_per_step": "bus bytes per rank per step (nccl-tests definitions)",
    "comm_bytes_intra": "of which over intra-node links (per rank, average)",
    "comm_bytes_inter": "of which over inter-node links (per rank, average)",
    "comm_by_op": 'bus bytes per step by "group/op:dtype", JSON',
    "comm_time_s": "predicted communication time per step (encode/decode included), s",
    "comm_time_low_s": "95 % interval low (stated bandwidths: at 100 % of nominal), s",
    "comm_time_high_s": "95 % interval high (stated bandwidths: at 50 % of nominal), s",
    "codec_time_s": "of which encode + decode, s",
    "comm_extrapolated": "a priced call lies outside the model's fitted range",
    "comm_warned": "the pricing warns (fitted beyond the measured points, extrapolated, a fit missing its points)",
    "comm_model": "what priced the communication, or what the model lacks; extrapolation warnings",
    "compute_s": "compute time per step, s",
    "comm_exposed_s": "communication not hidden behind compute (the strategy's overlap model), s",
    "step_time_s": "compute + exposed communication, s (--mfu: compute at that end-to-end MFU, nothing added)",
    "step_time_low_s": "step time with the communication interval's low end, s",
    "step_time_high_s": "step time with the communication interval's high end, s",
    "tokens_per_s": "tokens per second over all ranks",
    "tflops_per_gpu": "model TFLOP/s per GPU achieved (recompute included), an output",
    "mfu": "model FLOPs utilisation of the peak, an output",
    "bubble_frac": "pipeline bubble (0: no pipeline)",
    "policy": "the composed training policy (sharding / gradient hook)",
}
"""plan.csv columns and their meaning (units in the text)."""


def price_option(
    strat: PlanStrategy, names: tuple[str, str], policy: Policy, shape: Shape, parts: StateParts,
    act_elem_bytes: float, cost: CostModel | StatedLinks | None, compute_s: float, tokens: float,
    overlap: float | None, device_memory: float | None, *, headroom: float = 0.0, end_to_end: bool = False,
    fallback: StatedLinks | None = None, peak_flops: float | None = None,
    compute_scale: tuple[float, float] = (1.0, 1.0),
) -> dict[str, Any]:  # fmt: skip
    """One plan.csv row (:data:`COLUMNS`) of one option: memory, bytes and, with ``cost``, the times.
    ``overlap`` None: the strategy's overlap model; a number: one window of that fraction of the compute.
    ``end_to_end``: ``compute_s`` is the whole step (an end-to-end MFU): nothing is added to it. ``fallback``: the
    GPU preset's links for the calls the cost model lacks. ``peak_flops``: for the MFU column."""
    state = parts.state
    shape = replace(shape, grad_bytes=parts.grad)

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
            a, e = split_by_link(g.level, shape.gpus_per_node, shape.nodes, v)
            intra, inter = intra + a, inter + e
    buffers = comm_buffer_bytes(strat, policy, shape)
    act = activation_bytes(shape, act_elem_bytes)
    total = model_state + buffers + (0.0 if math.isnan(act) else act)
    usable = device_memory * (1.0 - headroom) if device_memory else None
    mb = shape.micro_batch if shape.model is not None else None
    row: dict[str, Any] = {
        "strategy": names[0],
        "precision": names[1],
        "tp": 1, "pp": 1, "dp": shape.world_size, "cp": 1, "vpp": 1, "micro_batch": mb,
        "global_batch": shape.world_size * mb if mb else None, "recompute": shape.recompute.name,
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
        "fits": (total <= usable) if usable else None,
        "mem_headroom_bytes": (usable - total) if usable else math.nan,
        "comm_bytes_per_step": intra + inter,
        "comm_bytes_intra": intra,
        "comm_bytes_inter": inter,
        "comm_by_op": json.dumps(by_op, sort_keys=True),
        "comm_time_s": math.nan,
        "comm_time_low_s": math.nan,
        "comm_time_high_s": math.nan,
        "codec_time_s": math.nan,
        "comm_extrapolated": None,
        "comm_warned": None,
        "comm_model": "no cost model given: memory and bytes only",
        "compute_s": compute_s,
        "comm_exposed_s": math.nan,
        "step_time_s": math.nan,
        "step_time_low_s": math.nan,
        "step_time_high_s": math.nan,
        "tokens_per_s": math.nan,
        "tflops_per_gpu": math.nan,
        "mfu": math.nan,
        "bubble_frac": 0.0,
        "policy": f"{type(policy.sharding).__name__} / {type(policy.grad_comm).__name__}",
    }
    if cost is not None:
        priced = [price_group(cost, g, shape.nodes, shape.gpus_per_node, strat.overlap.window, fallback)
                  for g in groups]  # fmt: skip
        row.update(time_columns(priced, cost, compute_s, 1, tokens, overlap, end_to_end=end_to_end,
                                compute_scale=compute_scale))  # fmt: skip
    step = row["step_time_s"]
    if not math.isnan(step) and shape.seq and shape.micro_batch and step > 0:
        flops = step_flops_per_token(shape) * tokens
        row["tflops_per_gpu"] = flops / (step * shape.world_size) / 1e12
        if peak_flops:
            model = step_flops_per_token(replace(shape, recompute=RECOMPUTES["none"])) * tokens
            row["mfu"] = model / (step * shape.world_size * peak_flops)
    return row


def time_columns(
    priced: list[Priced], cost: CostModel | StatedLinks, micro_s: float, microbatches: int, tokens: float,
    overlap: float | None, extra_s: float = 0.0, end_to_end: bool = False,
    compute_scale: tuple[float, float] = (1.0, 1.0),
) -> dict[str, Any]:  # fmt: skip
    """The time columns of a row from its priced groups: comm time and interval, exposed comm, step time and its
    interval, tokens/s. ``micro_s``: compute of one micro-batch; ``extra_s``: step time beyond compute and exposed
    comm (a pipeline's bubble); ``end_to_end``: the compute is the whole step (exposed comm reported, not added);
    ``compute_scale``: the compute at the interval's fast and slow ends over the point (the kernel efficiency's
    range)."""
    missing = [m for p in priced for m in p.missing]
    notes = [m for p in priced for m in p.notes]
    out: dict[str, Any] = {
        "comm_extrapolated": any(p.extrapolated for p in priced),
        "comm_warned": any(p.warned for p in priced),
    }
    if missing:
        out["comm_model"] = "; ".join(dict.fromkeys(missing))
        return out
    how = cost.describe() if isinstance(cost, StatedLinks) else _timing_note(cost)
    sources = [x for p in priced for x in p.sources]
    if sources:
        how = f"{sources.count('measured')} of {len(sources)} calls priced from measured points; {how}"
    t = sum(p.time_s for p in priced)
    lo, hi = sum(p.low_s for p in priced), sum(p.high_s for p in priced)
    out.update(
        comm_time_s=t, comm_time_low_s=lo, comm_time_high_s=hi, codec_time_s=sum(p.codec_s for p in priced),
        comm_model="; ".join(dict.fromkeys([*notes, how])),
    )  # fmt: skip
    if math.isnan(micro_s):
        return out
    compute = micro_s * microbatches

    def exposed(i: int, scale: float = 1.0) -> float:
        if overlap is not None:
            total = (t, lo, hi)[i]
            return max(0.0, total - overlap * compute * scale)
        windows: dict[str, float] = {}
        for p in priced:
            for w, v in p.windows.items():
                windows[w] = windows.get(w, 0.0) + v[i]
        return exposed_comm(windows, micro_s * scale, microbatches)

    ex = exposed(0)
    add = 0.0 if end_to_end else 1.0
    step = compute + extra_s + add * ex
    fast, slow = compute_scale
    out.update(
        comm_exposed_s=ex, step_time_s=step, step_time_low_s=compute * fast + extra_s + add * exposed(1, fast),
        step_time_high_s=compute * slow + extra_s + add * exposed(2, slow),
        tokens_per_s=tokens / step if step > 0 else math.nan,
    )  # fmt: skip
    return out


def _timing_note(cost: CostModel) -> str:
    """How the model's points were timed: a stream of ops (nccl-tests) or one op after compute (a step's)."""
    modes = sorted({f.timing_mode for f in cost.fits.values()})
    how = {"stream": "back-to-back ops", "isolated": "ops issued after compute"}
    return "fitted to " + " and ".join(f"{how.get(m, m)} ({m} timing)" for m in modes)


__all__ = [
    "COLUMNS", "OVERLAP", "STATED_EFFICIENCY", "ZERO3_PREFETCH_ELEMENTS", "StatedLinks", "activation_bytes",
    "comm_buffer_bytes", "compute_time", "exposed_comm", "native_precision", "price_option", "step_flops_per_token",
    "time_columns",
]  # fmt: skip
