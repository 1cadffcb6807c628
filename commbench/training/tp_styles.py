"""Tensor-parallel styles whose communication commbench chooses: cast to a wire dtype, or (the sequence-parallel
all-gather) through a codec of `commbench.measure.codec`, around the redistributions torch's styles would do.

torch's `ColwiseParallel` / `RowwiseParallel` move activations in whatever dtype the compute left them in; fp32
compute with bf16 communication, or an fp8 all-gather as Transformer Engine does, needs the collective itself
replaced. The subclasses here keep torch's parameter partitioning and replace only the input/output preparation with
autograd Functions that issue the collectives through `torch.distributed._functional_collectives` (the calls
`comm.CommCounter` counts), in Megatron-LM's conjugate pairs (Korthikanti et al. 2022, section 4.2.2):

- column-wise input, no SP (Megatron's f): identity forward; backward all-reduce of the partial input gradient;
- row-wise output, no SP (g): forward all-reduce of the partial sums; identity backward;
- column-wise input with SP: forward all-gather along the sequence; backward reduce-scatter;
- row-wise output with SP: forward reduce-scatter along the sequence; backward all-gather;
- the sequence-parallel region's entry (split the replicated residual stream; backward all-gather) and exit
  (all-gather; backward keeps the rank's slice).

Each is a `Wire`: the collective runs on the payload cast to `dtype` (then cast back, so compute stays in its own
dtype), or as is; a `codec` replaces the forward all-gather by encode, all-gather of the packed wire bytes (codes +
scales, `chunked.ChunkWire`), decode in fp32; a `reduce_codec` replaces the row-wise forward all-reduce by the fp8
hook's chunked all-reduce (`chunked.ChunkedAllReduce`: all_to_all of codes + scales, fp32 sum, re-encode,
all_gather), issued as `dist.<op>` calls, where `comm.CommCounter` counts them too.

Imported only when a policy wraps a model (it imports torch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import _functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from commbench.cluster import compat
from commbench.measure.chunked import ChunkedAllReduce, ChunkWire
from commbench.measure.codec import Codec, get_codec

SEQ = 1
"""The sequence dimension of the GPT's [batch, sequence, features] activations."""


@dataclass(frozen=True)
class Wire:
    """How one TP collective moves its payload."""

    group: dist.ProcessGroup
    dtype: torch.dtype | None = None
    """Cast the payload to this dtype for the collective (None: as computed)."""
    codec: Codec | None = None
    """Forward all-gathers through this codec (the backward's reduce-scatter still uses `dtype`)."""
    reduce_codec: Codec | None = None
    """Forward all-reduces (the row-wise outputs without SP) through this codec (`reduce_forward`)."""

    @classmethod
    def on(
        cls, mesh: DeviceMesh, dtype: torch.dtype | None = None, codec: str | None = None, reduce_codec: str | None = None
    ) -> Wire:
        return cls(mesh.get_group(), dtype, get_codec(codec) if codec else None,
                   get_codec(reduce_codec) if reduce_codec else None)  # fmt: skip

    @property
    def size(self) -> int:
        return int(dist.get_world_size(self.group))

    @property
    def rank(self) -> int:
        return int(dist.get_rank(self.group))

    def _cast(self, x: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.dtype is None or x.dtype == self.dtype:
            return _wait(run(x.contiguous()))
        return _wait(run(x.to(self.dtype).contiguous())).to(x.dtype)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self._cast(x, lambda t: funcol.all_reduce(t, "sum", self.group))

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        return self._cast(x, lambda t: compat.reduce_scatter_single(t, "sum", SEQ, self.group))

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return self._cast(x, lambda t: compat.all_gather_single(t, SEQ, self.group))

    def reduce_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The forward all-reduce of partial sums: through the reduce codec when there is one, as the fp8_hook
        reduces DDP's buckets (`chunked.ChunkedAllReduce`: all_to_all of each rank's chunks as codes + scales, fp32
        sum of the owned chunk, re-encode, all_gather; ZeRO++'s qgZ, one quantization per stage), else `all_reduce`."""
        if self.reduce_codec is None:
            return self.all_reduce(x)
        op = ChunkedAllReduce(
            self.reduce_codec, x.numel(), self.group, x.device, packed=False, gather_by_all_to_all=False
        )
        op.load(x.detach().reshape(-1).float())
        op.encode()
        op.comm()
        op.decode()
        return op.result().view(x.shape).to(x.dtype)  # op's own buffer: not reused after this call

    def gather_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The forward all-gather along the sequence: through the codec when there is one."""
        if self.codec is None:
            return self.all_gather(x)
        n, flat = self.size, x.detach().reshape(-1).float().contiguous()
        m = flat.numel()
        send = ChunkWire(self.codec, 1, m, x.device)
        send.encode_chunks(flat)
        recv = ChunkWire(self.codec, n, m, x.device)
        recv.wire.copy_(_wait(compat.all_gather_single(send.wire, 0, self.group)))
        out = torch.empty(n * m, dtype=torch.float32, device=x.device)
        recv.decode_chunks(out)
        return torch.cat(out.view(n, *x.shape).unbind(0), dim=SEQ).to(x.dtype)


def _wait(t: torch.Tensor) -> torch.Tensor:
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def _replicated(x: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    return DTensor.from_local(x, mesh, (Replicate(),), run_check=False)


def _partial_local(g: Any) -> tuple[torch.Tensor, bool]:
    """(local tensor, whether it holds partial sums still to be reduced) of a gradient or output DTensor."""
    if isinstance(g, DTensor):
        return g._local_tensor, any(isinstance(p, Partial) for p in g.placements)
    return g, False


class _CopyIn(torch.autograd.Function):
    """Column-wise input without SP (Megatron's f): replicated forward, all-reduce of the input gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: DeviceMesh, wire: Wire) -> DTensor:
        ctx.wire = wire
        return _replicated(x, mesh)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple[Any, None, None]:
        local, partial_sums = _partial_local(g)
        return (ctx.wire.all_reduce(local) if partial_sums else local), None, None


class _ReduceOut(torch.autograd.Function):
    """Row-wise output without SP (Megatron's g): all-reduce of the partial sums, identity backward."""

    @staticmethod
    def forward(ctx: Any, y: DTensor, wire: Wire) -> torch.Tensor:
        ctx.mesh = y.device_mesh
        local, partial_sums = _partial_local(y)
        return wire.reduce_forward(local) if partial_sums else local

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, None]:
        return _replicated(g, ctx.mesh), None


class _GatherIn(torch.autograd.Function):
    """Column-wise input with SP: all-gather of the sequence shards (wire dtype or codec), reduce-scatter of the
    input gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: DeviceMesh, wire: Wire) -> DTensor:
        ctx.wire = wire
        return _replicated(wire.gather_forward(x), mesh)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple[Any, None, None]:
        local, partial_sums = _partial_local(g)
        wire: Wire = ctx.wire
        if partial_sums:
            return wire.reduce_scatter(local), None, None
        return local.chunk(wire.size, SEQ)[wire.rank].contiguous(), None, None


class _ReduceScatterOut(torch.autograd.Function):
    """Row-wise output with SP: reduce-scatter of the partial sums along the sequence, all-gather backward."""

    @staticmethod
    def forward(ctx: Any, y: DTensor, wire: Wire) -> torch.Tensor:
        ctx.mesh, ctx.wire = y.device_mesh, wire
        local, partial_sums = _partial_local(y)
        if not partial_sums:
            return local.chunk(wire.size, SEQ)[wire.rank].contiguous()
        return wire.reduce_scatter(local)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, None]:
        return _replicated(ctx.wire.all_gather(g), ctx.mesh), None


class _SplitSeq(torch.autograd.Function):
    """Entry of the sequence-parallel region: keep this rank's slice of the replicated stream; all-gather the
    slices' gradients backward (each rank computed its slice's only)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, wire: Wire) -> torch.Tensor:
        ctx.wire = wire
        return x.chunk(wire.size, SEQ)[wire.rank].contiguous()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, None]:
        return ctx.wire.all_gather(g), None


class _GatherSeq(torch.autograd.Function):
    """Exit of the sequence-parallel region: all-gather the slices; backward keeps this rank's slice of the
    (replicated) gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, wire: Wire) -> torch.Tensor:
        ctx.wire = wire
        return wire.all_gather(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, None]:
        wire: Wire = ctx.wire
        return g.chunk(wire.size, SEQ)[wire.rank].contiguous(), None


class WiredColwise(ColwiseParallel):
    """`ColwiseParallel` whose input collective is commbench's: the backward all-reduce (no SP) or the forward
    all-gather + backward reduce-scatter (SP), cast to `dtype` or, the forward gather, through `codec`."""

    def __init__(self, *, sequence_parallel: bool, dtype: torch.dtype | None = None, codec: str | None = None):
        super().__init__()
        self.sequence_parallel, self.dtype, self.codec = sequence_parallel, dtype, codec

    def _prepare_in(self, wire: Wire, mod: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> DTensor:
        x = inputs[0]
        if isinstance(x, DTensor):  # SP: the norm's sequence-sharded output
            x = x.to_local()
        fn = _GatherIn if self.sequence_parallel else _CopyIn
        return fn.apply(x, mesh, wire)  # type: ignore[no-any-return]

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Linear):
            raise NotImplementedError("WiredColwise supports nn.Linear only")
        wire = Wire.on(device_mesh, self.dtype, self.codec)
        return distribute_module(
            module,
            device_mesh,
            self._partition_linear_fn,
            partial(self._prepare_in, wire),  # type: ignore[arg-type]  # torch types the hook as returning None
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )


class WiredRowwise(RowwiseParallel):
    """`RowwiseParallel` whose output collective is commbench's: the forward all-reduce (no SP: cast to `dtype`, or
    through `codec`) or reduce-scatter + backward all-gather (SP), cast to `dtype`."""

    def __init__(self, *, sequence_parallel: bool, dtype: torch.dtype | None = None, codec: str | None = None):
        super().__init__()
        if codec and sequence_parallel:
            raise ValueError("a reduce codec replaces the row-wise all-reduce, which sequence parallelism does not run")
        self.sequence_parallel, self.dtype, self.codec = sequence_parallel, dtype, codec

    def _prepare_out(self, wire: Wire, mod: nn.Module, outputs: DTensor, mesh: DeviceMesh) -> torch.Tensor:
        fn = _ReduceScatterOut if self.sequence_parallel else _ReduceOut
        return fn.apply(outputs, wire)  # type: ignore[no-any-return]

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Linear):
            raise NotImplementedError("WiredRowwise supports nn.Linear only")
        self.desired_input_layouts = (Shard(-1),)
        wire = Wire.on(device_mesh, self.dtype, reduce_codec=self.codec)
        return distribute_module(
            module,
            device_mesh,
            self._partition_linear_fn,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_out, wire),  # type: ignore[arg-type]  # torch types the hook as returning None
        )


def sequence_region(first: nn.Module, last: nn.Module, mesh: DeviceMesh, dtype: torch.dtype | None = None) -> None:
    """Make the blocks from `first` to `last` a sequence-parallel region: `first` takes this rank's slice of the
    sequence, `last`'s output is gathered whole again (the embeddings, final norm and head stay replicated)."""
    wire = Wire.on(mesh, dtype)
    first.register_forward_pre_hook(lambda _m, args: (_SplitSeq.apply(args[0], wire), *args[1:]))
    last.register_forward_hook(lambda _m, _args, out: _GatherSeq.apply(out, wire))


def reduce_norm_grads(norm: nn.Module) -> None:
    """All-reduce a sequence-parallel norm's parameter gradients once, when they are accumulated.

    Under SP each rank's norm sees its slice of the tokens, so its weight and bias gradients are partial sums
    (DTensor `Partial`); left so, every optimizer use of the gradient would all-reduce it again (AdamW: several
    times per step) and the gradient statistics would read partial sums. Megatron-LM all-reduces them once after
    backward; here each parameter's gradient is made `Replicate` as soon as it is complete."""

    def hook(p: Any) -> None:
        g = p.grad
        if isinstance(g, DTensor) and any(isinstance(pl, Partial) for pl in g.placements):
            p.grad = g.redistribute(g.device_mesh, [Replicate()] * len(g.placements))

    for p in norm.parameters():
        p.register_post_accumulate_grad_hook(hook)


__all__ = ["SEQ", "WiredColwise", "WiredRowwise", "Wire", "reduce_norm_grads", "sequence_region"]
