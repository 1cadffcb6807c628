"""DDP gradient communication hooks of our own: fp16 / bf16 casts and an fp8 (e4m3, scaled) reduction.

Torch's `bf16_compress_hook` refuses to run unless the backend is NCCL (checked by function name),
so the cast hooks here are re-implementations of `default_hooks._compress_hook` under other names:
cast, divide by the world size, all-reduce, copy back into the fp32 bucket (so gradients never stay
in low precision after communication).

The fp8 hook cannot all-reduce fp8 (gloo refuses fp8 dtypes and summing fp8 along a ring
requantizes at every hop). It follows ZeRO++'s qgZ: split the bucket in n chunks, quantize each
(per-chunk tensor scaling), all_to_all the uint8 bytes and the scales, decode and sum in fp32 the
chunk this rank owns, re-quantize it, all_gather bytes and scales, decode. Bus bytes per rank:
2(n-1)/n * (padded bucket elements * 1 byte + n scales * 4 bytes) -- the DDP formula at 1 byte/element.
The codec comes from `commbench.fp8` when present; otherwise a minimal per-tensor-amax codec on
torch's float8 casts (`_fallback_quantize`) is used.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

# DDP checks hook annotations against the real classes, so this module keeps annotations evaluated
# (no `from __future__ import annotations`) and annotates `bucket` as dist.GradBucket.
HookFn = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]

_FP8_DTYPES: dict[str, torch.dtype] = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _cast_allreduce(dtype: torch.dtype, group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    group_to_use = group if group is not None else dist.group.WORLD
    world = dist.get_world_size(group_to_use)
    buffer = bucket.buffer()
    compressed = buffer.to(dtype).div_(world)  # same order as torch's fp16_compress_hook

    def decompress(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        # Back into the fp32 bucket in place: the gradient leaves the hook in its parameter's dtype.
        buffer.copy_(fut.value()[0])
        return buffer

    return dist.all_reduce(compressed, group=group_to_use, async_op=True).get_future().then(decompress)


def fp16_cast_hook(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce the gradient bucket in fp16 (mean), copy back to fp32."""
    return _cast_allreduce(torch.float16, group, bucket)


def bf16_cast_hook(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce the gradient bucket in bf16 (mean), copy back to fp32; runs on gloo and NCCL."""
    return _cast_allreduce(torch.bfloat16, group, bucket)


# --- fp8 codec ---------------------------------------------------------------------------------------


def _fallback_quantize(x: torch.Tensor, fmt: str, scaling: str, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor amax scaling onto torch's float8 type, returned as uint8 bytes + one fp32 scale."""
    dt = _FP8_DTYPES[fmt]
    amax = x.abs().max().float()
    fmax = torch.finfo(dt).max
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax)).reshape(1)
    q = (x.float() / scale).clamp_(-fmax, fmax).to(dt)
    return q.view(torch.uint8), scale


def _fallback_dequantize(
    q: torch.Tensor, scales: torch.Tensor, fmt: str, scaling: str, block: int = 128
) -> torch.Tensor:
    return q.view(_FP8_DTYPES[fmt]).float() * scales


def fp8_codec() -> tuple[Callable[..., tuple[torch.Tensor, torch.Tensor]], Callable[..., torch.Tensor], str]:
    """(quantize, dequantize, source): commbench.fp8 when importable, else the fallback here."""
    try:
        from commbench.fp8 import dequantize, quantize
    except ImportError:
        return _fallback_quantize, _fallback_dequantize, "fallback"
    return quantize, dequantize, "commbench.fp8"


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    # torch 2.13 renamed all_gather_into_tensor to all_gather_single; looked up per call so a
    # CommCounter installed later still sees it.
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def make_fp8_hook(fmt: str = "e4m3") -> HookFn:
    """A DDP hook reducing gradients as scaled fp8 `fmt` (qgZ-style: all_to_all, fp32 sum, all_gather)."""
    if fmt not in _FP8_DTYPES:
        raise ValueError(f"unknown fp8 format {fmt!r}; valid: {', '.join(_FP8_DTYPES)}")
    quantize, dequantize, _ = fp8_codec()

    def fp8_reduce_hook(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        group_to_use = group if group is not None else dist.group.WORLD
        n = dist.get_world_size(group_to_use)
        buffer = bucket.buffer()
        numel = buffer.numel()
        chunk = -(-numel // n)
        padded = torch.zeros(n * chunk, dtype=torch.float32, device=buffer.device)
        padded[:numel].copy_(buffer)
        padded.div_(n)  # mean, like the other hooks
        parts = [quantize(c, fmt, "tensor") for c in padded.view(n, chunk)]
        send_q = torch.cat([q.reshape(-1) for q, _ in parts])
        send_s = torch.cat([s.reshape(-1).float() for _, s in parts])
        spc = send_s.numel() // n  # scales per chunk (1 with tensor scaling)
        recv_q = torch.empty_like(send_q)
        recv_s = torch.empty_like(send_s)
        dist.all_to_all_single(recv_q, send_q, group=group_to_use)
        dist.all_to_all_single(recv_s, send_s, group=group_to_use)
        owned = torch.zeros(chunk, dtype=torch.float32, device=buffer.device)
        for j in range(n):  # fp32 sum of the n decoded contributions: one quantization per hop, not per add
            owned += dequantize(recv_q[j * chunk : (j + 1) * chunk], recv_s[j * spc : (j + 1) * spc], fmt, "tensor")
        q_own, s_own = quantize(owned, fmt, "tensor")
        s_own = s_own.reshape(-1).float()
        all_q = torch.empty(n * chunk, dtype=torch.uint8, device=buffer.device)
        all_s = torch.empty(n * s_own.numel(), dtype=torch.float32, device=buffer.device)
        _all_gather(all_q, q_own.reshape(-1), group_to_use)
        _all_gather(all_s, s_own, group_to_use)
        k = s_own.numel()
        out = torch.cat(
            [
                dequantize(all_q[j * chunk : (j + 1) * chunk], all_s[j * k : (j + 1) * k], fmt, "tensor")
                for j in range(n)
            ]
        )
        buffer.copy_(out[:numel])
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(buffer)
        return fut

    return fp8_reduce_hook


def fp8_bucket_bus_bytes(numel: int, n: int, scales_per_chunk: int = 1) -> float:
    """Formula: bus bytes one rank sends for one bucket of `numel` fp32 gradients through the fp8 hook."""
    if n <= 1:
        return 0.0
    chunk = -(-numel // n)
    payload = n * chunk * 1 + n * scales_per_chunk * 4  # uint8 bytes + fp32 scales
    # all_to_all (n-1)/n of the per-rank buffer + all_gather (n-1)/n of the total output
    return 2.0 * (n - 1) / n * payload


# --- the API policies code against (commbench.training.strategies) -----------------------------------

_CODECS: dict[str, str] = {"fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}


def cast_hook(wire_dtype: torch.dtype) -> HookFn:
    """The all-reduce hook that communicates gradients in `wire_dtype` (fp16 or bf16), mean, back to fp32."""

    def cast_allreduce_hook(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return _cast_allreduce(wire_dtype, group, bucket)

    return cast_allreduce_hook


def codec_hook(codec_name: str) -> HookFn:
    """The chunked codec hook for `codec_name` ("fp8_e4m3", "fp8_e5m2")."""
    if codec_name not in _CODECS:
        raise ValueError(f"unknown gradient codec {codec_name!r}; valid: {', '.join(_CODECS)}")
    return make_fp8_hook(_CODECS[codec_name])


def cast_hook_bytes(numel: int, n: int, wire_dtype: torch.dtype) -> dict[str, float]:
    """Formula: bus bytes per step by "op:dtype" of `cast_hook` over `numel` gradient elements."""
    from commbench.training.comm import bus_factor, dtype_name

    v = bus_factor("all_reduce", n) * numel * wire_dtype.itemsize
    return {f"all_reduce:{dtype_name(wire_dtype)}": v} if v else {}


def codec_hook_bytes(codec_name: str, bucket_numels: Sequence[int], n: int) -> dict[str, float]:
    """Formula: per bucket, all_to_all + all_gather of the padded uint8 chunks and of one fp32 scale per chunk."""
    from commbench.training.comm import bus_factor

    out: dict[str, float] = {}
    if n <= 1:
        return out
    for numel in bucket_numels:
        chunk = -(-numel // n)
        for op in ("all_to_all", "all_gather"):
            for key, v in ((f"{op}:uint8", bus_factor(op, n) * n * chunk), (f"{op}:float", bus_factor(op, n) * n * 4)):
                out[key] = out.get(key, 0.0) + v
    return out
