"""3-D parallelism on the GPT: tensor parallelism inside each pipeline stage, pipeline parallelism across the
stages, data parallelism across the replicas, on a (pp, dp, tp) `DeviceMesh` built as torchtitan builds it
(`init_device_mesh(..., mesh_dim_names=("pp", "dp", "tp"))`), as a `Sharding` and the policies tp_pp_dp_fp32 and
tp_pp_dp_bf16 (autocast bf16; boundaries in bf16).

Layout: rank = p (dp tp) + d tp + t holds stage p of pipeline replica d, TP rank t. Each rank builds its stage
(`nets.GPTStage`: balanced blocks, the embeddings on the first stage, ln_f and head on the last), splits the stage's
blocks over the TP sub-mesh with torch's `parallelize_module` (`tensor_parallel.BLOCK_PLAN`: qkv and fc column-wise,
proj and out row-wise, the fused qkv reordered by heads), and runs a `torch.distributed.pipelining` 1F1B schedule
over its pipeline (the pp sub-mesh's group: the ranks of one (d, t)); after the schedule step the stage's gradients
(the TP shards' local tensors and the replicated ones) are all-reduced over the dp sub-mesh's group as one flat fp32
buffer and averaged, as `pipeline_parallel` does under PP x DP (DDP's result without DDP's unused-parameter bitmap).

Data: replica d's ranks (every stage, every TP rank) train on the batches of all of them concatenated
(`data_ranks`): pp tp batches per replica, split into `microbatches`, so the world's global batch is the fp32 DDP
baseline's and the loss and gradients are the unsplit model's.

Bytes per rank per step, T the tokens of one micro-batch, M micro-batches, h = d_model, L_p blocks on stage p:
- TP (`TensorParallel.tp_bytes` of the stage's blocks): per block per micro-batch 4 all-reduces of T h elements on
  the TP group (2 forward, 2 backward), bus factor 2 (tp-1)/tp;
- PP (`PipelineParallel`'s formula on the pipeline's pp ranks): M T h forward to the next stage and M T h backward
  to the previous one, in the boundary dtype; every TP rank sends its own (replicated) copy;
- DP: 4 bytes times the rank's local parameters (TP shards 1/tp, the rest whole), bus factor 2 (dp-1)/dp.
Averaged over the world: the TP part of all blocks over pp, the PP formula of a pp-rank pipeline, the DP part of
the units `describe` gives (the TP-local shapes) over pp. Needs at least 8 ranks (2 x 2 x 2): smaller worlds skip
with one line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from commbench.training.comm import bus_factor
from commbench.training.pipeline_parallel import BOUNDARY, PipelineParallel
from commbench.training.policies import Policy, register_policy
from commbench.training.pp_schedules import ONE_F_ONE_B
from commbench.training.strategies import (
    BF16,
    FP32,
    INTER,
    INTRA,
    Layout,
    UnitShape,
    World,
    add_bytes,
    blocks,
)
from commbench.training.tensor_parallel import (
    BLOCK_PLAN,
    COLWISE,
    ROWWISE,
    TensorParallel,
    _order_qkv_by_heads,
    _sub,
    _tp_local,
)

if TYPE_CHECKING:
    import torch
    import torch.nn as nn


@dataclass(frozen=True, slots=True)
class TPPPDP(PipelineParallel):
    """TP (`tp` ranks) inside each of `pp` pipeline stages, data parallel over the rest of the world (>= 2)."""

    kind: str = "pp"  # a pipeline layout: under "all" its world-free refusals skip it while the PP policies run
    parallelism: str = "tp+pp+dp"
    tp: int = 2
    """Ranks per TP group (the suite's tp_degree; 0 there: 2)."""

    def degree(self, world_size: int) -> int:
        pp, tp = self.pp or 2, self.tp or 2
        if world_size % (pp * tp) or world_size // (pp * tp) < 2:
            raise ValueError(
                f"3-D TP x PP x DP needs a world of tp_degree x pp_degree x dp with dp >= 2; world_size={world_size}, "
                f"tp_degree={tp}, pp_degree={pp}: valid worlds are multiples of {pp * tp} from {2 * pp * tp}"
            )
        return pp

    def dims(self, world_size: int) -> tuple[int, int, int]:
        """(pp, dp, tp) of the mesh."""
        pp = self.degree(world_size)
        tp = self.tp or 2
        return pp, world_size // (pp * tp), tp

    def configure(self, section: Any) -> TPPPDP:
        base: Any = PipelineParallel.configure(self, section)
        out: TPPPDP = replace(base, parallelism="tp+pp+dp", tp=int(getattr(section, "tp_degree", 0)) or 2)
        return out

    def config_error(self, section: Any) -> str | None:
        """What no world can run: the pipeline's refusals (`PipelineParallel.config_error`, at pp_degree or 2
        stages), heads that tp_degree does not divide."""
        tp = int(getattr(section, "tp_degree", 0)) or 2
        if getattr(section, "model", "gpt") == "gpt" and int(section.n_heads) % tp:
            return f"tensor parallelism over {tp} ranks needs n_heads divisible by {tp}; n_heads={section.n_heads}"
        reason = PipelineParallel.config_error(self, section)
        if reason or getattr(section, "model", "gpt") != "gpt":
            return reason
        given = tuple(getattr(section, "stage_layers", None) or ())
        return replace(self, tp=tp, stage_layers=given).split_error(
            int(section.pp_degree) or 2, int(section.microbatches), int(section.n_layers), int(section.batch_size)
        )

    def split_error(self, pp: int, m: int, layers: int, batch: int) -> str | None:
        return PipelineParallel.split_error(self, pp, m, layers, batch * (self.tp or 2))

    def stage_of(self, rank: int, world_size: int) -> tuple[int, int]:
        """(replica index d tp + t, stage p)."""
        pp, dp, tp = self.dims(world_size)
        return rank % (dp * tp), rank // (dp * tp)

    def data_ranks(self, rank: int, world_size: int) -> tuple[int, ...]:
        pp, dp, tp = self.dims(world_size)
        d = rank // tp % dp
        return tuple(p * dp * tp + d * tp + t for p in range(pp) for t in range(tp))

    def replica_ranks(self, rank: int, world_size: int) -> tuple[int, ...]:
        pp, dp, tp = self.dims(world_size)
        p, t = rank // (dp * tp), rank % tp
        return tuple(p * dp * tp + d * tp + t for d in range(dp))

    def replicated_grad(self, param: Any) -> bool:
        from torch.distributed.tensor import DTensor, Replicate

        return not isinstance(param, DTensor) or all(isinstance(p, Replicate) for p in param.placements)

    def counts_grad(self, param: Any, index: int) -> bool | None:
        """Each gradient counted once in the statistics: a TP shard by its TP rank of replica 0, a replicated tensor
        (held alike by every TP rank and every replica) by TP rank 0 of replica 0."""
        import torch.distributed as dist

        rank = dist.get_rank()
        _, dp, tp = self.dims(dist.get_world_size())
        return rank // tp % dp == 0 and (not self.replicated_grad(param) or rank % tp == 0)

    def describe_activations(self, model: nn.Module) -> tuple[tuple[str, int], ...]:
        """The boundary's features, then each block's TP Linears (style, features), as `TensorParallel` gives them."""
        return PipelineParallel.describe_activations(self, model) + TensorParallel(tp=2).describe_activations(model)

    def describe(self, model: nn.Module) -> tuple[UnitShape, ...]:
        """One unit of every parameter with the shape one TP rank holds (the DP all-reduce's elements, summed over
        the stages)."""
        tp = self.tp or 2
        split: dict[int, tuple[int, ...]] = {}
        for b in blocks(model):
            for path, style in BLOCK_PLAN:
                for name, p in _sub(b, path).named_parameters():
                    split[id(p)] = _tp_local(tuple(p.shape), style, name, tp)
        return (UnitShape(tuple(split.get(id(p), tuple(p.shape)) for p in model.parameters())),)

    def _tp(self) -> TensorParallel:
        """The TP formula's object: row-wise outputs in the compute dtype (= the boundary dtype), column-wise input
        gradients fp32 (the LayerNorm's output under CPU autocast)."""
        return TensorParallel(tp=self.tp or 2, act_dtype_name=self.act_dtype_name)

    def _comm_by_link(self, w: World) -> dict[str, dict[str, float]]:
        pp, dp, tp = self.dims(w.world_size)
        tokens = (
            w.layout.tokens * self.microbatches
        )  # TP's formula counts a step's tokens; Layout's are a micro-batch's
        tp_acts = tuple(a for a in w.layout.activations if a[0] != BOUNDARY)
        out: dict[str, float] = {}
        for k, v in self._tp().tp_bytes(Layout(activations=tp_acts, tokens=tokens), tp).items():
            add_bytes(out, k, v / pp)
        pipe = PipelineParallel(
            pp=pp, microbatches=self.microbatches, schedule=self.schedule, act_dtype_name=self.act_dtype_name
        )
        for k, v in pipe.comm_bytes(psi=w.psi, world_size=pp, layout=w.layout).items():
            add_bytes(out, k, v)
        local = sum(_numel(s) for u in w.layout.units for s in u.shapes) if w.layout.units else w.psi
        add_bytes(out, "all_reduce:float", bus_factor("all_reduce", dp) * 4 * local / pp)
        return {INTRA: out, INTER: {}} if w.nodes <= 1 else {INTRA: {}, INTER: out}

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        import copy

        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        from commbench.training.nets import GPTStage, PipelineRank

        n = world.world_size
        pp, dp, tp = self.dims(n)
        self.check_layout(model, pp)
        mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        p = mesh.get_local_rank("pp")
        sizes = self.splits(pp, len(blocks(model)))
        start = sum(sizes[:p])
        stage = GPTStage(
            model, start, start + sizes[p], first=p == 0, last=p == pp - 1, wire_dtype_name=self.act_dtype_name
        ).to(device)
        styles = {COLWISE: ColwiseParallel(), ROWWISE: RowwiseParallel()}
        for b in stage.blocks:
            attn = _sub(b, "attn")
            _order_qkv_by_heads(attn.qkv, tp)
            attn.n_heads = attn.n_heads // tp
            parallelize_module(b, mesh["tp"], {path: copy.copy(styles[style]) for path, style in BLOCK_PLAN})
        rank = PipelineRank([(p, stage)], p, pp, self.microbatches, self.plan, mesh["pp"].get_group(), device)
        rank.dp3_group = mesh["dp"].get_group()  # type: ignore[assignment]
        return rank

    def check_layout(self, model: nn.Module, world_size: int) -> None:
        from commbench.training.tensor_parallel import check_layout

        check_layout(model, self.tp or 2)

    def _optimizer(self, params: list[Any], lr: float) -> Any:
        import torch

        return torch.optim.AdamW(params, lr=lr, foreach=False)  # DTensor shards and plain tensors together

    def pipeline_step(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, **step: Any) -> torch.Tensor | None:
        """The pipeline's schedule step (TP inside the stage), then the stage's gradients averaged over its dp group."""
        out = PipelineParallel.pipeline_step(self, model, x, y, **step)
        average_local_grads(model, model.dp3_group)
        return out


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def average_local_grads(model: nn.Module, group: Any) -> None:
    """`model`'s gradients (a DTensor's local shard, or the plain tensor) all-reduced over `group` (None: the world)
    as one flat buffer and averaged."""
    import torch
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
    from torch.distributed.tensor import DTensor

    grads = []
    for p in model.parameters():
        if p.requires_grad:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            grads.append(g._local_tensor if isinstance(g, DTensor) else g)
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    for g, avg in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        g.copy_(avg)


def _3d(name: str, description: str, act: str = FP32) -> Policy:
    return Policy(
        name=name, family="tp+pp+dp", description=description,
        sharding=TPPPDP(schedule=ONE_F_ONE_B, act_dtype_name=act), autocast_name=None if act == FP32 else act,
        reference=None if act == FP32 else "tp_pp_dp_fp32",
    )  # fmt: skip


_POLICIES = (
    _3d("tp_pp_dp_fp32", "3-D: TP (tp_degree) inside each of pp_degree 1F1B pipeline stages, data parallel over the rest; fp32"),
    _3d("tp_pp_dp_bf16", "3-D TP x PP x DP, autocast bf16; activations and their gradients cross the stages in bf16", BF16),
)  # fmt: skip
for _p in _POLICIES:
    register_policy(_p)
