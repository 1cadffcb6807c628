"""DDP gradient communication hooks of our own: a cast all-reduce (fp16 / bf16) and a chunked-codec reduction.

Torch's `bf16_compress_hook` refuses to run unless the backend is NCCL (checked by function name), so the
cast hook here re-implements `default_hooks._compress_hook` under another name: cast, divide by the world
size, all-reduce, copy back into the fp32 bucket (so gradients never stay in low precision after
communication).

The codec hook (`codec_hook("fp8_e4m3")`) cannot all-reduce fp8 (gloo refuses fp8 dtypes, and summing fp8
along a ring re-encodes at every hop). It runs the chunked all_reduce of `commbench.measure.chunked` (ZeRO++ qgZ:
encode n chunks, all_to_all, decode and sum the owned chunk in fp32, re-encode, all_gather, decode) on the
bucket divided by the world size, in the split wire layout (codes as uint8, scales as float32 calls). It is
asynchronous, like torch's own hooks: it returns at once with a future that completes when the
communication has, so backward overlaps it.

Ordering. The second stage (the gather) is launched from the callback of the first, on whatever thread
completes it (gloo: a worker thread), while DDP may already be calling the hook for the next bucket. Ranks
must issue collectives on a group in the same order, so the launches take tickets: bucket k's gather goes
before bucket k+1's exchange, on every rank. DDP launches buckets in index order, so the hook for bucket k+1
waits (if at all) only until bucket k's exchange has arrived and its gather is on its way.

Streams. On NCCL a work's future completes on the host when the kernel is queued, not when its output is
written; only that future's own ``wait()`` orders the current stream after the kernel. So each stage waits
on every work future it launched before it reads their buffers (never on a ``collect_all`` of them, which
carries no CUDA events), decodes on a stream from torch's pool rather than DDP's compute stream, and
completes a result future made for the bucket's device, whose ``set_result`` records the event DDP waits
on. Every reduction in flight owns its buffers. ``tests/test_hook_streams.py`` checks this on CPU with a
fake collective whose future is complete at launch while its output lands later.
"""

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from commbench.measure.chunked import ChunkedAllReduce
from commbench.measure.codec import Codec, get_codec
from commbench.measure.collectives import COLLECTIVES
from commbench.measure.precision import nccl_type_name

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


_Devices = list[int | str | torch.device]
"""What ``torch.futures.Future(devices=...)`` takes."""


def _stream_devices(t: torch.Tensor) -> _Devices:
    """The devices a future holding ``t`` records events on: ``t``'s own when it has an index, else none.

    torch's Future accepts only indexed devices ("Expected devices to have indices"); an accelerator tensor
    always carries its index and a CPU tensor never does (a Future given ``cpu:0`` completes, but its ``then``
    asks the CPU for a pool stream and raises). So the rule needs no device-type test."""
    return [t.device] if t.device.index is not None else []


def _when_complete(works: list[Any], devices: _Devices, stage: Callable[[list[Any]], None]) -> None:
    """Run ``stage(futures)`` once every work's future has completed on the host; ``stage`` must ``wait()``
    each future before it reads that work's output.

    Why the waits. An NCCL work's future completes on the host as soon as the kernel is queued: ProcessGroupNCCL
    marks it completed at enqueue under a guard on its NCCL stream (``collective()``: ``work->future_ =
    make_intrusive<Future>(..., devices); work->future_->markCompleted(...)``), which records events there, and
    ``Future.wait()`` then "insert[s] the necessary instructions in the current streams to ensure that further
    operations enqueued on those streams will be properly scheduled after the async kernels" (torch.futures
    docs; c10 ``synchronizeWithCurrentStreams``: ``event.block(current stream)``), without blocking the host.
    ``torch.futures.collect_all`` gives no such guarantee: its combined future is built without devices ("No
    need to pass devices, because dstFuture won't directly contain the value", c10 ``collectAll`` in
    ivalue.cpp), so it records no events and neither its ``wait()`` nor its ``then`` callbacks order anything
    after the kernels. It is used here only for the host-side "all launched works are done" signal.

    Where the stage runs. Its callback hangs off a future of the bucket's devices, so on CUDA it runs with a
    stream from torch's pool as current ("the callback will be invoked with some dedicated streams set as
    current (fetched from a global pool)", ``Future.then`` docs; c10 ``invokeCallback``): decoding waits on
    NCCL on that side stream, never holding the compute stream that DDP's backward runs on (torch's own
    compression hooks decompress in ``then`` callbacks of the work's future for the same reason). That
    future's value holds no tensor, so the callback inherits no event: the stage's own ``wait()`` calls
    order it. On CPU the callback runs on the thread that completed the last work (gloo: a worker thread)."""
    futures = [w.get_future() for w in works]
    ready: torch.futures.Future[None] = torch.futures.Future(devices=devices)
    ready.then(lambda _: stage(futures))
    # An inner error also completes the combined future; the stage's wait() on that future raises it.
    torch.futures.collect_all(futures).add_done_callback(lambda _: ready.set_result(None))


def _wait_each(futures: list[Any]) -> None:
    """Order the current stream after every future's kernels (on the host: block until each is complete)."""
    for f in futures:
        f.wait()


def _fail(result: torch.futures.Future[Any], error: Exception) -> None:
    # torch's stub types set_exception's argument as the future's value type (it takes an exception)
    result.set_exception(error)  # type: ignore[arg-type]


class _Slot:
    """A chunked all_reduce op with its buffers, and the result future of its latest use."""

    __slots__ = ("op", "last")

    def __init__(self, op: ChunkedAllReduce) -> None:
        self.op = op
        self.last: torch.futures.Future[torch.Tensor] | None = None

    def free(self) -> bool:
        return self.last is None or self.last.done()


_SlotKey = tuple[int, int, torch.device, int]
"""(bucket index, numel, device, id of the group)."""


def tensor_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of the distinct storages of the tensors in ``obj``'s attributes, in lists and dicts there, and in the
    attributes of commbench objects there (a chunked op's wires and their codec workspaces)."""
    seen = set() if seen is None else seen
    total = 0
    for v in vars(obj).values():
        items = list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, (list, tuple)) else [v]
        for t in items:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if st.data_ptr() not in seen:
                    seen.add(st.data_ptr())
                    total += st.nbytes()
            elif type(t).__module__.startswith("commbench.") and hasattr(t, "__dict__"):
                total += tensor_bytes(t, seen)
    return total


class _CodecReducer:
    """State of one codec hook: chunked all_reduce ops (buffers reused across steps) and tickets.

    Each in-flight reduction owns its op and every buffer the op holds (input, wire, received, output): a slot
    is taken only when its previous use has completed on the host, else a new one is made (DDP reduces a bucket
    once per step, so that is one op per bucket). Before reusing a slot, the current stream waits on the
    previous use's result future, so on CUDA no write of the new use overtakes a kernel of the old one even if
    a caller did not wait on it.

    Slots of buckets that are gone are freed. DDP rebuilds its buckets after the first step (in the order the
    gradients became ready; the first step's buckets follow the parameters in reverse, with a small first one), so
    the keys of step 0 are not those of step 1: at the last bucket of every step (``GradBucket.is_last``), the
    slots of every key that step did not use are dropped once their last use completed. What the hook holds is
    then one op per bucket of the current layout, about 4 bytes x 4 buffers per gradient element, never the
    layouts before it too (``held_bytes``)."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.tickets = _Tickets()
        self.slots: dict[_SlotKey, list[_Slot]] = {}
        self._used: set[_SlotKey] = set()
        """Keys taken since the last bucket of the previous step."""
        self._lock = threading.Lock()  # slots are returned from callbacks on other threads

    def held_bytes(self) -> int:
        """Bytes of every buffer of every slot this hook keeps (distinct storages)."""
        seen: set[int] = set()
        with self._lock:
            return sum(tensor_bytes(s.op, seen) for slots in self.slots.values() for s in slots)

    def _prune(self) -> None:
        """Drop the slots of keys the step that just ended did not use (a layout DDP rebuilt away), and of every
        key all but one free slot (a bucket reduced twice at once once left two), never one still in flight;
        called under the lock at the last bucket of a step. What is held is then bounded by one op per bucket of
        the current layout plus the reductions in flight."""
        for key in list(self.slots):
            busy = [s for s in self.slots[key] if not s.free()]
            spare = [s for s in self.slots[key] if s.free()][:1] if key in self._used else []
            if busy or spare:
                self.slots[key] = busy + spare
            else:
                del self.slots[key]
        self._used = set()

    def _take(
        self, bucket: dist.GradBucket, group: Any, result: torch.futures.Future[torch.Tensor]
    ) -> ChunkedAllReduce:
        """A free op for ``bucket``, marked in use until ``result`` completes."""
        buffer = bucket.buffer()
        key = (bucket.index(), buffer.numel(), buffer.device, id(group))
        with self._lock:
            self._used.add(key)
            slots = self.slots.setdefault(key, [])
            slot = next((s for s in slots if s.free()), None)
            if slot is None:
                op = ChunkedAllReduce(
                    self.codec, buffer.numel(), group, buffer.device, packed=False, gather_by_all_to_all=False
                )
                slot = _Slot(op)
                slots.append(slot)
            previous, slot.last = slot.last, result
            is_last = getattr(bucket, "is_last", None)  # a GradBucket has it; a caller's duck bucket may not
            if is_last is not None and is_last():
                self._prune()
        if previous is not None:
            # Complete on the host (the slot was free); on CUDA the current stream waits on its decode. A use
            # that failed has no events, and its error already went to its own caller.
            with contextlib.suppress(Exception):
                previous.wait()
        return slot.op

    def __call__(self, group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        group_to_use = group if group is not None else dist.group.WORLD
        n = dist.get_world_size(group_to_use)
        buffer = bucket.buffer()
        devices = _stream_devices(buffer)
        # set_result records an event on the stream that decoded (CUDA), which DDP's wait() then orders after.
        result: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=devices)
        op = self._take(bucket, group_to_use, result)
        try:
            op.load(buffer)
            op.x.div_(n)  # mean, like the other hooks (the zero pad stays zero)
            op.encode()
        except Exception as e:  # before any ticket: nothing launched, the op is free again
            _fail(result, e)
            return result
        first, second = self.tickets.take(), self.tickets.take()

        def gathered(futures: list[Any]) -> None:
            try:
                _wait_each(futures)
                op.decode()
                buffer.copy_(op.result())
                result.set_result(buffer)
            except Exception as e:  # a callback's exception would be lost: hand it to DDP's future
                _fail(result, e)

        def exchanged(futures: list[Any]) -> None:
            try:
                _wait_each(futures)
                op.reencode()
            except Exception as e:
                self.tickets.issue(second, list)  # the gather's ticket still goes, keeping the order moving
                _fail(result, e)
                return
            try:  # a launch that raises has used its ticket (issue advances it either way)
                works = self.tickets.issue(second, lambda: op.gather(async_op=True))
                _when_complete(works, devices, gathered)
            except Exception as e:
                _fail(result, e)

        try:
            works = self.tickets.issue(first, lambda: op.exchange(async_op=True))
        except Exception as e:
            self.tickets.issue(second, list)
            _fail(result, e)
            return result
        # Attached after the launch returned: with NCCL (futures complete at enqueue) the stages run right here.
        _when_complete(works, devices, exchanged)
        return result


def codec_hook(codec_name: str) -> HookFn:
    """An asynchronous DDP hook reducing gradients through the chunked algorithm with codec ``codec_name``
    (``"fp8_e4m3"``, ``"fp8_e5m2:block128"``, any registered codec); ``ValueError`` for an unknown name."""
    reducer = _CodecReducer(get_codec(codec_name))

    def codec_reduce_hook(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return reducer(group, bucket)

    codec_reduce_hook.reducer = reducer  # type: ignore[attr-defined]  # what it holds: reducer.held_bytes()
    return codec_reduce_hook


def codec_hook_bytes(codec_name: str, bucket_numels: Sequence[int], n: int) -> dict[str, float]:
    """Formula: bus bytes per step ("op:dtype", nccl-tests bus bytes) of :func:`codec_hook` over DDP buckets
    of ``bucket_numels`` gradients, from the chunked algorithm's own wire-byte function."""
    out: dict[str, float] = {}
    if n <= 1:
        return out
    codec = get_codec(codec_name)
    for numel in bucket_numels:
        for coll, dtype, size in ChunkedAllReduce.stage_bytes(
            codec, numel, n, packed=False, gather_by_all_to_all=False
        ):
            key = _key(coll.name, dtype)
            out[key] = out.get(key, 0.0) + coll.bus_factor(n) * size
    return out


_PROBE_AMAXES = tuple(1.0 + k / 32 for k in range(32))
"""One binade of chunk amaxes: a codec with power-of-two scales is tightest at one of them (for fp8 e4m3 at
1.75 = 448 / 2**8, where the amax lands on the format's maximum)."""


@functools.cache
def codec_underflow(codec_name: str) -> float:
    """The fraction of a chunk's amax at or below which ``codec_name`` encodes an element as zero: the gradient
    threshold of `runner`'s underflow count for a codec hook (``0.0``: the codec loses no nonzero value).

    Measured on the codec itself, so every registered codec has one without declaring it: for each amax of one
    binade, the largest float32 ``t`` with ``decode(encode([amax, t]))[1] == 0`` (bisection on float32 bit
    patterns, which order like the positive values), and the smallest ``t / amax`` over them (the codec at its
    tightest; fp8 e4m3 per-tensor: 2**-10 / 448, half the smallest subnormal relative to the maximum)."""
    codec = get_codec(codec_name)
    codes = torch.zeros(codec.code_bytes(2), dtype=torch.uint8)
    scales = torch.zeros(codec.num_scales(2), dtype=torch.float32)
    out = torch.zeros(2, dtype=torch.float32)

    def lost(amax: float, bits: int) -> bool:
        t = torch.tensor([bits], dtype=torch.int32).view(torch.float32)
        codec.encode(torch.cat([torch.tensor([amax]), t]), codes, scales)
        codec.decode(codes, scales, out)
        return float(out[1]) == 0.0

    best = math.inf
    for amax in _PROBE_AMAXES:
        lo = 0  # bits of 0.0: always lost
        hi = int(torch.tensor([amax], dtype=torch.float32).view(torch.int32))  # the amax itself: never lost
        if lost(amax, hi):
            raise ValueError(f"codec {codec_name!r} decodes a chunk's amax {amax} as zero")
        while hi - lo > 1:  # invariant: lo lost, hi kept
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if lost(amax, mid) else (lo, mid)
        t = float(torch.tensor([lo], dtype=torch.int32).view(torch.float32))
        best = min(best, t / amax)
    return best
