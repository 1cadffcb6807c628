"""Tensor parallelism (Megatron-LM style) on the GPT, with torch's own `torch.distributed.tensor.parallel`, as a
`Sharding` and its policies: plain, sequence parallel (SP), with commbench-chosen communication precision (a cast
or an fp8 codec, `tp_styles.py`), and 2-D TP x DP (FSDP2 over the data-parallel dimension of the mesh).

Policies: tp_fp32; tp_bf16 (autocast bf16); tp_bf16comm (fp32 compute, TP collectives cast to bf16); tp_sp_fp32,
tp_sp_bf16 (SP); tp_sp_fp8 (SP, the norm outputs all-gathered as fp8 e4m3 codes + scales, the rest bf16);
tp_dp_fp32, tp_dp_bf16 (2-D); tp_fp16 (autocast fp16 + a ShardedGradScaler on the shards, `tp_scaling.py`);
tp_fp8comm (fp32 compute, the row-wise outputs' all-reduces through the fp8 e4m3 codec, the rest bf16);
tp_vocab_fp32 (tp_fp32 plus a vocabulary-parallel embedding, head and loss, `vocab_parallel.py`).

Per block, over the TP dimension of a `DeviceMesh`: `attn.qkv` and `fc` column-wise, `attn.proj` and `out` row-wise;
with SP also the two LayerNorms (`SequenceParallel`): between the column/row pairs the residual stream is split
over the ranks along the sequence. Embeddings, the final LayerNorm and the head stay plain replicated tensors
(`tp_vocab_fp32`: the token embedding and head sharded along the vocabulary, `vocab_parallel.py`). The
fused qkv Linear is sharded by heads: before `parallelize_module` its rows are reordered so that rank r's contiguous
block of 3h/tp rows is [q, k, v] of heads r*H/tp .. (r+1)*H/tp - 1 (torch's Colwise on the fused weight would give
rank 0 all of q and part of k), and each attention module computes with `n_heads / tp` heads.

Bytes (Narayanan et al. 2021, section 3.1; Korthikanti et al. 2022, section 4.2.2), per layer per micro-batch of b
samples of s tokens, hidden size h:
- without SP, 4 all-reduces of b*s*h elements: the two row-wise Linears all-reduce their partial outputs in the
  forward (in the activation dtype: bf16 under autocast), the two column-wise ones the gradients of their replicated
  input in the backward (in that input's dtype: what the LayerNorm before it returns, fp32 under CPU autocast);
- with SP the same volume as all-gathers and reduce-scatters: each column-wise input is all-gathered along the
  sequence (forward) and its gradient reduce-scattered (backward); each row-wise output reduce-scattered (forward)
  and its gradient all-gathered (backward). Besides, once per micro-batch, the region's entry all-gathers the
  residual stream's gradient (backward) and its exit the stream itself (forward), b*s*h each, fp32; and the SP
  LayerNorms' weight and bias gradients are partial sums over the ranks' tokens, all-reduced once per step
  (`tp_styles.reduce_norm_grads`, Megatron's layernorm all-reduce), 4h fp32 elements per layer;
- a wire cast (`comm_cast_name`) moves every activation collective in that dtype; a gather codec moves the
  column-wise inputs' forward all-gathers as the codec's wire bytes (uint8 codes + scales of each rank's b*s*h/tp
  slice, `Codec.wire_bytes`); a reduce codec (no SP) moves the row-wise outputs' forward all-reduces as the
  fp8_hook does (`hooks.codec_hook_bytes`: all_to_all of tp chunks of ceil(b*s*h/tp) elements as codes and,
  apart, fp32 scales, fp32 sum, re-encode, all_gather of the same);
- vocabulary parallel (`tp_vocab_fp32`): the token embedding's forward all-reduce and the head's input-gradient
  all-reduce, b*s*h fp32 elements each, and loss_parallel's three forward all-reduces of b*s fp32 elements;
- a loss scaler (`tp_fp16`) adds its found-inf all-reduce, one fp32 element per step (`tp_scaling.py`);
- 2-D (`dp` set): the TP part on each TP group (tokens: the group's micro-batch), plus FSDP2's all-gathers and
  reduce-scatters on each data-parallel group over the TP-local parameters (Psi/tp per rank: `describe` gives the
  units with TP-local shapes), split by link class with the groups' own node layout.
Nothing else is communicated in 1-D TP: the replicated parameters' gradients are identical on every rank. The
counter in `comm.py` sees the TP collectives at `torch.distributed._functional_collectives`, where DTensor and
`tp_styles` issue them.

Data: a TP group computes one micro-batch together, so its ranks must see the same batch. Each rank trains on the
batches of every rank of its TP group, concatenated (`data_ranks`): the group sees the global tokens the
data-parallel ranks it replaces would see, so the loss and gradients are those of the fp32 DDP baseline's global
batch (in 2-D, FSDP2 averages the TP groups' gradients), and drift against it is meaningful.

Degrees: the suite's `tp_degree` (`configure`); 0 is the whole world for the 1-D policies and half of it (two
data-parallel groups) for the 2-D ones. A world that cannot form the layout skips the policy with one line
(`layout_error`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from commbench.training.comm import bus_factor, dtype_name
from commbench.training.policies import Policy, register_policy
from commbench.training.strategies import (
    ADAM_FP32,
    BF16,
    DTYPE_UNDERFLOW,
    FP16,
    FP32,
    FSDP2,
    INTER,
    INTRA,
    SHORT,
    GradComm,
    Layout,
    ModelState,
    Sharding,
    Underflow,
    UnitShape,
    World,
    blocks,
    merge_bytes,
)
from commbench.training.tp_scaling import TPGradScaling
from commbench.training.vocab_parallel import VOCAB_EMB, VOCAB_HEAD, VOCAB_LOSS

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    import torch.nn as nn

COLWISE, ROWWISE = "colwise", "rowwise"
SEQ_SPLIT, SEQ_GATHER, NORM_GRAD = "seq_split", "seq_gather", "norm_grad"
"""`Layout.activations` entries of sequence parallelism: the region's entry and exit (features of the residual
stream) and one SP norm parameter (its elements, per step rather than per token)."""

BLOCK_PLAN: tuple[tuple[str, str], ...] = (
    ("attn.qkv", COLWISE),
    ("attn.proj", ROWWISE),
    ("fc", COLWISE),
    ("out", ROWWISE),
)
"""The GPT block's Linears (`nets.Block`) and how each is split."""


SP_NORMS: tuple[str, ...] = ("ln1", "ln2")
"""The GPT block's LayerNorms, sequence parallel under SP."""


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
    order = torch.cat([torch.arange(j * h + r * per, j * h + (r + 1) * per) for r in range(tp) for j in range(3)]).to(
        qkv.weight.device
    )
    with torch.no_grad():
        qkv.weight.copy_(qkv.weight[order])
        if qkv.bias is not None:
            qkv.bias.copy_(qkv.bias[order])


def _tp_local(shape: tuple[int, ...], style: str | None, name: str, tp: int) -> tuple[int, ...]:
    """The shape one TP rank holds of a block parameter (`style` of its Linear, None: replicated)."""
    if style == COLWISE:  # weight and bias split on dim 0
        return (shape[0] // tp, *shape[1:])
    if style == ROWWISE and name == "weight":  # weight split on dim 1, bias replicated
        return (shape[0], shape[1] // tp)
    return shape


def _spans_nodes(ranks: range, world_size: int, nodes: int) -> bool:
    """Whether a group of `ranks` (node-major numbering, as many ranks on every node) spans nodes."""
    per_node = max(world_size // max(nodes, 1), 1)
    return len({r // per_node for r in ranks}) > 1


@dataclass(frozen=True, slots=True)
class TensorParallel(Sharding):
    """Megatron-style tensor parallelism, AdamW on every rank's shards; 1-D over the whole world, or 2-D with FSDP2
    over the data-parallel groups (`dp`).

    The planner asks it about a model it never builds: `TensorParallel(tp=8, sequence_parallel=True).comm_bytes(
    psi=..., world_size=8, layout=Layout(activations=..., tokens=b*s))` (`activations` as `describe_activations`
    gives them; `tokens` the TP group's micro-batch)."""

    kind: str = "tp"
    parallelism: str = "tp"
    shards_grads: bool = True
    takes_hooks: bool = False
    tp: int = 0
    """Ranks per TP group (the suite's `tp_degree`, set by `configure`); 0: the whole world (1-D), half of it
    (2-D)."""
    sequence_parallel: bool = False
    """Norms sequence parallel: all-gathers and reduce-scatters instead of all-reduces (Korthikanti 2022)."""
    act_dtype_name: str = FP32
    """The dtype the row-wise Linears' outputs are communicated in (the policy's autocast dtype)."""
    grad_dtype_name: str = FP32
    """The dtype of the column-wise Linears' inputs and their gradients (the LayerNorm's output: fp32 under CPU
    autocast)."""
    comm_cast_name: str | None = None
    """Cast every TP activation collective to this dtype (fp32 compute, low-precision communication)."""
    gather_codec: str | None = None
    """SP only: the column-wise inputs' forward all-gathers through this codec (`commbench.measure.codec`)."""
    reduce_codec: str | None = None
    """Without SP only: the row-wise outputs' forward all-reduces through this codec, as the fp8_hook reduces DDP's
    buckets (`tp_styles.Wire.reduce_forward`)."""
    dp: FSDP2 | None = None
    """2-D TP x DP: FSDP2 (its mixed-precision dtypes) over the data-parallel dimension of a (dp, tp) mesh."""
    seq_len: int = 0
    """Tokens per sample, for the layout check (set by `configure`; 0: not checked)."""
    n_heads: int = 0
    """Attention heads, for the layout check (set by `configure`; 0: checked when wrapping)."""
    vocab: int = 0
    """Vocabulary, for the vocabulary-parallel layout check (set by `configure`; 0: checked when wrapping)."""
    vocab_parallel: bool = False
    """Token embedding and head sharded along the vocabulary, the loss under `loss_parallel` (`vocab_parallel.py`);
    1-D without SP only."""

    def __post_init__(self) -> None:
        if self.reduce_codec and self.sequence_parallel:
            raise ValueError("TensorParallel: reduce_codec replaces the row-wise all-reduce, which SP does not run")
        if self.gather_codec and not self.sequence_parallel:
            raise ValueError("TensorParallel: gather_codec replaces SP's all-gather; set sequence_parallel")
        if self.vocab_parallel and (self.sequence_parallel or self.dp is not None):
            raise ValueError("TensorParallel: vocab_parallel is 1-D tensor parallelism without SP")

    def configure(self, section: Any) -> TensorParallel:
        return replace(self, tp=int(section.tp_degree), seq_len=int(section.seq_len), n_heads=int(section.n_heads),
                       vocab=int(section.vocab))  # fmt: skip

    def degree(self, world_size: int) -> int:
        """Ranks of one TP group."""
        if self.dp is not None:
            return self.tp or max(world_size // 2, 1)
        return self.tp or world_size

    def config_error(self, section: Any) -> str | None:
        """A given tp_degree that the heads or (under SP) the sequence cannot split by, whatever the world."""
        if getattr(section, "model", "gpt") != "gpt":
            return f"tensor parallelism needs the gpt model (its attention heads are split); model={section.model}"
        tp = int(section.tp_degree)
        return self.split_error(tp, int(section.n_heads), int(section.seq_len)) if tp else None

    def split_error(self, tp: int, n_heads: int, seq_len: int) -> str | None:
        """Heads (and under SP the sequence) that `tp` ranks cannot split evenly, or None."""
        if n_heads and n_heads % tp:
            return f"n_heads={n_heads} is not divisible by the TP degree {tp}; valid TP degrees: " + ", ".join(
                str(d) for d in range(2, n_heads + 1) if n_heads % d == 0
            )
        if self.sequence_parallel and seq_len and seq_len % tp:
            return f"sequence parallelism needs seq_len divisible by the TP degree {tp}; seq_len={seq_len}"
        if self.vocab_parallel and self.vocab:
            from commbench.training.vocab_parallel import vocab_error

            return vocab_error(self.vocab, tp)
        return None

    def layout_error(self, world_size: int, nodes: int = 1) -> str | None:
        tp = self.degree(world_size)
        if world_size % tp:
            given = f"tp_degree={self.tp}" if self.tp else f"TP degree {tp} (half the world)"
            return f"{given} does not divide world {world_size}"
        if self.dp is not None and (world_size < 4 or tp == world_size):
            return f"2-D TP x DP needs at least 4 ranks and a TP degree below the world; world {world_size}, TP degree {tp}"
        if self.dp is None and tp != world_size:
            return f"1-D tensor parallelism spans the world; tp_degree={tp} < world {world_size} (the tp_dp_* policies run TP x DP)"
        return self.split_error(tp, self.n_heads, self.seq_len)

    def data_ranks(self, rank: int, world_size: int) -> tuple[int, ...]:
        tp = self.degree(world_size)
        first = rank // tp * tp
        return tuple(range(first, first + tp))

    def replicated_grad(self, param: Any) -> bool:
        from torch.distributed.tensor import DTensor, Replicate

        if isinstance(param, DTensor):
            return all(isinstance(p, Replicate) for p in param.placements)
        return True

    def counts_grad(self, param: Any, index: int) -> bool | None:
        """2-D: a gradient the TP ranks of a group hold alike (replicated on the TP dimension, or a parameter FSDP2
        shards over the DP dimension only) is counted by one of them (`index` mod tp); a TP shard by its rank."""
        if self.dp is None:
            return None
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor, Shard

        tp = self.degree(dist.get_world_size())
        if isinstance(param, DTensor) and "tp" in (param.device_mesh.mesh_dim_names or ()):
            dim = param.device_mesh.mesh_dim_names.index("tp")  # type: ignore[union-attr]
            if isinstance(param.placements[dim], Shard):
                return True
        return index % tp == dist.get_rank() % tp

    def describe_activations(self, model: nn.Module) -> tuple[tuple[str, int], ...]:
        """Per parallelised Linear (style, features of the activation it communicates): a row-wise Linear's output,
        a column-wise Linear's input; with SP also the region's entry and exit and each norm parameter."""
        out: list[tuple[str, int]] = []
        for b in blocks(model):
            for path, style in BLOCK_PLAN:
                lin = _sub(b, path)
                out.append((style, int(lin.out_features if style == ROWWISE else lin.in_features)))
            if self.sequence_parallel:
                out.extend((NORM_GRAD, int(p.numel())) for name in SP_NORMS for p in _sub(b, name).parameters())
        if self.sequence_parallel and blocks(model):
            width = int(_sub(blocks(model)[0], "attn.qkv").in_features)
            out.extend(((SEQ_SPLIT, width), (SEQ_GATHER, width)))
        if self.vocab_parallel:
            from commbench.training.vocab_parallel import vocab_activations

            out.extend(vocab_activations(model))
        return tuple(out)

    def describe(self, model: nn.Module) -> tuple[UnitShape, ...]:
        """2-D: FSDP2's units (each block, then the root) with the shapes one TP rank holds; 1-D: none."""
        if self.dp is None:
            return ()
        import torch.distributed as dist

        tp = self.degree(dist.get_world_size()) if dist.is_initialized() else 1
        taken: set[int] = set()
        units: list[UnitShape] = []
        for b in blocks(model):
            styles = dict(BLOCK_PLAN)
            shapes = []
            for name, p in b.named_parameters():
                owner, _, leaf = name.rpartition(".")
                shapes.append(_tp_local(tuple(p.shape), styles.get(owner), leaf, tp))
                taken.add(id(p))
            units.append(UnitShape(tuple(shapes)))
        units.append(UnitShape(tuple(tuple(p.shape) for p in model.parameters() if id(p) not in taken), root=True))
        return tuple(units)

    def _styles(self) -> dict[str, Any]:
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        sp = self.sequence_parallel
        if self.comm_cast_name is None and self.gather_codec is None and self.reduce_codec is None:  # torch's own
            col = ColwiseParallel(input_layouts=Shard(1)) if sp else ColwiseParallel()
            row = RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel()
        else:
            from commbench.measure.precision import torch_dtype
            from commbench.training.tp_styles import WiredColwise, WiredRowwise

            dt = torch_dtype(self.comm_cast_name) if self.comm_cast_name else None
            col = WiredColwise(sequence_parallel=sp, dtype=dt, codec=self.gather_codec)
            row = WiredRowwise(sequence_parallel=sp, dtype=dt, codec=self.reduce_codec)
        return {COLWISE: col, ROWWISE: row}

    def _block_plan(self, styles: dict[str, Any]) -> dict[str, Any]:
        """One block's `parallelize_module` plan: a copy of its style per Linear, and under SP the norms."""
        import copy

        from torch.distributed.tensor.parallel import SequenceParallel

        plan: dict[str, Any] = {path: copy.copy(styles[style]) for path, style in BLOCK_PLAN}
        if self.sequence_parallel:
            plan.update({name: SequenceParallel() for name in SP_NORMS})
        return plan

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        tp = self.degree(world.world_size)
        check_layout(model, tp)
        if self.dp is not None:
            mesh2 = init_device_mesh(device.type, (world.world_size // tp, tp), mesh_dim_names=("dp", "tp"))
            mesh = mesh2["tp"]
        else:
            mesh = init_device_mesh(device.type, (tp,), mesh_dim_names=("tp",))
        styles = self._styles()
        bs = blocks(model)
        for b in bs:
            attn = _sub(b, "attn")
            _order_qkv_by_heads(attn.qkv, tp)
            attn.n_heads = attn.n_heads // tp
            parallelize_module(b, mesh, self._block_plan(styles))
        if self.vocab_parallel:
            from commbench.training.vocab_parallel import parallelize_vocab

            parallelize_vocab(model, mesh)
        if self.sequence_parallel:
            from commbench.measure.precision import torch_dtype
            from commbench.training.tp_styles import reduce_norm_grads, sequence_region

            for b in bs:
                for name in SP_NORMS:
                    reduce_norm_grads(_sub(b, name))
            sequence_region(bs[0], bs[-1], mesh, torch_dtype(self.comm_cast_name) if self.comm_cast_name else None)
        if self.dp is not None:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy(param_dtype=self.dp.param_dtype, reduce_dtype=self.dp.reduce_dtype)
            for b in bs:
                fully_shard(b, mesh=mesh2["dp"], mp_policy=mp)
            fully_shard(model, mesh=mesh2["dp"], mp_policy=mp)
        return model

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
        """Vocabulary parallel: forward, the loss and backward under `loss_parallel` (`vocab_parallel.py`)."""
        if not self.vocab_parallel:
            return None
        from commbench.training.vocab_parallel import vocab_parallel_step

        return vocab_parallel_step(model, x, y, scale=scale, autocast=autocast, scaler=scaler)

    def _optimizer(self, params: list[Any], lr: float) -> Any:
        import torch

        # DTensor shards and plain replicated tensors in one group: the per-tensor loop, not the foreach kernels
        # (which need all tensors of one kind).
        return torch.optim.AdamW(params, lr=lr, foreach=False)

    def tp_bytes(self, layout: Layout, tp: int) -> dict[str, float]:
        """Bus bytes per step of one TP group of `tp` ranks (module docstring), from `Layout.activations`; without a
        layout (a plan for a model never built) nothing can be said: {}."""
        from commbench.measure.precision import torch_dtype

        if tp <= 1:
            return {}
        ar, ag, rs = (bus_factor(op, tp) for op in ("all_reduce", "all_gather", "reduce_scatter"))
        cast = self.comm_cast_name
        row, col, stream = cast or self.act_dtype_name, cast or self.grad_dtype_name, cast or FP32
        out: dict[str, float] = {}

        def add(op: str, dt: str, factor: float, elems: float) -> None:
            key = f"{op}:{dtype_name(dt)}"
            out[key] = out.get(key, 0.0) + factor * elems * torch_dtype(dt).itemsize

        tokens = layout.tokens
        for style, features in layout.activations:
            elems = tokens * features
            if style == NORM_GRAD:
                add("all_reduce", FP32, ar, features)
            elif style in (VOCAB_EMB, VOCAB_HEAD, VOCAB_LOSS):  # fp32: the embedding, ln_f's output, the loss
                add("all_reduce", FP32, ar, elems)
            elif style in (SEQ_SPLIT, SEQ_GATHER):
                add("all_gather", stream, ag, elems)
            elif not self.sequence_parallel and style == ROWWISE and self.reduce_codec:
                from commbench.training.hooks import codec_hook_bytes  # the fp8_hook's chunked all-reduce

                for key, v in codec_hook_bytes(self.reduce_codec, [int(elems)], tp).items():
                    out[key] = out.get(key, 0.0) + v
            elif not self.sequence_parallel:
                add("all_reduce", row if style == ROWWISE else col, ar, elems)
            elif style == ROWWISE:
                add("reduce_scatter", row, rs, elems)
                add("all_gather", row, ag, elems)
            else:
                add("reduce_scatter", col, rs, elems)
                if self.gather_codec:
                    from commbench.measure.codec import get_codec

                    wire = tp * get_codec(self.gather_codec).wire_bytes(elems // tp)
                    out["all_gather:uint8"] = out.get("all_gather:uint8", 0.0) + ag * wire
                else:
                    add("all_gather", col, ag, elems)
        return {k: v for k, v in out.items() if v}

    def _comm_by_link(self, w: World) -> dict[str, dict[str, float]]:
        n = w.world_size
        tp = self.degree(n)
        by_link: dict[str, dict[str, float]] = {INTRA: {}, INTER: {}}
        if n <= 1:
            return by_link
        by_link[INTER if _spans_nodes(range(tp), n, w.nodes) else INTRA] = self.tp_bytes(w.layout, tp)
        if self.dp is not None and n // tp > 1:
            units = w.layout.units or (UnitShape(((int(w.psi / tp),),)),)
            dp_part = self.dp.comm_bytes(psi=w.psi / tp, world_size=n // tp, layout=Layout(units=units))
            link = INTER if _spans_nodes(range(0, n, tp), n, w.nodes) else INTRA
            by_link[link] = merge_bytes(by_link[link], dp_part)
        return by_link

    def _comm_bytes(self, w: World) -> dict[str, float]:
        return merge_bytes(*self._comm_by_link(w).values())

    def comm_dtype(self, grad_comm: GradComm) -> str:
        label = SHORT[self.comm_cast_name or self.act_dtype_name]
        codec = self.gather_codec or self.reduce_codec
        return f"{codec}+{label}" if codec else label

    def grad_dtype_names(self) -> tuple[str, ...]:
        return (self.dp.param_dtype_name,) if self.dp is not None else ()

    def comm_underflow(self, grad_comm: GradComm) -> Underflow:
        # Parameter gradients travel only in 2-D (FSDP2's reduce dtype); input gradients in the column-wise dtype.
        stages = [DTYPE_UNDERFLOW[self.comm_cast_name or self.grad_dtype_name]]
        if self.dp is not None:
            stages.append(DTYPE_UNDERFLOW[self.dp.reduce_dtype_name])
        return Underflow.through(stages)

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        """Psi/tp of the ZeRO figure (2-D: FSDP2's over the DP group): exact for the block Linears (sharded over the
        TP ranks), an under-estimate by the replicated embeddings, LayerNorms and head (which every TP rank keeps
        whole: Psi alone cannot say how much of it they are)."""
        tp = self.degree(world_size)
        if self.dp is not None:
            return self.dp.state_bytes(psi=psi / tp, world_size=world_size // tp, state=state)
        return (state.param_bytes + state.grad_bytes + state.optimizer_bytes) * psi / tp


_TP = "tensor parallel over all ranks"
_POLICIES = (
    Policy(
        name="tp_fp32",
        family="tp",
        description=f"{_TP} (Megatron column/row Linears), fp32; activations all-reduced fp32",
        sharding=TensorParallel(),
    ),
    Policy(
        name="tp_bf16",
        family="tp",
        description=f"{_TP}, autocast bf16: forward activations all-reduced in bf16",
        sharding=TensorParallel(act_dtype_name=BF16, grad_dtype_name=FP32),
        autocast_name=BF16,
        reference="tp_fp32",
    ),
    Policy(
        name="tp_bf16comm",
        family="tp",
        description=f"{_TP}, fp32 compute, every TP all-reduce cast to bf16 (commbench's parallel styles)",
        sharding=TensorParallel(comm_cast_name=BF16),
        reference="tp_fp32",
    ),
    Policy(
        name="tp_sp_fp32",
        family="tp",
        description=f"{_TP} + sequence parallel norms, fp32: all-gathers and reduce-scatters instead of all-reduces",
        sharding=TensorParallel(sequence_parallel=True),
    ),
    Policy(
        name="tp_sp_bf16",
        family="tp",
        description=f"{_TP} + sequence parallel norms, autocast bf16: row-wise outputs reduce-scattered in bf16",
        sharding=TensorParallel(sequence_parallel=True, act_dtype_name=BF16),
        autocast_name=BF16,
        reference="tp_sp_fp32",
    ),
    Policy(
        name="tp_sp_fp8",
        family="tp",
        description=f"{_TP} + sequence parallel, fp32 compute; norm outputs all-gathered as fp8 e4m3 codes + scales, "
        "the rest of the TP traffic in bf16 (as Transformer Engine)",
        sharding=TensorParallel(sequence_parallel=True, comm_cast_name=BF16, gather_codec="fp8_e4m3"),
        reference="tp_sp_fp32",
    ),
    Policy(
        name="tp_dp_fp32",
        family="tp",
        description="2-D: tensor parallel in groups of tp_degree ranks x FSDP2 over the data-parallel groups, fp32",
        sharding=TensorParallel(parallelism="tp+dp", dp=FSDP2()),
    ),
    Policy(
        name="tp_dp_bf16",
        family="tp",
        description="2-D TP x FSDP2, params bf16 (FSDP2 mixed precision): TP activations and their gradients, "
        "FSDP2's all-gathers and reduce-scatters all in bf16",
        sharding=TensorParallel(
            parallelism="tp+dp",
            dp=FSDP2(param_dtype_name=BF16, reduce_dtype_name=BF16),
            act_dtype_name=BF16,
            grad_dtype_name=BF16,
        ),
        reference="tp_dp_fp32",
    ),
    Policy(
        name="tp_fp16",
        family="tp",
        description=f"{_TP}, autocast fp16 + a ShardedGradScaler on the shards (found-inf all-reduced: the "
        "ranks' shards differ): "
        "forward activations all-reduced in fp16",
        sharding=TensorParallel(act_dtype_name=FP16, grad_dtype_name=FP32),
        autocast_name=FP16,
        loss_scaling=TPGradScaling(),
        reference="tp_fp32",
    ),
    Policy(
        name="tp_fp8comm",
        family="tp",
        description=f"{_TP}, fp32 compute; row-wise outputs all-reduced as fp8 e4m3 codes + scales (the fp8_hook's "
        "all_to_all, fp32 sum, re-encode, all_gather), the input gradients' all-reduces in bf16",
        sharding=TensorParallel(comm_cast_name=BF16, reduce_codec="fp8_e4m3"),
        reference="tp_fp32",
    ),
    Policy(
        name="tp_vocab_fp32",
        family="tp",
        description=f"{_TP}, fp32, plus the token embedding and head sharded along the vocabulary and the "
        "cross-entropy under loss_parallel (Megatron-LM, torchtitan): full logits never gathered",
        sharding=TensorParallel(vocab_parallel=True),
    ),
)
for _p in _POLICIES:
    register_policy(_p)
