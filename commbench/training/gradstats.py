"""The gradient statistics of a step, after its clock stopped: global norm, non-finite elements, underflow fraction.

underflow_frac: fraction of the gradient elements (after communication, multiplied back by the GradScaler scale
when there is one, i.e. as the low-precision arithmetic saw them) whose magnitude is at most half the smallest
subnormal of the lowest precision the gradient went through (`Policy.underflow`, the largest threshold of its
stages): the values a cast to that precision rounds to zero, exact zeros included. For a codec the threshold is
relative to the gradient's amax, measured on the codec (`hooks.codec_underflow`; fp8 e4m3 with per-tensor scaling:
amax / 448 * 2**-10). The fp32 baseline's figure is its fraction of exact zeros, the floor the pitfall detector
compares against.

Each rank computes the sums over its share of the gradients (`GradStats.share`) and the sums are all-reduced once
at the end of the policy, so the statistics add no collective to a step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from commbench.training.policies import Policy
from commbench.training.strategies import Underflow


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    out = []
    for p in model.parameters():
        g = p.grad
        if g is None:
            continue
        out.append(g._local_tensor if hasattr(g, "_local_tensor") else g)
    return out


def grad_dtypes(model: nn.Module) -> set[tuple[torch.dtype, torch.dtype]]:
    pairs = set()
    for p in model.parameters():
        if p.grad is not None:
            pairs.add((p.dtype, p.grad.dtype))
    return pairs


def underflow_threshold(low: Underflow, grads: list[torch.Tensor]) -> torch.Tensor | float:
    absolute, relative = low.absolute, low.relative
    if not relative:
        return absolute
    amax = max((g.detach().abs().max() for g in grads if g.numel()), default=torch.tensor(0.0))
    return (amax.double() * relative).clamp(min=absolute)  # lost in either stage: the larger threshold


class BNInspector:
    """Forward pre-hooks on BatchNorm modules: records the input and running-stat dtypes of one step."""

    def __init__(self, model: nn.Module) -> None:
        self.seen: set[tuple[str, str]] = set()
        self.handles = [
            m.register_forward_pre_hook(self._hook)
            for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
        ]

    def _hook(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0] if args else None
        in_dt = str(x.dtype).removeprefix("torch.") if isinstance(x, torch.Tensor) else "?"
        rm = getattr(module, "running_mean", None)
        buf_dt = str(rm.dtype).removeprefix("torch.") if isinstance(rm, torch.Tensor) else "none"
        self.seen.add((in_dt, buf_dt))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

class GradStats:
    """One policy's gradient statistics on this rank: which gradients it sums (`share`) and the per-step sums."""

    def __init__(self, policy: Policy, model: nn.Module, rank: int, n: int, device: torch.device) -> None:
        self.policy, self.model, self.rank, self.n, self.device = policy, model, rank, n, device
        self.dtype_pairs: set[tuple[torch.dtype, torch.dtype]] = set()
        self._share: list[int] | None = None

    def share(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's part of the gradient tensors for the statistics.

        Sharded gradients: all of its (local) shards. Replicated gradients (DDP, ZeRO-1; tensor parallelism's
        replicated parameters: `Sharding.replicated_grad`) are identical on every rank, so the ranks split those
        tensors between them (greedy by size, the same split
        everywhere) and the sums add up across ranks: each rank does 1/n of the work.
        """
        if self.n == 1:
            return grads
        if self._share is None:
            sharding = self.policy.sharding
            with_grad = [p for p in self.model.parameters() if p.grad is not None]
            replicated = [sharding.replicated_grad(p) for p in with_grad]
            counted = [sharding.counts_grad(p, i) for i, p in enumerate(with_grad)]  # held alike by some ranks
            # split among the ranks that hold the same replicas (the world; a pipeline stage's data-parallel group)
            load = dict.fromkeys(sharding.replica_ranks(self.rank, self.n), 0)
            owner = [self.rank] * len(grads)  # a shard is this rank's own
            for i in sorted(range(len(grads)), key=lambda i: -grads[i].numel()):
                if counted[i] is not None:
                    owner[i] = self.rank if counted[i] else -1
                elif replicated[i]:
                    r = min(load, key=load.__getitem__)  # the first least-loaded rank
                    owner[i] = r
                    load[r] += grads[i].numel()
            self._share = [i for i, r in enumerate(owner) if r == self.rank]
        return [grads[i] for i in self._share]

    def step(self, loss: torch.Tensor, scale: float) -> torch.Tensor:
        grads = self.share(grads_of(self.model))
        self.dtype_pairs |= grad_dtypes(self.model)
        low = self.policy.underflow
        dev = self.device
        with torch.no_grad():
            if grads:
                # One fused pass for the norms; a non-finite element makes its tensor's norm non-finite.
                norms = torch.stack(torch._foreach_norm(grads)).double()
                sumsq = norms.pow(2).sum()
                nonfin = (~torch.isfinite(norms)).any().double()
            else:
                sumsq = nonfin = torch.zeros((), dtype=torch.float64, device=dev)
            under = torch.zeros((), dtype=torch.float64, device=dev)
            thr = underflow_threshold(low, grads)
            if isinstance(thr, float) and thr == 0.0:
                for g in grads:  # fp32 itself: only exact zeros (counted without a temporary)
                    under += g.numel() - torch.count_nonzero(g)
            else:
                for g in grads:
                    # |g * scale| <= thr, with the threshold scaled once instead of every element
                    under += torch.count_nonzero(torch.abs(g).le_(thr / scale))
            count = float(sum(g.numel() for g in grads))
            # a pipeline's loss lives on its last stage: the reported loss is the mean over the ranks that have one
            has_loss = 1.0 if self.policy.sharding.reports_loss(self.rank, self.n) else 0.0
            return torch.stack(
                [loss.double().reshape(()).to(dev) * has_loss, sumsq, under,
                 torch.tensor(count, dtype=torch.float64, device=dev), nonfin,
                 torch.tensor(has_loss, dtype=torch.float64, device=dev)]
            )  # fmt: skip
