"""Codec registry: how a float32 chunk becomes wire bytes (codes + float32 scales) and back.

A codec knows nothing about communication. The chunked algorithm (:mod:`commbench.measure.chunked`) moves what a codec
encodes, for the sweep's precisions and for the DDP hook alike. Names may carry an option after a colon
(``fp8_e4m3:block128``); the registry maps the base name to a factory, like the precision registry.

Adding a codec: subclass :class:`Codec`, call :func:`register_codec` with a factory, in a module the plugin loader
imports (a built-in, an entry point of ``commbench.plugins`` or ``--plugin MODULE``). That also registers a sweep
precision of the same name (``impl`` says how the bytes move in the results' ``implementation`` column), and
:func:`commbench.training.hooks.codec_hook` accepts the name at once: both ask :data:`CODECS` / the precision
registry, which load the plugins before a lookup.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from commbench.core.registry import OptionRegistry
from commbench.measure.collectives import Collective, Layout
from commbench.measure.precision import PRECISIONS, PointOp, Precision

if TYPE_CHECKING:  # torch is imported where tensors are handled: the registry itself is torch-free
    import torch
    import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class ChunkRows:
    """The wire side of ``k`` chunks a codec encodes into or decodes from (see :meth:`Codec.encode_chunks`)."""

    codes: torch.Tensor
    """``[k, code_bytes(m)]`` uint8, rows contiguous, the wire's row stride."""
    scales: torch.Tensor
    """``[k, num_scales(m)]`` float32: the scales' home."""
    wire_scales: torch.Tensor | None
    """``[k, 4 * scale_count(m)]`` uint8 where the travelling scales are (maybe misaligned); None when none travel."""
    workspace: dict[str, torch.Tensor] | None
    """Scratch the caller (the wire) owns, which a codec may keep buffers in."""


class Codec(ABC):
    """Encode a contiguous 1-D float32 chunk into codes (bytes) and float32 scales; decode back."""

    name: str
    """Canonical name recorded in results (``fp8_e4m3:block128``)."""
    description: str = ""

    @abstractmethod
    def code_bytes(self, numel: int) -> int:
        """Bytes of codes for ``numel`` elements."""

    @abstractmethod
    def num_scales(self, numel: int) -> int:
        """Length of the float32 scale tensor :meth:`encode` writes (at least the ones that travel)."""

    def scale_count(self, numel: int) -> int:
        """How many of those scales travel with the codes (a prefix; the rest are local constants)."""
        return self.num_scales(numel)

    def wire_bytes(self, numel: int) -> int:
        """Bytes on the wire for one chunk of ``numel`` elements, scales included."""
        return self.code_bytes(numel) + 4 * self.scale_count(numel)

    @abstractmethod
    def encode(self, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
        """Write ``x``'s codes into ``codes`` (uint8, :meth:`code_bytes` long, maybe a slice of a wire buffer)
        and its scales into ``scales`` (float32, :meth:`num_scales` long)."""

    @abstractmethod
    def decode(self, codes: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, accumulate: bool = False) -> None:
        """``out = decoded`` (float32), or ``out += decoded`` with ``accumulate`` (the fp32 sum of sources)."""

    def encode_chunks(
        self,
        x: torch.Tensor,
        codes: torch.Tensor,
        scales: torch.Tensor,
        wire_scales: torch.Tensor | None,
        *,
        workspace: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Encode ``k`` chunks at once: ``x`` ``[k, m]`` float32, ``codes`` ``[k, code_bytes(m)]`` uint8 (each
        row contiguous; the row stride is the wire's), ``scales`` the ``[k, num_scales(m)]`` float32 home,
        ``wire_scales`` ``[k, 4 * scale_count(m)]`` uint8 where the travelling scales go (little-endian float32
        bytes, possibly misaligned), None when none travel. ``workspace`` is scratch owned by the caller (the
        wire), which a codec may keep buffers in. A codec overrides :meth:`encode_rows`, which gets these as one
        :class:`ChunkRows`."""
        self.encode_rows(x, ChunkRows(codes, scales, wire_scales, workspace))

    def decode_chunks(
        self,
        codes: torch.Tensor,
        scales: torch.Tensor,
        wire_scales: torch.Tensor | None,
        out: torch.Tensor,
        *,
        reduce: bool = False,
        workspace: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Decode ``k`` chunks (arguments as :meth:`encode_chunks`; the scales are read from ``wire_scales``
        when they travel): into ``out`` ``[k, m]``, or with ``reduce`` the float32 sum of the k decoded chunks,
        source order 0..k-1, into ``out`` ``[m]``. A codec overrides :meth:`decode_rows`."""
        self.decode_rows(ChunkRows(codes, scales, wire_scales, workspace), out, reduce)

    def encode_rows(self, x: torch.Tensor, rows: ChunkRows) -> None:
        """:meth:`encode_chunks`. This default loops over :meth:`encode` (so a codec that defines only the
        per-chunk methods works unchanged); a codec meant for GPUs overrides it with a few ops whatever ``k``
        (see ``Fp8Codec``)."""
        import torch

        for i in range(x.shape[0]):
            self.encode(x[i], rows.codes[i], rows.scales[i])
        if rows.wire_scales is not None and x.shape[0]:
            rows.wire_scales.copy_(rows.scales[:, : rows.wire_scales.shape[1] // 4].view(torch.uint8))

    def decode_rows(self, rows: ChunkRows, out: torch.Tensor, reduce: bool) -> None:
        """:meth:`decode_chunks`. The default loops over :meth:`decode` (``accumulate`` for chunks after the
        first)."""
        import torch

        codes, scales, wire_scales = rows.codes, rows.scales, rows.wire_scales
        if wire_scales is not None and codes.shape[0]:
            scales[:, : wire_scales.shape[1] // 4].view(torch.uint8).copy_(wire_scales)
        for i in range(codes.shape[0]):
            self.decode(codes[i], scales[i], out if reduce else out[i], accumulate=reduce and i > 0)

    @abstractmethod
    def error_bound(self, abs_sum: torch.Tensor, contributions: int, encodings: int) -> torch.Tensor | float:
        """Per-element bound on ``|decoded - exact|`` for a result summing ``contributions`` encoded terms whose
        ``|x|`` sum to ``abs_sum`` (float64), encoded ``encodings`` times on the way (re-encoded partial sums)."""

    def check_tolerance(self, abs_sum: torch.Tensor, contributions: int, encodings: int) -> torch.Tensor | float:
        """The tolerance of the ``wrong`` count on :func:`commbench.measure.check.exact_inputs` (same arguments as
        :meth:`error_bound`, which it is unless the codec carries those inputs exactly: then 0)."""
        return self.error_bound(abs_sum, contributions, encodings)


CodecFactory = Callable[[str | None], Codec]
"""Builds a codec from the option after the colon (``None`` when the name has none)."""

CODECS: OptionRegistry[Codec] = OptionRegistry("codec")
"""The codecs by base name (each also a sweep precision of the same name)."""


class CodecPrecision(Precision):
    """A sweep precision whose fp32 tensor travels through a codec with the chunked algorithm."""

    input_dtype_name = "float32"
    wire_dtype_name = "uint8"
    chunked = True

    def __init__(self, codec: Codec, impl: str) -> None:
        self.codec = codec
        self.name = codec.name
        self.impl = impl
        self.description = codec.description

    def supports(self, collective: Collective, backend: str) -> bool:
        return collective.supports_chunked()

    def make_op(
        self, collective: Collective, layout: Layout, group: dist.ProcessGroup | None, device: torch.device
    ) -> PointOp:
        return collective.chunked_op(self.codec, layout, group, device)

    def error_bound(self, collective: Collective, abs_sum: torch.Tensor, n: int) -> torch.Tensor | float:
        import torch

        contributions = n if collective.reduces else 1
        return self.codec.error_bound(torch.as_tensor(abs_sum), contributions, collective.chunked_encodings)

    def buffer_bytes(self, collective: Collective, layout: Layout, n: int) -> int:
        # fp32 input and output, and a send and a receive wire of n chunks per encoding stage (all_reduce:
        # the exchange and the gather, plus the gathered fp32 output)
        m = -(-max(layout.input_numel, layout.output_numel) // n)
        wire = n * self.codec.wire_bytes(m)
        stages = collective.chunked_encodings
        return 4 * (layout.input_numel + layout.output_numel) * stages + 2 * wire * stages

    def check_tolerance(self, collective: Collective, abs_sum: torch.Tensor, n: int) -> torch.Tensor | float:
        import torch

        contributions = n if collective.reduces else 1
        return self.codec.check_tolerance(torch.as_tensor(abs_sum), contributions, collective.chunked_encodings)


def register_codec(
    base: str, factory: CodecFactory, options_help: str = "", impl: str = "codec_bytes", *, replace: bool = False
) -> None:
    """Register a codec family under ``base``, and the sweep precision of the same name.

    ``impl`` is the precision's ``implementation`` column; ``options_help`` documents ``:option`` values. A taken
    name (codec or precision) is an error unless ``replace``.
    """

    def precision(option: str | None) -> Precision:
        return CodecPrecision(factory(option), impl)

    PRECISIONS.register_family(base, precision, options_help, replace=replace)  # first: it holds every name
    CODECS.register_family(base, factory, options_help, replace=replace)


def codec_names() -> list[str]:
    """Registered codec base names."""
    return CODECS.names()


def get_codec(name: str) -> Codec:
    """Resolve ``base[:option]`` to a codec, or raise ``ValueError`` naming the valid choices."""
    return CODECS.get(name)
