"""Float8 training with torchao (`torchao.float8`) as `Sharding`s and their policies.

fsdp2_float8: FSDP2 whose Linear layers are torchao's `Float8Linear` (tensorwise dynamic scaling: inputs and weights
e4m3, output gradients e5m2, the matmuls through `torch._scaled_mm`) and whose float8 weights are all-gathered as
float8 (`enable_fsdp_float8_all_gather`), the torchtitan recipe (docs/float8.md of pytorch/torchtitan).

Conversion: every `nn.Linear` whose in and out features are multiples of 16 (what `_scaled_mm` needs; torchao's
`_auto_filter_for_recipe` checks the same) except the output head, which torchtitan leaves in high precision (its
`filter_fqns` default, the head named `output` there, `head` here). Then FSDP2 as `dp_shardings.FSDP2` wraps it:
`fully_shard` per block, then the root.

Scales: `precompute_float8_dynamic_scale_for_fsdp` after every optimizer step (`after_optimizer_step`) computes every
float8 weight's amax in one all-reduce (MAX) of one fp32 element per float8 weight, which the next all-gathers cast
with; it also runs once after wrapping, so the first step casts with precomputed scales too (without them each
all-gather of a float8 weight would all-reduce its own amax first) and every step moves the same bytes.

Bytes, per FSDP unit on n ranks (`_comm_bytes`; FSDP2's foreach all-gather, `_fsdp_collectives`): one all-gather of
the unit's shards, again for backward where the unit is resharded after forward (every unit but the root); a float8
weight's shard is 1 byte per element, every other parameter 4; a unit with both is gathered as one uint8 buffer of
those bytes (FSDP2 views every input as uint8 when their dtypes differ), a unit of fp32 parameters only in fp32, one
of float8 weights only in float8. The gradients are reduce-scattered in fp32 (4 bytes per shard element); per step
one all-reduce of 4 bytes per float8 weight (the amaxes). Bus factors as nccl-tests'.

Where it cannot run, the runner skips it with one line (`environment_error`): torchao missing, or a CUDA device of
compute capability below 8.9 (float8 matmuls need sm_89: Ada, Hopper, Blackwell). On CPU it runs (torch's CPU
`_scaled_mm`).

tp_float8 and tp_sp_float8 (`TensorParallelFloat8`): the GPT's TP layout (`tensor_parallel.py`) whose block Linears
are torchao's `Float8Linear` (tensorwise dynamic scaling, as fsdp2_float8 converts them) and are split with
torchao's float8 styles (`torchao.float8.float8_tensor_parallel`), the torchtitan recipe (`apply_tp` of its llama:
`Float8ColwiseParallel`, `Float8RowwiseParallel`, and under sequence parallelism `PrepareFloat8ModuleInput` on the
attention module, whose input it casts to float8 before the all-gather; here the attention's one float8 user is the
fused qkv, the MLP's is `fc`, whose own style gathers its input).

What torchao moves in float8 (read from `float8_tensor_parallel.py` and checked against the profiler's events): an
activation is cast to float8 *before* a redistribution, so only all-gathers carry float8 (a tensorwise-scaled
tensor gathers its codes, the scale is the same on every rank); every reduction runs on high-precision partial sums.
- without SP (tp_float8): the row-wise outputs' forward all-reduces and the column-wise inputs' backward all-reduces
  stay fp32, as tp_fp32's; nothing travels in float8;
- with SP (tp_sp_float8): the column-wise inputs are all-gathered as e4m3 codes (forward) and the row-wise outputs'
  gradients as e5m2 codes (backward, `NoopFwToFloat8BwDynamic` casts them before the backward all-gather), one byte
  per element; the reduce-scatters (row-wise outputs forward, column-wise input gradients backward) stay fp32, as do
  the region's entry and exit and the norms' gradient all-reduces (tp_sp_fp32's).
- amaxes: a dynamic cast of a sharded DTensor needs the amax over every shard: one all-reduce (MAX) of one float64
  element (torchao takes the amax to float64 before the scale). Per Float8Linear and step: its weight shard twice
  (the forward cast, and the backward's recast of the saved high-precision weight for the input gradient), the
  Shard(-1) activation once (a row-wise input forward, a column-wise output gradient backward), and with SP the
  sequence-sharded activation once (a column-wise input forward, a row-wise output gradient backward); a replicated
  tensor's amax is the same on every rank and moves nothing.

On gloo, which has no float8 type, torchao's float8 all-gather fails ("Invalid scalar type"): `gather_float8_as_bytes`
replaces torchao's all-gather of a Float8TrainingTensor by the same all-gather of its codes viewed as uint8 (the
same bytes, on every backend; NCCL sends float8 as bytes in an all-gather anyway), and `comm.CommCounter` counts
such a payload as those uint8 bytes. So it runs on CPU, as fsdp2_float8; where it cannot (torchao missing, a CUDA
GPU below sm_89) the runner skips it with `Float8Linears`'s one line, as fsdp2_float8.

Each is measured against the fp32 TP policy of its layout (tp_fp32, tp_sp_fp32).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from commbench.measure.fp8_format import get_format
from commbench.training.comm import bus_factor, dtype_name
from commbench.training.policies import Policy, register_policy
from commbench.training.strategies import (
    FP32,
    FSDP2,
    GradComm,
    Layout,
    Underflow,
    UnitShape,
    World,
    add_bytes,
    unit_shapes,
)
from commbench.training.tensor_parallel import BLOCK_PLAN, COLWISE, ROWWISE, TensorParallel

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

INSTALL_HINT = "float8 training needs torchao: pip install 'commbench[float8]'"
MIN_CAPABILITY = (8, 9)
"""The CUDA compute capability float8 matmuls need (sm_89: Ada; Hopper is 9.0, Blackwell 10.0)."""
MULTIPLE = 16
"""A float8 Linear's in and out features are multiples of this (`torch._scaled_mm`'s requirement)."""
WEIGHT_FORMAT, GRAD_FORMAT = get_format("e4m3"), get_format("e5m2")
"""What torchao's default recipe casts the weights (and inputs) and the output gradients to
(`Float8LinearConfig.cast_config_weight`, `cast_config_grad_output`)."""

_NOISY_LOGGERS = ("torchao", "torch.utils._pytree")
"""Loggers that warn while torchao imports: its CUDA extensions that a CPU build cannot load, a pytree
registration torch deprecates; neither is about the run."""


@contextlib.contextmanager
def _quiet(names: Sequence[str]) -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def torchao_float8() -> Any:
    """`torchao.float8`, imported without its import-time warnings; ImportError where torchao is not installed."""
    with _quiet(_NOISY_LOGGERS):
        return importlib.import_module("torchao.float8")


class Float8Linears:
    """What every float8 sharding shares: which Linears become torchao's `Float8Linear`, where float8 cannot run
    (one line), and the gradients' e5m2 cast. A mixin before the sharding class (`FSDP2Float8`, `TensorParallelFloat8`); the
    dataclass that mixes it in declares `skip_fqns`."""

    __slots__ = ()
    skip_fqns: tuple[str, ...]

    def converts(self, module: nn.Module, fqn: str) -> bool:
        """Whether `module` (named `fqn` in the model) becomes a float8 Linear (torchao's `module_filter_fn`)."""
        import torch.nn as nn

        if not isinstance(module, nn.Linear) or fqn in self.skip_fqns:
            return False
        return module.in_features % MULTIPLE == 0 and module.out_features % MULTIPLE == 0

    def environment_error(self, device: torch.device) -> str | None:
        try:
            torchao_float8()
        except ImportError:
            return INSTALL_HINT
        if device.type != "cuda":
            return None
        import torch

        cc = tuple(torch.cuda.get_device_capability(device))
        if cc < MIN_CAPABILITY:
            need = ".".join(map(str, MIN_CAPABILITY))
            return f"float8 matmuls need CUDA compute capability >= {need} (sm_89+: Ada, Hopper, Blackwell); {device} is {cc[0]}.{cc[1]}"
        return None

    def grad_underflows(self) -> tuple[Underflow, ...]:
        """The output gradients' tensorwise cast to e5m2 (amax to the format's max): an element at or below half the
        smallest subnormal, relative to that max, rounds to zero."""
        scaled = Underflow(f"fp8_{GRAD_FORMAT.name}", relative=GRAD_FORMAT.sub_step / 2 / GRAD_FORMAT.max)
        return (*super().grad_underflows(), scaled)  # type: ignore[misc]  # the sharding's own, after this mixin


@dataclass(frozen=True, slots=True)
class FSDP2Float8(Float8Linears, FSDP2):
    """FSDP2 over torchao's float8 Linears, their weights all-gathered in float8 (module docstring)."""

    kind: str = "fsdp2_float8"
    skip_fqns: tuple[str, ...] = ("head",)
    """Linears left in high precision by name (the output head, as torchtitan's `filter_fqns`)."""

    def describe(self, model: nn.Module) -> tuple[UnitShape, ...]:
        weights = {id(m.weight) for fqn, m in model.named_modules() if self.converts(m, fqn)}
        return unit_shapes(model, self.mixed, weights)

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        f8 = torchao_float8()
        config = f8.Float8LinearConfig(enable_fsdp_float8_all_gather=True)
        f8.convert_to_float8_training(model, module_filter_fn=self.converts, config=config)
        wrapped = FSDP2._wrap(self, model, device, world)
        f8.precompute_float8_dynamic_scale_for_fsdp(wrapped)  # the first step casts with precomputed scales too
        return wrapped

    def after_optimizer_step(self, model: nn.Module) -> None:
        torchao_float8().precompute_float8_dynamic_scale_for_fsdp(model)

    def _comm_bytes(self, w: World) -> dict[str, float]:
        """Module docstring. Without units (from Psi alone): one resharded unit of Psi float8 elements."""
        n = w.world_size
        ag, rs = bus_factor("all_gather", n), bus_factor("reduce_scatter", n)
        fp32 = 4
        out: dict[str, float] = {}
        weights = 0
        for u in w.layout.units or (UnitShape(((int(w.psi),),), float8=(True,)),):
            flags = u.float8 or (False,) * len(u.shapes)
            low = self.shard_numel([s for s, f in zip(u.shapes, flags, strict=True) if f], n)
            high = self.shard_numel([s for s, f in zip(u.shapes, flags, strict=True) if not f], n)
            if not low + high:
                continue
            weights += sum(flags)
            wire = "uint8" if low and high else (WEIGHT_FORMAT.dtype_name if low else FP32)
            gathers = 2 if self.reshard_after_forward and not u.root else 1
            add_bytes(out, f"all_gather:{dtype_name(wire)}", gathers * ag * n * (low + high * fp32))
            add_bytes(out, f"reduce_scatter:{dtype_name(FP32)}", rs * n * (low + high) * fp32)
        add_bytes(out, f"all_reduce:{dtype_name(FP32)}", bus_factor("all_reduce", n) * weights * fp32)
        return out


AMAX_BYTES = 8
"""One amax all-reduced, as torchao reduces it: a float64 element."""
PREPARED = ("attn",)
"""Under SP, the modules whose input `PrepareFloat8ModuleInput` casts to float8 and gathers once for their float8
Linears (torchtitan's attention and feed-forward; the GPT's MLP has one Linear, `fc`, whose style does it)."""


def _tp_styles() -> Any:
    with _quiet(_NOISY_LOGGERS):
        return importlib.import_module("torchao.float8.float8_tensor_parallel")


def gather_float8_as_bytes() -> None:
    """Make torchao's all-gather of a Float8TrainingTensor gather its codes as uint8 (module docstring); idempotent,
    for the process (torchao's dispatch table is global; the bytes gathered are the same)."""
    import torch

    ops = importlib.import_module("torchao.float8.float8_ops")
    keys = (
        torch.ops._c10d_functional.all_gather_into_tensor.default,
        torch.ops.c10d_functional.all_gather_into_tensor.default,
    )
    if all(getattr(ops.FLOAT8_OPS_TABLE.get(k), "as_bytes", False) for k in keys):
        return

    def gather(aten_op: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
        x = args[0]
        codes = x._data.contiguous()
        out = aten_op(codes.view(torch.uint8), *args[1:], **(kwargs or {})).view(codes.dtype)
        return type(x)(out, x._scale, x._orig_dtype, x._linear_mm_config, x._gemm_input_role)

    gather.as_bytes = True  # type: ignore[attr-defined]
    for k in keys:
        ops.FLOAT8_OPS_TABLE[k] = gather


@dataclass(frozen=True, slots=True)
class TensorParallelFloat8(Float8Linears, TensorParallel):
    """Tensor parallelism over torchao's float8 Linears with torchao's float8 styles (module docstring)."""

    kind: str = "tp_float8"
    skip_fqns: tuple[str, ...] = ("head",)
    """Linears left in high precision by name (the replicated output head)."""
    d_model: int = 0
    """The GPT's width, for the layout check (set by `configure`; 0: not checked)."""

    def configure(self, section: Any) -> TensorParallelFloat8:
        base = TensorParallel.configure(self, section)
        assert isinstance(base, TensorParallelFloat8)  # `replace` keeps the class
        return replace(base, d_model=int(section.d_model))

    def split_error(self, tp: int, n_heads: int, seq_len: int) -> str | None:
        """TP's, and a shard of a float8 Linear whose features are not a multiple of 16 (`torch._scaled_mm`)."""
        err = TensorParallel.split_error(self, tp, n_heads, seq_len)
        if err is None and self.d_model and self.d_model % (MULTIPLE * tp):
            return (f"float8 tensor parallelism needs d_model divisible by {MULTIPLE} x the TP degree {tp} "
                    f"(each shard's features a multiple of {MULTIPLE}); d_model={self.d_model}")  # fmt: skip
        return err

    def _styles(self) -> dict[str, Any]:
        from torch.distributed.tensor import Shard

        f8tp = _tp_styles()
        sp = self.sequence_parallel
        col = f8tp.Float8ColwiseParallel(input_layouts=Shard(1)) if sp else f8tp.Float8ColwiseParallel()
        row = f8tp.Float8RowwiseParallel(output_layouts=Shard(1)) if sp else f8tp.Float8RowwiseParallel()
        return {COLWISE: col, ROWWISE: row}

    def _block_plan(self, styles: dict[str, Any]) -> dict[str, Any]:
        plan = TensorParallel._block_plan(self, styles)
        if self.sequence_parallel:
            from torch.distributed.tensor import Replicate, Shard

            f8tp = _tp_styles()
            for name in PREPARED:
                plan[name] = f8tp.PrepareFloat8ModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                )
            for path, style in BLOCK_PLAN:
                if style == COLWISE and path.split(".")[0] in PREPARED:  # its input arrives cast and gathered
                    plan[path] = f8tp.Float8ColwiseParallel()
        return plan

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        torchao_float8().convert_to_float8_training(model, module_filter_fn=self.converts)
        gather_float8_as_bytes()
        return TensorParallel._wrap(self, model, device, world)

    def tp_bytes(self, layout: Layout, tp: int) -> dict[str, float]:
        """Bus bytes per step of one TP group (module docstring): the norms and the SP region as tp_sp_fp32's, each
        float8 Linear's reduction in fp32, under SP its gathered activation as uint8 codes, and its amaxes."""
        linears = [(s, f) for s, f in layout.activations if s in (COLWISE, ROWWISE)]
        rest = tuple(a for a in layout.activations if a[0] not in (COLWISE, ROWWISE))
        if tp <= 1 or not linears:
            return {}
        out = TensorParallel.tp_bytes(self, replace(layout, activations=rest), tp)
        sp = self.sequence_parallel
        reduction = "reduce_scatter" if sp else "all_reduce"
        for _, features in linears:
            elems = layout.tokens * features
            add_bytes(out, f"{reduction}:float", bus_factor(reduction, tp) * elems * 4)
            if sp:
                add_bytes(out, "all_gather:uint8", bus_factor("all_gather", tp) * elems)
        add_bytes(out, "all_reduce:double", bus_factor("all_reduce", tp) * AMAX_BYTES * len(linears) * (4 if sp else 3))
        return out

    def comm_dtype(self, grad_comm: GradComm) -> str:
        return "float8+fp32" if self.sequence_parallel else "fp32"


_TP = "tensor parallel over all ranks"
_POLICIES = (
    Policy(
        name="fsdp2_float8",
        family="fsdp2",
        description="FSDP2 over torchao float8 Linears (tensorwise), weights all-gathered in float8, reduce-scatter fp32",
        sharding=FSDP2Float8(),
    ),
    Policy(
        name="tp_float8",
        family="tp",
        description=f"{_TP}, torchao float8 Linears (tensorwise) with torchao's float8 TP styles; activations and "
        "their gradients all-reduced fp32, the amaxes of sharded tensors all-reduced",
        sharding=TensorParallelFloat8(),
        reference="tp_fp32",
    ),
    Policy(
        name="tp_sp_float8",
        family="tp",
        description=f"{_TP} + sequence parallel norms, torchao float8 Linears and float8 TP styles (torchtitan): "
        "norm outputs all-gathered as e4m3, row-wise output gradients as e5m2, reduce-scatters fp32",
        sharding=TensorParallelFloat8(sequence_parallel=True),
        reference="tp_sp_fp32",
    ),
)
for _p in _POLICIES:
    register_policy(_p)
