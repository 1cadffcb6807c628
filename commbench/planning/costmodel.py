"""Fitted latency-bandwidth cost model of the collectives: fit to measured points, predict, serialise.

Owns the capacity-planning cost model (DESIGN "Capacity planning"); pure pandas/numpy, it reads results and
never runs anything.

Model
-----
Per (collective, precision, group) the communication time of one call is

    time(S, n) = alpha * A(n) + S * beta * B(n)

with ``S`` the nccl-tests size in **wire bytes** (the ``size_bytes`` column: all_reduce the buffer, all_gather the
total output, reduce_scatter the total input, all_to_all the per-rank buffer) and ``n`` the ranks of the group
(``group_size``, else ``world_size``). ``A(n)`` counts latency steps and ``B(n)`` the fraction of ``S`` each rank
sends; both come from the algorithm assumed (:data:`ALGORITHMS`):

* ``ring`` (default; NCCL's ring and gloo's ring all_reduce; the bandwidth-optimal schedule at large sizes, which is
  the regime capacity planning is about): all_reduce = reduce_scatter + all_gather, ``A = 2(n-1)``,
  ``B = 2(n-1)/n``; all_gather and reduce_scatter ``A = n-1``, ``B = (n-1)/n``; all_to_all (pairwise exchange)
  ``A = n-1``, ``B = (n-1)/n``; broadcast/reduce (pipelined chain) ``A = n-1``, ``B = 1``; sendrecv ``A = B = 1``.
  ``B(n)`` is exactly nccl-tests' busbw factor, so ``1/beta`` is the asymptotic **bus bandwidth**.
* ``tree`` (NCCL's double binary tree all_reduce, small messages at scale): ``A = 2 log2(n)``, ``B = 2`` (reduce up
  and broadcast down, each moving S, pipelined); other collectives fall back to ring.
* Two-level (multi-node) layouts are modelled by fitting the ``intra`` and ``inter`` groups separately (nccl-tests'
  NCCL_TESTS_SPLIT groups); a hierarchical collective's time is then the sum of its stages, which the planner
  composes.

Layouts: how a group maps onto the node links
---------------------------------------------
Ranks are placed node by node (torchrun's order: ranks of a node contiguous), and a node's link to the others is
full duplex and the bottleneck of any ring that crosses it (intra-node hops are much faster). Then:

* a ring over ``n`` ranks spanning several nodes crosses each node's link once per direction (ranks of a node are
  neighbours), so each node's link carries ``S * B(n)`` bytes per direction: the per-rank bus bytes. Each of the
  ``A(n)`` steps waits for its slowest edge, an inter-node hop, so the steps are priced at the link's alpha (the
  intra hops of a step run meanwhile). A ``world`` (or ``inter``) fit over several nodes therefore measures the
  **per-node link**, whatever the ranks per node: a fit on 2 and 3 nodes x 1 rank predicts a flat ring over
  2 nodes x 2 ranks with ``n = 4`` in the same formula;
* ``c`` groups of one kind running at once whose rings each cross a node's link (the ``inter`` groups, one per
  local rank: HSDP's replica groups, the sweep's ``inter`` on g ranks per node, ``c = g``) share that link: each
  gets ``1/c`` of it, ``time = alpha*A(n) + c*S*beta*B(n)``. :func:`link_sharing` counts ``c`` for a group kind on
  a layout by asking the kind's partition (:mod:`commbench.measure.groups`); a group within one node has ``c = 0`` (no
  node link in its path; concurrent intra groups on different nodes do not share anything modelled here).

A fit scales each point's bandwidth term by its ``c`` (from the point's ``nodes``, ``world_size`` and group), so
its beta is per byte on one node link; ``Fit.link_shares`` keeps the ``c`` values it saw (0: within a node).
:meth:`CostModel.predict` takes the layout of the group predicted as ``nodes=`` (nodes it spans) and
``concurrent=`` (its ``c``); the planner (:mod:`commbench.plan`) prices inter-node groups through the same
arguments. Not modelled: rings that are not node-contiguous, NCCL's tree/NVLS inter-node algorithms, a link
shared by different kinds at once, and a switch core slower than the node links.

Codec cost (encode before, decode after the collective; ``encode_us``/``decode_us``) is fitted as
``c0 + c1 * F * E(n)`` where ``F`` is the fp32 nccl-tests size and ``E(n)`` the fraction of it a rank encodes
(all_gather encodes its own input shard, ``1/n``; the other collectives encode the whole input, 1) or decodes
(always the whole output or all received chunks, 1). A precision with no codec (fp32, or bf16 when the user's
tensor already is bf16) has zero codec cost.

Timing mode
-----------
A fit is of points timed one way (``timing_mode``, :class:`commbench.core.suite.TimingConfig`): ``stream`` points are
nccl-tests' back-to-back loop; ``isolated`` points are one op after compute, the fastest rank's duration, as a
training step issues one collective per bucket after its backward reaches it. On a 2-core gloo machine the two
differ (1 MiB all_reduce after 20 ms of compute: median 1.35-1.54x the streamed time). ``fit`` refuses to mix them, and a
plan priced from an isolated fit prices a step's collectives as a step issues them.

Weights and fit
---------------
Weighted least squares with ``w = 1/sigma^2`` per point and non-negative ``alpha``, ``beta`` (exact: with two
parameters every active set is tried). ``sigma`` comes, per fit and in this order of preference, from

1. the 95 % CI of ``time_us`` (``time_ci_low_us``/``time_ci_high_us``): ``sigma = (high - low) / 2 / 1.96``;
2. the coefficient of variation: ``sigma = 1.2533 * cv * time / sqrt(samples)`` (standard error of a median of
   normal samples; ``cv`` pools all ranks' samples, so this is approximate);
3. neither: ``sigma = time`` (every point carries the same *relative* weight: a fit of relative residuals).

A floor ``sigma >= rel_floor * time`` (default 1 %) stops one very tight point from dominating a model that is only
approximately right. The parameter covariance is ``s * (X^T W X)^-1`` with ``s`` the reduced chi-square (at least
1 when sigma came from intervals, which then only widen). A prediction's 95 % interval combines that covariance
with the residual scatter of the fit (rms of the log residuals), log-normally: ``t * exp(+-1.96 sd_log)``: an
interval for a new measurement, not just for the mean. Goodness of fit: R^2 of log time, rms of the log residuals,
and the worst relative residual with where it was.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from commbench.measure.collectives import Collective

SCHEMA = "commbench.costmodel"
SCHEMA_VERSION = 3
"""2: ``Fit.link_shares``; an inter fit's beta is per byte of one node link (version 1: per group). 3: ``Fit.timing_mode``
(earlier files: stream)."""
Z95 = 1.959963984540054
MEDIAN_SE = math.sqrt(math.pi / 2.0)
"""Standard error of the median over that of the mean, for normal samples (1.2533)."""

GROUPS = ("world", "intra", "inter")


# ----------------------------------------------------------------------------------------------- algorithms
class Algorithm:
    """How a collective's time scales with the group size: latency steps A(n) and bandwidth factor B(n)."""

    name = ""

    def latency_steps(self, collective: str, n: int) -> float:
        raise NotImplementedError

    def bandwidth_factor(self, collective: str, n: int) -> float:
        raise NotImplementedError

    def knows(self, collective: str) -> bool:
        try:
            self.latency_steps(collective, 2)
        except KeyError:
            return False
        return True


def _registered(collective: str) -> Collective | None:
    """The commbench collective of that name; None for one only nccl-tests logs bring (broadcast, reduce, ...)."""
    from commbench.measure.collectives import COLLECTIVES

    return COLLECTIVES.get(collective)


class Ring(Algorithm):
    """A commbench collective's ring is its nccl-tests bus factor: ``bus_passes`` passes of n-1 steps, each rank
    sending (n-1)/n of the size per pass. Collectives only imported from nccl-tests logs take the table."""

    name = "ring"
    _IMPORTED: dict[str, tuple[Callable[[int], float], Callable[[int], float]]] = {
        # name: (latency steps, bandwidth factor); broadcast/reduce as a pipelined chain
        "broadcast": (lambda n: float(n - 1), lambda n: 1.0),
        "reduce": (lambda n: float(n - 1), lambda n: 1.0),
        "sendrecv": (lambda n: 1.0, lambda n: 1.0),
    }

    def latency_steps(self, collective: str, n: int) -> float:
        c = _registered(collective)
        return float(c.bus_passes * (n - 1)) if c is not None else self._IMPORTED[collective][0](n)

    def bandwidth_factor(self, collective: str, n: int) -> float:
        c = _registered(collective)
        return c.bus_factor(n) if c is not None else self._IMPORTED[collective][1](n)


class Tree(Ring):
    """NCCL's double binary tree for the collectives that have one (``Collective.nccl_tree``: all_reduce):
    2 log2(n) steps, the size up and down once each (pipelined); the others fall back to ring."""

    name = "tree"

    def latency_steps(self, collective: str, n: int) -> float:
        c = _registered(collective)
        if c is not None and c.nccl_tree:
            return 2.0 * math.log2(n)
        return super().latency_steps(collective, n)

    def bandwidth_factor(self, collective: str, n: int) -> float:
        c = _registered(collective)
        if c is not None and c.nccl_tree:
            return 2.0
        return super().bandwidth_factor(collective, n)


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (Ring(), Tree())}


def encode_factor(collective: str, n: int) -> float:
    """Fraction of the fp32 nccl-tests size one rank encodes (all_gather: its own shard)."""
    c = _registered(collective)
    return 1.0 / n if c is not None and c.input_per_rank else 1.0


def decode_factor(collective: str, n: int) -> float:
    """Fraction of the fp32 nccl-tests size one rank decodes (the whole output / all received chunks)."""
    return 1.0


def link_sharing(group: str, nodes: int, gpus_per_node: int) -> int:
    """Groups of kind ``group`` whose rings cross each node's link at once, on ``nodes x gpus_per_node`` ranks
    placed node by node: 1 for the world over several nodes, ``gpus_per_node`` for the ``inter`` groups, 0 for
    groups within one node (see "Layouts" in the module docstring). Asks the kind's partition, so a new group
    kind needs nothing here."""
    from commbench.measure.groups import get_group_kind

    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"nodes and gpus_per_node must be >= 1, got {nodes} and {gpus_per_node}")
    hosts = [str(i) for i in range(nodes) for _ in range(gpus_per_node)]
    parts = get_group_kind(group).partition(hosts)
    # nodes are alike under node-by-node placement: count node 0's spanning groups
    return sum(1 for part in parts if "0" in {hosts[r] for r in part} and len({hosts[r] for r in part}) > 1)


def _point_shares(df: pd.DataFrame) -> np.ndarray:
    """:func:`link_sharing` of each row (columns group, world_size, nodes): 0 within one node; a world that does
    not split evenly into its nodes counts its groups as crossing once (1) when they span nodes."""
    out = np.zeros(len(df), dtype=int)
    for i, (grp, w, nn, gs) in enumerate(zip(df["group"], df["world_size"], df["nodes"], df["_n"], strict=True)):
        if pd.isna(w) or pd.isna(nn) or int(nn) <= 1:
            continue
        w, nn = int(w), int(nn)
        if w % nn == 0:
            out[i] = link_sharing(str(grp), nn, w // nn)
        else:
            out[i] = 1 if int(gs) > w // nn else 0
    return out


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": list(self.params),
            "cov": [list(r) for r in self.cov],
            "free": list(self.free),
            "chi2_red": self.chi2_red,
            "log_scatter": self.log_scatter,
            "n_points": self.n_points,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LinearFit:
        c = d["cov"]
        return cls(
            params=(float(d["params"][0]), float(d["params"][1])),
            cov=((float(c[0][0]), float(c[0][1])), (float(c[1][0]), float(c[1][1]))),
            free=(bool(d["free"][0]), bool(d["free"][1])),
            chi2_red=float(d["chi2_red"]),
            log_scatter=float(d["log_scatter"]),
            n_points=int(d["n_points"]),
        )


def nnls2(x: np.ndarray, y: np.ndarray, sigma: np.ndarray, *, sigma_is_absolute: bool) -> LinearFit:
    """Weighted least squares of ``y ~ x @ p`` (x: m x 2) with ``p >= 0``; every active set is tried, the feasible
    one with the smallest weighted residual wins (exact for two parameters)."""
    m = len(y)
    w = 1.0 / sigma**2
    sw = np.sqrt(w)
    scale = np.where(np.abs(x).max(axis=0) > 0, np.abs(x).max(axis=0), 1.0)  # column scaling: conditioning
    xs = x / scale
    best: tuple[float, np.ndarray, tuple[bool, bool]] | None = None
    for free in ((True, True), (True, False), (False, True)):
        cols = [i for i in (0, 1) if free[i]]
        a = xs[:, cols] * sw[:, None]
        if np.linalg.matrix_rank(a) < len(cols):
            continue
        sol, *_ = np.linalg.lstsq(a, y * sw, rcond=None)
        if np.any(sol < 0):
            continue
        p = np.zeros(2)
        p[cols] = sol
        sse = float(np.sum(w * (y - xs @ p) ** 2))
        if best is None or sse < best[0] - 1e-12 * abs(best[0]):
            best = (sse, p, free)
    if best is None:
        raise ValueError("no non-negative fit exists (are all times positive and sizes distinct?)")
    sse, ps, free = best
    k = sum(free)
    dof = m - k
    chi2_red = sse / dof if dof > 0 else math.nan
    yhat = xs @ ps
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.log(y / np.where(yhat > 0, yhat, np.nan))
    log_scatter = math.sqrt(float(np.nansum(lr**2)) / dof) if dof > 0 else math.nan
    cols = [i for i in (0, 1) if free[i]]
    cov = np.zeros((2, 2))
    if dof > 0:
        a = xs[:, cols] * sw[:, None]
        inv = np.linalg.inv(a.T @ a)
        s = max(chi2_red, 1.0) if sigma_is_absolute else chi2_red
        sub = inv * s / np.outer(scale[cols], scale[cols])
        for ii, i in enumerate(cols):
            for jj, j in enumerate(cols):
                cov[i, j] = sub[ii, jj]
    else:
        cov[:] = math.nan
    p = ps / scale
    return LinearFit(
        params=(float(p[0]), float(p[1])),
        cov=((float(cov[0, 0]), float(cov[0, 1])), (float(cov[1, 0]), float(cov[1, 1]))),
        free=free,
        chi2_red=chi2_red,
        log_scatter=log_scatter,
        n_points=m,
    )


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
    """How sigma was obtained: "ci", "cv" or "relative" (see the module docstring)."""
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

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        d["comm"] = self.comm.to_dict()
        d["encode"] = self.encode.to_dict() if self.encode else None
        d["decode"] = self.decode.to_dict() if self.decode else None
        d["world_sizes"] = list(self.world_sizes)
        d["nodes"] = list(self.nodes)
        d["link_shares"] = list(self.link_shares)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Fit:
        return cls(
            collective=str(d["collective"]),
            precision=str(d["precision"]),
            group=str(d["group"]),
            algorithm=str(d["algorithm"]),
            comm=LinearFit.from_dict(d["comm"]),
            encode=LinearFit.from_dict(d["encode"]) if d.get("encode") else None,
            decode=LinearFit.from_dict(d["decode"]) if d.get("decode") else None,
            weighting=str(d["weighting"]),
            wire_per_fp32=float(d["wire_per_fp32"]),
            min_bytes=float(d["min_bytes"]),
            max_bytes=float(d["max_bytes"]),
            world_sizes=tuple(int(n) for n in d["world_sizes"]),
            nodes=tuple(int(n) for n in d["nodes"]),
            backend=str(d["backend"]),
            impl=str(d["impl"]),
            r2_log=float(d["r2_log"]),
            worst_rel_residual=float(d["worst_rel_residual"]),
            worst_where=str(d["worst_where"]),
            link_shares=tuple(int(c) for c in d.get("link_shares") or ()),
            timing_mode=str(d.get("timing_mode") or "stream"),
        )


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

        enc = dec = 0.0
        var_codec = 0.0
        for lf, factor, attr in ((f.encode, encode_factor, "enc"), (f.decode, decode_factor, "dec")):
            if lf is None:
                continue
            x = fp32 * factor(collective, n)
            v = lf.value(1.0, x)
            var_codec += (v * lf.log_sd(1.0, x)) ** 2
            if attr == "enc":
                enc = v
            else:
                dec = v
        total = enc + t + dec
        # Terms combined as independent, in absolute variance, then back to a log-normal width.
        tl, th = _lognormal_interval(total, math.sqrt((t * lsd) ** 2 + var_codec) / total if total > 0 else math.nan)
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
                    "bytes": f"{_human(f.min_bytes)}..{_human(f.max_bytes)}",
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
        for key, why in self.skipped.items():
            lines.append(f"# skipped {key}: {why}")
        return "\n".join(lines)

    # ------------------------------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        res = self.residuals.astype(object).where(pd.notna(self.residuals), None)
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "model": "time = alpha*A(n) + wire_bytes*beta*B(n); codec = c0 + c1*fp32_bytes*E(n)",
            "sources": list(self.sources),
            "fits": [f.to_dict() for f in self.fits.values()],
            "skipped": dict(self.skipped),
            "residuals": res.to_dict("records"),
        }

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        from commbench.store.results import atomic_write_text

        atomic_write_text(p, json.dumps(self.to_dict(), indent=1, allow_nan=True) + "\n")
        return p

    @classmethod
    def from_dict(cls, d: Any, where: str = "cost model") -> CostModel:
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise ValueError(f'{where} is not a commbench cost model (no "schema": "{SCHEMA}")')
        v = d.get("schema_version")
        if not isinstance(v, int) or v > SCHEMA_VERSION or v < 1:
            raise ValueError(
                f"{where} has cost-model schema version {v!r}; this commbench reads versions 1..{SCHEMA_VERSION}"
            )
        try:
            fits = [Fit.from_dict(f) for f in d["fits"]]
            residuals = pd.DataFrame(d.get("residuals") or [], columns=list(RESIDUAL_COLUMNS))
            skipped = {str(k): str(x) for k, x in (d.get("skipped") or {}).items()}
            sources = [str(s) for s in d.get("sources") or []]
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ValueError(f"{where} is malformed: {type(e).__name__}: {e}") from None
        for f in fits:
            if f.algorithm not in ALGORITHMS:
                raise ValueError(f"{where}: unknown algorithm {f.algorithm!r} (known: {', '.join(ALGORITHMS)})")
        return cls(
            fits={(f.collective, f.precision, f.group): f for f in fits},
            residuals=residuals,
            skipped=skipped,
            sources=sources,
        )

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> CostModel:
        p = Path(path)
        try:
            d = json.loads(p.read_text())
        except OSError as e:
            raise ValueError(f"cannot read cost model {p}: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{p} is not JSON: {e}") from None
        return cls.from_dict(d, str(p))


def _lognormal_interval(t: float, log_sd: float) -> tuple[float, float]:
    if not (t > 0 and math.isfinite(log_sd)):
        return (math.nan, math.nan)
    k = math.exp(Z95 * log_sd)
    return (t / k, t * k)


def _ranks(ws: Sequence[int]) -> str:
    return ",".join(str(n) for n in ws)


def _human(b: float) -> str:
    for unit, s in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if b >= s:
            return f"{b / s:g}{unit}"
    return f"{b:g}"


# ----------------------------------------------------------------------------------------------- fitting
Source: TypeAlias = "pd.DataFrame | str | os.PathLike[str]"
REQUIRED = ("collective", "precision", "world_size", "size_bytes", "fp32_bytes", "time_us")


def _frames(sources: Source | Iterable[Source]) -> tuple[pd.DataFrame, list[str]]:
    from commbench.store.results import load

    if isinstance(sources, (pd.DataFrame, str, os.PathLike)):
        sources = [sources]
    frames, names = [], []
    for i, s in enumerate(sources):
        if isinstance(s, pd.DataFrame):
            df, name = s.copy(), f"frame{i}"
        elif isinstance(s, (str, os.PathLike)):
            df, name = load(s), str(s)
        else:
            raise ValueError(f"fit takes run directories or DataFrames, got {type(s).__name__}")
        missing = [c for c in REQUIRED if c not in df.columns]
        if missing:
            raise ValueError(f"{name} lacks column(s) {', '.join(missing)} needed to fit a cost model")
        df["source"] = name
        frames.append(df)
        names.append(name)
    if not frames:
        raise ValueError("fit needs at least one run directory or DataFrame")
    return pd.concat(frames, ignore_index=True), names


def _sigma(g: pd.DataFrame, t: np.ndarray, rel_floor: float) -> tuple[np.ndarray, str]:
    """Per-point sigma of time (us) and the weighting used (same kind for every point of one fit)."""
    if {"time_ci_low_us", "time_ci_high_us"} <= set(g.columns):
        lo = pd.to_numeric(g["time_ci_low_us"], errors="coerce").to_numpy(float)
        hi = pd.to_numeric(g["time_ci_high_us"], errors="coerce").to_numpy(float)
        s = (hi - lo) / 2.0 / Z95
        if np.all(np.isfinite(s)) and np.all(s >= 0):
            return np.maximum(s, rel_floor * t), "ci"
    if {"cv", "samples"} <= set(g.columns):
        cv = pd.to_numeric(g["cv"], errors="coerce").to_numpy(float)
        ns = pd.to_numeric(g["samples"], errors="coerce").to_numpy(float)
        if np.all(np.isfinite(cv)) and np.all(cv > 0) and np.all(ns > 1):
            s = MEDIAN_SE * cv * t / np.sqrt(ns)
            return np.maximum(s, rel_floor * t), "cv"
    return t.copy(), "relative"


def _where(row: pd.Series) -> str:
    return f"{_human(float(row['size_bytes']))} n={int(row['_n'])}"


def fit(
    sources: Source | Iterable[Source],
    *,
    algorithm: str | dict[str, str] = "ring",
    rel_floor: float = 0.01,
    min_points: int = 3,
) -> CostModel:
    """Fit a :class:`CostModel` to run directories (``commbench.store.results.load``) and/or results DataFrames.

    ``algorithm``: one name of :data:`ALGORITHMS` for every collective, or a dict collective -> name (default
    ring). Keys with fewer than ``min_points`` points or fewer than two distinct sizes are listed in
    ``model.skipped`` with the reason instead of fitted.
    """
    if not (0 <= rel_floor < 1):
        raise ValueError(f"rel_floor must be in [0, 1), got {rel_floor!r}")
    if min_points < 3:
        raise ValueError(f"min_points must be >= 3 (an interval needs residual degrees of freedom), got {min_points}")
    algs = algorithm if isinstance(algorithm, dict) else {}
    default_alg = algorithm if isinstance(algorithm, str) else "ring"
    for a in [default_alg, *algs.values()]:
        if a not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {a!r}; known: {', '.join(ALGORITHMS)}")

    df, names = _frames(sources)
    if "group" not in df.columns:
        df["group"] = "world"
    df["group"] = df["group"].astype(object).where(df["group"].notna(), "world").astype(str)
    bad_groups = sorted(set(df["group"]) - set(GROUPS))
    if bad_groups:
        raise ValueError(f"unknown group(s) {', '.join(bad_groups)}; known: {', '.join(GROUPS)}")
    n_col = df["group_size"].fillna(df["world_size"]) if "group_size" in df.columns else df["world_size"]
    df["_n"] = pd.to_numeric(n_col, errors="coerce")
    for c in ("size_bytes", "fp32_bytes", "time_us"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    for c in ("encode_us", "decode_us"):
        df[c] = pd.to_numeric(df[c], errors="coerce").fillna(0.0) if c in df.columns else 0.0
    if "nodes" not in df.columns:
        df["nodes"] = 1
    df["nodes"] = pd.to_numeric(df["nodes"], errors="coerce").fillna(1)
    df["world_size"] = pd.to_numeric(df["world_size"], errors="coerce")

    fits: dict[tuple[str, str, str], Fit] = {}
    skipped: dict[str, str] = {}
    residuals: list[pd.DataFrame] = []
    for (coll, prec, grp), g in df.groupby(["collective", "precision", "group"], sort=False):
        key = (str(coll), str(prec), str(grp))
        name = "/".join(key)
        alg = ALGORITHMS[algs.get(key[0], default_alg)]
        if not alg.knows(key[0]):
            skipped[name] = f"no {alg.name} formula for collective {key[0]!r}"
            continue
        ok = (g["time_us"] > 0) & (g["size_bytes"] > 0) & (g["_n"] >= 2) & g["time_us"].notna()
        dropped = int((~ok).sum())
        g = g[ok].reset_index(drop=True)
        if len(g) < min_points or g["size_bytes"].nunique() < 2:
            skipped[name] = (
                f"{len(g)} usable point(s), {g['size_bytes'].nunique()} distinct size(s): need >= {min_points} "
                "points over >= 2 sizes"
                + (f" ({dropped} dropped: no positive time/size or group < 2)" if dropped else "")
            )
            continue
        backends = sorted({str(b) for b in g.get("backend", pd.Series(["?"])).dropna()})
        if len(backends) > 1:
            raise ValueError(f"{name}: points from several backends ({', '.join(backends)}); fit them separately")
        impls = sorted({str(b) for b in g.get("impl", pd.Series(["?"])).dropna()})
        mode_col = g["timing_mode"] if "timing_mode" in g.columns else pd.Series(["stream"])
        modes = sorted({str(m) if pd.notna(m) else "stream" for m in mode_col})  # runs from before the column: stream
        if len(modes) > 1:
            raise ValueError(
                f"{name}: points timed in several modes ({', '.join(modes)}): a stream of ops and an op issued after "
                "compute are different questions; fit them separately"
            )

        n = g["_n"].to_numpy(int)
        t = g["time_us"].to_numpy(float)
        shares = _point_shares(g)
        x = np.column_stack(
            [
                [alg.latency_steps(key[0], int(k)) for k in n],
                # c groups sharing a node link each get 1/c of it: beta is per byte of one link
                g["size_bytes"].to_numpy(float)
                * np.array([alg.bandwidth_factor(key[0], int(k)) for k in n])
                * np.maximum(shares, 1),
            ]
        )
        sigma, weighting = _sigma(g, t, rel_floor)
        comm = nnls2(x, t * 1e-6, sigma * 1e-6, sigma_is_absolute=weighting != "relative")
        pred = (x @ np.array(comm.params)) * 1e6
        ratio = t / pred
        logt, logp = np.log(t), np.log(np.where(pred > 0, pred, np.nan))
        ss_tot = float(np.sum((logt - logt.mean()) ** 2))
        r2 = 1.0 - float(np.nansum((logt - logp) ** 2)) / ss_tot if ss_tot > 0 else math.nan
        worst = int(np.nanargmax(np.abs(ratio - 1.0)))
        residuals.append(_residual_frame(g, key, "comm", t, pred, sigma, g["size_bytes"]))

        codec: dict[str, LinearFit | None] = {}
        for term, factor in (("encode", encode_factor), ("decode", decode_factor)):
            y = g[f"{term}_us"].to_numpy(float)
            if not np.any(y > 0):
                codec[term] = None
                continue
            xc = np.column_stack(
                [np.ones(len(g)), g["fp32_bytes"].to_numpy(float) * [factor(key[0], int(k)) for k in n]]
            )
            ys = np.maximum(y, 1e-3)  # a zero-time point gets the floor's weight, not an infinite one
            lf = nnls2(xc, y * 1e-6, ys * 1e-6, sigma_is_absolute=False)
            codec[term] = lf
            residuals.append(_residual_frame(g, key, term, y, (xc @ np.array(lf.params)) * 1e6, ys, g["size_bytes"]))

        ratio_wf = (g["size_bytes"] / g["fp32_bytes"]).replace([np.inf, -np.inf], np.nan).dropna()
        fits[key] = Fit(
            collective=key[0],
            precision=key[1],
            group=key[2],
            algorithm=alg.name,
            comm=comm,
            encode=codec["encode"],
            decode=codec["decode"],
            weighting=weighting,
            wire_per_fp32=float(ratio_wf.median()) if len(ratio_wf) else 1.0,
            min_bytes=float(g["size_bytes"].min()),
            max_bytes=float(g["size_bytes"].max()),
            world_sizes=tuple(sorted({int(k) for k in n})),
            nodes=tuple(sorted({int(k) for k in pd.to_numeric(g["nodes"], errors="coerce").fillna(1)})),
            backend=backends[0] if backends else "?",
            impl=",".join(impls),
            r2_log=r2,
            worst_rel_residual=float(ratio[worst] - 1.0),
            worst_where=_where(g.iloc[worst]),
            link_shares=tuple(sorted({int(c) for c in shares})),
            timing_mode=modes[0],
        )
    res = pd.concat(residuals, ignore_index=True) if residuals else pd.DataFrame(columns=list(RESIDUAL_COLUMNS))
    return CostModel(fits=fits, residuals=res, skipped=skipped, sources=names)


def _residual_frame(
    g: pd.DataFrame, key: tuple[str, str, str], term: str, y: np.ndarray, pred: np.ndarray, sigma: np.ndarray,
    size: pd.Series,
) -> pd.DataFrame:  # fmt: skip
    return pd.DataFrame(
        {
            "collective": key[0],
            "precision": key[1],
            "group": key[2],
            "term": term,
            "source": g["source"].to_numpy(),
            "world_size": g["_n"].to_numpy(int),
            "size_bytes": size.to_numpy(float),
            "fp32_bytes": g["fp32_bytes"].to_numpy(float),
            "measured_us": y,
            "predicted_us": pred,
            "ratio": y / np.where(pred > 0, pred, np.nan),
            "sigma_us": sigma,
        },
        columns=list(RESIDUAL_COLUMNS),
    )


def main_fit(run_dirs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]) -> str:
    """``commbench fit RUN_DIR... --out model.json``: fit, write the model, return a printable summary."""
    model = fit(list(run_dirs))
    p = model.to_json(out)
    head = f"# cost model of {len(run_dirs)} run(s): {', '.join(str(r) for r in run_dirs)}\n"
    head += "# time = alpha*A(n) + wire_bytes*beta*B(n)  (ring: busbw = 1/beta); codec = c0 + c1*fp32_bytes\n"
    return head + model.format_summary() + f"\n# model: {p}"


__all__ = [
    "ALGORITHMS",
    "CostModel",
    "Fit",
    "LinearFit",
    "Prediction",
    "decode_factor",
    "encode_factor",
    "fit",
    "link_sharing",
    "main_fit",
    "nnls2",
]
