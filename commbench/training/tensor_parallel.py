"""Tensor parallelism (Megatron-LM style, no sequence parallelism) on the GPT, with torch's own
`torch.distributed.tensor.parallel`, as a `Sharding` and its policies.

Per block, over a 1-D `DeviceMesh` of the TP group: `attn.qkv` and `fc` column-wise (`ColwiseParallel`), `attn.proj`
and `out` row-wise (`RowwiseParallel`); embeddings, LayerNorms and the head stay plain replicated tensors. The fused
qkv Linear is sharded by heads: before `parallelize_module` its rows are reordered so that rank r's contiguous
block of 3h/tp rows is [q, k, v] of heads r*H/tp .. (r+1)*H/tp - 1 (torch's Colwise on the fused weight would give
rank 0 all of q and part of k), and each attention module computes with `n_heads / tp` heads.

Bytes (Narayanan et al. 2021, section 3.1; Korthikanti et al. 2022, section 4.2.2), per layer per micro-batch of b
samples of s tokens, hidden size h, no sequence parallelism: the two row-wise Linears all-reduce their b*s*h partial
outputs in the forward, the two column-wise ones all-reduce the b*s*h gradients of their replicated input in the
backward: 4 all-reduces of b*s*h elements, the forward ones in the activation dtype (bf16 under autocast), the
backward ones in the dtype of the column-wise Linear's input (what the LayerNorm before it returns: fp32 under CPU
autocast, so on CPU the backward all-reduces stay fp32). Nothing else is communicated: the replicated parameters'
gradients are identical on every rank (their inputs and incoming gradients are the all-reduced, replicated ones),
and the row-wise biases' gradients come from the replicated output gradient. The counter in `comm.py` sees these
all-reduces at `torch.distributed._functional_collectives`, where DTensor issues them.

Data: a TP group computes one micro-batch together, so its ranks must see the same batch. Each rank trains on the
batches of every rank of its TP group, concatenated (`data_ranks`): the group sees the global tokens the
data-parallel ranks it replaces would see, so with TP over the whole world the loss and gradients are those of
the fp32 DDP baseline's global batch, and drift against it is meaningful.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from commbench.training.comm import bus_factor, dtype_name
from commbench.training.policies import Policy, register_policy
from commbench.training.strategies import (
    ADAM_FP32,
    BF16,
    DTYPE_UNDERFLOW,
    FP32,
    SHORT,
    GradComm,
    ModelState,
    Sharding,
    Underflow,
    World,
    blocks,
)

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

COLWISE, ROWWISE = "colwise", "rowwise"

BLOCK_PLAN: tuple[tuple[str, str], ...] = (
    ("attn.qkv", COLWISE),
    ("attn.proj", ROWWISE),
    ("fc", COLWISE),
    ("out", ROWWISE),
)
"""The GPT block's Linears (`nets.Block`) and how each is split."""


def _sub(module: nn.Module, path: str) -> Any:
    for part in path.split("."):
        module = getattr(module, part, None)  # type: ignore[assignment]
        if module is None:
            return None
    return module


def check_layout(model: nn.Module, tp: int) -> None:
    """ValueError (one line) when `model` cannot be split over `tp` ranks: not the GPT, or heads not divisible."""
    bs = blocks(model)
    if not bs or any(_sub(b, path) is None for b in bs for path, _ in BLOCK_PLAN):
        raise ValueError(
            f"tensor parallelism needs the gpt model (blocks with {', '.join(p for p, _ in BLOCK_PLAN)}); "
            f"got {type(model).__name__}"
        )
    heads = int(_sub(bs[0], "attn").n_heads)
    if heads % tp:
        raise ValueError(f"tensor parallelism over {tp} ranks needs n_heads divisible by {tp}; n_heads={heads}")


def _order_qkv_by_heads(qkv: nn.Linear, tp: int) -> None:
    """Reorder the fused [q; k; v] rows so that rank r's contiguous 3h/tp rows are its heads' q, k and v."""
    import torch

    h = qkv.out_features // 3
    per = h // tp
    order = torch.cat(
        [torch.arange(j * h + r * per, j * h + (r + 1) * per) for r in range(tp) for j in range(3)]
    ).to(qkv.weight.device)
    with torch.no_grad():
        qkv.weight.copy_(qkv.weight[order])
        if qkv.bias is not None:
            qkv.bias.copy_(qkv.bias[order])


@dataclass(frozen=True, slots=True)
class TensorParallel(Sharding):
    """Megatron-style tensor parallelism over the whole world (one TP group), AdamW on every rank's shards.

    `act_dtype_name` is the dtype the forward's activations are all-reduced in (the policy's autocast dtype);
    `grad_dtype_name` that of the backward's input gradients (the column-wise Linears' input dtype)."""

    kind: str = "tp"
    parallelism: str = "tp"
    shards_grads: bool = True
    takes_hooks: bool = False
    act_dtype_name: str = FP32
    grad_dtype_name: str = FP32

    def degree(self, world_size: int) -> int:
        """Ranks of one TP group (here the whole world: 2-D TP x DP is not built yet)."""
        return world_size

    def data_ranks(self, rank: int, world_size: int) -> tuple[int, ...]:
        tp = self.degree(world_size)
        first = rank // tp * tp
        return tuple(range(first, first + tp))

    def replicated_grad(self, param: Any) -> bool:
        from torch.distributed.tensor import DTensor, Replicate

        if isinstance(param, DTensor):
            return all(isinstance(p, Replicate) for p in param.placements)
        return True

    def describe_activations(self, model: nn.Module) -> tuple[tuple[str, int], ...]:
        """Per parallelised Linear (style, features of the replicated activation it all-reduces): a row-wise
        Linear's output, a column-wise Linear's input."""
        out: list[tuple[str, int]] = []
        for b in blocks(model):
            for path, style in BLOCK_PLAN:
                lin = _sub(b, path)
                out.append((style, int(lin.out_features if style == ROWWISE else lin.in_features)))
        return tuple(out)

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        tp = self.degree(world.world_size)
        check_layout(model, tp)
        mesh = init_device_mesh(device.type, (tp,), mesh_dim_names=("tp",))
        styles = {COLWISE: ColwiseParallel, ROWWISE: RowwiseParallel}
        for b in blocks(model):
            attn = _sub(b, "attn")
            _order_qkv_by_heads(attn.qkv, tp)
            attn.n_heads = attn.n_heads // tp
            parallelize_module(b, mesh, {path: styles[style]() for path, style in BLOCK_PLAN})
        return model

    def _optimizer(self, params: list[Any], lr: float) -> Any:
        import torch

        # DTensor shards and plain replicated tensors in one group: the per-tensor loop, not the foreach kernels
        # (which need all tensors of one kind).
        return torch.optim.AdamW(params, lr=lr, foreach=False)

    def _comm_bytes(self, w: World) -> dict[str, float]:
        """4 all-reduces of b*s*h per layer per micro-batch (module docstring), from `Layout.activations`;
        without a layout (a plan for a model never built) nothing can be said: {}."""
        from commbench.measure.precision import torch_dtype

        tp = self.degree(w.world_size)
        ar = bus_factor("all_reduce", tp)
        out: dict[str, float] = {}
        for style, features in w.layout.activations:
            dt = self.act_dtype_name if style == ROWWISE else self.grad_dtype_name
            key = f"all_reduce:{dtype_name(dt)}"
            out[key] = out.get(key, 0.0) + ar * w.layout.tokens * features * torch_dtype(dt).itemsize
        return {k: v for k, v in out.items() if v}

    def comm_dtype(self, grad_comm: GradComm) -> str:
        return SHORT[self.act_dtype_name]

    def comm_underflow(self, grad_comm: GradComm) -> Underflow:
        # The gradients of the parameters are never communicated; the input gradients are, in grad_dtype.
        return DTYPE_UNDERFLOW[self.grad_dtype_name]

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        """Psi/tp of the ZeRO figure: exact for the block Linears (sharded over the TP ranks), an under-estimate
        by the replicated embeddings, LayerNorms and head (which every rank keeps whole: Psi alone cannot say how
        much of it they are)."""
        return (state.param_bytes + state.grad_bytes + state.optimizer_bytes) * psi / self.degree(world_size)


_POLICIES = (
    Policy(
        name="tp_fp32",
        family="tp",
        description="tensor parallel over all ranks (Megatron column/row Linears), fp32; activations all-reduced fp32",
        sharding=TensorParallel(),
    ),
    Policy(
        name="tp_bf16",
        family="tp",
        description="tensor parallel over all ranks, autocast bf16: forward activations all-reduced in bf16",
        sharding=TensorParallel(act_dtype_name=BF16, grad_dtype_name=FP32),
        autocast_name=BF16,
        reference="tp_fp32",
    ),
)
for _p in _POLICIES:
    register_policy(_p)
