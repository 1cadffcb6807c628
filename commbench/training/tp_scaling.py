"""Loss scaling under tensor parallelism (`TPGradScaling`): torch's `ShardedGradScaler` on gradients that mix DTensor
shards and plain replicated tensors.

Under 1-D TP the block Linears' gradients are DTensor shards and the embeddings', norms' and head's are plain tensors
(`tensor_parallel.py`). torch's scalers hand all gradients of one device and dtype to one
`_amp_foreach_non_finite_check_and_unscale_` call, which DTensor refuses for a mix of DTensors and plain tensors
("got mixed torch.Tensor and DTensor"). Here each gradient is unscaled through its local tensor (a DTensor's shard is
its `_local_tensor`, unscaled in place), and the found-inf flag, which differs between TP ranks because their shards
differ, is then all-reduced over the scaler's group (the world) by `ShardedGradScaler.unscale_` itself, so every
rank skips or steps together: one fp32 element per step, `ShardedGradScaling.comm_bytes`.

Imported only when a TP policy with a scaler makes its scaler (it imports torch there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from commbench.training.scaling import ShardedGradScaling

if TYPE_CHECKING:
    import torch


def _tp_grad_scaler(device: torch.device) -> Any:
    import torch
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from torch.distributed.tensor import DTensor

    class TPGradScaler(ShardedGradScaler):
        """`ShardedGradScaler` unscaling each gradient through its local tensor (module docstring)."""

        def _unscale_grads_(
            self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor,
            allow_fp16: bool = True,
        ) -> dict[torch.device, torch.Tensor]:  # fmt: skip
            groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is None:
                        continue
                    local = g._local_tensor if isinstance(g, DTensor) else g
                    if not allow_fp16 and local.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    groups.setdefault((local.device, local.dtype), []).append(local)
            found: dict[torch.device, torch.Tensor] = {}
            with torch.no_grad():
                for (dev, _), grads in groups.items():
                    if dev not in found:
                        found[dev] = found_inf if found_inf.device == dev else found_inf.to(dev)
                    torch._amp_foreach_non_finite_check_and_unscale_(grads, found[dev], inv_scale.to(dev))
            return found or {found_inf.device: found_inf}

    return TPGradScaler(device=device.type)


@dataclass(frozen=True, slots=True)
class TPGradScaling(ShardedGradScaling):
    """`ShardedGradScaler` for TP's mixed DTensor and plain gradients (module docstring); its bytes are
    `ShardedGradScaling`'s (the found-inf all-reduce)."""

    def make(self, device: torch.device) -> Any:
        return _tp_grad_scaler(device)
