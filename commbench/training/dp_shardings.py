"""The data-parallel shardings: DDP, ZeRO-1, FSDP1, FSDP2 and HSDP, each wrapping the model and stating its bus
bytes and model-state bytes as formulas of Psi (see `strategies`)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from commbench.measure.precision import torch_dtype
from commbench.training.comm import bus_factor, dtype_name
from commbench.training.gradcomm import GradComm
from commbench.training.layouts import (
    ADAM_FP32,
    DTYPE_UNDERFLOW,
    FP32,
    INTER,
    INTRA,
    SHORT,
    FsdpUnit,
    GatherReduceDtypes,
    ModelState,
    Underflow,
    UnitShape,
    add_bytes,
    batchnorms,
    blocks,
    merge_bytes,
    numel_of,
    unit_shapes,
)
from commbench.training.scaling import LossScaling
from commbench.training.sharding import Sharding, World

if TYPE_CHECKING:
    import torch
    import torch.nn as nn



@dataclass(frozen=True, slots=True)
class DDP(Sharding):
    """DistributedDataParallel with `gradient_as_bucket_view=True` and a Python comm hook; AdamW on every rank."""

    kind: str = "ddp"
    shards_grads: bool = False
    takes_hooks: bool = True

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        from commbench.cluster.launch import device_ids  # torch.distributed at module level: imported at use

        ddp = DistributedDataParallel(
            model,
            device_ids=device_ids(device),
            gradient_as_bucket_view=True,  # grads are views of the buckets: no second 4*Psi copy
        )
        world.grad_comm.register(ddp)
        return ddp

    def bucket_numels(self, wrapped: nn.Module) -> list[int]:
        data = wrapped._get_ddp_logging_data()  # type: ignore[operator]
        sizes = str(data.get("bucket_sizes", "")).replace(" ", "")
        return [int(s) // 4 for s in sizes.split(",") if s]  # bytes of fp32 buckets

    def _comm_bytes(self, w: World) -> dict[str, float]:
        out = w.grad_comm.comm_bytes(psi=w.psi, world_size=w.world_size, bucket_numels=w.layout.bucket_numels)
        for key, nbytes in w.layout.buffer_bytes.items():  # DDP re-broadcasts buffers from rank 0 every forward
            add_bytes(out, f"broadcast:{key}", nbytes * bus_factor("broadcast", w.world_size))
        return out

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        return state.param_bytes * psi + state.grad_bytes * psi + state.optimizer_bytes * psi


@dataclass(frozen=True, slots=True)
class ZeRO1(DDP):
    """ZeRO-1 in torch: ZeroRedundancyOptimizer (optimizer state partitioned) over DDP."""

    def _optimizer(self, params: list[Any], lr: float) -> Any:
        import torch
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=lr)

    def _comm_bytes(self, w: World) -> dict[str, float]:
        out = DDP._comm_bytes(self, w)
        # each owner broadcasts its updated fp32 parameters
        add_bytes(out, "broadcast:float", w.psi * 4 * bus_factor("broadcast", w.world_size))
        return out

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        return state.param_bytes * psi + state.grad_bytes * psi + state.optimizer_bytes * psi / world_size


@dataclass(frozen=True, slots=True)
class _Fsdp(Sharding, GatherReduceDtypes):
    """What FSDP1 and FSDP2 share: mixed-precision dtypes, units, the all-gather/reduce-scatter formula."""

    param_dtype_name: str = FP32
    """torch's name of the dtype the parameters are all-gathered and computed in."""
    reduce_dtype_name: str = FP32
    """torch's name of the dtype of the gradient reduce-scatter."""
    reshard_after_forward: bool = True
    """Free the gathered parameters after forward (FULL_SHARD / ZeRO-3) or keep them (ZeRO-2)."""
    shards_grads: bool = True
    takes_hooks: bool = False


    @property
    def mixed(self) -> bool:
        """Mixed precision is on (BatchNorm then becomes its own fp32 unit)."""
        return self.param_dtype_name != FP32 or self.reduce_dtype_name != FP32

    def comm_dtype(self, grad_comm: GradComm) -> str:
        return SHORT[self.reduce_dtype_name]

    def comm_underflow(self, grad_comm: GradComm) -> Underflow:
        return DTYPE_UNDERFLOW[self.reduce_dtype_name]

    def grad_dtype_names(self) -> tuple[str, ...]:
        return (self.param_dtype_name,)

    def describe(self, model: nn.Module) -> tuple[UnitShape, ...]:
        return unit_shapes(model, self.mixed)

    @abstractmethod
    def shard_numel(self, shapes: Sequence[tuple[int, ...]], world_size: int) -> int:
        """Elements of one rank's shard of a unit with parameters of `shapes` (padding included)."""

    def units(self, shapes: Sequence[UnitShape], world_size: int) -> list[FsdpUnit]:
        """The units as the formulas see them (a unit without parameters is not wrapped)."""
        out = []
        for u in shapes:
            size = self.shard_numel(u.shapes, world_size)
            if size:
                pd, rd = (FP32, FP32) if u.keep_fp32 else (self.param_dtype_name, self.reduce_dtype_name)
                out.append(FsdpUnit(size, pd, rd, 2 if self.reshard_after_forward and not u.root else 1))
        return out

    def _comm_bytes(self, w: World) -> dict[str, float]:
        """Per unit: all_gather of the param-dtype shards (again for backward when resharded after
        forward; the root stays gathered) and a reduce-scatter in the reduce dtype. Without units, one
        resharded unit of Psi elements (the root's share of a large model is negligible)."""
        n = w.world_size
        ag, rs = bus_factor("all_gather", n), bus_factor("reduce_scatter", n)
        out: dict[str, float] = {}
        for u in self.units(w.layout.units or (UnitShape(((int(w.psi),),)),), n):
            add_bytes(
                out,
                f"all_gather:{dtype_name(u.param_dtype_name)}",
                u.gathers * ag * n * u.shard_numel * u.param_dtype.itemsize,
            )
            add_bytes(
                out,
                f"reduce_scatter:{dtype_name(u.reduce_dtype_name)}",
                rs * n * u.shard_numel * u.reduce_dtype.itemsize,
            )
        return out

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        """Gradients are set to None after each step, so the peak is the larger of two phases: the
        optimizer step (sharded P + G + K) and the end of forward (sharded P + K, plus the unsharded
        param-dtype copy ZeRO-2 keeps from forward to backward; FULL_SHARD's one or two gathered units
        in flight excluded)."""
        n = world_size
        optimizer_step = (state.param_bytes + state.grad_bytes + state.optimizer_bytes) * psi / n
        end_of_forward = (state.param_bytes + state.optimizer_bytes) * psi / n
        if not self.reshard_after_forward:
            end_of_forward += self.param_dtype.itemsize * psi
        return max(optimizer_step, end_of_forward)


@dataclass(frozen=True, slots=True)
class FSDP1(_Fsdp):
    """FullyShardedDataParallel: FULL_SHARD (ZeRO-3) or SHARD_GRAD_OP (ZeRO-2), `MixedPrecision`."""

    kind: str = "fsdp1"
    buffer_dtype_name: str | None = None
    """torch's name of the dtype of buffers (None keeps fp32)."""

    def shard_numel(self, shapes: Sequence[tuple[int, ...]], world_size: int) -> int:
        # one flat parameter per unit, padded to a multiple of n
        return -(-sum(numel_of(s) for s in shapes) // world_size)

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        block_types = {type(b) for b in blocks(model)}
        mp = None
        if self.mixed or self.buffer_dtype_name:
            buffer_dtype = torch_dtype(self.buffer_dtype_name) if self.buffer_dtype_name else None
            mp = MixedPrecision(param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype, buffer_dtype=buffer_dtype)
        return FullyShardedDataParallel(
            model,
            device_id=device,
            auto_wrap_policy=ModuleWrapPolicy(block_types) if block_types else None,
            sharding_strategy=ShardingStrategy.FULL_SHARD
            if self.reshard_after_forward
            else ShardingStrategy.SHARD_GRAD_OP,
            mixed_precision=mp,
        )


@dataclass(frozen=True, slots=True)
class FSDP2(_Fsdp):
    """`fully_shard` per block then the root, `MixedPrecisionPolicy`, on a 1-D mesh of all ranks."""

    kind: str = "fsdp2"

    def shard_numel(self, shapes: Sequence[tuple[int, ...]], world_size: int) -> int:
        # every parameter sharded on dim 0, dim 0 padded to a multiple of n
        return sum(-(-s[0] // world_size) * (numel_of(s) // max(s[0], 1)) for s in shapes if s)

    def _mesh(self, device: torch.device, world_size: int, nodes: int = 1) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device.type, (world_size,))

    def scaler_comm_bytes(self, loss_scaling: LossScaling, world_size: int) -> dict[str, float]:
        """DTensor's own found-inf all-reduce (`found_inf_reduce_handler` of `_amp_foreach_non_finite_check_and_unscale_`
        on sharded DTensor gradients): one fp32 element per step, beside the scaler's own."""
        out: dict[str, float] = {}
        if loss_scaling.scales:
            add_bytes(out, "all_reduce:float", bus_factor("all_reduce", world_size) * 4)
        return out

    def _wrap(self, model: nn.Module, device: torch.device, world: World) -> nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = self._mesh(device, world.world_size, world.nodes)
        mp = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype)
        # None = FSDP2's default: reshard blocks after forward, keep the root gathered (the formula assumes it).
        reshard = None if self.reshard_after_forward else False
        if self.mixed:
            # BatchNorm kept in fp32 as its own unit, as FSDP1's MixedPrecision does by default
            # (`_module_classes_to_ignore`); its inputs are cast to fp32 on the way in.
            fp32 = torch_dtype(FP32)
            keep = MixedPrecisionPolicy(param_dtype=fp32, reduce_dtype=fp32)
            for bn in batchnorms(model):
                fully_shard(bn, mesh=mesh, mp_policy=keep, reshard_after_forward=reshard)
        for block in blocks(model):
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        return model


@dataclass(frozen=True, slots=True)
class HSDP(FSDP2):
    """FSDP2 on a 2-D mesh (replicate across nodes, shard within a node): parameters are all-gathered and
    gradients reduce-scattered inside a node, then each rank's gradient shard is all-reduced with the ranks
    of the same local index on the other nodes (`foreach_reduce`'s `all_reduce_group`). Only that all-reduce
    crosses nodes: 2(r-1)/r of a shard in the reduce dtype per unit, r = nodes. On one node it is FSDP2."""

    kind: str = "hsdp"
    node_mesh: bool = True

    @staticmethod
    def split(world_size: int, nodes: int) -> tuple[int, int]:
        """(replicas, ranks per shard group) = (nodes, ranks per node); ValueError when the nodes differ."""
        if nodes < 1 or world_size % nodes:
            raise ValueError(f"HSDP needs the same number of ranks on every node: {world_size} ranks on {nodes} nodes")
        return nodes, world_size // nodes

    def _mesh(self, device: torch.device, world_size: int, nodes: int = 1) -> Any:
        from torch.distributed.device_mesh import init_device_mesh

        # init_device_mesh lays ranks out row-major: row i = ranks i*g .. i*g+g-1, one node (node-major ranks,
        # as torchrun, srun and mpirun's by-node defaults number them; the runner checks it).
        return init_device_mesh(device.type, self.split(world_size, nodes), mesh_dim_names=("replicate", "shard"))

    def _comm_by_link(self, w: World) -> dict[str, dict[str, float]]:
        r, g = self.split(w.world_size, w.nodes)
        intra = _Fsdp._comm_bytes(self, World(w.psi, g, layout=w.layout)) if g > 1 else {}
        inter: dict[str, float] = {}
        ar = bus_factor("all_reduce", r)
        for u in self.units(w.layout.units or (UnitShape(((int(w.psi),),)),), g):
            add_bytes(inter, f"all_reduce:{dtype_name(u.reduce_dtype_name)}", ar * u.shard_numel * u.reduce_dtype.itemsize)
        if r == 1:  # one node: the replicate group is that node's own ranks
            intra, inter = merge_bytes(intra, inter), {}
        return {INTRA: intra, INTER: inter}

    def _comm_bytes(self, w: World) -> dict[str, float]:
        return merge_bytes(*self._comm_by_link(w).values())

    def state_bytes(self, *, psi: float, world_size: int, state: ModelState = ADAM_FP32, nodes: int = 1) -> float:
        """FSDP2's figure with the model sharded over one node's ranks (every node keeps a full copy)."""
        return FSDP2.state_bytes(self, psi=psi, world_size=self.split(world_size, nodes)[1], state=state)
