"""FP8 precisions for the sweep: registered into :mod:`commbench.precision`, each with its collective algorithms.

Names (``base[:option]``): ``fp8_e4m3`` and ``fp8_e5m2`` with option ``tensor`` (the default, also spelled
with no option), ``block<N>`` (one scale per N elements, N > 0; ``block`` alone means ``block128``) or ``none``
(saturating cast, scale 1, no scales on the wire). The canonical name recorded in results is ``fp8_e4m3`` for
tensor scaling, ``fp8_e4m3:block128``, ``fp8_e4m3:none``. Codecs are in :mod:`commbench.fp8`.

``impl = "fp8_bytes"`` (any backend, gloo included: fp8 dtypes are moved as ``uint8`` views). One wire *chunk*
is the fp8 codes of a run of elements followed by the raw bytes of its float32 scales, so codes and scales move
in a single collective call. Algorithms, with the phases the sweep times:

- all_gather: encode = quantise the rank's tensor into its chunk; comm = ``all_gather_into_tensor`` of chunks;
  decode = each source's codes with that source's scales.
- reduce_scatter (ZeRO++ qgZ): encode = quantise each of the n per-destination chunks; comm =
  ``all_to_all_single``; decode = dequantise the n received chunks and **sum in float32** (one quantisation,
  no requantisation along a ring). The local sum is part of decode: it is the fp8 -> fp32 work.
- all_reduce: encode = as reduce_scatter; comm = ``all_to_all_single``, decode + fp32 sum of the owned chunk,
  re-quantise it, gather it to every rank (the local middle step sits between two transfers, so comm holds
  it); decode = every gathered chunk. The gather is ``all_gather_into_tensor``, except on gloo, where an
  ``all_to_all_single`` of the chunk copied into every slot moves the same bytes several times faster. Every rank decodes the same bytes: results are identical across ranks.
  A buffer whose length is not a multiple of n is zero-padded to ``n * ceil(N / n)``.
- all_to_all: encode per destination chunk; comm = ``all_to_all_single``; decode each received chunk.

``tensor`` scaling puts one scale on each tensor that goes on the wire: the rank's whole tensor for
all_gather, each per-destination chunk for reduce_scatter/all_to_all/all_reduce (so a destination never
depends on data it does not receive), and the re-encoded partial sum in all_reduce's gather stage.

``wire_bytes`` (nccl-tests ``size`` on the wire, scales included) with per-chunk elements ``m`` and
``S = wire_scale_count(m)`` scales per chunk (tensor 1, block ceil(m/B), none 0): all_gather
``n * (m + 4S)`` (total output), reduce_scatter ``n * (m + 4S)`` (total input), all_reduce ``n * (m + 4S)``
with ``m = ceil(N/n)`` (the buffer plus its scales), all_to_all ``n * (m + 4S)`` (the per-rank buffer).

``impl = "fp8_native"``: separate precisions ``fp8_e4m3_native`` / ``fp8_e5m2_native`` (same options) for
NCCL's own fp8 reduction (sm90+, NCCL >= 2.24, and torch must accept the dtype: a one-off 8-element probe
when the first op is built). Encode = local amax, ``all_reduce(MAX)`` so ranks share the scales (a sum of codes
means nothing otherwise), with n-fold headroom for the sum, then the scaled cast; comm = NCCL's fp8 collective;
decode = cast back times the scale. Only all_reduce and reduce_scatter (the collectives that reduce); :func:`native_fp8_available`
detects support and ``supports()`` is False elsewhere, so the sweep skips it cleanly.
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist

from commbench import fp8
from commbench.collectives import Collective, Layout
from commbench.precision import PointOp, Precision, register_precision

DEFAULT_BLOCK = 128
OPTIONS_HELP = "tensor (default) | block<N> (one scale per N elements, e.g. block128) | none (saturating cast)"


def parse_option(base: str, option: str | None) -> tuple[str, int]:
    """``(scaling, block)`` from the text after the colon, or a ``ValueError`` listing the valid options."""
    if option is None or option == "tensor":
        return "tensor", DEFAULT_BLOCK
    if option == "none":
        return "none", DEFAULT_BLOCK
    if option == "block":
        return "block", DEFAULT_BLOCK
    m = re.fullmatch(r"block(\d+)", option)
    if m and int(m.group(1)) > 0:
        return "block", int(m.group(1))
    raise ValueError(f"invalid option {option!r} for precision {base!r}; valid options: {OPTIONS_HELP}")


def canonical_name(base: str, scaling: str, block: int) -> str:
    if scaling == "tensor":
        return base
    if scaling == "block":
        return f"{base}:block{block}"
    return f"{base}:none"


# ----------------------------------------------------------------------------------------------------------
# Wire chunks: [fp8 codes (m bytes) | float32 scales (4 S bytes)]


class _Chunks:
    """n chunks of ``m`` elements each, laid out back to back in one uint8 wire buffer."""

    def __init__(self, n: int, m: int, fmt: str, scaling: str, block: int, device: torch.device) -> None:
        self.n, self.m, self.fmt, self.scaling, self.block = n, m, fmt, scaling, block
        self.s_wire = fp8.wire_scale_count(m, scaling, block)
        self.stride = m + 4 * self.s_wire
        self.wire = torch.zeros(n * self.stride, dtype=torch.uint8, device=device)
        ns = fp8.num_scales(m, scaling, block)
        # Aligned float32 homes for the scales: the wire offset of a chunk's scales is not 4-byte aligned
        # in general, so they are copied byte-wise (a few bytes per chunk) rather than viewed.
        self.scales = torch.ones(n, ns, dtype=torch.float32, device=device)

    def codes(self, i: int) -> torch.Tensor:
        return self.wire[i * self.stride : i * self.stride + self.m]

    def _scale_bytes(self, i: int) -> torch.Tensor:
        start = i * self.stride + self.m
        return self.wire[start : start + 4 * self.s_wire]

    def encode(self, i: int, x: torch.Tensor) -> None:
        fp8.quantize(x, self.fmt, self.scaling, self.block, out=(self.codes(i), self.scales[i]))
        if self.s_wire:
            self._scale_bytes(i).copy_(self.scales[i].view(torch.uint8))

    def decode(self, i: int, out: torch.Tensor, accumulate: bool = False) -> None:
        if self.s_wire:
            self.scales[i].view(torch.uint8).copy_(self._scale_bytes(i))
        fp8.dequantize(
            self.codes(i), self.scales[i], self.fmt, self.scaling, self.block, out=out, accumulate=accumulate
        )


class _Fp8OpBase:
    has_codec = True

    def __init__(self, prec: Fp8BytesPrecision, group: dist.ProcessGroup | None) -> None:
        self.fmt, self.scaling, self.block = prec.fmt, prec.scaling, prec.block
        self.group = group
        self.n = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def _chunks(self, m: int, device: torch.device) -> _Chunks:
        return _Chunks(self.n, m, self.fmt, self.scaling, self.block, device)


class _AllGatherOp(_Fp8OpBase):
    def __init__(
        self, prec: Fp8BytesPrecision, layout: Layout, group: dist.ProcessGroup | None, device: torch.device
    ) -> None:
        super().__init__(prec, group)
        m = layout.input_numel
        self.m = m
        self.x = torch.empty(m, dtype=torch.float32, device=device)
        self.send = _Chunks(1, m, self.fmt, self.scaling, self.block, device)
        self.recv = self._chunks(m, device)
        self.y = torch.empty(self.n * m, dtype=torch.float32, device=device)
        self.wire_bytes = self.recv.wire.numel()

    def load(self, x: torch.Tensor) -> None:
        self.x.copy_(x)

    def encode(self) -> None:
        self.send.encode(0, self.x)

    def comm(self) -> None:
        dist.all_gather_into_tensor(self.recv.wire, self.send.wire, group=self.group)

    def decode(self) -> None:
        for r in range(self.n):
            self.recv.decode(r, self.y[r * self.m : (r + 1) * self.m])

    def result(self) -> torch.Tensor:
        return self.y


class _AllToAllOp(_Fp8OpBase):
    """all_to_all, and the base of reduce_scatter (which sums instead of concatenating on decode)."""

    def __init__(
        self, prec: Fp8BytesPrecision, total: int, group: dist.ProcessGroup | None, device: torch.device
    ) -> None:
        super().__init__(prec, group)
        self.m = total // self.n
        self.x = torch.empty(total, dtype=torch.float32, device=device)
        self.send = self._chunks(self.m, device)
        self.recv = self._chunks(self.m, device)
        self.y = torch.empty(total, dtype=torch.float32, device=device)
        self.wire_bytes = self.send.wire.numel()

    def load(self, x: torch.Tensor) -> None:
        self.x.copy_(x)

    def encode(self) -> None:
        for i in range(self.n):
            self.send.encode(i, self.x[i * self.m : (i + 1) * self.m])

    def comm(self) -> None:
        dist.all_to_all_single(self.recv.wire, self.send.wire, group=self.group)

    def decode(self) -> None:
        for r in range(self.n):
            self.recv.decode(r, self.y[r * self.m : (r + 1) * self.m])

    def result(self) -> torch.Tensor:
        return self.y


class _ReduceScatterOp(_AllToAllOp):
    def __init__(
        self, prec: Fp8BytesPrecision, total: int, group: dist.ProcessGroup | None, device: torch.device
    ) -> None:
        super().__init__(prec, total, group, device)
        self.y = torch.empty(self.m, dtype=torch.float32, device=device)

    def decode(self) -> None:
        # Source order 0..n-1 on every rank: the fp32 sum is deterministic.
        for r in range(self.n):
            self.recv.decode(r, self.y, accumulate=r > 0)


class _AllReduceOp(_ReduceScatterOp):
    def __init__(
        self, prec: Fp8BytesPrecision, total: int, group: dist.ProcessGroup | None, device: torch.device
    ) -> None:
        n = dist.get_world_size(group)
        self.total = total
        padded = n * -(-total // n)
        super().__init__(prec, padded, group, device)
        self.x.zero_()  # the pad tail stays zero: load() writes only the first `total` elements
        self.acc = self.y  # the owned chunk's fp32 sum
        # Gloo's all_gather_into_tensor is several times slower than its all_to_all_single for the same bytes
        # (measured here: 4 MiB out, 2 ranks: 7 ms vs 2.5 ms), so on gloo the gather stage is an all_to_all of
        # the owned chunk copied into every slot: same bytes received, (n-1) local chunk copies more.
        self.gather_by_a2a = dist.get_backend(group) == "gloo"
        self.gsend = _Chunks(self.n if self.gather_by_a2a else 1, self.m, self.fmt, self.scaling, self.block, device)
        self.grecv = self._chunks(self.m, device)
        self.out = torch.empty(padded, dtype=torch.float32, device=device)
        self.wire_bytes = self.grecv.wire.numel()

    def load(self, x: torch.Tensor) -> None:
        self.x[: self.total].copy_(x)

    def comm(self) -> None:
        dist.all_to_all_single(self.recv.wire, self.send.wire, group=self.group)
        for r in range(self.n):
            self.recv.decode(r, self.acc, accumulate=r > 0)
        self.gsend.encode(0, self.acc)
        if self.gather_by_a2a:
            c = self.gsend.stride
            for i in range(1, self.n):
                self.gsend.wire[i * c : (i + 1) * c].copy_(self.gsend.wire[:c])
            dist.all_to_all_single(self.grecv.wire, self.gsend.wire, group=self.group)
        else:
            dist.all_gather_into_tensor(self.grecv.wire, self.gsend.wire, group=self.group)

    def decode(self) -> None:
        for r in range(self.n):
            self.grecv.decode(r, self.out[r * self.m : (r + 1) * self.m])

    def result(self) -> torch.Tensor:
        return self.out[: self.total]


_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


class _Fp8Base(Precision):
    input_dtype = torch.float32

    def __init__(self, base: str, fmt: str, scaling: str, block: int) -> None:
        self.fmt, self.scaling, self.block = fmt, scaling, block
        self.format = fp8.get_format(fmt)
        self.name = canonical_name(base, scaling, block)
        what = {"tensor": "one scale per tensor", "block": f"one scale per {block} elements", "none": "no scaling"}
        how = "NCCL sums fp8 natively" if self.impl == "fp8_native" else "moved as uint8"
        self.description = f"fp32 quantised to fp8 {fmt} ({what[scaling]}; {how})"

    def error_bound(self, collective: Collective, abs_sum: torch.Tensor, n: int) -> torch.Tensor | float:
        """Format-derived tolerance (see :func:`commbench.fp8.error_bound`); all_reduce quantises twice."""
        contributions = n if collective.reduces else 1
        quantisations = 2 if collective.name == "all_reduce" and self.impl == "fp8_bytes" else 1
        return fp8.error_bound(self.fmt, self.scaling, torch.as_tensor(abs_sum), contributions, quantisations)


class Fp8BytesPrecision(_Fp8Base):
    """FP8 on any backend: codes and scales travel as uint8."""

    impl = "fp8_bytes"
    wire_dtype = torch.uint8

    def supports(self, collective: Collective, backend: str) -> bool:
        return collective.name in _COLLECTIVES

    def make_op(
        self, collective: Collective, layout: Layout, group: dist.ProcessGroup | None, device: torch.device
    ) -> PointOp:
        name = collective.name
        if name == "all_gather":
            return _AllGatherOp(self, layout, group, device)
        if name == "reduce_scatter":
            return _ReduceScatterOp(self, layout.input_numel, group, device)
        if name == "all_to_all":
            return _AllToAllOp(self, layout.input_numel, group, device)
        if name == "all_reduce":
            return _AllReduceOp(self, layout.input_numel, group, device)
        raise ValueError(f"{self.name} does not implement {name!r}; valid choices: {', '.join(_COLLECTIVES)}")


# ----------------------------------------------------------------------------------------------------------
# Native NCCL fp8


def native_fp8_available(backend: str, device: torch.device | None = None) -> bool:
    """Whether NCCL can reduce fp8 here: backend nccl, a CUDA device of compute capability >= 9.0,
    NCCL >= 2.24, and torch exposing the fp8 dtypes. Never assumed: False on CPU, gloo, or any doubt."""
    if backend != "nccl" or not hasattr(torch, "float8_e4m3fn"):
        return False
    try:
        if not torch.cuda.is_available():
            return False
        dev = (
            device
            if device is not None and device.type == "cuda"
            else torch.device("cuda", torch.cuda.current_device())
        )
        if torch.cuda.get_device_capability(dev) < (9, 0):
            return False
        version = torch.cuda.nccl.version()
    except (RuntimeError, AssertionError, AttributeError):
        return False
    if isinstance(version, int):  # older torch: 2.24.3 reported as 22403
        version = (version // 10000, (version // 100) % 100, version % 100)
    return tuple(version[:2]) >= (2, 24)


class _NativeOp:
    """Shared scale (all_reduce MAX of the amax, headroom for the n-way sum), then NCCL's own fp8 sum."""

    has_codec = True

    def __init__(
        self,
        prec: Fp8NativePrecision,
        collective: Collective,
        layout: Layout,
        group: dist.ProcessGroup | None,
        device: torch.device,
    ) -> None:
        self.prec, self.coll, self.group = prec, collective, group
        self.n = dist.get_world_size(group)
        f = prec.format
        self.x = torch.empty(layout.input_numel, dtype=torch.float32, device=device)
        self.wire_in = torch.empty(layout.input_numel, dtype=f.dtype, device=device)
        self.wire_out = (
            torch.empty(layout.output_numel, dtype=f.dtype, device=device)
            if collective.out_of_place()
            else self.wire_in
        )
        self.y = torch.empty(layout.output_numel, dtype=torch.float32, device=device)
        nb = fp8.num_scales(layout.input_numel, prec.scaling, prec.block) if prec.scaling == "block" else 1
        self.amax = torch.zeros(nb, dtype=torch.float32, device=device)
        self.scale = torch.ones(nb, dtype=torch.float32, device=device)
        sc = fp8.wire_scale_count(layout.input_numel, prec.scaling, prec.block)
        self.wire_bytes = layout.total * 1 + 4 * sc

    def _blocks(self, t: torch.Tensor) -> torch.Tensor:
        b = self.prec.block if self.prec.scaling == "block" else t.numel()
        pad = -t.numel() % b
        return torch.nn.functional.pad(t, (0, pad)).view(-1, b) if pad else t.view(-1, b)

    def load(self, x: torch.Tensor) -> None:
        self.x.copy_(x)

    def encode(self) -> None:
        if self.prec.scaling == "none":
            self.wire_in.copy_(self.x.clamp(-self.prec.format.max, self.prec.format.max))
            return
        rows = self._blocks(self.x)
        self.amax.copy_(rows.abs().amax(dim=1))
        # Ranks must share the scale for a sum of codes to mean anything; the MAX costs one tiny collective.
        dist.all_reduce(self.amax, op=dist.ReduceOp.MAX, group=self.group)
        headroom = self.amax * self.n
        k = torch.ceil(torch.log2(headroom.double() / self.prec.format.max)).clamp(-126, 127)
        self.scale.copy_(torch.where(headroom > 0, torch.exp2(k), torch.ones_like(k)).float())
        q = rows / self.scale.unsqueeze(1)
        self.wire_in.copy_(q.flatten()[: self.x.numel()])

    def comm(self) -> None:
        self.coll.run(self.wire_in, self.wire_out, self.group)

    def decode(self) -> None:
        v = self.wire_out.float()
        if self.prec.scaling == "none":
            self.y.copy_(v)
            return
        if self.prec.scaling == "tensor":
            torch.mul(v, self.scale[0], out=self.y)
            return
        # block: the output covers the blocks of this rank's slice (reduce_scatter) or all of them.
        b = self.prec.block
        start = dist.get_rank(self.group) * self.y.numel() if self.coll.name == "reduce_scatter" else 0
        idx = torch.arange(start, start + self.y.numel(), device=v.device) // b
        torch.mul(v, self.scale[idx], out=self.y)

    def result(self) -> torch.Tensor:
        return self.y


class Fp8NativePrecision(_Fp8Base):
    """NCCL's native fp8 reduction (Hopper, NCCL >= 2.24); skipped wherever it is not detected."""

    impl = "fp8_native"

    def __init__(self, base: str, fmt: str, scaling: str, block: int) -> None:
        super().__init__(base, fmt, scaling, block)
        self.wire_dtype = self.format.dtype

    def supports(self, collective: Collective, backend: str) -> bool:
        return collective.name in ("all_reduce", "reduce_scatter") and native_fp8_available(backend)

    def error_bound(self, collective: Collective, abs_sum: torch.Tensor, n: int) -> torch.Tensor | float:
        """Conservative: NCCL rounds every partial sum to fp8 (up to n roundings in all), and the shared scale
        carries n-fold headroom, so each rounding may cost ``rel * |partial| + sub * 2 * n * A / max``."""
        f = self.format
        a = torch.as_tensor(abs_sum).to(torch.float64)
        big = float(a.max()) if a.numel() else 0.0
        floor = f.sub_step * (1.0 if self.scaling == "none" else max(2.0 * n * big / f.max, 2.0**-126))
        err = torch.zeros_like(a)
        for _ in range(max(n, 1)):
            err = err + f.rel_step * (a + err) + floor
        return err + n * 2.0**-23 * a

    def make_op(
        self, collective: Collective, layout: Layout, group: dist.ProcessGroup | None, device: torch.device
    ) -> PointOp:
        if collective.name not in ("all_reduce", "reduce_scatter"):
            raise ValueError(f"{self.name} supports all_reduce and reduce_scatter, not {collective.name!r}")
        _probe_native(self.format.dtype, group, device)
        return _NativeOp(self, collective, layout, group, device)


_PROBED: dict[tuple[torch.dtype, int], bool] = {}


def _probe_native(dtype: torch.dtype, group: dist.ProcessGroup | None, device: torch.device) -> None:
    """One tiny fp8 all_reduce per (dtype, group): the static checks say NCCL could; this shows torch does.
    Every rank builds the same point at the same time, so every rank runs the probe together."""
    key = (dtype, id(group))
    if key not in _PROBED:
        try:
            dist.all_reduce(torch.zeros(8, dtype=dtype, device=device), group=group)
            _PROBED[key] = True
        except (RuntimeError, TypeError, ValueError) as e:
            _PROBED[key] = False
            raise RuntimeError(f"native fp8 all_reduce ({dtype}) was detected but torch/NCCL refused it: {e}") from e
    elif not _PROBED[key]:
        raise RuntimeError(f"native fp8 all_reduce ({dtype}) is not usable on this group")


def _register() -> None:
    for fmt in fp8.FORMATS:
        for base, cls in ((f"fp8_{fmt}", Fp8BytesPrecision), (f"fp8_{fmt}_native", Fp8NativePrecision)):

            def factory(option: str | None, base: str = base, cls: type[_Fp8Base] = cls, fmt: str = fmt) -> Precision:
                scaling, block = parse_option(base, option)
                return cls(base, fmt, scaling, block)

            register_precision(base, factory, OPTIONS_HELP)


_register()
