"""Capacity planning: memory per rank, bytes per step and predicted time of a training configuration.

``plan(params=7e9, nodes=8, gpus_per_node=8, ...)`` crosses strategies (ddp, zero1, zero2, zero3, fsdp,
hsdp) with precisions (fp32, bf16, fp8) and returns one ranked row per option; ``write_plan`` writes
``plan.csv``, ``plan.md`` and ``plan.html``. The CLI is ``python -m commbench plan``.

One source. Model-state memory and bytes per step are asked of the training strategy objects
(``training/strategies.py`` through a ``training.policies.Policy``), the same formulas the training runs
report as ``model_state_bytes`` and ``comm_bytes_expected``; nothing here restates them. This module adds
what the strategies do not own, each stated where it is computed:

* the model-state layout per precision (:data:`PRECISIONS`): fp32 keeps (P, G, K) = (4, 4, moments);
  bf16 and fp8 keep the ZeRO paper's mixed-precision layout (Rajbhandari et al. 2020, section 3): 2-byte
  parameters and gradients, fp32 master weights (4) + optimizer moments, so Adam's K = 12. (The training
  suite's torch-autocast policies keep fp32 parameters and gradients instead: compare them with the fp32
  rows.) Adam keeps two fp32 moments (8 bytes), SGD one momentum buffer (4 bytes).
* activations (when ``layers``, ``hidden``, ``seq`` and ``micro_batch`` are given): Korthikanti et al. 2022
  ("Reducing Activation Recomputation in Large Transformer Models", eq. 2, no tensor/sequence parallelism,
  no recomputation): ``s*b*h*(34 + 5*a*s/h)`` bytes per layer with 16-bit activations, times the layers;
  scaled by itemsize/2 for fp32 compute. Embedding, logits and the loss are left out.
* comm buffers: one in-flight call per "op:dtype" (its nccl-tests size: an FSDP unit gathered, a DDP bucket
  in its wire dtype); an upper bound where a collective works in place, NCCL's own buffers excluded.
* the split of bus bytes between intra- and inter-node links: a flat ring over ``nodes x gpus_per_node``
  ranks placed node by node crosses nodes on ``nodes`` of its ``N`` hops, so per rank on average ``1/g`` of
  the bytes go inter-node and ``(g-1)/g`` intra-node (zero inter-node bytes on one node). HSDP's shard group
  is the node (all intra) and its replica group one rank per node (all inter).
* time, from a fitted :class:`commbench.planning.costmodel.CostModel`: each "op:dtype" is priced by the fit of
  (op, precision named by the dtype, group) as ``calls`` calls of equal size (DDP: one per bucket; FSDP: one
  per unit; a resharded unit's two all-gathers count as one call of twice the size: one latency short).
  A DDP gradient hook's bytes are priced as the all_reduce of the hook's wire precision (the sweep measures
  the same chunked algorithm for a codec, encode and decode included). A flat collective across nodes uses
  any fit that measured the node link (a ``world`` fit across nodes, any ranks per node, else the ``inter``
  fit), with ``n`` all its ranks; HSDP's replica groups (one per local rank) share each node link, ``1/g``
  each. Both by :func:`commbench.planning.costmodel.link_sharing` and ``CostModel.predict(nodes=, concurrent=)``: the
  cost model's "Layouts" rule, the one the layout benchmark checks. Where the model lacks the key,
  ``comm_model`` says so and the time stays empty.
* overlap: communication hides behind ``overlap`` (default 2/3, the backward pass's share of 6*Psi flops per
  token: 4 of 6) of the compute time; ``exposed = max(0, comm - overlap * compute)``; ``step = compute +
  exposed``. Compute is ``--compute-ms`` or ``6 * Psi * seq * micro_batch / (tflops * 1e12 * mfu)``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import types
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from commbench.measure.precision import torch_dtype
from commbench.planning.costmodel import link_sharing
from commbench.training.comm import bus_factor, dtype_name
from commbench.training.policies import Policy
from commbench.training.strategies import (
    ALL_REDUCE,
    BF16,
    DDP,
    FP32,
    FSDP1,
    FSDP2,
    SHORT,
    CastHook,
    CodecHook,
    GradComm,
    Layout,
    ModelState,
    UnitShape,
    ZeRO1,
    default_bucket_numels,
    merge_bytes,
)

if TYPE_CHECKING:
    from commbench.planning.costmodel import CostModel

OVERLAP = 2.0 / 3.0
"""Default fraction of the compute time communication can hide behind (the backward pass: 4 of 6 Psi flops)."""
KORTHIKANTI_PER_LAYER = (34.0, 5.0)
"""Korthikanti et al. 2022, eq. 2: activation bytes per layer = s*b*h*(34 + 5*a*s/h) with 16-bit activations."""

_PRECISION_OF_DTYPE: dict[str, str] = {dtype_name(d): short for d, short in SHORT.items()}
"""nccl-tests dtype name ("float", "bfloat16", "half") -> the sweep precision of that native dtype."""


# ----------------------------------------------------------------------------------------------- options
@dataclass(frozen=True, slots=True)
class Optimizer:
    """Optimizer state beyond the master weights, bytes per parameter."""

    name: str
    moment_bytes: float
    description: str


OPTIMIZERS: dict[str, Optimizer] = {
    o.name: o
    for o in (
        Optimizer("adam", 8.0, "Adam/AdamW: two fp32 moments"),
        Optimizer("sgd", 4.0, "SGD with momentum: one fp32 buffer"),
    )
}


@dataclass(frozen=True, slots=True)
class PlanPrecision:
    """A plan precision: the training dtypes it maps to and the model-state layout it keeps."""

    name: str
    description: str
    param_dtype_name: str
    """torch's name of FSDP's param (gather and compute) dtype."""
    reduce_dtype_name: str | None
    """torch's name of FSDP's gradient reduce dtype; None: this precision has no FSDP form (its comm needs a DDP
    hook)."""
    grad_comm: GradComm
    """The DDP comm hook."""
    autocast_name: str | None
    param_bytes: float
    grad_bytes: float
    master_bytes: float
    """fp32 master weights kept next to low-precision parameters (sharded like optimizer state)."""
    activation_bytes: float
    """Bytes per activation element (Korthikanti's constants assume 2)."""

    def state(self, optimizer: Optimizer) -> ModelState:
        """ZeRO's (P, G, K) for this precision, K = master weights + optimizer moments."""
        return ModelState(self.param_bytes, self.grad_bytes, self.master_bytes + optimizer.moment_bytes)


PRECISIONS: dict[str, PlanPrecision] = {
    p.name: p
    for p in (
        PlanPrecision("fp32", "fp32 compute, parameters, gradients and communication", FP32, FP32, ALL_REDUCE, None,
                      4, 4, 0, 4),
        PlanPrecision("bf16", "bf16 parameters, gradients and communication; fp32 master weights", BF16, BF16,
                      CastHook(BF16), BF16, 2, 2, 4, 2),
        PlanPrecision("fp8", "bf16 as above, gradients reduced as fp8 e4m3 through the codec hook (DDP only)", BF16,
                      None, CodecHook("fp8_e4m3"), BF16, 2, 2, 4, 2),
    )
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class StateParts:
    """Bytes per parameter of each model-state kind; ``ModelState(param, grad, master + moments)``."""

    param: float
    grad: float
    master: float
    moments: float

    @property
    def state(self) -> ModelState:
        return ModelState(self.param, self.grad, self.master + self.moments)


TORCH_ADAMW = StateParts(4.0, 4.0, 0.0, 8.0)
"""What the training policies keep (fp32 parameters and gradients under autocast, AdamW's two moments)."""


@dataclass(frozen=True, slots=True)
class Shape:
    """Where the plan stands: model size, world layout, optional transformer shape."""

    psi: float
    nodes: int
    gpus_per_node: int
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    seq: int | None = None
    micro_batch: int | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    piece: bool = False
    """Describe Psi as one call: one DDP bucket and one FSDP unit gathered once (comm buffers are priced so)."""

    def layout(self) -> Layout:
        """DDP's default buckets and, with ``layers``, one FSDP unit per layer plus the root (embeddings):
        a layer has 12h^2 + 13h parameters with ``hidden`` (Megatron's count), else Psi / layers."""
        if self.piece:
            return Layout(bucket_numels=(int(self.psi),), units=(UnitShape(((int(self.psi),),), root=True),))
        units: tuple[UnitShape, ...] = ()
        if self.layers:
            per = 12 * self.hidden**2 + 13 * self.hidden if self.hidden else self.psi / self.layers
            per = int(min(per, self.psi / self.layers))
            root = int(self.psi) - per * self.layers
            units = tuple(UnitShape(((per,),)) for _ in range(self.layers))
            units += (UnitShape(((root,),), root=True),) if root > 0 else ()
        return Layout(bucket_numels=tuple(default_bucket_numels(self.psi)), units=units)


@dataclass(frozen=True, slots=True)
class GroupBytes:
    """Bus bytes per step of one group kind: ``world`` (flat over all ranks), ``intra`` or ``inter``."""

    level: str
    n: int
    by_op: dict[str, float]
    calls: int
    """Calls per "op:dtype" (DDP buckets or FSDP units)."""
    hook: GradComm | None = None
    """The DDP gradient hook whose bytes are in ``by_op`` (priced as an all_reduce of its wire precision)."""
    hook_psi: float = 0.0


class PlanStrategy(ABC):
    """A plan strategy name -> the training strategy objects it composes."""

    name: str
    description: str

    @abstractmethod
    def policy(self, precision: PlanPrecision) -> Policy:
        """The training policy of this strategy in ``precision``; ValueError when there is none."""

    @abstractmethod
    def groups(self, policy: Policy, shape: Shape) -> list[GroupBytes]:
        """Bus bytes per step per group (from the strategy objects)."""

    @abstractmethod
    def state_bytes(self, policy: Policy, shape: Shape, state: ModelState) -> float:
        """Model-state bytes per rank at the step's peak (from the strategy objects)."""


def pieces(policy: Policy, layout: Layout, n: int) -> list[int]:
    """Elements per collective call: the sharding's units where it has them (one unit of Psi when the layout
    names none), else DDP's buckets."""
    units = policy.sharding.units(layout.units or (UnitShape(((1,),)),), max(n, 1))
    if not units:
        return list(layout.bucket_numels) or [0]
    return [sum(math.prod(s) for s in u.shapes) for u in layout.units] if layout.units else []


def _calls(policy: Policy, layout: Layout, n: int) -> int:
    """Collective calls per step and "op:dtype" (DDP buckets or FSDP units)."""
    return max(len(pieces(policy, layout, n)), 1)


@dataclass(frozen=True, slots=True)
class FlatStrategy(PlanStrategy):
    """One sharding over all ``nodes x gpus_per_node`` ranks."""

    name: str
    description: str
    make: Any
    """(param dtype name, reduce dtype name) -> Sharding."""

    def policy(self, precision: PlanPrecision) -> Policy:
        sharding = self.make(precision.param_dtype_name, precision.reduce_dtype_name or FP32)
        if not sharding.takes_hooks and precision.reduce_dtype_name is None:
            raise ValueError(
                f"{precision.name} gradient communication needs a DDP comm hook; {type(sharding).__name__} takes none"
            )
        grad_comm = precision.grad_comm if sharding.takes_hooks else ALL_REDUCE
        return Policy(
            name=f"{self.name}_{precision.name}",
            family="plan",
            description=f"{self.description}; {precision.description}",
            sharding=sharding,
            grad_comm=grad_comm,
            autocast_name=precision.autocast_name,
        )

    def groups(self, policy: Policy, shape: Shape) -> list[GroupBytes]:
        n, layout = shape.world_size, shape.layout()
        by_op = policy.comm_bytes(psi=shape.psi, world_size=n, layout=layout)
        hook = policy.grad_comm if policy.sharding.takes_hooks else None
        return [GroupBytes("world", n, by_op, _calls(policy, layout, n), hook, shape.psi if hook else 0.0)]

    def state_bytes(self, policy: Policy, shape: Shape, state: ModelState) -> float:
        return policy.state_bytes(psi=shape.psi, world_size=shape.world_size, state=state)


@dataclass(frozen=True, slots=True)
class HybridStrategy(PlanStrategy):
    """HSDP: FSDP2 within each node (the shard group) and an all_reduce of each gradient shard across nodes
    (the replica group, one rank per node), as torch's HYBRID_SHARD / a 2-D FSDP2 mesh do.

    TODO(hsdp): delegate to ``strategies.HSDP`` once it lands (another branch adds it); until then its
    formulas are composed here from FSDP2's (intra) and the all_reduce bus factor (inter)."""

    name: str = "hsdp"
    description: str = "HSDP: FSDP2 within a node, gradient shards all-reduced across nodes"

    def policy(self, precision: PlanPrecision) -> Policy:
        if precision.reduce_dtype_name is None:
            raise ValueError(f"{precision.name} gradient communication needs a DDP comm hook; HSDP takes none")
        return Policy(
            name=f"{self.name}_{precision.name}",
            family="plan",
            description=f"{self.description}; {precision.description}",
            sharding=FSDP2(
                param_dtype_name=precision.param_dtype_name, reduce_dtype_name=precision.reduce_dtype_name
            ),
            autocast_name=precision.autocast_name,
        )

    def groups(self, policy: Policy, shape: Shape) -> list[GroupBytes]:
        g, layout = shape.gpus_per_node, shape.layout()
        intra = policy.comm_bytes(psi=shape.psi, world_size=g, layout=layout)
        units = policy.sharding.units(layout.units or (UnitShape(((int(shape.psi),),)),), g)
        inter: dict[str, float] = {}
        for u in units:  # each rank all-reduces its gradient shard with the ranks holding the same shard
            key = f"all_reduce:{dtype_name(u.reduce_dtype_name)}"
            inter = merge_bytes(inter, {key: bus_factor("all_reduce", shape.nodes) * u.shard_numel * u.reduce_dtype.itemsize})
        calls = _calls(policy, layout, g)
        return [GroupBytes("intra", g, intra, calls), GroupBytes("inter", shape.nodes, inter, calls)]

    def state_bytes(self, policy: Policy, shape: Shape, state: ModelState) -> float:
        return policy.state_bytes(psi=shape.psi, world_size=shape.gpus_per_node, state=state)


STRATEGIES: dict[str, PlanStrategy] = {
    s.name: s
    for s in (
        FlatStrategy("ddp", "DDP: replicated model and optimizer", lambda pd_, rd: DDP()),
        FlatStrategy("zero1", "ZeRO-1: ZeroRedundancyOptimizer over DDP", lambda pd_, rd: ZeRO1()),
        FlatStrategy("zero2", "ZeRO-2: FSDP1 SHARD_GRAD_OP",
                     lambda pd_, rd: FSDP1(param_dtype_name=pd_, reduce_dtype_name=rd, reshard_after_forward=False)),
        FlatStrategy("zero3", "ZeRO-3: FSDP1 FULL_SHARD",
                     lambda pd_, rd: FSDP1(param_dtype_name=pd_, reduce_dtype_name=rd)),
        FlatStrategy("fsdp", "FSDP2 fully_shard (ZeRO-3 on FSDP2)",
                     lambda pd_, rd: FSDP2(param_dtype_name=pd_, reduce_dtype_name=rd)),
        HybridStrategy(),
    )
}  # fmt: skip
"""Plan strategy names (the CLI's --strategies) -> the training strategy objects they compose."""


# ----------------------------------------------------------------------------------------------- pricing
@dataclass(slots=True)
class _Priced:
    time_s: float = 0.0
    low_s: float = 0.0
    high_s: float = 0.0
    codec_s: float = 0.0
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extrapolated: bool = False


def _across(f: Any) -> bool:
    """Whether a fit measured node links (``Fit.crosses_nodes``; a version-1 model without it: its runs' nodes)."""
    c = f.crosses_nodes
    return bool(c) if c is not None else max(f.nodes) > 1


def _group_for(
    model: CostModel, coll: str, prec: str, level: str, nodes: int, gpus_per_node: int
) -> tuple[str | None, str]:
    """Which fitted group prices a call at ``level``; (None, why) when the model has none. Across nodes any fit
    that measured the node link does (a ``world`` fit on any nodes x ranks, or the ``inter`` fit: the costmodel's
    "Layouts"), within a node the ``intra`` fit or a ``world`` fit on one node."""
    fits = model.fits
    world = fits.get((coll, prec, "world"))
    across = link_sharing(level, nodes, gpus_per_node) > 0  # the group kind says whether it crosses node links
    other = "inter" if across else "intra"  # the split group measuring the same link as this level
    order = ("world", other) if level == "world" else (other, "world")
    # a world fit stands in only where it measured the same link (across nodes or within one)
    cands = [(grp, grp != "world" or (world is not None and _across(world) == across)) for grp in order]
    for grp, ok in cands:
        if ok and (coll, prec, grp) in fits:
            note = "" if grp == level or (level == "world" and nodes == 1) else f"{coll}/{prec}: {level} priced by the {grp} fit"
            return grp, note
    have = sorted("/".join(k) for k in fits if k[:2] == (coll, prec)) or ["none"]
    where = f"across {nodes} nodes" if level == "world" and nodes > 1 else f"({level})"
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
        prec = _PRECISION_OF_DTYPE.get(dtype)
        if prec is None:
            out.missing.append(f"no precision runs {op} in {dtype}")
            continue
        f = bus_factor(op, g.n)
        calls_keys.append((op, prec, {"nbytes": bus / f if f else 0.0}))
    for coll, prec, size in calls_keys:
        grp, note = _group_for(model, coll, prec, g.level, nodes, gpus_per_node)
        if grp is None:
            out.missing.append(note)
            continue
        if note:
            out.notes.append(note)
        per_call: dict[str, Any] = {k: v / g.calls for k, v in size.items()}
        p = model.predict(coll, prec, world_size=g.n, group=grp, **layout, **per_call)
        out.time_s += p.total_s * g.calls
        out.low_s += p.total_low_s * g.calls  # summed as if fully correlated: the wider, honest interval
        out.high_s += p.total_high_s * g.calls
        out.codec_s += (p.encode_s + p.decode_s) * g.calls
        if p.extrapolated:
            out.extrapolated = True
            out.notes.append(f"{coll}/{prec}/{grp}: {p.reason}")
    return out


# ----------------------------------------------------------------------------------------------- plan
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
    from dataclasses import replace

    largest = max(pieces(policy, shape.layout(), shape.world_size) or [int(shape.psi)])
    if largest <= 0:
        return 0.0
    out = 0.0
    for g in strat.groups(policy, replace(shape, psi=float(largest), piece=True)):
        for key, v in g.by_op.items():
            f = bus_factor(key.split(":", 1)[0], g.n)
            out += v / f if f else 0.0
    return out


def _split(level: str, n: int, gpn: int, nodes: int, total: float) -> tuple[float, float]:
    """(intra, inter) bytes of ``total`` bus bytes per rank at ``level`` (see the module docstring)."""
    if level == "intra":
        return total, 0.0
    if level == "inter":
        return 0.0, total
    inter = total / gpn if nodes > 1 else 0.0
    return total - inter, inter


def plan(
    *,
    params: float,
    nodes: int = 1,
    gpus_per_node: int = 8,
    strategies: Sequence[str] = tuple(STRATEGIES),
    precisions: Sequence[str] = tuple(PRECISIONS),
    optimizer: str = "adam",
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    seq: int | None = None,
    micro_batch: int | None = None,
    device_memory: float | None = None,
    compute_ms: float | None = None,
    tflops: float | None = None,
    mfu: float | None = None,
    overlap: float = OVERLAP,
    model: CostModel | str | os.PathLike[str] | None = None,
    policies: Sequence[Policy] | None = None,
    parts: StateParts = TORCH_ADAMW,
) -> pd.DataFrame:
    """One ranked row per (strategy, precision): memory per rank, bytes per step, predicted time.

    ``model``: a fitted CostModel, a model.json or a run directory (fitted here); None gives memory and bytes
    only. Bytes are per rank and per step (nccl-tests bus bytes). Options that do not exist (fp8 gradient
    communication on FSDP) are listed in ``df.attrs["skipped"]``. ``policies``: plan these training policies
    instead of strategies x precisions (see :func:`plan_policies`; ``parts`` is their model state). ValueError
    for bad input.
    """
    shape, opt = _validate(
        params, nodes, gpus_per_node, strategies, precisions, optimizer, layers, hidden, heads, seq, micro_batch,
        device_memory, compute_ms, tflops, mfu, overlap,
    )  # fmt: skip
    cost = _load_model(model)
    compute_s, tokens = _compute(shape, compute_ms, tflops, mfu)
    skipped: dict[str, str] = {}
    options = _policy_options(policies, parts) if policies is not None else _grid(strategies, precisions, opt, skipped)
    rows = [
        _row(strat, names, policy, shape, state, elem, cost, compute_s, tokens, overlap, device_memory)
        for strat, names, policy, state, elem in options
    ]
    df = _rank(pd.DataFrame(rows, columns=list(COLUMNS)))
    df.attrs["skipped"] = skipped
    df.attrs["assumptions"] = assumptions(shape, opt, overlap, cost, compute_ms, tflops, mfu)
    return df


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


def _compute(shape: Shape, compute_ms: float | None, tflops: float | None, mfu: float | None) -> tuple[float, float]:
    """(compute seconds per step, tokens per step over all ranks); NaN where not given."""
    compute_s = math.nan
    if compute_ms is not None:
        compute_s = compute_ms / 1e3
    elif tflops is not None and mfu is not None:
        compute_s = 6.0 * shape.psi * (shape.seq or 0) * (shape.micro_batch or 0) / (tflops * 1e12 * mfu)
    tokens = shape.world_size * shape.seq * shape.micro_batch if shape.seq and shape.micro_batch else math.nan
    return compute_s, tokens


def plan_policies(policies: Sequence[Policy], **options: Any) -> pd.DataFrame:
    """The plan of training policies themselves (``training.policies``), flat over all ranks, with the model
    state they keep (``parts=``, default: torch's, :data:`TORCH_ADAMW`): what the training suite measured, at
    any scale. ``strategy`` is the policy name and ``precision`` its gradient-communication dtype; the other
    keywords are :func:`plan`'s."""
    return plan(policies=policies, **options)


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


def _row(
    strat: PlanStrategy, names: tuple[str, str], policy: Policy, shape: Shape, parts: StateParts,
    act_elem_bytes: float, cost: CostModel | None, compute_s: float, tokens: float, overlap: float,
    device_memory: float | None,
) -> dict[str, Any]:  # fmt: skip
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
            a, e = _split(g.level, g.n, shape.gpus_per_node, shape.nodes, v)
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
    shape: Shape, opt: Optimizer, overlap: float, cost: CostModel | None, compute_ms: float | None,
    tflops: float | None, mfu: float | None,
) -> list[str]:  # fmt: skip
    """The stated assumptions of a plan, one line each (plan.md and plan.html print them)."""
    out = [
        f"Psi = {shape.psi:.4g} parameters on {shape.nodes} node(s) x {shape.gpus_per_node} ranks; {opt.description}.",
        "Model state: the training strategies' state_bytes (ZeRO, Rajbhandari et al. 2020); fp32 keeps "
        "(P, G, K) = (4, 4, moments), bf16/fp8 keep (2, 2, 4 master + moments).",
        "Bytes: the strategies' comm_bytes, nccl-tests bus bytes per rank per step; a flat ring over nodes sends "
        "1/gpus_per_node of them inter-node.",
    ]
    if shape.layers:
        out.append(
            f"FSDP units: {shape.layers} layers + the root; DDP buckets: 1 MiB then 25 MiB (torch's defaults)."
        )
    else:
        out.append("FSDP units: one unit of Psi (give --layers for per-layer units and their buffers).")
    if shape.seq and shape.micro_batch and shape.hidden and shape.layers:
        out.append(
            "Activations: Korthikanti et al. 2022 eq. 2, s*b*h*(34 + 5*a*s/h) bytes per layer (16-bit, no "
            f"recomputation, no tensor parallelism), a = {shape.heads or max(shape.hidden // 128, 1)} heads."
        )
    else:
        out.append("Activations: not counted (give --layers, --hidden, --seq and --micro-batch).")
    if compute_ms is not None:
        out.append(f"Compute: {compute_ms:g} ms per step (given).")
    elif tflops is not None and mfu is not None:
        out.append(f"Compute: 6*Psi*seq*micro_batch / ({tflops:g} TFLOP/s x MFU {mfu:g}).")
    else:
        out.append("Compute: not given (--compute-ms or --tflops and --mfu): no step time.")
    out.append(
        f"Overlap: communication hides behind {overlap:.2f} of the compute time; exposed = max(0, comm - "
        f"{overlap:.2f} x compute)."
    )
    if cost is None:
        out.append("Time: no cost model (give --model model.json or a run directory).")
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


def _validate(
    params: float, nodes: int, gpus_per_node: int, strategies: Sequence[str], precisions: Sequence[str],
    optimizer: str, layers: int | None, hidden: int | None, heads: int | None, seq: int | None,
    micro_batch: int | None, device_memory: float | None, compute_ms: float | None, tflops: float | None,
    mfu: float | None, overlap: float,
) -> tuple[Shape, Optimizer]:  # fmt: skip
    if isinstance(params, bool) or not isinstance(params, (int, float)) or not (math.isfinite(params) and params >= 1):
        raise ValueError(f"params must be a positive number of parameters (e.g. 7e9), got {params!r}")
    for name, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        _int_or_none(name, v)
    for name, dim in (("layers", layers), ("hidden", hidden), ("heads", heads), ("seq", seq),
                      ("micro_batch", micro_batch)):  # fmt: skip
        _int_or_none(name, dim)
    for kind, names, valid in (("strategy", strategies, STRATEGIES), ("precision", precisions, PRECISIONS)):
        if isinstance(names, str) or not names:
            raise ValueError(f"give a list of {kind} names; valid: {', '.join(valid)}")
        for n in names:
            if n not in valid:
                raise ValueError(f"unknown {kind} {n!r}; valid: {', '.join(valid)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    for name, x in (("device_memory", device_memory), ("compute_ms", compute_ms), ("tflops", tflops)):
        if x is not None and not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0):
            raise ValueError(f"{name} must be a positive number, got {x!r}")
    if mfu is not None and not (isinstance(mfu, (int, float)) and 0 < mfu <= 1):
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")
    if compute_ms is not None and (tflops is not None or mfu is not None):
        raise ValueError("give either compute_ms or tflops with mfu, not both")
    if (tflops is None) != (mfu is None):
        raise ValueError("tflops and mfu go together (compute = 6*Psi*seq*micro_batch / (tflops*1e12*mfu))")
    if tflops is not None and not (seq and micro_batch):
        raise ValueError("tflops/mfu need seq and micro_batch (tokens per step)")
    if not (isinstance(overlap, (int, float)) and 0 <= overlap <= 1):
        raise ValueError(f"overlap must be in [0, 1], got {overlap!r}")
    if hidden and heads and hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    shape = Shape(float(params), nodes, gpus_per_node, layers, hidden, heads, seq, micro_batch)
    return shape, OPTIMIZERS[optimizer]


def _load_model(model: CostModel | str | os.PathLike[str] | None) -> CostModel | None:
    from commbench.planning.costmodel import CostModel, fit

    if model is None or isinstance(model, CostModel):
        return model
    p = Path(model)
    if p.is_dir():
        return fit([p])
    if not p.exists():
        raise ValueError(f"cost model {str(p)!r} does not exist (give a model.json from `commbench fit` or a run directory)")
    return CostModel.from_json(p)


# ----------------------------------------------------------------------------------------------- output
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
    from commbench.views.report import Table, frame_table, render_html, render_markdown

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


__all__ = [
    "COLUMNS", "OPTIMIZERS", "PRECISIONS", "STRATEGIES", "FlatStrategy", "HybridStrategy", "PlanPrecision",
    "PlanStrategy", "Shape", "StateParts", "TORCH_ADAMW", "activation_bytes", "comm_buffer_bytes", "pieces",
    "plan_policies", "assumptions", "format_plan", "plan", "write_plan",
]  # fmt: skip


class _CallableModule(types.ModuleType):
    """``commbench.plan(...)`` works whether ``commbench.plan`` resolves to this module (once anything imported
    it, the import system binds the submodule over the package attribute) or to the function."""

    def __call__(self, **kwargs: Any) -> pd.DataFrame:
        return plan(**kwargs)


sys.modules[__name__].__class__ = _CallableModule
