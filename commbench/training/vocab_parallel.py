"""The vocabulary-parallel embedding, head and loss of the `tp_vocab_fp32` policy (`tensor_parallel.py`), as
Megatron-LM's VocabParallelEmbedding / parallel cross-entropy and torchtitan's `parallelize_llama` do them with
torch's own styles:

- the token embedding sharded along the vocabulary: `RowwiseParallel(input_layouts=Replicate())` on `nn.Embedding`
  (each rank looks up its rows, the others' tokens give zeros), its output all-reduced in the forward, b*s*h
  elements; nothing in the backward (the input is token indices; DTensor computes the weight's gradient whole on
  every rank, which a hook cuts to the rank's rows, `_shard_grad`);
- the head column-parallel with `output_layouts=Shard(-1), use_local_output=False`: each rank's logits are its
  slice of the vocabulary (a DTensor), nothing in the forward; its replicated input's gradient all-reduced in the
  backward, b*s*h elements;
- the cross-entropy under `torch.distributed.tensor.parallel.loss_parallel()`: log-softmax all-reduces the row
  maxima and the sums of exponentials, nll_loss the target logits (each rank holds the target's logit or zero),
  b*s fp32 elements each, all in the forward; the backward is local. Full logits are never gathered.

All in fp32 (the embedding's output, ln_f's output and the fp32 loss). The position embedding stays replicated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

VOCAB_EMB, VOCAB_HEAD, VOCAB_LOSS = "vocab_emb", "vocab_head", "vocab_loss"
"""`Layout.activations` entries of the vocabulary-parallel policy: the token embedding's forward all-reduce, the
head's input-gradient all-reduce and loss_parallel's three all-reduces per token (priced in `tensor_parallel.py`)."""
LOSS_ALL_REDUCES = 3
"""loss_parallel's all-reduces per token in the forward: max, sum of exponentials, target logit
(`torch/distributed/tensor/parallel/loss.py`: `_log_softmax`, `_nll_loss_forward`)."""


def vocab_activations(model: nn.Module) -> tuple[tuple[str, int], ...]:
    """`Layout.activations` entries (features per token) of the vocabulary-parallel collectives."""
    tok: Any = model.tok
    width = int(tok.embedding_dim)
    return ((VOCAB_EMB, width), (VOCAB_HEAD, width), (VOCAB_LOSS, LOSS_ALL_REDUCES))


def vocab_error(vocab: int, tp: int) -> str | None:
    """A vocabulary that `tp` ranks cannot split evenly, or None."""
    if vocab % tp:
        return f"the vocabulary-parallel policy needs vocab divisible by the TP degree {tp}; vocab={vocab}"
    return None


def parallelize_vocab(model: nn.Module, mesh: Any) -> None:
    """Shard `model.tok` and `model.head` along the vocabulary over the 1-D TP `mesh`."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tok: Any = model.tok
    vocab = int(tok.num_embeddings)
    reason = vocab_error(vocab, mesh.size())
    if reason:
        raise ValueError(reason)
    plan = {
        "tok": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    }
    parallelize_module(model, mesh, plan)
    tok.weight.register_post_accumulate_grad_hook(_shard_grad)


def _shard_grad(param: Any) -> None:
    """DTensor's embedding backward (replicated output gradient and indices) gives every rank the whole, replicated
    vocabulary gradient: keep this rank's rows only, as the parameter is sharded (a local slice, no collective), so
    that the gradient, its memory and its statistics are the shard's."""
    if param.grad is not None and param.grad.placements != param.placements:
        param.grad = param.grad.redistribute(param.device_mesh, param.placements)


def vocab_parallel_step(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    scale: float,
    autocast: Callable[[], Any],
    scaler: Any = None,
) -> torch.Tensor:
    """Forward, the mean cross-entropy on the vocabulary-sharded logits and backward (the loss times `scale`, and
    the scaler's scale if any), both under `loss_parallel`; returns the detached loss (a plain tensor)."""
    import torch.nn.functional as F
    from torch.distributed.tensor.parallel import loss_parallel

    with autocast():
        logits = model(x)
    with loss_parallel():
        loss: Any = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        scaled = loss * scale
        (scaler.scale(scaled) if scaler is not None else scaled).backward()
    return loss.full_tensor().detach()
