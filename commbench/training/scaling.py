"""Loss scaling of a policy (`LossScaling`): none, torch's GradScaler, FSDP's ShardedGradScaler (see `strategies`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from commbench.training.comm import bus_factor
from commbench.training.layouts import add_bytes

if TYPE_CHECKING:
    import torch


class Sharded(Protocol):
    """What a scaler asks of a sharding (`sharding.Sharding` answers it; not imported here: it imports us)."""

    kind: str
    shards_grads: bool


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

    def pitfall(self, sharding: Sharded) -> str | None:
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
        add_bytes(out, "all_reduce:float", bus_factor("all_reduce", world_size) * 4)
        return out


NO_SCALING = NoLossScaling()
