"""The training precision-policy registry: stable names -> composed strategy objects (see `strategies.py`).

A policy is a Sharding, a GradComm and a LossScaling plus an autocast dtype. Adding one is a row in
`_POLICIES` (or `register_policy` from a plugin module, see `commbench.core.plugins`); a new kind of sharding or
hook is a class (here in `strategies.py`, or in the plugin). Everything the runner and the reports need is asked
of those objects (bytes, memory, the underflow threshold, pitfalls), never looked up by the policy's name.

Names are stable because reports and `training.csv` rows use them:

DDP (family "ddp"; every DDP policy uses `gradient_as_bucket_view=True` and a Python comm hook, so
the gradient all-reduce goes through `dist.all_reduce` where it can be counted; the non-compressing
policies use torch's own `default_hooks.allreduce_hook`, the same mean all-reduce as the builtin):
  fp32               fp32 compute, fp32 all-reduce (the baseline every drift is measured against)
  amp_bf16           autocast bf16, fp32 gradients and all-reduce
  amp_fp16           autocast fp16 + GradScaler
  amp_fp16_noscaler  autocast fp16 without loss scaling (the pitfall: gradients underflow)
  fp16_hook          fp32 compute, gradients all-reduced in fp16 (our hook, like fp16_compress_hook)
  bf16_hook          fp32 compute, gradients all-reduced in bf16 (our hook: torch's bf16_compress_hook
                     refuses to run without NCCL)
  fp8_hook           fp32 compute, gradients reduced as fp8 e4m3 with per-chunk tensor scaling
                     (all_to_all of bytes + scales, fp32 sum, re-encode, all_gather)
FSDP2 (family "fsdp2": `fully_shard` per block then the root, `MixedPrecisionPolicy`):
  fsdp2_bf16_fp32reduce  params bf16, gradient reduce-scatter fp32
  fsdp2_bf16             params bf16, reduce-scatter bf16
  fsdp2_fp16_scaler      params fp16, reduce-scatter fp16, ShardedGradScaler
  fsdp2_float8           torchao float8 Linears, weights all-gathered in float8, reduce-scatter fp32 (`float8.py`;
                         needs torchao, and sm_89+ on CUDA)
HSDP (family "hsdp": FSDP2 on a (nodes x ranks-per-node) mesh: shard within a node, replicate across nodes;
only the gradient shards' all-reduce crosses nodes; on one node it is FSDP2):
  hsdp_fp32              fp32 throughout
  hsdp_bf16_fp32reduce   params bf16, reduce-scatter and cross-node all-reduce fp32
  hsdp_bf16              params bf16, reduce-scatter and cross-node all-reduce bf16
FSDP1 (family "fsdp1": FULL_SHARD, `MixedPrecision(param_dtype, reduce_dtype, buffer_dtype)`):
  fsdp1_bf16             MixedPrecision(bf16, fp32, bf16)  (buffers in bf16: BatchNorm statistics too)
PP (family "pp", `pipeline_parallel.py`): pp_{gpipe,1f1b,interleaved}_{fp32,bf16}, pp_izb_fp32, pp_zbv_fp32, and on the
wire only pp_gpipe_bf16comm, pp_1f1b_bf16comm (fp32 compute), pp_1f1b_fp16 (autocast fp16 + ShardedGradScaler),
pp_1f1b_fp8comm (fp8 e4m3 codes + a scale per token through the codec); TP (family "tp"): `tensor_parallel.py`;
tp_float8, tp_sp_float8 (torchao float8 Linears and float8 TP styles): `float8.py`.
CP (family "cp", `context_parallel.py`): cp_fp32, cp_bf16comm (fp32 compute, K/V on the ring bf16), cp_bf16
(autocast bf16): the sequence split over cp_degree ranks, ring attention (`ring_attention.py`).
3-D (family "tp+pp+dp", `tp_pp_dp.py`): tp_pp_dp_fp32, tp_pp_dp_bf16: TP inside each 1F1B pipeline stage, data
parallel over the replicas, on a (pp, dp, tp) DeviceMesh (at least 2 x 2 x 2 ranks).
ZeRO stages in torch (family "zero"):
  zero1_fp32, zero1_bf16  ZeroRedundancyOptimizer over DDP (bf16: autocast bf16 + bf16 gradient hook)
  zero2_fp32, zero2_bf16  FSDP1 SHARD_GRAD_OP (no resharding after forward); bf16: MixedPrecision(bf16, bf16)
  zero3_fp32, zero3_bf16  FSDP1 FULL_SHARD; bf16: MixedPrecision(bf16, bf16)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from commbench.core.registry import Registry
from commbench.measure.precision import torch_dtype
from commbench.training.strategies import (
    ADAM_FP32,
    ALL_REDUCE,
    BF16,
    DDP,
    DTYPE_UNDERFLOW,
    FP16,
    FP32,
    FSDP1,
    FSDP2,
    HSDP,
    INTER,
    INTRA,
    NO_LAYOUT,
    NO_SCALING,
    SHORT,
    CastHook,
    CodecHook,
    GradComm,
    GradScaling,
    Layout,
    LossScaling,
    ModelState,
    ShardedGradScaling,
    Sharding,
    Underflow,
    ZeRO1,
    merge_bytes,
)

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    """One precision policy: the strategies it composes. `runner.py` asks them, never their names."""

    name: str
    """Stable registry name (used in rows and reports)."""
    family: str
    """ddp | fsdp1 | fsdp2 | hsdp | zero (a report label)."""
    description: str
    """One line for reports."""
    sharding: Sharding = DDP()
    """How the model and optimizer are replicated or sharded."""
    grad_comm: GradComm = ALL_REDUCE
    """DDP gradient hook (sharded wrappers communicate in their reduce dtype instead)."""
    loss_scaling: LossScaling = NO_SCALING
    """Loss scaler."""
    autocast_name: str | None = None
    """torch's name of the autocast compute dtype, or None for no autocast."""
    reference: str | None = None
    """The full-precision policy of the same parallelism this one's low-precision gain is measured against (e.g.
    tp_bf16 -> tp_fp32); None for a reference itself (every policy is also compared with the fp32 DDP baseline)."""

    def __post_init__(self) -> None:
        if self.grad_comm != ALL_REDUCE and not self.sharding.takes_hooks:
            raise ValueError(f"policy {self.name!r}: {type(self.sharding).__name__} takes no gradient hook")

    @property
    def autocast(self) -> torch.dtype | None:
        """Autocast compute dtype, or None for no autocast."""
        return None if self.autocast_name is None else torch_dtype(self.autocast_name)

    @property
    def comm_dtype(self) -> str:
        """Dtype the gradients are communicated in (for reports)."""
        return self.sharding.comm_dtype(self.grad_comm)

    def stages(self) -> list[Underflow]:
        """What each precision a gradient passes through loses: its communication, the autocast compute dtype and
        the wrapper's own arithmetic (FSDP's parameter dtype), each asked of the object that owns it."""
        out = [self.sharding.comm_underflow(self.grad_comm)]
        if self.autocast_name is not None:
            out.append(DTYPE_UNDERFLOW[self.autocast_name])
        out.extend(self.sharding.grad_underflows())
        return out

    @property
    def underflow(self) -> Underflow:
        """The gradient underflow threshold of the whole policy (an element lost at any stage is lost)."""
        return Underflow.through(self.stages())

    @property
    def loss_scaling_format(self) -> str | None:
        """Report name of a format the gradients pass through that loses them unless the loss is scaled (fp16), or
        None where none does."""
        return next((u.label for u in self.stages() if u.needs_loss_scaling), None)

    def comm_bytes(
        self, *, psi: float, world_size: int, layout: Layout = NO_LAYOUT, nodes: int = 1
    ) -> dict[str, float]:
        """Formula: bus bytes per step by "op:dtype" (nccl-tests definitions, see comm.py)."""
        return merge_bytes(*self.comm_by_link(psi=psi, world_size=world_size, layout=layout, nodes=nodes).values())

    def comm_by_link(
        self, *, psi: float, world_size: int, layout: Layout = NO_LAYOUT, nodes: int = 1
    ) -> dict[str, dict[str, float]]:
        """Formula: bus bytes per step by "op:dtype", split into INTRA- and INTER-node (see `Sharding.comm_by_link`)."""
        if world_size <= 1:
            return {INTRA: {}, INTER: {}}
        split = self.sharding.comm_by_link(
            psi=psi, world_size=world_size, grad_comm=self.grad_comm, layout=layout, nodes=nodes
        )
        # the scaler's found-inf all-reduce runs on the whole world
        link = INTER if nodes > 1 else INTRA
        split[link] = merge_bytes(
            self.loss_scaling.comm_bytes(world_size=world_size),
            self.sharding.scaler_comm_bytes(self.loss_scaling, world_size),
            split[link],
        )
        return split

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        """Model-state bytes per rank at the step's peak (see `Sharding.state_bytes`)."""
        return self.sharding.state_bytes(psi=psi, world_size=world_size, state=state, nodes=nodes)

    def configure(self, section: Any) -> Policy:
        """This policy for a suite's `[training]` table: its sharding configured (`Sharding.configure`: model-parallel
        degrees, micro-batches); the policy itself where the sharding takes nothing from the table."""
        sharding = self.sharding.configure(section)
        return self if sharding is self.sharding else replace(self, sharding=sharding)

    def pitfalls(self) -> list[str]:
        """Warnings the configuration itself deserves, before any step runs."""
        msg = self.loss_scaling.pitfall(self.sharding)
        return [msg] if msg else []


# One constructor per large family: its rows then differ only in what makes each policy itself.
_ddp, _zero = partial(Policy, family="ddp"), partial(Policy, family="zero")


def _zero_fsdp1(stage: int, mode: str, **fsdp: Any) -> tuple[Policy, Policy]:
    """`zero{stage}_fp32` and `zero{stage}_bf16`: ZeRO-2/3 as FSDP1 in ``mode``, fp32, then params/reduce bf16
    (its low-precision gain measured against the fp32 one)."""
    return (
        _zero(name=f"zero{stage}_fp32", description=f"ZeRO-{stage}: FSDP1 {mode}, fp32", sharding=FSDP1(**fsdp)),
        _zero(
            name=f"zero{stage}_bf16",
            description=f"ZeRO-{stage}: FSDP1 {mode}, params/reduce bf16",
            sharding=FSDP1(**fsdp, param_dtype_name=BF16, reduce_dtype_name=BF16),
            reference=f"zero{stage}_fp32",
        ),
    )


def _bf16_params(
    family: str, label: str, sharding: type[FSDP2], reduces: str, reference: str | None = None
) -> tuple[Policy, ...]:
    """`{family}_bf16_fp32reduce` and `{family}_bf16`: bf16 parameters, gradients reduced in fp32, then in bf16;
    ``reference`` their full-precision twin (None: the family has none, the fp32 DDP baseline stands in)."""
    return tuple(
        Policy(
            name=f"{family}_bf16{suffix}",
            family=family,
            description=f"{label}, params bf16, {reduces} {SHORT[reduce_dtype]}",
            sharding=sharding(param_dtype_name=BF16, reduce_dtype_name=reduce_dtype),
            reference=reference,
        )
        for suffix, reduce_dtype in (("_fp32reduce", FP32), ("", BF16))
    )


_POLICIES: tuple[Policy, ...] = (
    _ddp(name="fp32", description="DDP, fp32 compute and all-reduce (baseline)"),
    _ddp(name="amp_bf16", description="DDP, autocast bf16", autocast_name=BF16, reference="fp32"),
    _ddp(
        name="amp_fp16",
        description="DDP, autocast fp16 + GradScaler",
        autocast_name=FP16,
        loss_scaling=GradScaling(),
        reference="fp32",
    ),
    _ddp(
        name="amp_fp16_noscaler",
        description="DDP, autocast fp16 without loss scaling (pitfall)",
        autocast_name=FP16,
        reference="fp32",
    ),
    _ddp(
        name="fp16_hook",
        description="DDP, fp32 compute, fp16 gradient all-reduce hook",
        grad_comm=CastHook(FP16),
        reference="fp32",
    ),
    _ddp(
        name="bf16_hook",
        description="DDP, fp32 compute, bf16 gradient all-reduce hook",
        grad_comm=CastHook(BF16),
        reference="fp32",
    ),
    _ddp(
        name="fp8_hook",
        description="DDP, fp32 compute, fp8 e4m3 (scaled) gradient reduction hook",
        grad_comm=CodecHook("fp8_e4m3"),
        reference="fp32",
    ),
    *_bf16_params("fsdp2", "FSDP2", FSDP2, "reduce-scatter"),
    Policy(
        name="fsdp2_fp16_scaler",
        family="fsdp2",
        description="FSDP2, params fp16, reduce-scatter fp16, ShardedGradScaler",
        sharding=FSDP2(param_dtype_name=FP16, reduce_dtype_name=FP16),
        loss_scaling=ShardedGradScaling(),
    ),
    Policy(
        name="hsdp_fp32",
        family="hsdp",
        description="HSDP (FSDP2, shard within a node, replicate across nodes), fp32",
        sharding=HSDP(),
    ),
    *_bf16_params("hsdp", "HSDP", HSDP, "gradient reduce-scatter and cross-node all-reduce", "hsdp_fp32"),
    Policy(
        name="fsdp1_bf16",
        family="fsdp1",
        description="FSDP1 FULL_SHARD, MixedPrecision(param bf16, reduce fp32, buffers bf16)",
        sharding=FSDP1(param_dtype_name=BF16, reduce_dtype_name=FP32, buffer_dtype_name=BF16),
        reference="zero3_fp32",  # FSDP1 FULL_SHARD in fp32
    ),
    _zero(name="zero1_fp32", description="ZeRO-1: ZeroRedundancyOptimizer + DDP, fp32", sharding=ZeRO1()),
    _zero(
        name="zero1_bf16",
        description="ZeRO-1: ZeroRedundancyOptimizer + DDP, autocast bf16, bf16 hook",
        sharding=ZeRO1(),
        autocast_name=BF16,
        grad_comm=CastHook(BF16),
        reference="zero1_fp32",
    ),
    *_zero_fsdp1(2, "SHARD_GRAD_OP", reshard_after_forward=False),
    *_zero_fsdp1(3, "FULL_SHARD"),
)

POLICIES: Registry[Policy] = Registry("policy")
"""The training policies by stable name, built-ins first (in the order above), then plugins' in loading order."""
for _p in _POLICIES:
    POLICIES.register(_p.name, _p)

BASELINE = "fp32"
"""The policy every drift and gain is measured against (always run first)."""


def register_policy(policy: Policy) -> Policy:
    """Add a policy to the registry (after the built-in ones); a taken name, or a gradient hook that cannot run
    (`GradComm.validate`, e.g. an unknown codec), raises ValueError here rather than during a run."""
    if policy.name in POLICIES or policy.name == "all":
        raise ValueError(f"training policy {policy.name!r} is already registered")
    try:
        policy.grad_comm.validate()
    except ValueError as e:
        raise ValueError(f"training policy {policy.name!r}: {e}") from None
    return POLICIES.register(policy.name, policy)


def unregister_policy(name: str) -> None:
    """Remove a registered policy (tests register toys and clean up after themselves)."""
    POLICIES.unregister(name)


def list_policies() -> list[str]:
    """Stable policy names in registry order (fp32 first: it is the baseline)."""
    return POLICIES.names()


def get_policy(name: str) -> Policy:
    """Look a policy up by name; unknown names raise ValueError listing the valid ones."""
    try:
        return POLICIES.get(name)
    except ValueError:
        raise ValueError(f"unknown training policy {name!r}; valid: {', '.join(POLICIES.names())}") from None
