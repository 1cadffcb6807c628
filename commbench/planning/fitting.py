"""Fitting the latency-bandwidth cost model (:mod:`commbench.planning.costmodel`) to a run's measured points.

``fit(run_dirs_or_frames)`` groups the points by (collective, precision, group), scales each by the algorithm's
``A(n)``/``B(n)`` and its node-link sharing (the cost model's "Layouts"), and fits ``alpha``, ``beta`` and the codec
terms, and keeps the points themselves, one :class:`commbench.planning.interpolate.MeasuredCurve` per layout (the
model prices from them inside their sizes); ``main_fit`` is ``commbench fit``. Pure pandas/numpy: it reads results
and never runs anything.

Timing mode
-----------
A fit is of points timed one way (``timing_mode``, :class:`commbench.core.suite.TimingConfig`): ``stream`` points are
nccl-tests' back-to-back loop; ``isolated`` points are one op after compute, the fastest rank's duration, as a
training step issues one collective per bucket after its backward reaches it. The two differ (measured on one machine:
benchmarks/results/2026-12-01_2core-vm_gloo.md), so ``fit`` refuses to mix them, and a plan priced from an isolated
fit prices a step's collectives as a step issues them.

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
1 when sigma came from intervals, which then only widen); a prediction combines it with the residual scatter
(:meth:`commbench.planning.costmodel.CostModel.predict`). Goodness of fit: R^2 of log time, rms of the log
residuals, and the worst relative residual with where it was.

Trust
-----
A fit extrapolates (prices sizes outside its points, states the asymptotic busbw ``1/beta``) only where its points
support it: :func:`untrusted` names the fits whose R^2 of log time is below :data:`R2_MIN` or whose busbw is more
than :data:`REACH` times the best measured (a run of latency-bound sizes: a gloo run of 1K..64K reads 0.6 GB/s at
best and fits 36.6 GB/s, R^2 -0.07). ``commbench fit`` warns and keeps no model for them (:func:`refuse_untrusted`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from typing import TypeAlias

import numpy as np
import pandas as pd

from commbench.measure.groups import GROUP_KINDS
from commbench.planning.costmodel import (
    ALGORITHMS,
    RESIDUAL_COLUMNS,
    Z95,
    CostModel,
    Fit,
    LinearFit,
    decode_factor,
    encode_factor,
    group_spans,
    human_bytes,
    link_sharing,
)
from commbench.planning.costmodel_io import write_model
from commbench.planning.interpolate import MeasuredCurve, curve_from_rows

MEDIAN_SE = math.sqrt(math.pi / 2.0)
"""Standard error of the median over that of the mean, for normal samples (1.2533)."""


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


def _point_spans(df: pd.DataFrame, shares: np.ndarray) -> np.ndarray:
    """Nodes each row's group spans (:func:`group_spans`); a world that does not split evenly into its nodes spans
    them all when its groups cross node links, else one."""
    out = np.ones(len(df), dtype=int)
    for i, (grp, w, nn) in enumerate(zip(df["group"], df["world_size"], df["nodes"], strict=True)):
        if pd.isna(w) or pd.isna(nn) or int(nn) <= 1:
            continue
        w, nn = int(w), int(nn)
        out[i] = group_spans(str(grp), nn, w // nn) if w % nn == 0 else (nn if shares[i] > 0 else 1)
    return out


def _point_bounds(g: pd.DataFrame, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's 95 % bounds of time (us): its interval when measured, else from cv and samples as :func:`_sigma`
    does (log-normal), else NaN (an imported nccl-tests row)."""
    nan = np.full(len(g), math.nan)
    if {"time_ci_low_us", "time_ci_high_us"} <= set(g.columns):
        lo = pd.to_numeric(g["time_ci_low_us"], errors="coerce").to_numpy(float)
        hi = pd.to_numeric(g["time_ci_high_us"], errors="coerce").to_numpy(float)
        if np.all(np.isfinite(lo) & np.isfinite(hi) & (lo > 0) & (hi >= lo)):
            return lo, hi
    if {"cv", "samples"} <= set(g.columns):
        cv = pd.to_numeric(g["cv"], errors="coerce").to_numpy(float)
        ns = pd.to_numeric(g["samples"], errors="coerce").to_numpy(float)
        if np.all(np.isfinite(cv)) and np.all(cv > 0) and np.all(ns > 1):
            k = np.exp(Z95 * MEDIAN_SE * cv / np.sqrt(ns))
            return t / k, t * k
    return nan, nan.copy()


def _curves(g: pd.DataFrame, t_us: np.ndarray, shares: np.ndarray) -> tuple[MeasuredCurve, ...]:
    """The measured points of one key, one curve per layout (ranks, nodes spanned, link sharing)."""
    lo, hi = _point_bounds(g, t_us)
    spans = _point_spans(g, shares)
    n = g["_n"].to_numpy(int)
    size = g["size_bytes"].to_numpy(float)
    out = []
    for lay in sorted({(int(a), int(b), int(c)) for a, b, c in zip(n, spans, shares, strict=True)}):
        m = (n == lay[0]) & (spans == lay[1]) & (shares == lay[2])
        out.append(curve_from_rows(*lay, size[m], t_us[m] * 1e-6, lo[m] * 1e-6, hi[m] * 1e-6))
    return tuple(out)


# ----------------------------------------------------------------------------------------------- linear fit
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
    return f"{human_bytes(float(row['size_bytes']))} n={int(row['_n'])}"


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
    if "group" not in df.columns:  # runs from before the group column ran in the world
        df["group"] = "world"
    df["group"] = df["group"].astype(object).where(df["group"].notna(), "world").astype(str)
    bad_groups = sorted(g for g in set(df["group"]) if g not in GROUP_KINDS)
    if bad_groups:
        raise ValueError(f"unknown group(s) {', '.join(bad_groups)}; known: {', '.join(GROUP_KINDS)}")
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
    measured: dict[tuple[str, str, str], tuple[MeasuredCurve, ...]] = {}
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

        measured[key] = _curves(g, t, shares)
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
    return CostModel(fits=fits, residuals=res, skipped=skipped, sources=names, measured=measured)


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


R2_MIN = 0.5
"""A fit whose R^2 of log time is below this explains too little of how time grows with size to extrapolate."""
REACH = 2.0
"""A fit whose asymptotic busbw (1/beta) exceeds the best busbw measured by more than this factor extrapolates to
a bandwidth no measured size came near: every point was latency-bound."""


def untrusted(model: CostModel) -> dict[tuple[str, str, str], str]:
    """The fits that cannot be trusted outside their own points, with why: an R^2 of log time below
    :data:`R2_MIN` (the sizes explain little of the time: flat, latency-bound or noisy points) or a fitted busbw more
    than :data:`REACH` times the best busbw measured (the range never approached the bandwidth the fit claims).
    The best busbw is read off the model's comm residuals, in the fit's own units (the algorithm's ``B(n)``, one
    link's share), so it is the number ``1/beta`` is compared with."""
    out: dict[tuple[str, str, str], str] = {}
    res = model.residuals
    for key, f in model.fits.items():
        why = []
        if not f.r2_log >= R2_MIN:  # NaN too: every point the same time
            why.append(f"R^2 of log time {f.r2_log:.2f} < {R2_MIN:g}: the sizes explain little of the time")
        sel = res[(res["collective"] == key[0]) & (res["precision"] == key[1]) & (res["group"] == key[2])
                  & (res["term"] == "comm")]  # fmt: skip
        if len(sel):
            alg = ALGORITHMS[f.algorithm]
            share = max(min(f.link_shares), 1) if f.link_shares else 1
            bus = [float(s) * alg.bandwidth_factor(key[0], int(n)) * share / (float(t) * 1e-6)
                   for s, n, t in zip(sel["size_bytes"], sel["world_size"], sel["measured_us"], strict=True)
                   if float(t) > 0]  # fmt: skip
            best = max(bus, default=math.nan) * 1e-9
            if not math.isfinite(f.busbw_gbps):
                why.append(f"time does not grow with size over its points (best measured busbw {best:.3g} GB/s): "
                           "the fit has no bandwidth term")  # fmt: skip
            elif best > 0 and f.busbw_gbps > REACH * best:
                why.append(
                    f"its busbw {f.busbw_gbps:.3g} GB/s is {f.busbw_gbps / best:.3g}x the best measured {best:.3g} GB/s: "
                    "no measured size came near it"
                )
        if why:
            out[key] = "; ".join(why)
    return out


def refuse_untrusted(model: CostModel) -> list[str]:
    """Take the :func:`untrusted` fits out of ``model`` (and their points), listing each under ``skipped`` with why:
    a model file then prices no call from them, so nothing is extrapolated from a fit that cannot be. Returns the
    warning line (none when every fit holds)."""
    refused = untrusted(model)
    for key, why in refused.items():
        f = model.fits.pop(key)
        model.measured.pop(key, None)
        name = "/".join(key)
        model.skipped[name] = (
            f"not kept: the fit cannot be trusted outside its points ({why}); measure sizes large enough that the "
            f"time grows with size (raise -e above {human_bytes(f.max_bytes)}), then fit again"
        )
    if not refused:
        return []
    names = ", ".join("/".join(k) for k in refused)
    return [f"# warning: {len(refused)} fit(s) cannot be trusted outside their points, so nothing is extrapolated from "
            f"them and no model is kept for them (why: skipped, below): {names}"]  # fmt: skip


def main_fit(run_dirs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]) -> str:
    """``commbench fit RUN_DIR... --out model.json``: fit, refuse what cannot be trusted (:func:`refuse_untrusted`),
    write the model, return a printable summary."""
    model = fit(list(run_dirs))
    warnings = refuse_untrusted(model)
    p = write_model(model, out)
    head = f"# cost model of {len(run_dirs)} run(s): {', '.join(str(r) for r in run_dirs)}\n"
    head += "# time = alpha*A(n) + wire_bytes*beta*B(n)  (ring: busbw = 1/beta); codec = c0 + c1*fp32_bytes\n"
    head += "# inside the measured sizes of a layout a call is priced from its points; the fit prices the rest\n"
    return head + "".join(w + "\n" for w in warnings) + model.format_summary() + f"\n# model: {p}"


__all__ = [
    "MEDIAN_SE", "R2_MIN", "REACH", "REQUIRED", "Source", "fit", "main_fit", "nnls2", "refuse_untrusted", "untrusted",
]  # fmt: skip
