"""The reference every model-parallel test compares with: the unsplit model (same seed, so the same weights) on
the batches of every rank together, one forward and backward in the model's own precision."""

from __future__ import annotations

from typing import Any


def unsplit_reference(sec: Any, n: int) -> tuple[Any, float, float]:
    """`(model, loss, grad_norm)` of the unsplit model of `sec` (a `TrainingConfig`) over the `n` ranks' batches
    of step 0; the gradient norm summed in float64. The model keeps its gradients for per-parameter checks."""
    import torch

    from commbench.training.models import build_model, loss_fn, make_batch

    model = build_model(sec)
    xs, ys = zip(*(make_batch(sec, r, 0, torch.device("cpu")) for r in range(n)), strict=True)
    loss = loss_fn(model(torch.cat(xs)), torch.cat(ys))
    loss.backward()
    grad_norm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())))
    return model, float(loss.detach()), grad_norm
