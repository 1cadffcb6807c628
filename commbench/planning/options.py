"""The options a capacity plan crosses: optimizers, plan precisions, plan strategies and the shape of the model and
cluster they are priced on.

A plan strategy (ddp, zero1, zero2, zero3, fsdp, hsdp) composes the training strategy objects
(:mod:`commbench.training.strategies`, through a :class:`commbench.training.policies.Policy`) and a plan precision
(fp32, bf16, fp8) names the dtypes and the gradient hook they are built with; every byte figure is asked of those
objects. What they do not own is stated here, where it is decided:

* the model-state layout per precision: fp32 keeps (P, G, K) = (4, 4, moments); bf16 and fp8 keep the ZeRO paper's
  mixed-precision layout (Rajbhandari et al. 2020, section 3): parameters and gradients in the parameter dtype,
  fp32 master weights (4) + optimizer moments, so Adam's K = 12. The bytes are the dtypes' item sizes. (The training
  suite's torch-autocast policies keep fp32 parameters and gradients instead: compare them with the fp32 rows.)
  Adam keeps two fp32 moments (8 bytes), SGD one momentum buffer (4 bytes).
* the groups a strategy's collectives run in (:class:`GroupBytes`, named by the group kinds of
  :mod:`commbench.measure.groups`): a flat strategy runs everything on the world; HSDP's shard group is the node
  (``intra``) and its replica group one rank per node (``inter``).
"""

from __future__ import annotations

import collections
import functools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from commbench.measure.precision import torch_dtype
from commbench.planning.activations import ATTENTIONS, RECOMPUTES, Attention, Recompute
from commbench.planning.presets import ModelShape
from commbench.training.comm import bus_factor, dtype_name
from commbench.training.policies import Policy
from commbench.training.strategies import (
    ALL_REDUCE,
    BF16,
    DDP,
    DDP_BUCKET_CAP_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    FP32,
    FSDP1,
    FSDP2,
    CastHook,
    CodecHook,
    GradComm,
    Layout,
    ModelState,
    UnitShape,
    ZeRO1,
    merge_bytes,
)


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



@functools.lru_cache(maxsize=16)
def _itemsize(dtype_name: str) -> float:
    """Bytes per element of a torch dtype, by name (asked often by the search: looked up once)."""
    return float(torch_dtype(dtype_name).itemsize)


@dataclass(frozen=True, slots=True)
class PlanPrecision:
    """A plan precision: the training dtypes it maps to; the model-state layout it keeps follows from them."""

    name: str
    description: str
    param_dtype_name: str
    """torch's name of FSDP's param (gather and compute) dtype; parameters, gradients and activations are kept in it."""
    reduce_dtype_name: str | None
    """torch's name of FSDP's gradient reduce dtype; None: this precision has no FSDP form (its comm needs a DDP
    hook)."""
    grad_comm: GradComm
    """The DDP comm hook."""
    autocast_name: str | None

    @property
    def param_bytes(self) -> float:
        return _itemsize(self.param_dtype_name)

    @property
    def grad_bytes(self) -> float:
        return self.param_bytes

    @property
    def master_bytes(self) -> float:
        """fp32 master weights kept next to low-precision parameters (sharded like optimizer state)."""
        fp32 = _itemsize(FP32)
        return fp32 if self.param_bytes < fp32 else 0.0

    @property
    def activation_bytes(self) -> float:
        """Bytes per activation element (Korthikanti's constants assume 2)."""
        return self.param_bytes

    def state(self, optimizer: Optimizer) -> ModelState:
        """ZeRO's (P, G, K) for this precision, K = master weights + optimizer moments."""
        return ModelState(self.param_bytes, self.grad_bytes, self.master_bytes + optimizer.moment_bytes)


PRECISIONS: dict[str, PlanPrecision] = {
    p.name: p
    for p in (
        PlanPrecision("fp32", "fp32 compute, parameters, gradients and communication", FP32, FP32, ALL_REDUCE, None),
        PlanPrecision("bf16", "bf16 parameters, gradients and communication; fp32 master weights", BF16, BF16,
                      CastHook(BF16), BF16),
        PlanPrecision("fp8", "bf16 as above, gradients reduced as fp8 e4m3 through the codec hook (DDP only)", BF16,
                      None, CodecHook("fp8_e4m3"), BF16),
    )
}  # fmt: skip
"""Plan precision names (the CLI's --precisions) -> the training dtypes and gradient hook they stand for."""


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
    unit_numel: int | None = None
    """Parameters of one layer's FSDP unit when the model's shape says (a preset's ``layer_params``, over TP)."""
    model: ModelShape | None = None
    """The transformer's shape (a preset or a complete given shape): units, activations, FLOPs per token."""
    attention: Attention = ATTENTIONS["flash"]
    recompute: Recompute = RECOMPUTES["none"]
    grad_bytes: float = 4.0
    """Bytes of one gradient element: DDP's buckets hold ``bucket_cap_mb`` of them (torch counts the gradients'
    own bytes, so bf16 gradients fill a 25 MiB bucket with twice the elements of fp32 ones)."""

    def layout(self) -> Layout:
        """FSDP units: with ``layers``, one per layer plus the root (embeddings, the rest of Psi); a layer has
        ``unit_numel`` parameters, else 12h^2 + 13h with ``hidden`` (Megatron's count), else Psi / layers. DDP's
        buckets are not listed here (:func:`bucket_counts` describes them in O(1))."""
        return _layout(self.psi, self.piece, self.layers, self.unit_numel, self.hidden)


@functools.lru_cache(maxsize=64)
def _layout(psi: float, piece: bool, layers: int | None, unit_numel: int | None, hidden: int | None) -> Layout:
    """:meth:`Shape.layout`, built once per shape (a plan asks it many times; 9600 layers are 9600 units)."""
    if piece:
        return Layout(bucket_numels=(int(psi),), units=(UnitShape(((int(psi),),), root=True),))
    units: tuple[UnitShape, ...] = ()
    if layers:
        if unit_numel:
            per: float = unit_numel
        else:
            per = 12 * hidden**2 + 13 * hidden if hidden else psi / layers
        per = int(min(per, psi / layers))
        root = int(psi) - per * layers
        one = UnitShape(((per,),))
        units = (one,) * layers
        units += (UnitShape(((root,),), root=True),) if root > 0 else ()
    return Layout(units=units)


def layout_bytes(policy: Policy, psi: float, n: int, layout: Layout) -> dict[str, float]:
    """``policy.comm_bytes`` of a layout of many identical layer units in O(1): every byte formula is a sum over
    units, so L units are the bytes of one unit (and the rest) plus L-1 times what a second unit adds."""
    body = [u for u in layout.units if not u.root]
    if len(body) <= 2 or any(u != body[0] for u in body):
        return policy.comm_bytes(psi=psi, world_size=n, layout=layout)
    roots = tuple(u for u in layout.units if u.root)
    a = policy.comm_bytes(psi=psi, world_size=n, layout=Layout(units=(body[0], *roots)))
    b = policy.comm_bytes(psi=psi, world_size=n, layout=Layout(units=(body[0], body[0], *roots)))
    return {k: a.get(k, 0.0) + (len(body) - 1) * (b.get(k, 0.0) - a.get(k, 0.0)) for k in {**a, **b}}


def bucket_counts(psi: float, elem_bytes: float = 4.0) -> tuple[tuple[int, int], ...]:
    """DDP's default buckets for ``psi`` gradient elements of ``elem_bytes`` each, as (elements, how many): a 1 MiB
    first bucket, then 25 MiB ones, the last holding the rest (torch's defaults, parameter boundaries ignored as in
    :func:`commbench.training.strategies.default_bucket_numels`). O(1) in Psi: no list of buckets is built."""
    left = int(psi)
    if left <= 0:
        return ()
    first = max(int(DDP_FIRST_BUCKET_BYTES // elem_bytes), 1)
    if left <= first:
        return ((left, 1),)
    cap = max(int(DDP_BUCKET_CAP_BYTES // elem_bytes), 1)
    full, rest = divmod(left - first, cap)
    return ((first, 1),) + (((cap, full),) if full else ()) + (((rest, 1),) if rest else ())


@dataclass(frozen=True, slots=True)
class Overlap:
    """When a strategy's collectives can run behind compute (the plan's overlap model, stated per strategy).

    * ``backward``: once per step, behind the last micro-batch's backward pass (2/3 of its compute: 4 of the 6*Psi
      FLOPs per token): DDP's bucketed all-reduce, FSDP's gradient reduce-scatter.
    * ``per_micro_batch``: once per micro-batch, behind that micro-batch's forward and backward (prefetched):
      the parameter all-gathers of units resharded after use (ZeRO-3, FSDP; ZeRO-2 keeps them gathered: once).
    * everything else is exposed: ZeRO-1's parameter all-gather or broadcast after the optimizer step.
    """

    backward: tuple[str, ...] = ()
    """Collectives (registry names) hidden behind the last micro-batch's backward."""
    per_micro_batch: tuple[str, ...] = ()
    """Collectives repeated every micro-batch and hidden behind its compute."""
    description: str = ""

    def window(self, op: str) -> str:
        """"backward", "micro_batch" or "exposed" for the collective ``op``."""
        if op in self.per_micro_batch:
            return "micro_batch"
        return "backward" if op in self.backward else "exposed"


BACKWARD_SHARE = 4.0 / 6.0
"""Share of a micro-batch's compute in its backward pass (4 of 6 FLOPs per parameter per token)."""


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
    hook_bytes: dict[str, float] = field(default_factory=dict)
    """The hook's own bytes within ``by_op`` (the rest is priced op by op)."""
    nodes: int | None = None
    """Nodes the group spans when placed explicitly (the 3-D search's TP, PP and DP groups); None: as ``level``
    says on the plan's nodes."""
    concurrent: int = 1
    """With ``nodes``: groups of this kind crossing each node's link at once (each gets 1/concurrent of it)."""
    window_ops: dict[str, str] = field(default_factory=dict)
    """Overlap window by "op:dtype" when the group's strategy is not the plan strategy's (TP, PP: "exposed")."""
    calls_by_op: dict[str, int] = field(default_factory=dict)
    """Calls per step of an "op:dtype" where they differ from ``calls``: a unit resharded after forward is
    all-gathered twice per step (forward and backward), so twice ``calls`` calls of one unit's size."""


@dataclass(frozen=True, slots=True)
class DPSchedule:
    """How a data-parallel strategy's collectives fall in a step: what the layout model
    (:mod:`commbench.planning.steptime`) prices per call and decides the exposure of."""

    grad_op: str
    """The gradient collective: all_reduce or reduce_scatter."""
    grads_every_micro_batch: bool
    """Gradients are reduced in every micro-batch's backward (ZeRO-2/3, FSDP), not once per step (DDP's no_sync)."""
    param_gather: str
    """none; after_step (ZeRO-1/2: updated shards all-gathered after the optimizer step, before the next forward);
    per_micro_batch (ZeRO-3/FSDP: each unit gathered before its forward and again before its backward)."""
    shards_optimizer: bool
    """The optimizer step runs on a 1/N shard of the parameters."""
    gather_elements: int | None = None
    """Parameters per all-gather call; None: one layer (an FSDP unit) or one DDP-sized bucket."""
    reduce_elements: int | None = None
    """Gradients per reduce call; None: one layer (an FSDP unit) or torch DDP's 25 MiB bucket."""
    gather_fp32: bool = False
    """The parameters travel in fp32 (torch's ZeroRedundancyOptimizer broadcasts its fp32 shards)."""
    hybrid: bool = False
    """Sharded within a node, replicas across nodes (HSDP): the gradient shard all-reduced across nodes per step."""
    overlapped: bool = True
    """Per-micro-batch gathers and reduce-scatters are prefetched behind compute (torch FSDP's separate streams);
    False: on the critical path (DeepSpeed ZeRO-3 as Narayanan et al. 2021 measured it against PTD-P, section 5.2)."""


DEEPSPEED_PREFETCH_ELEMENTS = 50_000_000
"""DeepSpeed ZeRO-3 ``stage3_prefetch_bucket_size`` default: the call size the plan prices ZeRO-3's gathers at.
DeepSpeed itself gathers one parameter per call and prefetches this many ahead; its 2021 gathers ran far below the
links, which these smaller calls' ring latency stands in for (docs/validation.md, "The misses")."""
DEEPSPEED_REDUCE_ELEMENTS = 500_000_000
"""DeepSpeed ``reduce_bucket_size`` default: gradients per reduce-scatter call."""

DP_SCHEDULES: dict[str, DPSchedule] = {
    "ddp": DPSchedule("all_reduce", False, "none", False),
    "zero1": DPSchedule("reduce_scatter", False, "after_step", True),
    "zero1_torch": DPSchedule("all_reduce", False, "after_step", True, gather_fp32=True),
    "zero2": DPSchedule("reduce_scatter", True, "after_step", True),
    "zero3": DPSchedule("reduce_scatter", True, "per_micro_batch", True, DEEPSPEED_PREFETCH_ELEMENTS,
                        DEEPSPEED_REDUCE_ELEMENTS, overlapped=False),
    "fsdp": DPSchedule("reduce_scatter", True, "per_micro_batch", True),
    "hsdp": DPSchedule("reduce_scatter", True, "per_micro_batch", True, hybrid=True),
}  # fmt: skip
"""Each plan strategy's schedule (a strategy attribute, :attr:`PlanStrategy.dp`): zero3 is DeepSpeed's (its bucket
defaults), fsdp and hsdp torch's FSDP2 (one unit per layer)."""


class PlanStrategy(ABC):
    """A plan strategy name -> the training strategy objects it composes."""

    name: str
    description: str
    overlap: Overlap

    @property
    def dp(self) -> DPSchedule:
        """The strategy's schedule of data-parallel calls (:data:`DP_SCHEDULES`; a strategy of another name, a
        training policy planned as is, falls back to DDP's)."""
        return DP_SCHEDULES.get(self.name, DP_SCHEDULES["ddp"])

    @abstractmethod
    def policy(self, precision: PlanPrecision) -> Policy:
        """The training policy of this strategy in ``precision``; ValueError when there is none."""

    @abstractmethod
    def groups(self, policy: Policy, shape: Shape) -> list[GroupBytes]:
        """Bus bytes per step per group (from the strategy objects)."""

    @abstractmethod
    def state_bytes(self, policy: Policy, shape: Shape, state: ModelState) -> float:
        """Model-state bytes per rank at the step's peak (from the strategy objects)."""

    def largest_piece(self, policy: Policy, shape: Shape) -> int:
        """Elements of the largest collective call (the comm buffer; :func:`largest_piece`)."""
        return largest_piece(policy, shape, shape.world_size)


def _sharded_units(policy: Policy, layout: Layout, n: int) -> bool:
    """The sharding communicates per FSDP unit (it has units), not per DDP bucket."""
    return bool(policy.sharding.units(layout.units[:1] or (UnitShape(((1,),)),), max(n, 1)))


def _buckets(shape: Shape) -> tuple[tuple[int, int], ...]:
    return ((int(shape.psi), 1),) if shape.piece else bucket_counts(shape.psi, shape.grad_bytes)


def largest_piece(policy: Policy, shape: Shape, n: int) -> int:
    """Elements per largest collective call: the largest unit where the sharding has units (one unit of Psi when
    the layout names none), else DDP's largest bucket."""
    layout = shape.layout()
    if _sharded_units(policy, layout, n):
        return max((sum(math.prod(s) for s in u.shapes) for u in layout.units), default=int(shape.psi))
    return max((size for size, _ in _buckets(shape)), default=0)


def unit_passes(by_op: dict[str, float], unit_numels: list[int], n: int) -> dict[str, int]:
    """Calls per step of each "op:dtype" of a sharding that communicates per unit, read off its bytes: how many
    times the op passes over all units (bus bytes over those of one call per unit in that dtype: 2 for the
    all-gathers of units resharded after forward, 1 for ZeRO-2's and for the gradient reduce-scatter) times the
    units. An op smaller than one pass (a loss scaler's found-inf flag) is one call."""
    out: dict[str, int] = {}
    for key, bus in by_op.items():
        op, dtype = key.split(":", 1)
        try:
            itemsize = torch_dtype(dtype).itemsize
        except (KeyError, ValueError):
            continue
        one_pass = bus_factor(op, n) * sum(unit_numels) * itemsize
        passes = round(bus / one_pass) if one_pass > 0 else 0
        out[key] = passes * len(unit_numels) if passes >= 1 else 1
    return out


def unit_calls(policy: Policy, shape: Shape, n: int, by_op: dict[str, float]) -> dict[str, int]:
    """Calls per step by "op:dtype" of a sharding that communicates per unit (:func:`unit_passes` over the
    layout's units); {} for a bucketed one (one call per bucket, every op)."""
    layout = shape.layout()
    if not _sharded_units(policy, layout, n):
        return {}
    numels = [sum(math.prod(s) for s in u.shapes) for u in layout.units] or [int(shape.psi)]
    return unit_passes(by_op, numels, n)


def step_bytes(policy: Policy, shape: Shape, n: int) -> tuple[dict[str, float], int, dict[str, float]]:
    """(bus bytes by "op:dtype", calls per "op:dtype", the DDP hook's own bytes) of one step on ``n`` ranks, asked of
    the policy. Bucketed (DDP) bytes are asked once per distinct bucket size and multiplied by the count (every byte
    formula is a sum over buckets), so any Psi answers in O(1). Per-unit calls that differ by op: :func:`unit_calls`."""
    layout = shape.layout()
    if _sharded_units(policy, layout, n):
        return layout_bytes(policy, shape.psi, n, layout), max(len(layout.units), 1), {}
    by_op: dict[str, float] = {}
    hook: dict[str, float] = {}
    calls = 0
    for size, count in _buckets(shape):
        one = Layout(bucket_numels=(size,))
        by_op = merge_bytes(by_op, {k: v * count for k, v in policy.comm_bytes(psi=size, world_size=n, layout=one).items()})
        if policy.sharding.takes_hooks and n > 1:
            h = policy.grad_comm.comm_bytes(psi=size, world_size=n, bucket_numels=(size,))
            hook = merge_bytes(hook, {k: v * count for k, v in h.items()})
        calls += count
    return by_op, max(calls, 1), hook


@dataclass(frozen=True, slots=True)
class FlatStrategy(PlanStrategy):
    """One sharding over all ``nodes x gpus_per_node`` ranks."""

    name: str
    description: str
    make: Any
    """(param dtype name, reduce dtype name) -> Sharding."""
    overlap: Overlap = Overlap()

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
        n = shape.world_size
        by_op, calls, hook_bytes = step_bytes(policy, shape, n)
        hook = policy.grad_comm if policy.sharding.takes_hooks else None
        return [GroupBytes("world", n, by_op, calls, hook, shape.psi if hook else 0.0, hook_bytes,
                           calls_by_op=unit_calls(policy, shape, n, by_op))]  # fmt: skip

    def state_bytes(self, policy: Policy, shape: Shape, state: ModelState) -> float:
        return policy.state_bytes(psi=shape.psi, world_size=shape.world_size, state=state)


@dataclass(frozen=True, slots=True)
class PartitionedZeRO1(FlatStrategy):
    """ZeRO-1 as the ZeRO paper and DeepSpeed run it (Rajbhandari et al. 2020, section 7.2.1: P_os moves 2*Psi, as
    DDP): gradients reduce-scattered so each rank gets the shard it owns, its optimizer step on it, updated
    parameters all-gathered. Memory is :class:`commbench.training.strategies.ZeRO1`'s (full parameters and
    gradients, optimizer state / N); bytes are those of FSDP1 SHARD_GRAD_OP (ZeRO-2), which moves the same
    reduce-scatter and one all-gather per unit (``make`` builds it); torch has no partitioned ZeRO-1 of its own
    (its ZeroRedundancyOptimizer is ``zero1_torch``)."""

    def state_bytes(self, policy: Policy, shape: Shape, state: ModelState) -> float:
        return ZeRO1().state_bytes(psi=shape.psi, world_size=shape.world_size, state=state)


@dataclass(frozen=True, slots=True)
class HybridStrategy(PlanStrategy):
    """HSDP: FSDP2 within each node (the shard group) and an all_reduce of each gradient shard across nodes
    (the replica group, one rank per node), as torch's HYBRID_SHARD / a 2-D FSDP2 mesh do.

    TODO(hsdp): delegate to ``strategies.HSDP`` once it lands (another branch adds it); until then its
    formulas are composed here from FSDP2's (intra) and the all_reduce bus factor (inter)."""

    name: str = "hsdp"
    description: str = "HSDP: FSDP2 within a node, gradient shards all-reduced across nodes"
    overlap: Overlap = Overlap(("reduce_scatter", "all_reduce"), ("all_gather",), "as fsdp; the cross-node all-reduce behind backward")

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
        intra = layout_bytes(policy, shape.psi, g, layout)
        distinct = collections.Counter(layout.units or (UnitShape(((int(shape.psi),),)),))
        inter: dict[str, float] = {}
        for shape_u, count in distinct.items():  # each rank all-reduces its gradient shard with its replicas
            for u in policy.sharding.units((shape_u,), g):
                key = f"all_reduce:{dtype_name(u.reduce_dtype_name)}"
                inter = merge_bytes(inter, {key: count * bus_factor("all_reduce", shape.nodes) * u.shard_numel
                                            * u.reduce_dtype.itemsize})  # fmt: skip
        calls = max(len(layout.units), 1)
        return [GroupBytes("intra", g, intra, calls, calls_by_op=unit_calls(policy, shape, g, intra)),
                GroupBytes("inter", shape.nodes, inter, calls)]  # fmt: skip

    def state_bytes(self, policy: Policy, shape: Shape, state: ModelState) -> float:
        return policy.state_bytes(psi=shape.psi, world_size=shape.gpus_per_node, state=state)

    def largest_piece(self, policy: Policy, shape: Shape) -> int:
        return largest_piece(policy, shape, shape.gpus_per_node)


_GRADS_IN_BACKWARD = Overlap(("all_reduce", "all_to_all", "all_gather"), (), "gradient all-reduce behind backward")
_SHARDED = Overlap(("reduce_scatter",), ("all_gather",), "parameter all-gathers prefetched behind each micro-batch; "
                   "gradient reduce-scatter behind backward")  # fmt: skip

STRATEGIES: dict[str, PlanStrategy] = {
    s.name: s
    for s in (
        FlatStrategy("ddp", "DDP: replicated model and optimizer", lambda pd_, rd: DDP(), _GRADS_IN_BACKWARD),
        PartitionedZeRO1("zero1", "ZeRO-1 (DeepSpeed, partitioned): gradients reduce-scattered, parameters all-gathered",
                         lambda pd_, rd: FSDP1(param_dtype_name=pd_, reduce_dtype_name=rd, reshard_after_forward=False),
                         Overlap(("reduce_scatter",), (), "gradient reduce-scatter behind backward; the parameter "
                                 "all-gather after the optimizer step exposed")),
        FlatStrategy("zero1_torch", "ZeRO-1 in torch: ZeroRedundancyOptimizer over DDP (all-reduce + fp32 broadcast)",
                     lambda pd_, rd: ZeRO1(), Overlap(("all_reduce", "all_to_all", "all_gather"), (),
                                                      "all-reduce behind backward; the broadcast after the step exposed")),
        FlatStrategy("zero2", "ZeRO-2: FSDP1 SHARD_GRAD_OP",
                     lambda pd_, rd: FSDP1(param_dtype_name=pd_, reduce_dtype_name=rd, reshard_after_forward=False),
                     Overlap(("reduce_scatter",), ("all_gather",), "the all-gather behind forward (once: kept "
                             "gathered), the reduce-scatter behind backward")),
        FlatStrategy("zero3", "ZeRO-3: FSDP1 FULL_SHARD",
                     lambda pd_, rd: FSDP1(param_dtype_name=pd_, reduce_dtype_name=rd), _SHARDED),
        FlatStrategy("fsdp", "FSDP2 fully_shard (ZeRO-3 on FSDP2)",
                     lambda pd_, rd: FSDP2(param_dtype_name=pd_, reduce_dtype_name=rd), _SHARDED),
        HybridStrategy(),
    )
}  # fmt: skip
"""Plan strategy names (the CLI's --strategies) -> the training strategy objects they compose."""


__all__ = [
    "BACKWARD_SHARE", "DEEPSPEED_PREFETCH_ELEMENTS", "DEEPSPEED_REDUCE_ELEMENTS", "DP_SCHEDULES", "DPSchedule",
    "OPTIMIZERS", "PRECISIONS", "STRATEGIES", "TORCH_ADAMW", "FlatStrategy", "GroupBytes",
    "HybridStrategy", "Optimizer", "Overlap", "PartitionedZeRO1", "PlanPrecision", "PlanStrategy", "Shape",
    "StateParts", "bucket_counts", "largest_piece", "step_bytes", "unit_calls", "unit_passes",
]  # fmt: skip


def check_choices(
    *, strategies: Any, precisions: Any, optimizer: str, attention: str, recompute: str
) -> None:
    """ValueError (one line naming the valid choices) for an unknown strategy, precision, optimizer, attention or
    recompute: the plan and the search take the same names."""
    for kind, names, valid in (("strategy", strategies, STRATEGIES), ("precision", precisions, PRECISIONS)):
        if isinstance(names, str) or not names:
            raise ValueError(f"give a list of {kind} names; valid: {', '.join(valid)}")
        for name in names:
            if name not in valid:
                raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(valid)}")
    for kind, name, table in (("optimizer", optimizer, OPTIMIZERS), ("attention", attention, ATTENTIONS),
                              ("recompute", recompute, RECOMPUTES)):  # fmt: skip
        if name not in table:
            raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(table)}")
