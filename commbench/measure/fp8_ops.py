"""FP8 precisions for the sweep: registered into :mod:`commbench.measure.precision`, each with its collective algorithms.

Names (``base[:option]``): ``fp8_e4m3`` and ``fp8_e5m2`` with option ``tensor`` (the default, also spelled
with no option), ``block<N>`` (one scale per N elements, N > 0; ``block`` alone means ``block128``) or ``none``
(saturating cast, scale 1, no scales on the wire). The canonical name recorded in results is ``fp8_e4m3`` for
tensor scaling, ``fp8_e4m3:block128``, ``fp8_e4m3:none``. Numerics are in :mod:`commbench.measure.fp8`.

``impl = "fp8_bytes"`` (any backend, gloo included): :class:`Fp8Codec` (fp8 codes as ``uint8`` plus float32
scales) run through the chunked algorithm of :mod:`commbench.measure.chunked`, which documents the per-collective
algorithms, the phases the sweep times and the wire layout.

``tensor`` scaling puts one scale on each tensor that goes on the wire: the rank's whole tensor for
all_gather, each per-destination chunk for reduce_scatter/all_to_all/all_reduce (so a destination never
depends on data it does not receive), and the re-encoded partial sum in all_reduce's gather stage.

``wire_bytes`` (nccl-tests ``size`` on the wire, scales included) with per-chunk elements ``m`` and
``S = wire_scale_count(m)`` scales per chunk (tensor 1, block ceil(m/B), none 0): all_gather
``n * (m + 4S)`` (total output), reduce_scatter ``n * (m + 4S)`` (total input), all_reduce ``n * (m + 4S)``
with ``m = ceil(N/n)`` (the buffer plus its scales), all_to_all ``n * (m + 4S)`` (the per-rank buffer).

``impl = "fp8_native"``: separate precisions ``fp8_e4m3_native`` / ``fp8_e5m2_native`` (same options) for
NCCL's own fp8 reduction (sm90+, NCCL >= 2.24, and torch must accept the dtype: a tiny fp8 all_reduce probes
it once per dtype and group when the first op is built, on every rank, and the ranks agree on the outcome; a
failure on any rank raises :class:`~commbench.measure.precision.Unsupported` on all of them and the sweep skips the
precision with the reason). Encode = local amax, ``all_reduce(MAX)`` so ranks share the scales (a sum of codes
means nothing otherwise), with n-fold headroom for the sum, then the scaled cast; comm = NCCL's fp8 collective;
decode = cast back times the scale, with the same power-of-two scale rule as the codec
(:func:`commbench.measure.fp8.pow2_scales`). Only the collectives that reduce (all_reduce, reduce_scatter), and only
on NCCL: ``supports()`` asks :func:`native_fp8_backend` (the same on every rank), the device and torch's real
answer are the probe's.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from commbench.measure import fp8
from commbench.measure.codec import ChunkRows, Codec, register_codec
from commbench.measure.collectives import Collective, Layout
from commbench.measure.precision import (
    PointOp,
    Precision,
    ReceivedChunk,
    Unsupported,
    register_precision,
    split_received,
)

if TYPE_CHECKING:  # torch is imported where tensors are handled: registering the precisions needs none
    import torch
    import torch.distributed as dist

DEFAULT_BLOCK = 128
OPTIONS_HELP = "tensor (default) | block<N> (one scale per N elements, e.g. block128) | none (saturating cast)"


def parse_option(base: str, option: str | None) -> fp8.Scaling:
    """The scaling mode the text after the colon names, or a ``ValueError`` listing the valid options."""
    m = re.fullmatch(r"(tensor|none|block)(\d*)", option or "tensor")
    if m is None or (m.group(2) and (m.group(1) != "block" or int(m.group(2)) <= 0)):
        raise ValueError(f"invalid option {option!r} for precision {base!r}; valid options: {OPTIONS_HELP}")
    return fp8.get_scaling(m.group(1), int(m.group(2) or DEFAULT_BLOCK))


class Fp8Codec(Codec):
    """fp8 codes (one byte per element) plus power-of-two float32 scales (:mod:`commbench.measure.fp8`)."""

    def __init__(self, base: str, fmt: str, scaling: fp8.Scaling, how: str = "moved as uint8") -> None:
        self.fmt, self.scaling, self.block = fmt, scaling, scaling.block
        self.format = fp8.get_format(fmt)
        self.name = f"{base}:{scaling.option}" if scaling.option else base
        self.description = f"fp32 quantised to fp8 {fmt} ({scaling.describe()}; {how})"

    def code_bytes(self, numel: int) -> int:
        return numel

    def num_scales(self, numel: int) -> int:
        return self.scaling.num_scales(numel)

    def scale_count(self, numel: int) -> int:
        return self.scaling.wire_scale_count(numel)

    def encode(self, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
        fp8.quantize(x, self.fmt, self.scaling.name, self.block, out=(codes, scales))

    def decode(self, codes: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, accumulate: bool = False) -> None:
        fp8.dequantize(codes, scales, self.fmt, self.scaling.name, self.block, out=out, accumulate=accumulate)

    def encode_rows(self, x: torch.Tensor, rows: ChunkRows) -> None:
        """All chunks in a fixed handful of device ops on the torch path, one fused graph on the compiled path
        (:func:`commbench.measure.fp8.quantize_chunks`); the C kernel per chunk on CPU."""
        fp8.quantize_chunks(
            x,
            rows.codes,
            rows.scales,
            rows.wire_scales,
            self.fmt,
            self.scaling.name,
            self.block,
            workspace=rows.workspace,
        )

    def decode_rows(self, rows: ChunkRows, out: torch.Tensor, reduce: bool) -> None:
        fp8.dequantize_chunks(
            rows.codes, rows.scales, rows.wire_scales, out, self.fmt, self.scaling.name, self.block, reduce=reduce
        )

    def error_bound(self, abs_sum: torch.Tensor, contributions: int, encodings: int) -> torch.Tensor:
        """Format-derived tolerance (see :func:`commbench.measure.fp8.error_bound`)."""
        import torch

        return fp8.error_bound(self.fmt, self.scaling.name, torch.as_tensor(abs_sum), contributions, encodings)

    def check_tolerance(self, abs_sum: torch.Tensor, contributions: int, encodings: int) -> float:
        """0: every value the check inputs put on the wire is carried exactly (see
        :func:`commbench.measure.check.exact_inputs`: at most 3 significant bits, which e5m2's 2 mantissa bits + the
        implicit one hold, magnitudes from 1 to 112 so even unscaled e4m3 (normal from 2**-6 to 448) holds
        them, and with a power-of-two scale the quotient stays exact); the fp32 sums of such values are exact
        too. So the format loses nothing here and one changed element is one wrong element."""
        return 0.0


# ----------------------------------------------------------------------------------------------------------
# Native NCCL fp8


def native_fp8_backend(backend: str) -> bool:
    """Whether ``backend`` could reduce fp8 at all: nccl, with torch exposing the fp8 dtypes. What every rank
    of a job sees alike (one torch build, one backend), so the sweep's grid of points agrees across ranks; the
    device and what torch really does are asked by the agreed probe (:func:`_probe_native`)."""
    import torch

    return backend == "nccl" and hasattr(torch, "float8_e4m3fn")


def _static_refusal(backend: str, device: torch.device | None = None) -> str | None:
    """Why this rank need not even try native fp8 (not nccl, no fp8 dtypes, no CUDA device, compute capability
    below 9.0), or None. The NCCL version does not decide: torch gates float8 reductions on the NCCL headers it
    was built with, not on the library it loads, so only the probe tells."""
    import torch

    if not native_fp8_backend(backend):
        return f"needs backend nccl and a torch with fp8 dtypes (backend {backend}, torch {torch.__version__})"
    try:
        if not torch.cuda.is_available():
            return "needs a CUDA device (none visible)"
        # torch says whether `device` is a CUDA device (ValueError otherwise): no device-type test of our own
        cc = torch.cuda.get_device_capability(device if device is not None else torch.cuda.current_device())
    except (RuntimeError, AssertionError, AttributeError, ValueError) as e:
        return f"cannot query the CUDA device ({type(e).__name__}: {e})".splitlines()[0]
    if cc < (9, 0):
        return f"needs compute capability >= 9.0 (sm90, Hopper), this GPU is {cc[0]}.{cc[1]}"
    return None


def native_fp8_available(backend: str, device: torch.device | None = None) -> bool:
    """Whether this rank passes the static checks of native fp8 (backend nccl, fp8 dtypes, a CUDA device of
    compute capability >= 9.0): worth probing. Never assumed: False on CPU, gloo, or any doubt. Whether torch
    and NCCL then really reduce fp8 is the probe's answer, agreed across ranks (:func:`_probe_native`)."""
    return _static_refusal(backend, device) is None


def _scale_pieces(start: int, n: int, run: int) -> list[tuple[int, int, int, int]]:
    """Output elements ``[0, n)`` at offset ``start`` of a vector scaled per ``run`` elements, as pieces
    ``(lo, hi, first block, k)``: ``k`` whole blocks, or (``k == 0``) part of one block."""
    pieces, i = [], 0
    while i < n:
        pos = start + i
        block = pos // run
        if pos % run == 0 and n - i >= run:
            k = (n - i) // run
            pieces.append((i, i + k * run, block, k))
            i += k * run
        else:
            hi = min((block + 1) * run - start, n)
            pieces.append((i, hi, block, 0))
            i = hi
    return pieces


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
        import torch
        import torch.distributed as dist

        self.prec, self.coll, self.group = prec, collective, group
        self.n = dist.get_world_size(group)
        f = prec.format
        sc = self.scaling = prec.codec.scaling
        self.x = torch.empty(layout.input_numel, dtype=torch.float32, device=device)
        self.wire_in = torch.empty(layout.input_numel, dtype=f.dtype, device=device)
        self.wire_out = (
            torch.empty(layout.output_numel, dtype=f.dtype, device=device)
            if collective.out_of_place()
            else self.wire_in
        )
        self.y = torch.empty(layout.output_numel, dtype=torch.float32, device=device)
        self.amax = torch.zeros(sc.num_scales(layout.input_numel), dtype=torch.float32, device=device)
        self.scale = torch.ones_like(self.amax)
        self.run = sc.run_length(layout.input_numel)
        # Which scale each output element uses: the output covers this rank's slice of the summed vector
        # (reduce_scatter) or all of it; runs of whole blocks are applied as (blocks, run) views, so decode
        # needs no per-element index (a full-size int64 tensor) and no data-dependent step.
        start = collective.reduced_offset(dist.get_rank(group), layout)
        self.pieces = _scale_pieces(start, layout.output_numel, self.run)
        self.wire_bytes = layout.total * 1 + 4 * sc.wire_scale_count(layout.input_numel)

    def _blocks(self, t: torch.Tensor) -> torch.Tensor:
        import torch

        pad = -t.numel() % self.run
        return torch.nn.functional.pad(t, (0, pad)).view(-1, self.run) if pad else t.view(-1, self.run)

    def load(self, x: torch.Tensor) -> None:
        self.x.copy_(x)

    def encode(self) -> None:
        import torch.distributed as dist

        f = self.prec.format
        if not self.scaling.scaled:
            self.wire_in.copy_(self.x.clamp(-f.max, f.max))
            return
        rows = self._blocks(self.x)
        self.amax.copy_(rows.abs().amax(dim=1))
        # Ranks must share the scale for a sum of codes to mean anything; the MAX costs one tiny collective.
        dist.all_reduce(self.amax, op=dist.ReduceOp.MAX, group=self.group)
        # The one scale rule (fp8.pow2_scales), on the amax with n-fold headroom for the sum.
        self.scale.copy_(fp8.pow2_scales(self.amax * self.n, f))
        q = rows / self.scale.unsqueeze(1)
        self.wire_in.copy_(q.flatten()[: self.x.numel()])

    def comm(self) -> None:
        self.coll.run(self.wire_in, self.wire_out, self.group)

    def decode(self) -> None:
        self.y.copy_(self.wire_out)
        if not self.scaling.scaled:
            return
        for lo, hi, block, k in self.pieces:
            if k:
                self.y[lo:hi].view(k, self.run).mul_(self.scale[block : block + k].unsqueeze(1))
            else:
                self.y[lo:hi].mul_(self.scale[block])

    def result(self) -> torch.Tensor:
        return self.y

    def received(self) -> list[ReceivedChunk]:
        # The scales are agreed before the collective (all_reduce MAX), so only codes arrive.
        return split_received(self.wire_out, self.n)


class Fp8NativePrecision(Precision):
    """NCCL's native fp8 reduction (Hopper, NCCL >= 2.24, a torch that allows it); skipped with a note wherever
    the agreed probe fails on any rank."""

    impl = "fp8_native"
    input_dtype_name = "float32"

    def __init__(self, base: str, fmt: str, scaling: fp8.Scaling) -> None:
        self.codec = Fp8Codec(base, fmt, scaling, how="NCCL sums fp8 natively")
        self.name, self.description = self.codec.name, self.codec.description
        self.format = self.codec.format
        self.wire_dtype_name = self.format.dtype_name

    def supports(self, collective: Collective, backend: str) -> bool:
        # What every rank sees alike; the device and torch's real answer are probed, agreed, at make_op.
        return collective.reduces and native_fp8_backend(backend)

    def error_bound(self, collective: Collective, abs_sum: torch.Tensor, n: int) -> torch.Tensor | float:
        """Conservative: NCCL rounds every partial sum to fp8 (up to n roundings in all), and the shared scale
        carries n-fold headroom, so each rounding may cost ``rel * |partial| + sub * 2 * n * A / max``."""
        import torch

        f = self.format
        a = torch.as_tensor(abs_sum).to(torch.float64)
        big = float(a.max()) if a.numel() else 0.0
        floor = f.sub_step * (max(2.0 * n * big / f.max, 2.0**-126) if self.codec.scaling.scaled else 1.0)
        err = torch.zeros_like(a)
        for _ in range(max(n, 1)):
            err = err + f.rel_step * (a + err) + floor
        return err + n * 2.0**-23 * a

    def make_op(
        self, collective: Collective, layout: Layout, group: dist.ProcessGroup | None, device: torch.device
    ) -> PointOp:
        """The op, or :class:`~commbench.measure.precision.Unsupported` on every rank of ``group`` when the agreed probe
        (:func:`_probe_native`) failed on any of them: the sweep then skips this precision with the reason."""
        if not collective.reduces:
            raise ValueError(f"{self.name} supports the reducing collectives only, not {collective.name!r}")
        if not collective.scale_invariant():  # the same on every rank: skipped with this note
            raise Unsupported(
                f"{self.name} reduces codes under one shared scale; --op {collective.redop} does not keep it"
            )
        refusal = _probe_native(self.format.dtype, group, device)
        if refusal is not None:
            raise Unsupported(refusal)
        return _NativeOp(self, collective, layout, group, device)


_PROBED: dict[tuple[torch.dtype, int], str | None] = {}
"""The agreed outcome per (fp8 dtype, process group): None (usable) or why not."""


def _try_native(dtype: torch.dtype, group: dist.ProcessGroup | None, device: torch.device) -> str | None:
    """This rank's part of the probe: a tiny fp8 all_reduce on ``group``, its result read back (so an error
    the device reports late surfaces here too) and checked. None when it worked, else what went wrong."""
    import torch
    import torch.distributed as dist

    try:
        x = torch.zeros(8, dtype=torch.float32, device=device)
        if dist.get_rank(group) == 0:
            x[0] = 1.0  # one contribution: the exact sum is 1 in any order of any number of ranks
        w = x.to(dtype)
        dist.all_reduce(w, group=group)
        back = w.to(torch.float32).cpu()
    except (RuntimeError, TypeError, ValueError) as e:  # DistBackendError is a RuntimeError
        return f"torch/NCCL refused a {dtype} all_reduce ({type(e).__name__}: {e})".splitlines()[0]
    if back[0].item() != 1.0 or bool(back[1:].any()):
        return f"a {dtype} all_reduce of 1 + 0 + ... gave {back.tolist()}"
    return None


def _agree(ok: bool, group: dist.ProcessGroup | None, device: torch.device) -> bool:
    """True when ``ok`` holds on every rank of ``group`` (all_reduce MIN of a 0/1 flag in int32)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _refusals(mine: str | None, group: dist.ProcessGroup | None) -> str:
    """One line naming the ranks that refused and the first one's reason (every rank calls it together)."""
    import torch.distributed as dist

    said: list[tuple[int, str | None] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(said, (dist.get_rank(), mine), group=group)
    bad = [(r, why) for r, why in (x for x in said if x is not None) if why is not None]
    ranks = ", ".join(str(r) for r, _ in bad)
    return f"rank(s) {ranks}: {bad[0][1]}" if bad else "refused on another rank"


def _probe_native(dtype: torch.dtype, group: dist.ProcessGroup | None, device: torch.device) -> str | None:
    """Whether native fp8 sums of ``dtype`` work on ``group``: None, or why not; decided once per (dtype,
    group), by every rank of it, with the same answer on all of them (any rank failing fails them all), so a
    refusal skips the precision everywhere instead of raising on one rank and leaving its peers in a collective.

    Two agreed steps: the static checks (:func:`_static_refusal`), so every rank enters the fp8 all_reduce or
    none does; then the fp8 all_reduce itself (:func:`_try_native`). Every rank builds the same point at the
    same time (the sweep's order), so every rank of the group runs the probe together. A torch that refuses
    the dtype does so before enqueuing anything, alike on every rank of one build."""
    import torch.distributed as dist

    key = (dtype, id(group))
    if key in _PROBED:
        return _PROBED[key]
    why = _static_refusal(dist.get_backend(group), device)
    if _agree(why is None, group, device):
        why = _try_native(dtype, group, device)
        verdict = None if _agree(why is None, group, device) else _refusals(why, group)
    else:
        verdict = _refusals(why, group)
    _PROBED[key] = None if verdict is None else f"native fp8 all_reduce ({dtype}) not usable: {verdict}"
    return _PROBED[key]


def _register() -> None:
    # Order matters for `commbench list`: each format's bytes precision, then its native one.
    for fmt in fp8.FORMATS:
        base = f"fp8_{fmt}"

        def codec(option: str | None, base: str = base, fmt: str = fmt) -> Codec:
            return Fp8Codec(base, fmt, parse_option(base, option))

        def native(option: str | None, base: str = f"{base}_native", fmt: str = fmt) -> Precision:
            return Fp8NativePrecision(base, fmt, parse_option(base, option))

        register_codec(base, codec, OPTIONS_HELP, impl="fp8_bytes")
        register_precision(f"{base}_native", native, OPTIONS_HELP)


_register()
