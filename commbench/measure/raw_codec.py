"""``fp32_chunked``: float32 through the chunked algorithm, uncompressed.

On a backend without fp8 reductions a codec precision reaches its result by another algorithm than fp32 does
(reduce_scatter and all_reduce over all_to_all plus a local fp32 sum). Timing fp32 through that same
algorithm splits a codec's gain over native fp32 into its **algorithm** part (native fp32 / fp32_chunked) and
its **precision** part (fp32_chunked / codec): the sweep adds this contender wherever the split applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from commbench.measure.codec import ChunkRows, Codec, register_codec

if TYPE_CHECKING:  # imported where tensors are handled: registering the codec needs no torch
    import torch

NAME = "fp32_chunked"


class Fp32Raw(Codec):
    """The identity codec: four bytes of float32 per element, no scales."""

    name = NAME
    description = (
        "fp32 through the chunked (all_to_all) algorithm, uncompressed: the algorithm's share of a codec's gain"
    )

    def code_bytes(self, numel: int) -> int:
        return 4 * numel

    def num_scales(self, numel: int) -> int:
        return 0

    def encode(self, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
        import torch

        codes.copy_(x.contiguous().view(torch.uint8))

    def decode(self, codes: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, accumulate: bool = False) -> None:
        import torch

        # a chunk's bytes start 4-byte aligned in both wire layouts (no scales between chunks)
        v = codes.view(torch.float32)
        out.add_(v) if accumulate else out.copy_(v)

    def encode_rows(self, x: torch.Tensor, rows: ChunkRows) -> None:
        import torch

        rows.codes.copy_(x.view(torch.uint8))  # one copy for every chunk

    def decode_rows(self, rows: ChunkRows, out: torch.Tensor, reduce: bool) -> None:
        import torch

        v = rows.codes.view(torch.float32)  # [k, m]: chunks start 4-byte aligned in both layouts
        if reduce:
            from commbench.measure.fp8_eager import sum_chunks

            sum_chunks(v, out)  # one reduction over the chunks
        else:
            out.copy_(v)

    def error_bound(self, abs_sum: torch.Tensor, contributions: int, encodings: int) -> torch.Tensor | float:
        import torch

        # lossless transport; only the float32 sum of `contributions` terms rounds (|error| <= (k-1) u sum|x|)
        return torch.as_tensor(abs_sum, dtype=torch.float64) * max(contributions - 1, 0) * 2.0**-24


def _factory(option: str | None) -> Codec:
    if option is not None:
        raise ValueError(f"precision {NAME!r} takes no ':{option}' option")
    return Fp32Raw()


register_codec(NAME, _factory, impl="chunked")
