"""DDP gradient communication hooks of our own: a cast all-reduce (fp16 / bf16) and a chunked-codec reduction.

Torch's `bf16_compress_hook` refuses to run unless the backend is NCCL (checked by function name), so the
cast hook here re-implements `default_hooks._compress_hook` under another name: cast, divide by the world
size, all-reduce, copy back into the fp32 bucket (so gradients never stay in low precision after
communication).

The codec hook (`codec_hook("fp8_e4m3")`) cannot all-reduce fp8 (gloo refuses fp8 dtypes, and summing fp8
along a ring re-encodes at every hop). It runs the chunked all_reduce of `commbench.chunked` (ZeRO++ qgZ:
encode n chunks, all_to_all, decode and sum the owned chunk in fp32, re-encode, all_gather, decode) on the
bucket divided by the world size, in the split wire layout (codes as uint8, scales as float32 calls). It is
asynchronous, like torch's own hooks: it returns at once with a future that completes when the
communication has, so backward overlaps it.

Ordering. The second stage (the gather) is launched from the callback of the first, on whatever thread
completes it (gloo: a worker thread), while DDP may already be calling the hook for the next bucket. Ranks
must issue collectives on a group in the same order, so the launches take tickets: bucket k's gather goes
before bucket k+1's exchange, on every rank. DDP launches buckets in index order, so the hook for bucket k+1
waits (if at all) only until bucket k's exchange has arrived and its gather is on its way.
"""

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from commbench.chunked import ChunkedAllReduce
from commbench.codec import Codec, get_codec
from commbench.collectives import COLLECTIVES
from commbench.precision import nccl_type_name

# DDP checks hook annotations against the real classes, so this module keeps annotations evaluated
# (no `from __future__ import annotations`) and annotates `bucket` as dist.GradBucket.
HookFn = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def _key(op: str, dtype: torch.dtype) -> str:
    return f"{op}:{nccl_type_name(dtype)}"


# --- cast hook ------------------------------------------------------------------------------------------


def cast_hook(wire_dtype: torch.dtype) -> HookFn:
    """A DDP hook all-reducing the gradient bucket in ``wire_dtype`` (mean), copied back to fp32."""

    def cast_allreduce_hook(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        group_to_use = group if group is not None else dist.group.WORLD
        world = dist.get_world_size(group_to_use)
        buffer = bucket.buffer()
        compressed = buffer.to(wire_dtype).div_(world)  # same order as torch's fp16_compress_hook

        def decompress(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            # Back into the fp32 bucket in place: the gradient leaves the hook in its parameter's dtype.
            buffer.copy_(fut.value()[0])
            return buffer

        work = COLLECTIVES["all_reduce"].run(compressed, compressed, group_to_use, async_op=True)
        return work.get_future().then(decompress)

    return cast_allreduce_hook


def cast_hook_bytes(numel: int, n: int, wire_dtype: torch.dtype) -> dict[str, float]:
    """Formula: bus bytes per step ("op:dtype", nccl-tests bus bytes) of the cast hook over ``numel`` gradients."""
    if n <= 1:
        return {}
    ar = COLLECTIVES["all_reduce"]
    return {_key(ar.name, wire_dtype): ar.bus_factor(n) * numel * wire_dtype.itemsize}


# --- codec hook -----------------------------------------------------------------------------------------


class _Tickets:
    """Issues collective launches in ticket order, whichever thread launches them (see the module docstring)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._next = 0
        self._issued = 0

    def take(self) -> int:
        with self._cv:
            t = self._next
            self._next += 1
            return t

    def issue(self, ticket: int, launch: Callable[[], list[Any]]) -> list[Any]:
        with self._cv:
            self._cv.wait_for(lambda: self._issued == ticket)
            try:
                return launch()
            finally:
                # Advanced even when the launch fails, so a failure surfaces as an error, never as a hang.
                self._issued += 1
                self._cv.notify_all()


def _done(works: list[Any]) -> torch.futures.Future[Any]:
    futs = [w.get_future() for w in works]
    return futs[0] if len(futs) == 1 else torch.futures.collect_all(futs)


class _CodecReducer:
    """State of one codec hook: a chunked all_reduce op per bucket (buffers reused across steps) and tickets."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.tickets = _Tickets()
        self.ops: dict[tuple[int, int, torch.device, int], ChunkedAllReduce] = {}

    def _op(self, bucket: dist.GradBucket, group: Any) -> ChunkedAllReduce:
        buffer = bucket.buffer()
        key = (bucket.index(), buffer.numel(), buffer.device, id(group))
        op = self.ops.get(key)
        if op is None:
            op = ChunkedAllReduce(
                self.codec, buffer.numel(), group, buffer.device, packed=False, gather_by_all_to_all=False
            )
            self.ops[key] = op
        return op

    def __call__(self, group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        group_to_use = group if group is not None else dist.group.WORLD
        n = dist.get_world_size(group_to_use)
        buffer = bucket.buffer()
        op = self._op(bucket, group_to_use)
        op.load(buffer)
        op.x.div_(n)  # mean, like the other hooks (the zero pad stays zero)
        op.encode()
        first, second = self.tickets.take(), self.tickets.take()
        result: torch.futures.Future[torch.Tensor] = torch.futures.Future(
            devices=[buffer.device] if buffer.device.type == "cuda" else None
        )

        def gathered(fut: torch.futures.Future[Any]) -> None:
            try:
                fut.wait()
                op.decode()
                buffer.copy_(op.result())
                result.set_result(buffer)
            except Exception as e:  # a callback's exception would be lost: hand it to DDP's future
                result.set_exception(e)

        def exchanged(fut: torch.futures.Future[Any]) -> None:
            launched = False
            try:
                fut.wait()
                op.reencode()
                works = self.tickets.issue(second, lambda: op.gather(async_op=True))
                launched = True
                _done(works).then(gathered)
            except Exception as e:
                if not launched:
                    self.tickets.issue(second, list)  # keep the ticket order moving
                result.set_exception(e)

        works = self.tickets.issue(first, lambda: op.exchange(async_op=True))
        # Attached after the launch returned: a future already complete (NCCL) runs the callback right here.
        _done(works).then(exchanged)
        return result


def codec_hook(codec_name: str) -> HookFn:
    """An asynchronous DDP hook reducing gradients through the chunked algorithm with codec ``codec_name``
    (``"fp8_e4m3"``, ``"fp8_e5m2:block128"``, any registered codec); ``ValueError`` for an unknown name."""
    reducer = _CodecReducer(get_codec(codec_name))

    def codec_reduce_hook(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return reducer(group, bucket)

    return codec_reduce_hook


def codec_hook_bytes(codec_name: str, bucket_numels: Sequence[int], n: int) -> dict[str, float]:
    """Formula: bus bytes per step ("op:dtype", nccl-tests bus bytes) of :func:`codec_hook` over DDP buckets
    of ``bucket_numels`` gradients, from the chunked algorithm's own wire-byte function."""
    out: dict[str, float] = {}
    if n <= 1:
        return out
    codec = get_codec(codec_name)
    for numel in bucket_numels:
        for coll, dtype, size in ChunkedAllReduce.stage_bytes(codec, numel, n, packed=False, gather_by_all_to_all=False):
            key = _key(coll.name, dtype)
            out[key] = out.get(key, 0.0) + coll.bus_factor(n) * size
    return out
