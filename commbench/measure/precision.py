"""Precision registry: name -> codec that says what the user's tensor is, what travels on the wire, and how
one (collective, precision) point is executed as three timed phases: encode, comm, decode.

Names may carry an option after a colon (``fp8_e4m3:block128``); the registry (:data:`PRECISIONS`) maps the base
name to a factory. The codecs (:mod:`commbench.measure.codec`) and the fp8 precisions register into it from their
own modules, which the plugin loader imports: this one knows none of them.

Every point op follows the same protocol so the sweep never special-cases a precision:

    op.load(x)   # copy the user's per-rank input (``precision.input_dtype``) into the op's buffers
    op.encode()  # user tensor -> wire buffers (cast / quantise); a no-op for native dtypes
    op.comm()    # the communication (fp8 all_reduce: including its middle decode-sum-re-encode step)
    op.decode()  # wire output -> user-visible result (fp8 reduce_scatter: the local fp32 sum)
    op.result()  # the decoded output tensor (compared against the float64 reference)
    op.received()  # the received wire bytes per source chunk (the correctness tests inject faults there)

Each phase is repeatable so the timing core can run it k times back to back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from commbench.core.registry import OptionRegistry
from commbench.measure.collectives import Collective, Layout
from commbench.measure.collectives import Unsupported as Unsupported  # defined below, with the collectives

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

# Dtypes are named here (torch's attribute name, ``torch.<name>``) and resolved to ``torch.dtype`` only where
# tensors are made, so the registry (names, descriptions, wire types for ``commbench list``) needs no torch.

NCCL_TYPE_NAMES: dict[str, str] = {
    "float32": "float",
    "float16": "half",
    "bfloat16": "bfloat16",
    "float64": "double",
    "uint8": "uint8",
    "int8": "int8",
    "int32": "int32",
    "int64": "int64",
    "bool": "bool",
    "float8_e4m3fn": "f8e4m3",
    "float8_e5m2": "f8e5m2",
}
"""nccl-tests' type name of a dtype, by torch's name for it."""


def nccl_type_name(dtype: torch.dtype | str) -> str:
    """nccl-tests type name of a torch dtype or of its name (falls back to torch's own name)."""
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    return NCCL_TYPE_NAMES.get(name, name)


def torch_dtype(name: str) -> torch.dtype:
    """The ``torch.dtype`` called ``name`` (``"bfloat16"`` -> ``torch.bfloat16``); imports torch."""
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"torch has no dtype {name!r}")
    return dtype


@dataclass(frozen=True, slots=True)
class ReceivedChunk:
    """One received chunk of a point op's wire, as bytes that ``decode`` reads next: what a fault injector edits
    between ``comm`` and ``decode`` (views, not copies)."""

    codes: torch.Tensor
    """uint8 view of the chunk's element bytes (little-endian elements of ``element_bytes`` each)."""
    element_bytes: int
    scales: torch.Tensor | None
    """uint8 view of the chunk's travelling float32 scales; None when no scale travels."""


class PointOp(Protocol):
    """One collective at one precision and size, bound to preallocated buffers."""

    wire_bytes: int
    """nccl-tests ``size`` of what crosses the wire, scales included."""
    has_codec: bool
    """False when encode/decode are no-ops (native dtypes): they are then not timed and reported as 0."""

    def load(self, x: torch.Tensor) -> None: ...
    def encode(self) -> None: ...
    def comm(self) -> None: ...
    def decode(self) -> None: ...
    def result(self) -> torch.Tensor: ...
    def received(self) -> list[ReceivedChunk]: ...


class Precision(ABC):
    """A communication precision (codec)."""

    name: str
    impl: str
    """How the bytes move: ``native`` (collective in the user's dtype), ``cast`` (fp32 cast for the wire),
    ``fp8_bytes`` (a codec's bytes through :mod:`commbench.measure.chunked`), ``fp8_native``."""
    input_dtype_name: str
    """torch name of the dtype of the user's tensor (what ``load`` receives), e.g. ``float32``."""
    chunked: bool = False
    """True when the precision reaches its result through the chunked algorithm (:mod:`commbench.measure.chunked`)
    rather than the backend's own collective: the sweep then also times fp32 through that algorithm."""
    wire_dtype_name: str
    """torch name of the dtype that crosses the wire."""
    description: str = ""

    @property
    def input_dtype(self) -> torch.dtype:
        return torch_dtype(self.input_dtype_name)

    @property
    def wire_dtype(self) -> torch.dtype:
        return torch_dtype(self.wire_dtype_name)

    @property
    def nccl_type(self) -> str:
        return nccl_type_name(self.wire_dtype_name)

    def supports(self, collective: Collective, backend: str) -> bool:
        """Whether this precision can run ``collective`` on ``backend``."""
        return True

    @abstractmethod
    def make_op(
        self, collective: Collective, layout: Layout, group: dist.ProcessGroup | None, device: torch.device
    ) -> PointOp:
        """Allocate buffers and return the op for one point; :class:`Unsupported` (on every rank alike) when
        the precision turns out unable to run here."""

    def error_bound(self, collective: Collective, abs_sum: torch.Tensor, n: int) -> torch.Tensor | float:
        """Per-element tolerance for the ``wrong`` count on exactly representable inputs.

        ``abs_sum`` is the float64 sum over contributing ranks of ``|x|`` for each output element. Native and
        16-bit cast precisions carry exactly representable integers exactly: the bound is 0, as nccl-tests -c.
        """
        return 0.0

    def buffer_bytes(self, collective: Collective, layout: Layout, n: int) -> int:
        """Bytes the op of one point allocates on its device (an estimate made before allocating: the user's
        input and output in ``input_dtype``, and the wire's input and output where the wire dtype differs)."""
        user = (layout.input_numel + layout.output_numel) * self.input_dtype.itemsize
        if self.wire_dtype_name == self.input_dtype_name:
            return user
        return user + (layout.input_numel + layout.output_numel) * self.wire_dtype.itemsize

    def check_tolerance(self, collective: Collective, abs_sum: torch.Tensor, n: int) -> torch.Tensor | float:
        """Per-element tolerance of the ``wrong`` count on :func:`commbench.measure.check.exact_inputs`: what the
        precision really loses on those inputs. By default the general :meth:`error_bound`; a precision that
        carries the check inputs exactly returns 0, so any corrupted element counts."""
        return self.error_bound(collective, abs_sum, n)


def split_received(buf: torch.Tensor, n: int) -> list[ReceivedChunk]:
    """``buf`` (a received wire tensor of any dtype) as ``n`` consecutive chunks (the last may be shorter)."""
    import torch

    m = -(-buf.numel() // n)
    raw = buf.view(torch.uint8)
    e = buf.element_size()
    return [ReceivedChunk(raw[i * m * e : min((i + 1) * m, buf.numel()) * e], e, None) for i in range(n)]


class _CastOp:
    """Native collective in ``wire_dtype``, with optional cast from/to the user's dtype around it."""

    def __init__(
        self,
        collective: Collective,
        layout: Layout,
        input_dtype: torch.dtype,
        wire_dtype: torch.dtype,
        group: dist.ProcessGroup | None,
        device: torch.device,
    ) -> None:
        import torch

        self._coll = collective
        self._group = group
        self.has_codec = input_dtype != wire_dtype
        self.x = torch.empty(layout.input_numel, dtype=input_dtype, device=device)
        self.wire_in = torch.empty(layout.input_numel, dtype=wire_dtype, device=device) if self.has_codec else self.x
        if collective.out_of_place():
            self.wire_out = torch.empty(layout.output_numel, dtype=wire_dtype, device=device)
        else:
            self.wire_out = self.wire_in
        self.y = torch.empty(layout.output_numel, dtype=input_dtype, device=device) if self.has_codec else self.wire_out
        self.wire_bytes = layout.total * self.wire_in.element_size()

    def load(self, x: torch.Tensor) -> None:
        self.x.copy_(x)

    def encode(self) -> None:
        if self.has_codec:
            self.wire_in.copy_(self.x)

    def comm(self) -> None:
        self._coll.run(self.wire_in, self.wire_out, self._group)

    def decode(self) -> None:
        if self.has_codec:
            self.y.copy_(self.wire_out)

    def result(self) -> torch.Tensor:
        return self.y

    def received(self) -> list[ReceivedChunk]:
        import torch.distributed as dist

        return split_received(self.wire_out, dist.get_world_size(self._group))


class _CastPrecision(Precision):
    """A precision the collective runs on as a plain torch dtype: the input cast to the wire dtype and back."""

    def make_op(
        self, collective: Collective, layout: Layout, group: dist.ProcessGroup | None, device: torch.device
    ) -> PointOp:
        return _CastOp(collective, layout, self.input_dtype, self.wire_dtype, group, device)


class NativePrecision(_CastPrecision):
    """The user's tensor already is in this dtype; the collective runs on it directly."""

    impl = "native"

    def __init__(self, name: str, dtype: str, description: str) -> None:
        self.name = name
        self.input_dtype_name = dtype
        self.wire_dtype_name = dtype
        self.description = description


class CompressPrecision(_CastPrecision):
    """An fp32 tensor cast to a 16-bit dtype for the wire and back (what DDP's compress hooks do)."""

    impl = "cast"
    input_dtype_name = "float32"

    def __init__(self, name: str, wire_dtype: str, description: str) -> None:
        self.name = name
        self.wire_dtype_name = wire_dtype
        self.description = description


PrecisionFactory = Callable[[str | None], Precision]
"""Builds a precision from the option after the colon (``None`` when the name has none)."""

PRECISIONS: OptionRegistry[Precision] = OptionRegistry("precision")
"""The sweep's precisions by base name, in registration order (what ``commbench list`` shows)."""


def register_precision(base: str, factory: PrecisionFactory, options_help: str = "", *, replace: bool = False) -> None:
    """Register a precision family under ``base``; ``options_help`` documents accepted ``:option`` values. A taken
    name is an error unless ``replace``."""
    PRECISIONS.register_family(base, factory, options_help, replace=replace)


for _p in (
    NativePrecision("fp32", "float32", "float32 tensor"),
    NativePrecision("fp16", "float16", "float16 tensor"),
    NativePrecision("bf16", "bfloat16", "bfloat16 tensor"),
    CompressPrecision("fp16_compress", "float16", "fp32 cast to fp16 on the wire"),
    CompressPrecision("bf16_compress", "bfloat16", "fp32 cast to bf16 on the wire"),
):
    PRECISIONS.register(_p.name, _p)


def precision_names() -> list[str]:
    """Registered base names (options listed by :func:`precision_help`)."""
    return PRECISIONS.names()


def precision_help() -> dict[str, str]:
    """Base name -> the ``:option`` values it accepts, in words."""
    return PRECISIONS.options_help()


def get_precision(name: str) -> Precision:
    """Resolve ``base[:option]`` to a precision, or raise ``ValueError`` naming the valid choices."""
    return PRECISIONS.get(name)
