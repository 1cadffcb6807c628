"""What the strategies' byte and memory formulas are asked about: the dtypes by torch's name (and the underflow
thresholds they bring), the links (INTRA / INTER), ZeRO's model-state bytes, DDP's buckets, FSDP's units, the
model's activation `Layout` and the blocks of a model as the wrappers see it (see `strategies` for the whole)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from commbench.measure.precision import torch_dtype

if TYPE_CHECKING:
    import torch
    import torch.nn as nn


# Dtypes are stored by torch's name for them (``torch.<name>``, as in `commbench.measure.precision`) and resolved with
# `torch_dtype` only where tensors or torch objects are made, so the policy registry (`commbench list`) and the
# byte formulas' inputs need no torch at import.

FP32, FP16, BF16 = "float32", "float16", "bfloat16"

SHORT: dict[str, str] = {FP32: "fp32", FP16: "fp16", BF16: "bf16"}
"""Report names of the compute/communication dtypes, by torch's name."""

@dataclass(frozen=True, slots=True)
class Underflow:
    """Where a number format loses small gradient elements: those at or below ``absolute``, or (a scaled format)
    at or below ``relative`` times the gradient's amax, round to zero. Every stage a gradient passes through
    (compute, communication) has one; a policy's threshold is the largest of its stages' (`Policy.underflow`)."""

    label: str
    """Report name of the format (fp16, fp8_e4m3)."""
    absolute: float = 0.0
    """Magnitude at or below which an element underflows whatever the scale (0: only exact zeros)."""
    relative: float = 0.0
    """Fraction of the gradient's amax at or below which an element underflows (scaled formats)."""
    needs_loss_scaling: bool = False
    """Its range loses ordinary gradients unless the loss is scaled (fp16's 5-bit exponent)."""

    @classmethod
    def through(cls, stages: Sequence[Underflow]) -> Underflow:
        """The threshold of passing through every stage: an element lost in any one is lost."""
        lossy = [s for s in stages if s.absolute or s.relative] or list(stages)
        return cls(
            "+".join(dict.fromkeys(s.label for s in lossy)),
            max((s.absolute for s in stages), default=0.0),
            max((s.relative for s in stages), default=0.0),
            any(s.needs_loss_scaling for s in stages),
        )


DTYPE_UNDERFLOW: dict[str, Underflow] = {
    # Half the smallest positive subnormal: at or below it a value rounds to zero when cast (ties to even).
    FP16: Underflow("fp16", 2.0**-25, needs_loss_scaling=True),
    BF16: Underflow("bf16", 2.0**-134),
    FP32: Underflow("fp32"),  # 2**-150: below every nonzero fp32, so only exact zeros count
}
"""What a cast to each compute/communication dtype (torch's name) loses; a codec's figure comes from the codec
itself (`CodecHook.underflow`)."""

INTRA, INTER = "intra", "inter"
"""Link classes of a collective: its process group's ranks all on one node, or on several (see `comm.py`)."""

DDP_FIRST_BUCKET_BYTES = 1024**2
"""DDP's first bucket (`torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`): small, so communication starts early."""
DDP_BUCKET_CAP_BYTES = 25 * 1024**2
"""DDP's `bucket_cap_mb=25` default."""


def add_bytes(out: dict[str, float], key: str, v: float) -> None:
    if v:
        out[key] = out.get(key, 0.0) + v


def merge_bytes(*parts: dict[str, float]) -> dict[str, float]:
    """Sum "op:dtype" byte dicts key by key (zeros dropped)."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            add_bytes(out, k, v)
    return out


def default_bucket_numels(psi: float, elem_bytes: int = 4) -> list[int]:
    """DDP's buckets for `psi` gradient elements when the live model is unknown: a 1 MiB first bucket,
    then 25 MiB ones (parameter boundaries ignored: DDP never splits a parameter, so real buckets differ
    by at most a parameter each)."""
    left = int(psi)
    out: list[int] = []
    cap = DDP_FIRST_BUCKET_BYTES // elem_bytes
    while left > 0:
        take = min(left, cap)
        out.append(take)
        left -= take
        cap = DDP_BUCKET_CAP_BYTES // elem_bytes
    return out


@dataclass(frozen=True, slots=True)
class ModelState:
    """Bytes per parameter of the model state (ZeRO's 2 + 2 + K for mixed-precision Adam is (2, 2, 12))."""

    param_bytes: float = 4
    """Persistent parameters (fp32 master weights here)."""
    grad_bytes: float = 4
    """Gradients (fp32: DDP's buckets, FSDP's sharded grads)."""
    optimizer_bytes: float = 8
    """Optimizer state, K (AdamW: two fp32 moments)."""


ADAM_FP32 = ModelState()
"""What every policy here keeps: fp32 parameters and gradients, AdamW's two fp32 moments (16 bytes/param)."""


@dataclass(frozen=True, slots=True)
class UnitShape:
    """One FSDP unit as a description (no tensors): its parameters' shapes and how it is wrapped."""

    shapes: tuple[tuple[int, ...], ...]
    """Shapes of the parameters the unit owns (nested units' excluded)."""
    root: bool = False
    """The root unit: stays gathered from forward to backward (all-gathered once per step)."""
    keep_fp32: bool = False
    """Kept in fp32 under mixed precision (BatchNorm, as FSDP1's MixedPrecision does by default)."""
    float8: tuple[bool, ...] = ()
    """Per shape: the parameter is all-gathered as float8 (a float8 Linear's weight); empty: none is."""


class GatherReduceDtypes:
    """The torch dtypes behind ``param_dtype_name`` / ``reduce_dtype_name`` (an FSDP unit and the FSDP strategies
    keep dtypes by name, so that loading the policy table needs no torch)."""

    __slots__ = ()
    param_dtype_name: str
    reduce_dtype_name: str

    @property
    def param_dtype(self) -> torch.dtype:
        return torch_dtype(self.param_dtype_name)

    @property
    def reduce_dtype(self) -> torch.dtype:
        return torch_dtype(self.reduce_dtype_name)


@dataclass(frozen=True, slots=True)
class FsdpUnit(GatherReduceDtypes):
    """One FSDP unit as the formulas see it: its shard size, dtypes and how often it is all-gathered."""

    shard_numel: int
    param_dtype_name: str
    reduce_dtype_name: str
    gathers: int



@dataclass(frozen=True, slots=True)
class Layout:
    """What the exact byte count needs beyond Psi, described without tensors (empty: from Psi alone)."""

    bucket_numels: tuple[int, ...] = ()
    """DDP's gradient buckets (elements); empty: `default_bucket_numels(psi)`."""
    units: tuple[UnitShape, ...] = ()
    """FSDP's units; empty: one resharded unit of Psi elements."""
    buffer_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes of the model's buffers by nccl-tests dtype name (DDP re-broadcasts them every forward)."""
    activations: tuple[tuple[str, int], ...] = ()
    """Tensor parallelism: (style, features all-reduced) of each parallelised Linear (`Sharding.describe_activations`)."""
    tokens: int = 0
    """Tensor parallelism: tokens of one micro-batch as a tensor-parallel group computes it (b*s)."""


NO_LAYOUT = Layout()


# --- the model as the wrappers see it ---------------------------------------------------------------


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks (each its own FSDP unit)."""
    return list(getattr(model, "blocks", []))


def batchnorms(model: nn.Module) -> list[nn.Module]:
    """The model's BatchNorm modules."""
    import torch.nn as nn

    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def unit_shapes(model: nn.Module, split_batchnorm: bool, float8: Collection[int] = ()) -> tuple[UnitShape, ...]:
    """The units FSDP wraps: BatchNorms (when kept in fp32 under mixed precision), blocks, then the root; `float8`:
    the ids of the parameters gathered as float8."""
    taken: set[int] = set()
    out: list[UnitShape] = []

    def unit(ps: list[Any], **kw: bool) -> None:
        taken.update(id(p) for p in ps)
        low = tuple(id(p) in float8 for p in ps) if float8 else ()
        out.append(UnitShape(tuple(tuple(p.shape) for p in ps), float8=low, **kw))

    for bn in batchnorms(model) if split_batchnorm else []:  # innermost first: they leave their block's unit
        unit([p for p in bn.parameters() if id(p) not in taken], keep_fp32=True)
    for block in blocks(model):
        unit([p for p in block.parameters() if id(p) not in taken])
    unit([p for p in model.parameters() if id(p) not in taken], root=True)
    return tuple(out)


def numel_of(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
