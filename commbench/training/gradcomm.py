"""Gradient communication of DDP policies (`GradComm`): torch's all-reduce hook, a cast hook, a chunked-codec
hook; each registers itself on a DDP model and states its bus bytes per step (see `strategies`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from commbench.measure.precision import torch_dtype
from commbench.training.comm import bus_factor
from commbench.training.layouts import BF16, DTYPE_UNDERFLOW, SHORT, Underflow, add_bytes, default_bucket_numels

if TYPE_CHECKING:
    import torch

    from commbench.training.hooks import HookFn

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
        add_bytes(out, "all_reduce:float", bus_factor("all_reduce", world_size) * psi * 4)
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
