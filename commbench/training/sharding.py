"""The `Sharding` contract every layout answers (wrap, optimizer, comm bytes by link, state bytes, layout errors,
pipeline hooks), the `World` its formulas are asked about, and the autocast context (see `strategies`)."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from commbench.training.gradcomm import ALL_REDUCE, GradComm
from commbench.training.layouts import (
    ADAM_FP32,
    DTYPE_UNDERFLOW,
    INTER,
    INTRA,
    NO_LAYOUT,
    FsdpUnit,
    Layout,
    ModelState,
    Underflow,
    UnitShape,
)
from commbench.training.scaling import LossScaling

if TYPE_CHECKING:
    import torch
    import torch.nn as nn


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

    def environment_error(self, device: torch.device) -> str | None:
        """Why this installation or this rank's `device` cannot run this sharding (one line: an optional package
        missing, a GPU too old), or None. Asked before the model is built, after `layout_error`; the runner agrees
        the answer across ranks and skips the policy with it. Default: everywhere."""
        return None

    def after_optimizer_step(self, model: nn.Module) -> None:
        """What the wrapped `model` needs after every optimizer step, inside the step (torchao's float8 scales for
        the next all-gathers). Default: nothing."""
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
        scaler: Any = None,
    ) -> torch.Tensor | None:
        """Run a step that is not the runner's forward/backward (a pipeline schedule: forward and backward of every
        micro-batch, the loss multiplied by `scale` and by the `scaler`'s scale, if any, before backward; the runner
        then steps through the scaler) and return its detached loss; None (the default): the runner's own forward,
        backward and loss scaler."""
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

    def grad_underflows(self) -> tuple[Underflow, ...]:
        """What the gradients lose in this wrapper's own arithmetic: a cast to each of `grad_dtype_names`, and
        whatever else the wrapper computes in (a scaled float8 cast)."""
        return tuple(DTYPE_UNDERFLOW[d] for d in self.grad_dtype_names())

    @property
    def replicated_grads(self) -> bool:
        """Every rank holds the same full gradients after communication."""
        return not self.shards_grads


def autocast(dtype: torch.dtype | None, device: torch.device) -> Any:
    """The autocast context for a compute dtype (None: no autocast)."""
    if dtype is None:
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device.type, dtype=dtype)
