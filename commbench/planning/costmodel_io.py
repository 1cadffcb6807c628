"""The cost model's file format: a :class:`commbench.planning.costmodel.CostModel` as JSON and back, with the schema
checks that let an old file load and a foreign one fail in one line.

The format is what ``commbench fit --out model.json`` writes and ``commbench plan --model`` reads: ``"schema":
"commbench.costmodel"``, ``"schema_version"`` (versions 1 .. :data:`SCHEMA_VERSION` load), the fits (one object per
(collective, precision, group), the :class:`~commbench.planning.costmodel.Fit` fields), the measured points the
model prices from (``"measured"``: one object per key and layout, the
:class:`~commbench.planning.interpolate.MeasuredCurve` fields), the skipped keys, the source runs and the per-point
residuals. A file older than the measured points (version < 4) loads with none: every price it gives is fitted, and
says so.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import pandas as pd

from commbench.planning.costmodel import ALGORITHMS, RESIDUAL_COLUMNS, CostModel, Fit, LinearFit
from commbench.planning.interpolate import MeasuredCurve

SCHEMA = "commbench.costmodel"
SCHEMA_VERSION = 4
"""2: ``Fit.link_shares``; an inter fit's beta is per byte of one node link (version 1: per group). 3: ``Fit.timing_mode``
(earlier files: stream). 4: ``"measured"``, the points a model prices from inside their sizes (earlier files: none)."""
MEASURED_SINCE = 4
"""The first version that keeps the measured points."""
MODEL = "time = alpha*A(n) + wire_bytes*beta*B(n); codec = c0 + c1*fp32_bytes*E(n)"
"""The formula, written into every file for its reader."""


# ----------------------------------------------------------------------------------------------- to JSON
def linear_fit_to_dict(lf: LinearFit) -> dict[str, Any]:
    return {
        "params": list(lf.params),
        "cov": [list(r) for r in lf.cov],
        "free": list(lf.free),
        "chi2_red": lf.chi2_red,
        "log_scatter": lf.log_scatter,
        "n_points": lf.n_points,
    }


def fit_to_dict(f: Fit) -> dict[str, Any]:
    d: dict[str, Any] = {x.name: getattr(f, x.name) for x in fields(f)}
    d["comm"] = linear_fit_to_dict(f.comm)
    d["encode"] = linear_fit_to_dict(f.encode) if f.encode else None
    d["decode"] = linear_fit_to_dict(f.decode) if f.decode else None
    d["world_sizes"] = list(f.world_sizes)
    d["nodes"] = list(f.nodes)
    d["link_shares"] = list(f.link_shares)
    return d


def curve_to_dict(key: tuple[str, str, str], c: MeasuredCurve) -> dict[str, Any]:
    d: dict[str, Any] = {"collective": key[0], "precision": key[1], "group": key[2]}
    d.update({x.name: list(v) if isinstance(v := getattr(c, x.name), tuple) else v for x in fields(c)})
    return d


def curve_from_dict(d: dict[str, Any]) -> tuple[tuple[str, str, str], MeasuredCurve]:
    key = (str(d["collective"]), str(d["precision"]), str(d["group"]))
    return key, MeasuredCurve(
        world_size=int(d["world_size"]),
        spans=int(d["spans"]),
        link_share=int(d["link_share"]),
        sizes=tuple(float(x) for x in d["sizes"]),
        time_s=tuple(float(x) for x in d["time_s"]),
        low_s=tuple(float(x) for x in d["low_s"]),
        high_s=tuple(float(x) for x in d["high_s"]),
        spread=str(d["spread"]),
    )


def model_to_dict(model: CostModel) -> dict[str, Any]:
    """The JSON object of a model (NaN residuals as null)."""
    res = model.residuals.astype(object).where(pd.notna(model.residuals), None)
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": MODEL,
        "sources": list(model.sources),
        "fits": [fit_to_dict(f) for f in model.fits.values()],
        "measured": [curve_to_dict(k, c) for k, cs in model.measured.items() for c in cs],
        "skipped": dict(model.skipped),
        "residuals": res.to_dict("records"),
    }


def write_model(model: CostModel, path: str | os.PathLike[str]) -> Path:
    """Write ``model`` to ``path`` atomically (a crash leaves the old file or the new one); returns the path."""
    from commbench.store.results import atomic_write_text

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, json.dumps(model_to_dict(model), indent=1, allow_nan=True) + "\n")
    return p


# ----------------------------------------------------------------------------------------------- from JSON
def linear_fit_from_dict(d: dict[str, Any]) -> LinearFit:
    c = d["cov"]
    return LinearFit(
        params=(float(d["params"][0]), float(d["params"][1])),
        cov=((float(c[0][0]), float(c[0][1])), (float(c[1][0]), float(c[1][1]))),
        free=(bool(d["free"][0]), bool(d["free"][1])),
        chi2_red=float(d["chi2_red"]),
        log_scatter=float(d["log_scatter"]),
        n_points=int(d["n_points"]),
    )


def fit_from_dict(d: dict[str, Any]) -> Fit:
    """A :class:`Fit` of any schema version (fields added later take their defaults)."""
    return Fit(
        collective=str(d["collective"]),
        precision=str(d["precision"]),
        group=str(d["group"]),
        algorithm=str(d["algorithm"]),
        comm=linear_fit_from_dict(d["comm"]),
        encode=linear_fit_from_dict(d["encode"]) if d.get("encode") else None,
        decode=linear_fit_from_dict(d["decode"]) if d.get("decode") else None,
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


def model_from_dict(d: Any, where: str = "cost model") -> CostModel:
    """The model of a parsed JSON object; ValueError (naming ``where``) for a foreign, newer or malformed one."""
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        raise ValueError(f'{where} is not a commbench cost model (no "schema": "{SCHEMA}")')
    v = d.get("schema_version")
    if not isinstance(v, int) or v > SCHEMA_VERSION or v < 1:
        raise ValueError(
            f"{where} has cost-model schema version {v!r}; this commbench reads versions 1..{SCHEMA_VERSION}"
        )
    try:
        fits = [fit_from_dict(f) for f in d["fits"]]
        residuals = pd.DataFrame(d.get("residuals") or [], columns=list(RESIDUAL_COLUMNS))
        skipped = {str(k): str(x) for k, x in (d.get("skipped") or {}).items()}
        sources = [str(s) for s in d.get("sources") or []]
        measured: dict[tuple[str, str, str], tuple[MeasuredCurve, ...]] = {}
        for c in d.get("measured") or [] if v >= MEASURED_SINCE else []:
            key, curve = curve_from_dict(c)
            measured[key] = (*measured.get(key, ()), curve)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ValueError(f"{where} is malformed: {type(e).__name__}: {e}") from None
    for f in fits:
        if f.algorithm not in ALGORITHMS:
            raise ValueError(f"{where}: unknown algorithm {f.algorithm!r} (known: {', '.join(ALGORITHMS)})")
    return CostModel(
        fits={(f.collective, f.precision, f.group): f for f in fits},
        residuals=residuals,
        skipped=skipped,
        sources=sources,
        measured=measured,
        points_kept=v >= MEASURED_SINCE,
    )


def read_model(path: str | os.PathLike[str]) -> CostModel:
    """The model in a ``model.json``; ValueError for a file that cannot be read, is not JSON or not a model."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except OSError as e:
        raise ValueError(f"cannot read cost model {p}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p} is not JSON: {e}") from None
    return model_from_dict(d, str(p))


__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "MEASURED_SINCE",
    "curve_from_dict",
    "curve_to_dict",
    "fit_from_dict",
    "fit_to_dict",
    "linear_fit_from_dict",
    "linear_fit_to_dict",
    "model_from_dict",
    "model_to_dict",
    "read_model",
    "write_model",
]
