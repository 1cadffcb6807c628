"""Training strategies: how a policy shards the model, communicates gradients and scales the loss.

A policy (`policies.py`) composes three objects:
- a `Sharding` (DDP, ZeRO-1, FSDP1, FSDP2, HSDP): wraps the model and builds the optimizer;
- a `GradComm` (torch's all-reduce hook, a cast hook, a chunked-codec hook): the DDP gradient hook;
- a `LossScaling` (none, GradScaler, ShardedGradScaler): builds the scaler.

Each object answers for itself: what it does to a model (`wrap`, `register`, `make`), the bus bytes
it communicates per step and the model-state bytes it keeps per rank. Those are pure formulas of the
parameter count Psi, dtypes and the world layout (plus, where it decides the exact figure, a
description of DDP's buckets or FSDP's units), so the capacity planner can ask them about a model it
never builds: `FSDP1().comm_bytes(psi=70e9, world_size=512, grad_comm=ALL_REDUCE)`.

Bytes are nccl-tests bus bytes by "op:dtype" (see `comm.py`): all_reduce 2(n-1)/n of the buffer;
all_gather (n-1)/n of the total output; reduce_scatter (n-1)/n of the total input; broadcast 1.

Memory follows ZeRO (Rajbhandari et al. 2020, section 3): per parameter P bytes of parameters, G of
gradients and K of optimizer state (`ModelState`; here fp32 training with AdamW: 4 + 4 + 8); each
sharding says which of the three it partitions over the N ranks.

The parts live in modules of their own, re-exported here (the public names every caller imports from this
module): `layouts` (dtypes, links, model state, buckets, units, the activation layout), `gradcomm`, `scaling`,
`sharding` (the `Sharding` contract and `World`) and `dp_shardings` (DDP, ZeRO-1, FSDP1, FSDP2, HSDP); the model-parallel
shardings are `tensor_parallel` and `pipeline_parallel`.

A new kind is one new class (`HSDP` is an `FSDP2` whose `_mesh` is 2-D and whose formulas split the
traffic between the intra- and inter-node groups); nothing else asks a strategy for its name.

The world layout is `world_size` ranks on `nodes` nodes (default 1). `comm_by_link` splits a step's bus
bytes into INTRA (collectives whose group stays on one node) and INTER (groups spanning nodes), the same
classification `comm.CommCounter` applies to the calls it intercepts.
"""

from __future__ import annotations

from commbench.training.dp_shardings import DDP, FSDP1, FSDP2, HSDP, ZeRO1
from commbench.training.gradcomm import ALL_REDUCE, AllReduceHook, CastHook, CodecHook, GradComm
from commbench.training.layouts import (
    ADAM_FP32,
    BF16,
    DDP_BUCKET_CAP_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    DTYPE_UNDERFLOW,
    FP16,
    FP32,
    INTER,
    INTRA,
    NO_LAYOUT,
    SHORT,
    FsdpUnit,
    GatherReduceDtypes,
    Layout,
    ModelState,
    Underflow,
    UnitShape,
    add_bytes,
    batchnorms,
    blocks,
    default_bucket_numels,
    merge_bytes,
    numel_of,
    unit_shapes,
)
from commbench.training.scaling import NO_SCALING, GradScaling, LossScaling, NoLossScaling, ShardedGradScaling
from commbench.training.sharding import Sharding, World, autocast

__all__ = [
    "ADAM_FP32", "ALL_REDUCE", "BF16", "DDP", "DDP_BUCKET_CAP_BYTES", "DDP_FIRST_BUCKET_BYTES", "DTYPE_UNDERFLOW",
    "FP16", "FP32", "FSDP1", "FSDP2", "HSDP", "INTER", "INTRA", "NO_LAYOUT", "NO_SCALING", "SHORT", "AllReduceHook",
    "CastHook", "CodecHook", "FsdpUnit", "GatherReduceDtypes", "GradComm", "GradScaling", "Layout", "LossScaling",
    "ModelState", "NoLossScaling", "ShardedGradScaling", "Sharding", "Underflow", "UnitShape", "World", "ZeRO1",
    "add_bytes", "autocast", "batchnorms", "blocks", "default_bucket_numels", "merge_bytes", "numel_of", "unit_shapes",
]  # fmt: skip
