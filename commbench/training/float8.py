"""Float8 training with torchao (`torchao.float8`) as a `Sharding` and its policy fsdp2_float8: FSDP2 whose Linear
layers are torchao's `Float8Linear` (tensorwise dynamic scaling: inputs and weights e4m3, output gradients e5m2, the
matmuls through `torch._scaled_mm`) and whose float8 weights are all-gathered as float8
(`enable_fsdp_float8_all_gather`), the torchtitan recipe (docs/float8.md of pytorch/torchtitan).

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
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from commbench.measure.fp8_format import get_format
from commbench.training.comm import bus_factor, dtype_name
from commbench.training.policies import Policy, register_policy
from commbench.training.strategies import FP32, FSDP2, Underflow, UnitShape, World, add_bytes, unit_shapes

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
    import importlib

    with _quiet(_NOISY_LOGGERS):
        return importlib.import_module("torchao.float8")


@dataclass(frozen=True, slots=True)
class FSDP2Float8(FSDP2):
    """FSDP2 over torchao's float8 Linears, their weights all-gathered in float8 (module docstring)."""

    kind: str = "fsdp2_float8"
    skip_fqns: tuple[str, ...] = ("head",)
    """Linears left in high precision by name (the output head, as torchtitan's `filter_fqns`)."""

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

    def grad_underflows(self) -> tuple[Underflow, ...]:
        """The output gradients' tensorwise cast to e5m2 (amax to the format's max): an element at or below half the
        smallest subnormal, relative to that max, rounds to zero."""
        scaled = Underflow(f"fp8_{GRAD_FORMAT.name}", relative=GRAD_FORMAT.sub_step / 2 / GRAD_FORMAT.max)
        return (*FSDP2.grad_underflows(self), scaled)

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


_POLICIES = (
    Policy(
        name="fsdp2_float8",
        family="fsdp2",
        description="FSDP2 over torchao float8 Linears (tensorwise), weights all-gathered in float8, reduce-scatter fp32",
        sharding=FSDP2Float8(),
    ),
)
for _p in _POLICIES:
    register_policy(_p)
