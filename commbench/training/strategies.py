"""Training strategies: how a policy shards the model, communicates gradients and scales the loss.

A policy (`policies.py`) composes three objects:
- a `Sharding` (DDP, ZeRO-1, FSDP1, FSDP2, HSDP): wraps the model and builds the optimizer;
- a `GradComm` (torch's all-reduce hook, a cast hook, a chunked-codec hook): the DDP gradient hook;
- a `LossScaling` (none, GradScaler, ShardedGradScaler): builds the scaler.

Each object answers for itself: what it does to a model (`wrap`, `register`, `make`), the bus bytes
it communicates per step and the model-state bytes it keeps per rank. Those are pure formulas of the
parameter count Psi, dtypes and the world layout (plus, where it decides the exact figure, a
description of DDP's buckets or FSDP's units), so the capacity planner can ask them about a model it
never builds: `FSDP1().comm_bytes(psi=70e9, world_size=512, grad_comm=ALL_REDUCE)`.

Bytes are nccl-tests bus bytes by "op:dtype" (see `comm.py`): all_reduce 2(n-1)/n of the buffer;
all_gather (n-1)/n of the total output; reduce_scatter (n-1)/n of the total input; broadcast 1.

Memory follows ZeRO (Rajbhandari et al. 2020, section 3): per parameter P bytes of parameters, G of
gradients and K of optimizer state (`ModelState`; here fp32 training with AdamW: 4 + 4 + 8); each
sharding says which of the three it partitions over the N ranks.

A new kind is one new class here (`HSDP` is an `FSDP2` whose `_mesh` is 2-D and whose formulas split the
traffic between the intra- and inter-node groups); nothing else asks a strategy for its name.

The world layout is `world_size` ranks on `nodes` nodes (default 1). `comm_by_link` splits a step's bus
bytes into INTRA (collectives whose group stays on one node) and INTER (groups spanning nodes), the same
classification `comm.CommCounter` applies to the calls it intercepts.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from commbench.measure.precision import torch_dtype
from commbench.training.comm import bus_factor, dtype_name

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

    from commbench.training.hooks import HookFn

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


def _add(out: dict[str, float], key: str, v: float) -> None:
    if v:
        out[key] = out.get(key, 0.0) + v


def merge_bytes(*parts: dict[str, float]) -> dict[str, float]:
    """Sum "op:dtype" byte dicts key by key (zeros dropped)."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            _add(out, k, v)
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


class _GatherReduceDtypes:
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
class FsdpUnit(_GatherReduceDtypes):
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


def unit_shapes(model: nn.Module, split_batchnorm: bool) -> tuple[UnitShape, ...]:
    """The units FSDP wraps: BatchNorms (when kept in fp32 under mixed precision), blocks, then the root."""
    taken: set[int] = set()
    out: list[UnitShape] = []

    def unit(ps: list[Any], **kw: bool) -> None:
        taken.update(id(p) for p in ps)
        out.append(UnitShape(tuple(tuple(p.shape) for p in ps), **kw))

    for bn in batchnorms(model) if split_batchnorm else []:  # innermost first: they leave their block's unit
        unit([p for p in bn.parameters() if id(p) not in taken], keep_fp32=True)
    for block in blocks(model):
        unit([p for p in block.parameters() if id(p) not in taken])
    unit([p for p in model.parameters() if id(p) not in taken], root=True)
    return tuple(out)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# --- gradient communication -------------------------------------------------------------------------


class GradComm(ABC):
    """How DDP communicates a gradient bucket (a comm hook)."""

    wire: str
    """Report name of the dtype the gradients travel in (fp32, bf16, fp16, fp8_e4m3)."""

    @property
    def underflow(self) -> Underflow:
        """What the wire format loses. Default: a cast to the torch dtype ``wire`` names (fp32, bf16, fp16), else
        nothing but exact zeros; a hook that loses more says so by overriding it."""
        by_label = {u.label: u for u in DTYPE_UNDERFLOW.values()}
        return by_label.get(self.wire, Underflow(self.wire))

    def validate(self) -> None:
        """Raise ValueError when the hook cannot run (an unknown codec, say): called when a policy is registered,
        so the mistake shows there and not in the middle of a run. Default: nothing to check."""
        return None

    @abstractmethod
    def hook(self) -> HookFn:
        """The DDP comm hook."""

    def register(self, ddp: Any) -> None:
        """Install the hook on a DistributedDataParallel model."""
        ddp.register_comm_hook(None, self.hook())

    @abstractmethod
    def comm_bytes(self, *, psi: float, world_size: int, bucket_numels: Sequence[int]) -> dict[str, float]:
        """Bus bytes per step by "op:dtype" for `psi` fp32 gradients in DDP buckets of `bucket_numels`."""

    def notes(self) -> list[str]:
        """Lines for the summary row's notes."""
        return []


@dataclass(frozen=True, slots=True)
class AllReduceHook(GradComm):
    """torch's `allreduce_hook`: the builtin mean all-reduce in fp32, through `dist.all_reduce` so it is counted."""

    wire: str = "fp32"

    def hook(self) -> HookFn:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        return allreduce_hook

    def comm_bytes(self, *, psi: float, world_size: int, bucket_numels: Sequence[int] = ()) -> dict[str, float]:
        out: dict[str, float] = {}
        _add(out, "all_reduce:float", bus_factor("all_reduce", world_size) * psi * 4)
        return out


@dataclass(frozen=True, slots=True)
class CastHook(GradComm):
    """Cast the bucket to `dtype`, all-reduce (mean), copy back into the fp32 bucket."""

    dtype_name: str = BF16
    """torch's name of the wire dtype."""

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype_name)

    @property
    def wire(self) -> str:  # type: ignore[override]
        return SHORT[self.dtype_name]

    @property
    def underflow(self) -> Underflow:
        return DTYPE_UNDERFLOW[self.dtype_name]

    def validate(self) -> None:
        if self.dtype_name not in DTYPE_UNDERFLOW:
            raise ValueError(f"CastHook dtype {self.dtype_name!r} is not valid; valid: {', '.join(DTYPE_UNDERFLOW)}")

    def hook(self) -> HookFn:
        from commbench.training.hooks import cast_hook

        return cast_hook(self.dtype)

    def comm_bytes(self, *, psi: float, world_size: int, bucket_numels: Sequence[int] = ()) -> dict[str, float]:
        from commbench.training.hooks import cast_hook_bytes

        return cast_hook_bytes(psi, world_size, self.dtype)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class CodecHook(GradComm):
    """The chunked low-precision reduction with codec `codec` (encode per chunk, all_to_all, fp32 sum, all_gather)."""

    codec: str = "fp8_e4m3"

    @property
    def wire(self) -> str:  # type: ignore[override]
        return self.codec

    @property
    def underflow(self) -> Underflow:
        """The codec's own threshold, measured on the codec (`hooks.codec_underflow`), so any registered codec,
        a plugin's included, has one."""
        from commbench.training.hooks import codec_underflow

        return Underflow(self.codec, relative=codec_underflow(self.codec))

    def validate(self) -> None:
        from commbench.measure.codec import get_codec

        get_codec(self.codec)

    def hook(self) -> HookFn:
        from commbench.training.hooks import codec_hook

        return codec_hook(self.codec)

    def comm_bytes(self, *, psi: float, world_size: int, bucket_numels: Sequence[int] = ()) -> dict[str, float]:
        from commbench.training.hooks import codec_hook_bytes

        return codec_hook_bytes(self.codec, list(bucket_numels) or default_bucket_numels(psi), world_size)

    def notes(self) -> list[str]:
        return [f"codec: {self.codec} (commbench.measure.chunked)"]


ALL_REDUCE = AllReduceHook()


# --- loss scaling -----------------------------------------------------------------------------------


class LossScaling(ABC):
    """Whether and how the loss is scaled before backward."""

    scales: bool = False
    """True when the loss is scaled (fp16 underflow is guarded against)."""
    reduces_found_inf: bool = True
    """True when the skip decision agrees across ranks on sharded gradients."""

    @abstractmethod
    def make(self, device: torch.device) -> Any | None:
        """The scaler object for a step loop, or None."""

    def comm_bytes(self, *, world_size: int) -> dict[str, float]:
        """Bus bytes per step the scaler itself communicates."""
        return {}

    def pitfall(self, sharding: Sharding) -> str | None:
        """A warning when this scaler is wrong for `sharding`."""
        if not self.scales or self.reduces_found_inf or not sharding.shards_grads:
            return None
        return (
            f"plain {type(self).__name__} with {sharding.kind} sharded parameters: found-inf is not reduced "
            "across ranks; use ShardedGradScaler"
        )


@dataclass(frozen=True, slots=True)
class NoLossScaling(LossScaling):
    """No scaler."""

    def make(self, device: torch.device) -> None:
        return None


@dataclass(frozen=True, slots=True)
class GradScaling(LossScaling):
    """`torch.amp.GradScaler`: found-inf is local to each rank (right for replicated gradients only)."""

    scales: bool = True
    reduces_found_inf: bool = False

    def make(self, device: torch.device) -> Any:
        import torch

        return torch.amp.GradScaler(device.type)


@dataclass(frozen=True, slots=True)
class ShardedGradScaling(LossScaling):
    """`ShardedGradScaler`: all-reduces its one-element found-inf every step, so ranks skip together."""

    scales: bool = True
    reduces_found_inf: bool = True

    def make(self, device: torch.device) -> Any:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=device.type)

    def comm_bytes(self, *, world_size: int) -> dict[str, float]:
        out: dict[str, float] = {}
        _add(out, "all_reduce:float", bus_factor("all_reduce", world_size) * 4)
        return out


NO_SCALING = NoLossScaling()


# --- sharding ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class World:
    """What the byte formulas are asked about: Psi, the ranks and nodes, DDP's hook and the model's layout."""

    psi: float
    world_size: int
    grad_comm: GradComm = ALL_REDUCE
    layout: Layout = NO_LAYOUT
    nodes: int = 1


class Sharding(ABC):
    """How the model and its optimizer are replicated or sharded over the ranks."""

    kind: str
    """Short label for messages (ddp, fsdp1, fsdp2)."""
    shards_grads: bool
    """Gradients are sharded (a plain GradScaler's found-inf is then per rank)."""
    takes_hooks: bool
    """DDP comm hooks apply (a GradComm other than the all-reduce is accepted)."""

    parallelism: str = "dp"
    """What splits the work over the ranks, as reports group policies: "dp" (data parallel: DDP, FSDP, ZeRO, HSDP),
    "tp" (tensor parallel), "pp" (pipeline parallel), "tp+dp" / "pp+dp" for the 2-D layouts."""

    node_mesh: bool = False
    """Wraps on a (nodes x ranks-per-node) mesh: needs node-major rank order and as many ranks on every node."""

    def wrap(
        self,
        model: nn.Module,
        *,
        device: torch.device,
        lr: float,
        world_size: int,
        grad_comm: GradComm,
        nodes: int = 1,
    ) -> tuple[nn.Module, Any]:
        """(wrapped model, optimizer) for `model` already on `device`."""
        wrapped = self._wrap(model, device, World(0.0, world_size, grad_comm, nodes=nodes))
        return wrapped, self._optimizer(list(wrapped.parameters()), lr)

    @abstractmethod
    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        """`model` wrapped for `world` (its `psi` unused; `grad_comm` installed where the wrapper takes hooks)."""

    def _optimizer(self, params: list[Any], lr: float) -> Any:
        import torch

        return torch.optim.AdamW(params, lr=lr)

    def comm_bytes(
        self, *, psi: float, world_size: int, grad_comm: GradComm = ALL_REDUCE, layout: Layout = NO_LAYOUT, nodes: int = 1
    ) -> dict[str, float]:
        """Bus bytes per step by "op:dtype" on `world_size` ranks over `nodes` nodes. An empty `layout` means
        "from Psi alone"."""
        return self._comm_bytes(World(psi, world_size, grad_comm, layout, nodes)) if world_size > 1 else {}

    def comm_by_link(
        self, *, psi: float, world_size: int, grad_comm: GradComm = ALL_REDUCE, layout: Layout = NO_LAYOUT, nodes: int = 1
    ) -> dict[str, dict[str, float]]:
        """`comm_bytes` split by link: {INTRA: bytes of collectives whose group stays on one node, INTER: those
        whose group spans nodes}."""
        return self._comm_by_link(World(psi, world_size, grad_comm, layout, nodes))

    @abstractmethod
    def _comm_bytes(self, w: World) -> dict[str, float]:
        """`comm_bytes` on two ranks or more."""

    def _comm_by_link(self, w: World) -> dict[str, dict[str, float]]:
        """Here every collective runs on the whole world, so all of it crosses nodes as soon as there are two:
        a ring over the world is as slow as its inter-node edges."""
        total = self._comm_bytes(w) if w.world_size > 1 else {}
        return {INTRA: {}, INTER: total} if w.nodes > 1 else {INTRA: total, INTER: {}}

    @abstractmethod
    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        """Model-state bytes per rank at the step's peak."""

    def scaler_comm_bytes(self, loss_scaling: LossScaling, world_size: int) -> dict[str, float]:
        """Bus bytes per step the wrapper adds to a loss scaler's own (`LossScaling.comm_bytes`). Default: none."""
        return {}

    def configure(self, section: Any) -> Sharding:
        """The sharding a suite's `[training]` table asks for (`tp_degree`, `pp_degree`, `microbatches`): a
        model-parallel sharding returns a copy with its degrees set; a data-parallel one takes nothing from it."""
        return self

    def config_error(self, section: Any) -> str | None:
        """Why no world at all can run this sharding on the suite's `[training]` table (one line: heads that the
        given TP degree does not divide, more stages than layers), or None. Asked when the suite is loaded, so an
        impossible layout is an error before anything runs; what depends on the world is `layout_error`'s.
        Default: every table works."""
        return None

    def layout_error(self, world_size: int, nodes: int = 1) -> str | None:
        """Why `world_size` ranks on `nodes` nodes cannot form this sharding's layout (one line: a degree that does not
        divide the world, say), or None. Asked before the model is built: the runner skips the policy with the
        reason instead of running it. Default: every world works."""
        return None

    def bucket_numels(self, wrapped: nn.Module) -> list[int]:
        """DDP's bucket sizes of a wrapped model (elements), or [] where there are none."""
        return []

    def describe(self, model: nn.Module) -> tuple[UnitShape, ...]:
        """The units this sharding wraps `model` into (before wrapping), or () where it has none."""
        return ()

    def units(self, shapes: Sequence[UnitShape], world_size: int) -> list[FsdpUnit]:
        """The units as the formulas see them."""
        return []

    def describe_activations(self, model: nn.Module) -> tuple[tuple[str, int], ...]:
        """What a model-parallel sharding all-reduces per micro-batch token (`Layout.activations`), or ()."""
        return ()

    def data_ranks(self, rank: int, world_size: int) -> tuple[int, ...]:
        """The ranks whose synthetic batches `rank` trains on, concatenated: its own (data parallel), or those of
        its whole tensor-parallel group, so the group sees the tokens the data-parallel ranks it replaces see."""
        return (rank,)

    def replicated_grad(self, param: Any) -> bool:
        """`param`'s gradient is the same on every rank after communication (the grad-norm statistics then count
        it once over the ranks)."""
        return self.replicated_grads

    def counts_grad(self, param: Any, index: int) -> bool | None:
        """Whether this rank counts `param` (the `index`-th parameter with a gradient) in the gradient statistics,
        for gradients held alike by some ranks but not all (2-D layouts); None: decided by `replicated_grad`."""
        return None

    def replica_ranks(self, rank: int, world_size: int) -> tuple[int, ...]:
        """The ranks holding the same replicated gradients as `rank` (the grad-norm statistics split those tensors
        between them): the whole world, or a pipeline stage's data-parallel group."""
        return tuple(range(world_size))

    def reports_loss(self, rank: int, world_size: int) -> bool:
        """`rank` computes the step's loss (every rank, or a pipeline's last stage only): the reported loss is the
        mean over the ranks that do."""
        return True

    def layout_tokens(self, step_tokens: int) -> int:
        """`Layout.tokens` (one micro-batch's) from the tokens this rank's model computes per step: all of them,
        or a pipeline's step split into micro-batches."""
        return step_tokens

    def pipeline_step(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        scale: float,
        autocast: Callable[[], Any],
    ) -> torch.Tensor | None:
        """Run a step that is not the runner's forward/backward (a pipeline schedule: forward and backward of every
        micro-batch, the loss multiplied by `scale` before backward) and return its detached loss; None (the
        default): the runner's own forward, backward and loss scaler."""
        return None

    def step_profile(self, model: nn.Module, warmup: int) -> dict[str, Any]:
        """Record fields this sharding measures beyond the runner's (a pipeline's bubble and point-to-point time),
        after the steps, `warmup` first ones left out; collective over the world where not empty (every rank runs the
        same sharding). None here."""
        return {}

    def comm_dtype(self, grad_comm: GradComm) -> str:
        """Report name of the dtype the gradients are communicated in."""
        return grad_comm.wire

    def comm_underflow(self, grad_comm: GradComm) -> Underflow:
        """What the gradients' communication loses (DDP: the hook's format)."""
        return grad_comm.underflow

    def grad_dtype_names(self) -> tuple[str, ...]:
        """torch's names of the dtypes the gradients pass through in this wrapper's own arithmetic (beyond
        autocast and comm)."""
        return ()

    @property
    def replicated_grads(self) -> bool:
        """Every rank holds the same full gradients after communication."""
        return not self.shards_grads


@dataclass(frozen=True, slots=True)
class DDP(Sharding):
    """DistributedDataParallel with `gradient_as_bucket_view=True` and a Python comm hook; AdamW on every rank."""

    kind: str = "ddp"
    shards_grads: bool = False
    takes_hooks: bool = True

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        from commbench.cluster.launch import device_ids  # torch.distributed at module level: imported at use

        ddp = DistributedDataParallel(
            model,
            device_ids=device_ids(device),
            gradient_as_bucket_view=True,  # grads are views of the buckets: no second 4*Psi copy
        )
        world.grad_comm.register(ddp)
        return ddp

    def bucket_numels(self, wrapped: nn.Module) -> list[int]:
        data = wrapped._get_ddp_logging_data()  # type: ignore[operator]
        sizes = str(data.get("bucket_sizes", "")).replace(" ", "")
        return [int(s) // 4 for s in sizes.split(",") if s]  # bytes of fp32 buckets

    def _comm_bytes(self, w: World) -> dict[str, float]:
        out = w.grad_comm.comm_bytes(psi=w.psi, world_size=w.world_size, bucket_numels=w.layout.bucket_numels)
        for key, nbytes in w.layout.buffer_bytes.items():  # DDP re-broadcasts buffers from rank 0 every forward
            _add(out, f"broadcast:{key}", nbytes * bus_factor("broadcast", w.world_size))
        return out

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        return state.param_bytes * psi + state.grad_bytes * psi + state.optimizer_bytes * psi


@dataclass(frozen=True, slots=True)
class ZeRO1(DDP):
    """ZeRO-1 in torch: ZeroRedundancyOptimizer (optimizer state partitioned) over DDP."""

    def _optimizer(self, params: list[Any], lr: float) -> Any:
        import torch
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=lr)

    def _comm_bytes(self, w: World) -> dict[str, float]:
        out = DDP._comm_bytes(self, w)
        # each owner broadcasts its updated fp32 parameters
        _add(out, "broadcast:float", w.psi * 4 * bus_factor("broadcast", w.world_size))
        return out

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        return state.param_bytes * psi + state.grad_bytes * psi + state.optimizer_bytes * psi / world_size


@dataclass(frozen=True, slots=True)
class _Fsdp(Sharding, _GatherReduceDtypes):
    """What FSDP1 and FSDP2 share: mixed-precision dtypes, units, the all-gather/reduce-scatter formula."""

    param_dtype_name: str = FP32
    """torch's name of the dtype the parameters are all-gathered and computed in."""
    reduce_dtype_name: str = FP32
    """torch's name of the dtype of the gradient reduce-scatter."""
    reshard_after_forward: bool = True
    """Free the gathered parameters after forward (FULL_SHARD / ZeRO-3) or keep them (ZeRO-2)."""
    shards_grads: bool = True
    takes_hooks: bool = False


    @property
    def mixed(self) -> bool:
        """Mixed precision is on (BatchNorm then becomes its own fp32 unit)."""
        return self.param_dtype_name != FP32 or self.reduce_dtype_name != FP32

    def comm_dtype(self, grad_comm: GradComm) -> str:
        return SHORT[self.reduce_dtype_name]

    def comm_underflow(self, grad_comm: GradComm) -> Underflow:
        return DTYPE_UNDERFLOW[self.reduce_dtype_name]

    def grad_dtype_names(self) -> tuple[str, ...]:
        return (self.param_dtype_name,)

    def describe(self, model: nn.Module) -> tuple[UnitShape, ...]:
        return unit_shapes(model, self.mixed)

    @abstractmethod
    def shard_numel(self, shapes: Sequence[tuple[int, ...]], world_size: int) -> int:
        """Elements of one rank's shard of a unit with parameters of `shapes` (padding included)."""

    def units(self, shapes: Sequence[UnitShape], world_size: int) -> list[FsdpUnit]:
        """The units as the formulas see them (a unit without parameters is not wrapped)."""
        out = []
        for u in shapes:
            size = self.shard_numel(u.shapes, world_size)
            if size:
                pd, rd = (FP32, FP32) if u.keep_fp32 else (self.param_dtype_name, self.reduce_dtype_name)
                out.append(FsdpUnit(size, pd, rd, 2 if self.reshard_after_forward and not u.root else 1))
        return out

    def _comm_bytes(self, w: World) -> dict[str, float]:
        """Per unit: all_gather of the param-dtype shards (again for backward when resharded after
        forward; the root stays gathered) and a reduce-scatter in the reduce dtype. Without units, one
        resharded unit of Psi elements (the root's share of a large model is negligible)."""
        n = w.world_size
        ag, rs = bus_factor("all_gather", n), bus_factor("reduce_scatter", n)
        out: dict[str, float] = {}
        for u in self.units(w.layout.units or (UnitShape(((int(w.psi),),)),), n):
            _add(
                out,
                f"all_gather:{dtype_name(u.param_dtype_name)}",
                u.gathers * ag * n * u.shard_numel * u.param_dtype.itemsize,
            )
            _add(
                out,
                f"reduce_scatter:{dtype_name(u.reduce_dtype_name)}",
                rs * n * u.shard_numel * u.reduce_dtype.itemsize,
            )
        return out

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        """Gradients are set to None after each step, so the peak is the larger of two phases: the
        optimizer step (sharded P + G + K) and the end of forward (sharded P + K, plus the unsharded
        param-dtype copy ZeRO-2 keeps from forward to backward; FULL_SHARD's one or two gathered units
        in flight excluded)."""
        n = world_size
        optimizer_step = (state.param_bytes + state.grad_bytes + state.optimizer_bytes) * psi / n
        end_of_forward = (state.param_bytes + state.optimizer_bytes) * psi / n
        if not self.reshard_after_forward:
            end_of_forward += self.param_dtype.itemsize * psi
        return max(optimizer_step, end_of_forward)


@dataclass(frozen=True, slots=True)
class FSDP1(_Fsdp):
    """FullyShardedDataParallel: FULL_SHARD (ZeRO-3) or SHARD_GRAD_OP (ZeRO-2), `MixedPrecision`."""

    kind: str = "fsdp1"
    buffer_dtype_name: str | None = None
    """torch's name of the dtype of buffers (None keeps fp32)."""

    def shard_numel(self, shapes: Sequence[tuple[int, ...]], world_size: int) -> int:
        # one flat parameter per unit, padded to a multiple of n
        return -(-sum(_numel(s) for s in shapes) // world_size)

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        block_types = {type(b) for b in blocks(model)}
        mp = None
        if self.mixed or self.buffer_dtype_name:
            buffer_dtype = torch_dtype(self.buffer_dtype_name) if self.buffer_dtype_name else None
            mp = MixedPrecision(param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype, buffer_dtype=buffer_dtype)
        return FullyShardedDataParallel(
            model,
            device_id=device,
            auto_wrap_policy=ModuleWrapPolicy(block_types) if block_types else None,
            sharding_strategy=ShardingStrategy.FULL_SHARD
            if self.reshard_after_forward
            else ShardingStrategy.SHARD_GRAD_OP,
            mixed_precision=mp,
        )


@dataclass(frozen=True, slots=True)
class FSDP2(_Fsdp):
    """`fully_shard` per block then the root, `MixedPrecisionPolicy`, on a 1-D mesh of all ranks."""

    kind: str = "fsdp2"

    def shard_numel(self, shapes: Sequence[tuple[int, ...]], world_size: int) -> int:
        # every parameter sharded on dim 0, dim 0 padded to a multiple of n
        return sum(-(-s[0] // world_size) * (_numel(s) // max(s[0], 1)) for s in shapes if s)

    def _mesh(self, device: torch.device, world_size: int, nodes: int = 1) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device.type, (world_size,))

    def scaler_comm_bytes(self, loss_scaling: LossScaling, world_size: int) -> dict[str, float]:
        """DTensor's own found-inf all-reduce (`found_inf_reduce_handler` of `_amp_foreach_non_finite_check_and_unscale_`
        on sharded DTensor gradients): one fp32 element per step, beside the scaler's own."""
        out: dict[str, float] = {}
        if loss_scaling.scales:
            _add(out, "all_reduce:float", bus_factor("all_reduce", world_size) * 4)
        return out

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = self._mesh(device, world.world_size, world.nodes)
        mp = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype)
        # None = FSDP2's default: reshard blocks after forward, keep the root gathered (the formula assumes it).
        reshard = None if self.reshard_after_forward else False
        if self.mixed:
            # BatchNorm kept in fp32 as its own unit, as FSDP1's MixedPrecision does by default
            # (`_module_classes_to_ignore`); its inputs are cast to fp32 on the way in.
            fp32 = torch_dtype(FP32)
            keep = MixedPrecisionPolicy(param_dtype=fp32, reduce_dtype=fp32)
            for bn in batchnorms(model):
                fully_shard(bn, mesh=mesh, mp_policy=keep, reshard_after_forward=reshard)
        for block in blocks(model):
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        return model


@dataclass(frozen=True, slots=True)
class HSDP(FSDP2):
    """FSDP2 on a 2-D mesh (replicate across nodes, shard within a node): parameters are all-gathered and
    gradients reduce-scattered inside a node, then each rank's gradient shard is all-reduced with the ranks
    of the same local index on the other nodes (`foreach_reduce`'s `all_reduce_group`). Only that all-reduce
    crosses nodes: 2(r-1)/r of a shard in the reduce dtype per unit, r = nodes. On one node it is FSDP2."""

    kind: str = "hsdp"
    node_mesh: bool = True

    @staticmethod
    def split(world_size: int, nodes: int) -> tuple[int, int]:
        """(replicas, ranks per shard group) = (nodes, ranks per node); ValueError when the nodes differ."""
        if nodes < 1 or world_size % nodes:
            raise ValueError(f"HSDP needs the same number of ranks on every node: {world_size} ranks on {nodes} nodes")
        return nodes, world_size // nodes

    def _mesh(self, device: torch.device, world_size: int, nodes: int = 1) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        # init_device_mesh lays ranks out row-major: row i = ranks i*g .. i*g+g-1, one node (node-major ranks,
        # as torchrun, srun and mpirun's by-node defaults number them; the runner checks it).
        return init_device_mesh(device.type, self.split(world_size, nodes), mesh_dim_names=("replicate", "shard"))

    def _comm_by_link(self, w: World) -> dict[str, dict[str, float]]:
        r, g = self.split(w.world_size, w.nodes)
        intra = _Fsdp._comm_bytes(self, World(w.psi, g, layout=w.layout)) if g > 1 else {}
        inter: dict[str, float] = {}
        ar = bus_factor("all_reduce", r)
        for u in self.units(w.layout.units or (UnitShape(((int(w.psi),),)),), g):
            _add(inter, f"all_reduce:{dtype_name(u.reduce_dtype_name)}", ar * u.shard_numel * u.reduce_dtype.itemsize)
        if r == 1:  # one node: the replicate group is that node's own ranks
            intra, inter = merge_bytes(intra, inter), {}
        return {INTRA: intra, INTER: inter}

    def _comm_bytes(self, w: World) -> dict[str, float]:
        return merge_bytes(*self._comm_by_link(w).values())

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        """FSDP2's figure with the model sharded over one node's ranks (every node keeps a full copy)."""
        return FSDP2.state_bytes(self, psi=psi, world_size=self.split(world_size, nodes)[1], state=state)


def autocast(dtype: torch.dtype | None, device: torch.device) -> Any:
    """The autocast context for a compute dtype (None: no autocast)."""
    if dtype is None:
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device.type, dtype=dtype)


__all__ = [
    "ADAM_FP32", "ALL_REDUCE", "DDP", "FSDP1", "FSDP2", "NO_SCALING", "AllReduceHook", "CastHook", "CodecHook",
    "DTYPE_UNDERFLOW", "FsdpUnit", "GradComm", "GradScaling", "HSDP", "INTER", "INTRA", "Layout", "LossScaling",
    "ModelState", "NO_LAYOUT", "NoLossScaling", "ShardedGradScaling", "Sharding", "Underflow", "UnitShape", "ZeRO1",
    "default_bucket_numels", "merge_bytes", "unit_shapes",
]  # fmt: skip
