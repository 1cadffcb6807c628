"""The ``example_int8`` codec: symmetric int8 codes, one float32 absmax scale per chunk.

One ``register_codec`` call makes it a sweep precision (``implementation`` column ``example_int8_bytes``) and a
codec the DDP hook (``commbench.training.hooks.codec_hook``) and the policy :mod:`commbench_example.policy` use.
"""

from __future__ import annotations

import torch

from commbench.measure.codec import Codec, register_codec

NAME = "example_int8"


class Int8AbsmaxCodec(Codec):
    """x ~= q * s with q = round(x / s) in [-127, 127] and s = amax / 127 (float32), one scale per chunk."""

    name = NAME
    description = "fp32 as int8 with one absmax scale per chunk (example plugin)"

    def code_bytes(self, numel: int) -> int:
        return numel

    def num_scales(self, numel: int) -> int:
        return 1

    def encode(self, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
        amax = x.abs().max() if x.numel() else torch.zeros((), device=x.device)
        s = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
        scales.copy_(s.reshape(1))
        codes.view(torch.int8).copy_(torch.round(x / s).clamp_(-127, 127))

    def decode(self, codes: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, accumulate: bool = False) -> None:
        v = codes.view(torch.int8).float() * scales[0]
        if accumulate:
            out.add_(v)
        else:
            out.copy_(v)

    def error_bound(self, abs_sum: torch.Tensor, contributions: int, encodings: int) -> torch.Tensor:
        """Half a step per encoded term and per re-encoding, a step being at most 2 A / 127 with A the largest
        ``abs_sum`` (it bounds every chunk's amax, and a re-encoded partial sum's), plus float32 rounding."""
        a = torch.as_tensor(abs_sum, dtype=torch.float64)
        step = 2 * float(a.max()) / 127 if a.numel() else 0.0
        return contributions * step + encodings * step + 1e-6 * a


def _factory(option: str | None) -> Codec:
    if option is not None:
        raise ValueError(f"{NAME} takes no option, got {option!r}")
    return Int8AbsmaxCodec()


register_codec(NAME, _factory, impl=f"{NAME}_bytes")
