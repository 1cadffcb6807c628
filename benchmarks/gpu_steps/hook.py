"""The codec DDP hook against the synchronous chunked all_reduce: a duck-typed bucket, gradient-like data, bit-for-bit comparison, and the positive control (the hook with its waits removed must differ, or the check says it has no power there)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpu_steps.codec import bits_of

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist


class DuckBucket:
    """What the codec hook reads of DDP's ``GradBucket``: the flat buffer and the bucket index."""

    def __init__(self, buffer: torch.Tensor, index: int) -> None:
        self._buffer, self._index = buffer, index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return False


def sync_chunked_all_reduce(codec_name: str, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The synchronous reference: the sweep's chunked all_reduce stage by stage on ``x`` divided by the world
    (the hook's mean), in the split layout the hook uses."""
    import torch.distributed as dist

    from commbench.measure.chunked import ChunkedAllReduce
    from commbench.measure.codec import get_codec

    n = dist.get_world_size(group)
    op = ChunkedAllReduce(get_codec(codec_name), x.numel(), group, x.device, packed=False, gather_by_all_to_all=False)
    op.load(x)
    op.x.div_(n)
    op.encode()
    op.comm()
    op.decode()
    return op.result().clone()


def gradient_like(numel: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Random gradients whose magnitude changes every 4096 elements (so chunks and blocks get other scales)."""
    import torch

    x = torch.randn(numel, generator=generator, device=device)
    runs = -(-numel // 4096)
    mag = torch.exp2(torch.randint(-20, 0, (runs,), generator=generator, device=device).float())
    return (x * mag.repeat_interleave(4096)[:numel]).contiguous()


def hook_vs_sync(
    codec_name: str,
    numel: int,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
    steps: Sequence[Sequence[int]] = ((0, 1), (0, 0)),
    seed: int = 0,
) -> dict[str, int]:
    """Elements where the codec DDP hook's result differs from the synchronous chunked all_reduce's, per
    (step, call). ``steps`` lists the bucket index of each call of a step; every call of a step is in flight
    before any is waited, so each must own its buffers (the default: two buckets, then one bucket twice, and
    the second step reuses what the first left). The future's ``wait()`` is how DDP consumes it: on CUDA it
    makes the current stream wait on the events the hook recorded."""
    import torch

    from commbench.training.hooks import codec_hook

    hook = codec_hook(codec_name)
    gen = torch.Generator(device=device).manual_seed(seed)
    mismatches: dict[str, int] = {}
    for step, indices in enumerate(steps):
        grads = [gradient_like(numel, gen, device) for _ in indices]
        flat = [g.clone() for g in grads]
        futs = [hook(group, DuckBucket(b, i)) for i, b in zip(indices, flat, strict=True)]  # type: ignore[arg-type]
        results = [f.wait() for f in futs]
        for k, (g, got) in enumerate(zip(grads, results, strict=True)):
            got = got[0] if isinstance(got, (list, tuple)) else got
            ref = sync_chunked_all_reduce(codec_name, g, group)
            where = f"step{step}.call{k}(bucket {indices[k]})"
            mismatches[where] = numel if got.shape != ref.shape else int((bits_of(got) != bits_of(ref)).sum())
    return mismatches


def hook_control(rep: Any, codec_name: str, numel: int, device: torch.device) -> int:
    """The positive control of the hook check: the same comparison with the hook's waits removed
    (``hooks._wait_each`` made a no-op, so a stage reads its buffers without ordering after NCCL's kernels). It
    must differ somewhere, or the check has no power on this GPU (the race the waits prevent does not show here,
    so a passing hook check proves nothing about them); the figure says which. Returns the differing elements."""
    from unittest import mock

    from commbench.training import hooks

    with mock.patch.object(hooks, "_wait_each", lambda futures: None):
        found = hook_vs_sync(codec_name, numel, device, seed=1)
    bad = sum(found.values())
    rep.fig("control: waits removed, differing elements", bad)
    rep.fig(
        "hook check power",
        "yes: with the waits removed the results differ" if bad else
        "none here: with the waits removed the results still matched, so this GPU shows no race to catch",
    )  # fmt: skip
    return bad
