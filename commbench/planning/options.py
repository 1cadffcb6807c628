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

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from commbench.measure.precision import torch_dtype
from commbench.training.comm import bus_factor, dtype_name
from commbench.training.policies import Policy
from commbench.training.strategies import (
    ALL_REDUCE,
    BF16,
    DDP,
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
    default_bucket_numels,
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
        return float(torch_dtype(self.param_dtype_name).itemsize)

    @property
    def grad_bytes(self) -> float:
        return self.param_bytes

    @property
    def master_bytes(self) -> float:
        """fp32 master weights kept next to low-precision parameters (sharded like optimizer state)."""
        fp32 = float(torch_dtype(FP32).itemsize)
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


__all__ = [
    "OPTIMIZERS", "PRECISIONS", "STRATEGIES", "TORCH_ADAMW", "FlatStrategy", "GroupBytes", "HybridStrategy", "Optimizer",
    "PlanPrecision", "PlanStrategy", "Shape", "StateParts", "pieces",
]  # fmt: skip
