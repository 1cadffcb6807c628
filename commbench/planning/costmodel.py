"""The latency-bandwidth cost model of the collectives: the fitted objects, prediction with an interval, and the
layout rule of how a group's rings load the node links.

Owns the capacity-planning cost model (DESIGN "Capacity planning"); pure pandas/numpy, it reads results and never
runs anything. :mod:`commbench.planning.fitting` fits a :class:`CostModel` to a run's points and
:mod:`commbench.planning.costmodel_io` reads and writes it as JSON.

Measured first, fitted beyond
-----------------------------
A model keeps the points it was fitted to, one :class:`commbench.planning.interpolate.MeasuredCurve` per layout.
Inside a curve's sizes, on exactly its layout (ranks, nodes spanned, link sharing), a call is priced from the points
(``Prediction.source == "measured"``). A layout that was not measured (another world size, node count or link
sharing) over the same kind of link takes the nearest measured layout's points at that size, scaled by the fitted
formula's ratio between the two layouts (``source == "scaled"``): the measured level and bends, the formula's
scaling; its interval spans the ratio of pure latency to that of pure bandwidth, whatever the fit's split. The fitted
model alone prices only what no curve covers (a size outside every measured range, or another kind of link:
``source == "fitted"``). Both say so in ``Prediction.warnings``, the fitted price also when the fit misses its own
points by more than :data:`RESIDUAL_WARN`. What no fit
covers at all is named with the command that measures it (:meth:`CostModel.missing_measurement`).

The scaling formulas and the layout rule (``A(n)``, ``B(n)``, how a group's rings load the node links) are
:mod:`commbench.planning.algorithms`.

Codec cost (encode before, decode after the collective; ``encode_us``/``decode_us``) is fitted as
``c0 + c1 * F * E(n)`` where ``F`` is the fp32 nccl-tests size and ``E(n)`` the fraction of it a rank encodes
(all_gather encodes its own input shard, ``1/n``; the other collectives encode the whole input, 1) or decodes
(always the whole output or all received chunks, 1). A precision with no codec (fp32, or bf16 when the user's
tensor already is bf16) has zero codec cost.

Prediction
----------
A prediction's 95 % interval combines the fit's parameter covariance with its residual scatter (rms of the log
residuals), log-normally: ``t * exp(+-1.96 sd_log)``: an interval for a new measurement, not just for the mean
(how the covariance is obtained: :mod:`commbench.planning.fitting`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from commbench.planning.algorithms import (
    ALGORITHMS,
    Algorithm,
    Ring,
    Tree,
    decode_factor,
    encode_factor,
    group_spans,
    inter_node_share,
    link_sharing,
    registered,
)
from commbench.planning.interpolate import Z95, MeasuredCurve, find_curve, layouts

RESIDUAL_WARN = 0.20
"""A fit whose worst relative residual on its own points exceeds this is said to be approximate (issue 25)."""


# ----------------------------------------------------------------------------------------------- linear fit
@dataclass(frozen=True, slots=True)
class LinearFit:
    """``y = p0 * x0 + p1 * x1`` fitted by weighted, non-negative least squares (y in seconds)."""

    params: tuple[float, float]
    cov: tuple[tuple[float, float], tuple[float, float]]
    free: tuple[bool, bool]
    """False where the non-negativity bound is active (the parameter is 0 and has no variance)."""
    chi2_red: float
    log_scatter: float
    """Root mean square of the log residuals ln(y/yhat) over the residual degrees of freedom (= the relative rms
    for small residuals; in log space because contention on a shared machine scatters times multiplicatively)."""
    n_points: int

    def value(self, x0: float, x1: float) -> float:
        return self.params[0] * x0 + self.params[1] * x1

    def log_sd(self, x0: float, x1: float) -> float:
        """Standard deviation of ln(a new measurement) at (x0, x1): parameter uncertainty (delta method) plus the
        residual scatter of the fit."""
        x = np.array([x0, x1])
        var = float(x @ np.array(self.cov) @ x)
        t = self.value(x0, x1)
        if not t > 0:
            return math.nan
        return math.sqrt(max(var, 0.0) / t**2 + self.log_scatter**2)


# ----------------------------------------------------------------------------------------------- model
@dataclass(frozen=True, slots=True)
class Prediction:
    """A predicted time (seconds) with its 95 % interval; ``time_s`` is the collective (comm) time alone."""

    time_s: float
    low_s: float
    high_s: float
    extrapolated: bool
    reason: str
    encode_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = math.nan
    """encode + comm + decode."""
    total_low_s: float = math.nan
    total_high_s: float = math.nan
    wire_bytes: float = math.nan
    """The nccl-tests size on the wire used for the comm term."""
    fp32_bytes: float = math.nan
    """The nccl-tests size of the user's fp32 tensor used for the codec terms."""
    source: str = "fitted"
    """What priced the comm term: ``measured`` (the points of this layout, interpolated), ``scaled`` (another
    layout's points scaled by the formula) or ``fitted`` (the alpha-beta model alone)."""
    warnings: tuple[str, ...] = ()
    """What a planner must know about this price: the fitted model used outside the measured points (and why),
    an extrapolation in size, world size, nodes or link sharing, a fit that misses its own points by more than
    :data:`RESIDUAL_WARN`. Empty for a price read off the measured points."""


@dataclass(frozen=True, slots=True)
class Fit:
    """One (collective, precision, group) model: ``time = alpha*A(n) + wire_bytes*beta*B(n)`` plus codec terms."""

    collective: str
    precision: str
    group: str
    algorithm: str
    comm: LinearFit
    encode: LinearFit | None
    decode: LinearFit | None
    weighting: str
    """How sigma was obtained: "ci", "cv" or "relative" (see :mod:`commbench.planning.fitting`)."""
    wire_per_fp32: float
    """Wire bytes per fp32 byte (size_bytes / fp32_bytes, median), to convert a user's fp32 tensor size."""
    min_bytes: float
    max_bytes: float
    """Range of wire bytes fitted."""
    world_sizes: tuple[int, ...]
    nodes: tuple[int, ...]
    """Nodes of the fitted runs' worlds."""
    backend: str
    impl: str
    r2_log: float
    worst_rel_residual: float
    worst_where: str
    link_shares: tuple[int, ...] = ()
    """The groups sharing a node link (:func:`link_sharing`) of the fitted points: 0 for points within one node;
    empty when unknown (a version-1 model file)."""
    timing_mode: str = "stream"
    """How the fitted points were timed (``timing.mode``): ``stream`` (back-to-back ops, nccl-tests' loop) or
    ``isolated`` (one op after compute, as a training step issues its collectives)."""

    @property
    def crosses_nodes(self) -> bool | None:
        """True when every fitted point crossed node links, False when none did, None when mixed or unknown."""
        if not self.link_shares:
            return None
        if min(self.link_shares) > 0:
            return True
        return False if max(self.link_shares) == 0 else None

    @property
    def alpha_s(self) -> float:
        return self.comm.params[0]

    @property
    def beta_s_per_byte(self) -> float:
        return self.comm.params[1]

    @property
    def busbw_gbps(self) -> float:
        """Asymptotic bus bandwidth 1/beta (GB/s = 1e9 B/s; ring's B(n) is nccl-tests' busbw factor)."""
        return 1e-9 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else math.inf


RESIDUAL_COLUMNS = (
    "collective", "precision", "group", "term", "source", "world_size", "size_bytes", "fp32_bytes",
    "measured_us", "predicted_us", "ratio", "sigma_us",
)  # fmt: skip
"""Per-point residuals kept by a model; ``term`` is comm, encode or decode; ratio = measured / predicted."""


@dataclass(slots=True)
class CostModel:
    """Fitted models keyed by (collective, precision, group), with per-point residuals and skipped keys."""

    fits: dict[tuple[str, str, str], Fit]
    residuals: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(RESIDUAL_COLUMNS)))
    skipped: dict[str, str] = field(default_factory=dict)
    """"collective/precision/group" -> why no model was fitted."""
    sources: list[str] = field(default_factory=list)
    measured: dict[tuple[str, str, str], tuple[MeasuredCurve, ...]] = field(default_factory=dict)
    """The measured points per key, one curve per layout: what :meth:`predict` prices from inside their sizes."""
    points_kept: bool = True
    """False for a model read from a file older than the measured points (schema < 4): every price is fitted."""

    def get(self, collective: str, precision: str, group: str = "world") -> Fit:
        key = (collective, precision, group)
        if key in self.fits:
            return self.fits[key]
        why = self.skipped.get("/".join(key))
        if why:
            raise ValueError(f"no model for {'/'.join(key)}: {why}")
        have = ", ".join("/".join(k) for k in sorted(self.fits)) or "none"
        raise ValueError(f"no model for {'/'.join(key)} (collective/precision/group); fitted: {have}")

    def predict(
        self,
        collective: str,
        precision: str,
        *,
        world_size: int,
        nbytes: float | None = None,
        fp32_bytes: float | None = None,
        group: str = "world",
        nodes: int | None = None,
        concurrent: int = 1,
    ) -> Prediction:
        """Predicted time of one call on a group of ``world_size`` ranks.

        Give exactly one size, both nccl-tests sizes (all_reduce the buffer, all_gather the total output,
        reduce_scatter the total input, all_to_all the per-rank buffer):

        * ``nbytes``: **wire bytes** (what results' ``size_bytes`` holds: a bf16 all_reduce of 1 Mi fp32 elements
          is 2 MiB);
        * ``fp32_bytes``: bytes of the user's fp32 tensor; converted to wire bytes by the ratio fitted for this
          precision (0.5 for bf16).

        ``group`` chooses the fit; the layout of the group predicted (see "Layouts" in the module docstring):

        * ``nodes``: nodes the predicted group spans (None: as the fit's points did). A fit across nodes prices a
          group across nodes by its per-node link whatever the ranks per node (``world_size`` counts them all);
          a fit within one node predicting across nodes, or the reverse, is ``extrapolated`` (another link).
        * ``concurrent``: groups of this kind crossing each node's link at once (:func:`link_sharing`: 1 for a
          flat ring, ``gpus_per_node`` for the ``inter`` groups / HSDP's replica groups); each gets 1/concurrent
          of the link. Ignored for a group within one node.

        Where a measured curve of exactly this layout (``world_size``, ``nodes`` spanned, link sharing) covers the
        size, the points price the call (``source == "measured"``, ``reason`` names them, no warning); where only
        another layout over the same kind of link measured the size, its points scaled by the formula do
        (``source == "scaled"``); elsewhere the fit does (``source == "fitted"``). ``warnings`` says why no points
        of this layout priced it, every extrapolation and (fitted) a fit missing its own points by more than
        :data:`RESIDUAL_WARN`.

        ``extrapolated`` is True when the size, the world size or the link sharing lies outside the fitted range
        (``reason`` says which); a world size inside the range but not measured is interpolated by the formula.
        """
        f = self.get(collective, precision, group)
        if (nbytes is None) == (fp32_bytes is None):
            raise ValueError("predict needs exactly one of nbytes (wire bytes) or fp32_bytes (user's fp32 tensor)")
        if not isinstance(world_size, (int, np.integer)) or isinstance(world_size, bool) or world_size < 2:
            raise ValueError(f"world_size must be an integer >= 2, got {world_size!r}")
        if nbytes is not None:
            wire = float(nbytes)
            fp32 = wire / f.wire_per_fp32
        else:
            fp32 = float(fp32_bytes)  # type: ignore[arg-type]
            wire = fp32 * f.wire_per_fp32
        if not (math.isfinite(wire) and wire > 0):
            raise ValueError(
                f"the size must be a positive number of bytes, got {nbytes if nbytes is not None else fp32_bytes!r}"
            )
        n = int(world_size)
        if nodes is not None and (
            not isinstance(nodes, (int, np.integer)) or isinstance(nodes, bool) or not 1 <= nodes <= n
        ):
            raise ValueError(f"nodes must be an integer in 1..world_size ({n}), got {nodes!r}")
        if not isinstance(concurrent, (int, np.integer)) or isinstance(concurrent, bool) or concurrent < 1:
            raise ValueError(f"concurrent must be an integer >= 1 (groups sharing a node link), got {concurrent!r}")
        fitted_across = f.crosses_nodes
        across = fitted_across is not False if nodes is None else nodes > 1
        share = int(concurrent) if across else 0
        alg = ALGORITHMS[f.algorithm]
        x0, x1 = alg.latency_steps(collective, n), wire * alg.bandwidth_factor(collective, n) * max(share, 1)
        t = f.comm.value(x0, x1)
        lsd = f.comm.log_sd(x0, x1)
        low, high = _lognormal_interval(t, lsd)

        reasons, extrap = [], False
        if nodes is not None and fitted_across is not None and across != fitted_across:
            extrap = True
            reasons.append(
                f"fitted {'across nodes' if fitted_across else 'within one node'}, predicting "
                f"{'across ' + str(nodes) + ' nodes' if across else 'within one node'}: another link"
            )
        elif fitted_across is None and f.link_shares:
            reasons.append("fitted on points within one node and across nodes: the fit mixes two links")
        if across and f.link_shares and min(f.link_shares) > 0:
            lo_c, hi_c = min(f.link_shares), max(f.link_shares)
            if not lo_c <= share <= hi_c:
                extrap = True
                reasons.append(f"node link shared by {share} group(s), fitted {lo_c}..{hi_c} (1/c of the link each)")
        lo_b, hi_b = f.min_bytes, f.max_bytes
        if wire < lo_b * (1 - 1e-9) or wire > hi_b * (1 + 1e-9):
            extrap = True
            reasons.append(f"size {wire:.0f} wire bytes outside the fitted {lo_b:.0f}..{hi_b:.0f}")
        ws = f.world_sizes
        if n < min(ws) or n > max(ws):
            extrap = True
            reasons.append(f"world size {n} outside the fitted {_ranks(ws)} ({alg.name} formula)")
        elif n not in ws:
            reasons.append(f"world size {n} interpolated between the fitted {_ranks(ws)} by the {alg.name} formula")
        if not math.isfinite(lsd):
            reasons.append("no residual degrees of freedom: interval unknown")

        # Measured first: inside a curve of exactly this layout the points price the call, the fit does not.
        key = (collective, precision, group)
        curves = self.measured.get(key, ())
        curve = find_curve(curves, n, nodes, share)
        source, warnings = "fitted", []
        if curve is not None and curve.covers(wire):
            t, low, high, where = curve.at(wire)
            lsd = math.log(high / low) / (2 * Z95) if low > 0 else math.nan
            source, extrap = "measured", False
            spans = f"{curve.spans} node{'s' if curve.spans != 1 else ''}"
            reasons = [
                f"{where} (n={n} on {spans})"
                + ("; no spread measured: interval from the curve's scatter" if curve.spread == "none" else "")
            ]
        elif curve is None and (near := _nearest(curves, n, share, wire)) is not None:
            # another layout measured this size over the same kind of link: its points, scaled by the formula
            tm, lm, hm, where = near.at(wire)
            b0 = alg.latency_steps(collective, near.world_size)
            b1 = wire * alg.bandwidth_factor(collective, near.world_size) * max(near.link_share, 1)
            base = f.comm.value(b0, b1)
            ra, rb = x0 / b0, x1 / b1  # the ratio of pure latency and of pure bandwidth: any split lies between
            r = t / base if base > 0 else max(ra, rb)
            t, low, high = tm * r, lm * min(ra, rb), hm * max(ra, rb)
            lsd = math.log(high / low) / (2 * Z95) if low > 0 else math.nan
            source = "scaled"
            there = _layout_text(near.world_size, near.spans, near.link_share)
            warnings.append(
                f"{_layout_text(n, nodes, share)} was not measured: the {there} points ({where}) scaled by the "
                f"{alg.name} formula, x{r:.3g} (x{min(ra, rb):.3g}..x{max(ra, rb):.3g} for any latency/bandwidth split)"
            )
            warnings.extend(reasons)
        else:
            warnings.append(f"priced by the fitted {alg.name} model, not by measured points: "
                            + self._why_fitted(key, curves, curve, n, nodes, share, wire))  # fmt: skip
            warnings.extend(reasons)
            if abs(f.worst_rel_residual) > RESIDUAL_WARN:
                warnings.append(
                    f"the fit misses its own points by up to {f.worst_rel_residual:+.0%} (at {f.worst_where}): "
                    "fitted times are approximate"
                )

        codec = [0.0, 0.0]  # encode, decode
        var_codec = 0.0
        for i, (lf, factor) in enumerate(((f.encode, encode_factor), (f.decode, decode_factor))):
            if lf is None:
                continue
            x = fp32 * factor(collective, n)
            codec[i] = lf.value(1.0, x)
            var_codec += (codec[i] * lf.log_sd(1.0, x)) ** 2
        enc, dec = codec
        total = enc + t + dec
        if enc == dec == 0.0:
            tl, th = low, high
        else:  # terms combined as independent, in absolute variance, then back to a log-normal width
            tl, th = _lognormal_interval(
                total, math.sqrt((t * lsd) ** 2 + var_codec) / total if total > 0 else math.nan
            )
        return Prediction(
            time_s=t,
            low_s=low,
            high_s=high,
            extrapolated=extrap,
            reason="; ".join(reasons) if reasons else "within the fitted range",
            encode_s=enc,
            decode_s=dec,
            total_s=total,
            total_low_s=tl,
            total_high_s=th,
            wire_bytes=wire,
            fp32_bytes=fp32,
            source=source,
            warnings=tuple(warnings),
        )

    def _why_fitted(
        self, key: tuple[str, str, str], curves: Sequence[MeasuredCurve], curve: MeasuredCurve | None, n: int,
        nodes: int | None, share: int, wire: float,
    ) -> str:  # fmt: skip
        """Why no measured curve prices this call, in the words of a warning."""
        if not self.points_kept:
            return (
                "this model file keeps no measured points (cost-model schema < 4); "
                "refit it (commbench fit) to price from them"
            )
        if not curves:
            return f"the model keeps no measured points for {'/'.join(key)}"
        if curve is None:
            return f"{_layout_text(n, nodes, share)} was not measured (measured: {layouts(curves)})"
        measured = f"{human_bytes(curve.min_bytes)}..{human_bytes(curve.max_bytes)}"
        return f"size {human_bytes(wire)} outside the measured {measured}"

    def missing_measurement(
        self, collective: str, precision: str, group: str = "world", *, nodes: int = 1, gpus_per_node: int = 1,
        fp32_bytes: float | None = None,
    ) -> str:  # fmt: skip
        """One sentence for a call the model cannot price: what is missing, what the model has, and the command that
        measures it on a ``nodes x gpus_per_node`` cluster (:func:`measure_command`), around ``fp32_bytes`` when
        given. Asked by the planner for what a strategy needs and no fit covers (bf16 rows when only fp32 was
        imported; ZeRO-1's broadcast)."""
        have = sorted("/".join(k) for k in self.fits if k[:2] == (collective, precision))
        have = have or sorted("/".join(k) for k in self.fits) or ["nothing"]
        cmd = measure_command(collective, precision, group, nodes=nodes, gpus_per_node=gpus_per_node,
                              fp32_bytes=fp32_bytes)  # fmt: skip
        return (
            f"no measurement of {collective}/{precision} on the {group} group (the model has {', '.join(have)}); {cmd}"
        )

    # ------------------------------------------------------------------------------------------- views
    def summary(self) -> pd.DataFrame:
        """One row per fit: parameters, goodness of fit and the fitted ranges."""
        rows = []
        for f in self.fits.values():
            rows.append(
                {
                    "collective": f.collective,
                    "precision": f.precision,
                    "group": f.group,
                    "algorithm": f.algorithm,
                    "points": f.comm.n_points,
                    "world_sizes": _ranks(f.world_sizes),
                    "bytes": f"{human_bytes(f.min_bytes)}..{human_bytes(f.max_bytes)}",
                    "alpha_us": f.alpha_s * 1e6,
                    "busbw_gbps": f.busbw_gbps,
                    "r2_log": f.r2_log,
                    "log_rms": f.comm.log_scatter,
                    "worst": f"{f.worst_rel_residual:+.0%} at {f.worst_where}",
                    "weighting": f.weighting,
                    "codec_us_per_mib": (
                        ((f.encode.params[1] if f.encode else 0.0) + (f.decode.params[1] if f.decode else 0.0))
                        * 2**20
                        * 1e6
                    ),
                }
            )
        return pd.DataFrame(rows)

    def format_summary(self) -> str:
        df = self.summary()
        lines = []
        if df.empty:
            lines.append("# no model fitted")
        else:
            lines.append(
                df.to_string(
                    index=False,
                    formatters={
                        "alpha_us": "{:.1f}".format,
                        "busbw_gbps": "{:.3f}".format,
                        "r2_log": "{:.3f}".format,
                        "log_rms": "{:.2f}".format,
                        "codec_us_per_mib": "{:.1f}".format,
                    },
                )
            )
        for mkey, curves in self.measured.items():
            kept = "; ".join(
                f"n={c.world_size} on {c.spans} node(s): {len(c.sizes)} sizes "
                f"{human_bytes(c.min_bytes)}..{human_bytes(c.max_bytes)}"
                for c in curves
            )
            lines.append(f"# measured {'/'.join(mkey)} (priced from these points inside their sizes): {kept}")
        for f in self.fits.values():
            if abs(f.worst_rel_residual) > RESIDUAL_WARN:
                lines.append(
                    f"# warning {f.collective}/{f.precision}/{f.group}: the fit misses its own points by up to "
                    f"{f.worst_rel_residual:+.0%} (at {f.worst_where}); prices outside the measured points are "
                    "approximate"
                )
        for key, why in self.skipped.items():
            lines.append(f"# skipped {key}: {why}")
        return "\n".join(lines)


def measure_command(
    collective: str, precision: str, group: str = "world", *, nodes: int = 1, gpus_per_node: int = 1,
    fp32_bytes: float | None = None, nbytes: float | None = None,
) -> str:  # fmt: skip
    """The command that measures ``collective`` in ``precision`` on groups of kind ``group`` of a ``nodes x
    gpus_per_node`` cluster (torchrun across nodes, a local spawn on one), over the powers of two around one call's
    size when given: ``fp32_bytes`` (the user's fp32 tensor, what ``run -b/-e`` take) or ``nbytes`` (wire bytes,
    converted by the precision's wire element size). A collective commbench does not run (one only nccl-tests logs
    bring, like broadcast) is measured by nccl-tests and imported."""
    from commbench.measure.precision import get_precision

    try:
        prec = get_precision(precision)
    except ValueError:
        prec = None
    if fp32_bytes is None and nbytes is not None and prec is not None:
        fp32_bytes = nbytes * 4.0 / prec.wire_dtype.itemsize
    if registered(collective) is None:
        dtype = prec.nccl_type if prec is not None else precision
        return (f"commbench does not run {collective}: measure it with nccl-tests ({collective}_perf -d {dtype}) "
                f"and import the log: python -m commbench import nccl-tests LOG --out RUN_DIR; "
                f"then python -m commbench fit RUN_DIR ... --out model.json")  # fmt: skip
    if nodes > 1:
        launch = f"torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} -m commbench run"
    else:
        launch = f"python -m commbench run --nproc {gpus_per_node}"
    cmd = f"{launch} --collectives {collective} --precisions {precision} --groups {group}"
    if fp32_bytes is not None and math.isfinite(fp32_bytes) and fp32_bytes > 0:
        from commbench.core.units import format_size

        lo = 2 ** max(int(math.floor(math.log2(fp32_bytes))) - 1, 3)
        hi = 2 ** (int(math.ceil(math.log2(fp32_bytes))) + 1)
        cmd += f" -b {format_size(lo)} -e {format_size(hi)}"
    return f"measure it: {cmd}"


def _layout_text(n: int, nodes: int | None, share: int) -> str:
    """A layout as warnings name it: ``n=64 on 8 nodes, node link shared by 8``."""
    here = f"n={n}" + (f" on {nodes} node{'s' if nodes != 1 else ''}" if nodes is not None else "")
    return here + (f", node link shared by {share}" if share > 1 else "")


def _nearest(curves: Sequence[MeasuredCurve], n: int, share: int, wire: float) -> MeasuredCurve | None:
    """The measured curve that covers ``wire`` bytes over the same kind of link (across nodes or within one) with
    the world size nearest ``n`` (in ratio; the larger on a tie); None when no curve does."""
    same = [c for c in curves if (c.link_share > 0) == (share > 0) and c.covers(wire)]
    if not same:
        return None
    return min(same, key=lambda c: (abs(math.log(n / c.world_size)), -c.world_size))


def _lognormal_interval(t: float, log_sd: float) -> tuple[float, float]:
    if not (t > 0 and math.isfinite(log_sd)):
        return (math.nan, math.nan)
    k = math.exp(Z95 * log_sd)
    return (t / k, t * k)


def _ranks(ws: Sequence[int]) -> str:
    return ",".join(str(n) for n in ws)


def human_bytes(b: float) -> str:
    """A byte count as the summary and the residuals name it (``4M``, ``1.5K``: 1024-based, as the sizes)."""
    for unit, s in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if b >= s:
            return f"{b / s:g}{unit}"
    return f"{b:g}"


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "CostModel",
    "Fit",
    "LinearFit",
    "Prediction",
    "RESIDUAL_COLUMNS",
    "Ring",
    "Tree",
    "decode_factor",
    "encode_factor",
    "group_spans",
    "human_bytes",
    "inter_node_share",
    "link_sharing",
    "measure_command",
    "RESIDUAL_WARN",
]
