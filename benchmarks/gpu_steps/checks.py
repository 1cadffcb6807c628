"""The checks over what a `commbench run` wrote: every expected sweep point present with `#wrong == 0`, native fp8 run or skipped with a note, every training policy stepped (or skipped with its layout line)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpu_steps.constants import MIB
from gpu_steps.report import StepReport, size_text

if TYPE_CHECKING:
    import pandas as pd


def expected_pairs(collectives: Iterable[str], precisions: Iterable[str], backend: str) -> list[tuple[str, str]]:
    """(collective, precision) pairs the sweep must have measured: what each precision says it supports, native
    fp8 left out (whether it runs is the native step's question, decided by a probe)."""
    from commbench.measure.collectives import get_collective
    from commbench.measure.precision import get_precision

    pairs: list[tuple[str, str]] = []
    for p in precisions:
        prec = get_precision(p)
        if prec.impl == "fp8_native":
            continue
        pairs.extend((c, p) for c in collectives if prec.supports(get_collective(c), backend))
    return pairs


def check_sweep(
    rep: StepReport,
    df: pd.DataFrame,
    pairs: Sequence[tuple[str, str]],
    sizes: Sequence[int],
    backend: str,
) -> None:
    """Every expected (collective, precision) at every size, on ``backend``, with ``#wrong == 0``."""
    rep.fig("rows", len(df))
    if not len(df):
        rep.fail("the run wrote no result rows")
        return
    backends = sorted(set(map(str, df["backend"])))
    rep.check(backends == [backend], f"backend {', '.join(backends)} in the results, expected {backend} only")
    have = {
        (str(c), str(p), int(b)) for c, p, b in zip(df["collective"], df["precision"], df["fp32_bytes"], strict=True)
    }
    missing = [(c, p, s) for c, p in pairs for s in sizes if (c, p, s) not in have]
    for c, p, s in missing:
        rep.fail(f"{c} x {p} at {size_text(s)}: no result row")
    wrong = df["wrong"]
    unchecked = df[wrong.isna()]
    for _, row in unchecked.iterrows():
        rep.fail(f"{row['collective']} x {row['precision']} at {size_text(row['fp32_bytes'])}: #wrong not measured")
    bad = df[wrong.notna() & (wrong != 0)]
    for _, row in bad.iterrows():
        rep.fail(
            f"{row['collective']} x {row['precision']} at {size_text(row['fp32_bytes'])}: #wrong = {int(row['wrong'])} "
            f"(tolerance {float(row['tolerance']):.3g})"
        )
    rep.fig("points_checked", int(wrong.notna().sum()))
    rep.fig("wrong_total", int(wrong.fillna(0).sum()))
    rep.fig("largest_fp32_bytes", int(df["fp32_bytes"].max()))
    rep.fig("pairs_expected", len(pairs))
    rep.fig("native_fp8_rows", int((df["impl"] == "fp8_native").sum()))


def walk_strings(obj: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(key path, text) of every string in a JSON-like object, keys included as text of their own."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            sub = f"{path}.{k}" if path else str(k)
            yield sub, str(k)
            yield from walk_strings(v, sub)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from walk_strings(v, f"{path}[{i}]")
    elif isinstance(obj, str):
        yield path, obj


SKIP_WORDS = ("skip", "unavailable", "unsupported")
"""Words that mark a metadata entry as a skip record."""


def skip_notes(precision: str, meta: Mapping[str, Any], console: str) -> list[str]:
    """Notes saying ``precision`` was skipped: in the metadata (any string whose key path or text names a skip,
    :data:`SKIP_WORDS`, and the precision; shown with the other strings of its entry, the reason among them), or
    a console line with "skip" that names it. Read without assuming the metadata's exact shape."""
    base = precision.split(":")[0].lower()
    strings = list(walk_strings(meta))
    notes = []
    for path, text in strings:
        both = f"{path}\n{text}".lower()
        if any(w in both for w in SKIP_WORDS) and base in both:
            entry = path.rsplit(".", 1)[0] if "." in path else path
            inside = [(p[len(entry) + 1 :], t) for p, t in strings if p.startswith(entry + ".")]
            context = [f"{k}={t}" for k, t in inside if k != t]  # the keys themselves are walked as strings too
            note = f"metadata {entry}: {', '.join(dict.fromkeys(context))}" if context else f"metadata {path}: {text}"
            if note not in notes:
                notes.append(note)
    for line in console.splitlines():
        if "skip" in line.lower() and base in line.lower():
            notes.append(f"console: {line.strip()}")
    return notes


def check_native(
    rep: StepReport, df: pd.DataFrame, meta: Mapping[str, Any], console: str, precisions: Sequence[str]
) -> None:
    """Each native fp8 precision either ran (rows with impl fp8_native) or was skipped with a note."""
    for p in precisions:
        rows = df[(df["precision"] == p) & (df["impl"] == "fp8_native")] if len(df) else df
        if len(rows):
            rep.fig(p, f"ran: {len(rows)} rows")
            continue
        notes = skip_notes(p, meta, console)
        if notes:
            rep.fig(p, f"skipped: {notes[0]}")
        else:
            rep.fail(f"{p}: no fp8_native rows and no note saying it was skipped (metadata and console)")


def check_training(
    rep: StepReport,
    df: pd.DataFrame,
    policies: Sequence[str],
    mem_kind: str,
    layout_skips: Mapping[str, str] | None = None,
) -> None:
    """Every policy stepped: no error, memory measured by ``mem_kind`` and positive, finite loss and drifts. A
    policy in ``layout_skips`` (name -> why the world cannot form its layout: pipeline stages or TP x DP in a
    1-rank world) must instead have its one-line skip row naming that reason, and nothing else."""
    skips = dict(layout_skips or {})
    rep.fig("policies_expected", len(policies))
    rep.fig("policies_recorded", len(df))
    rep.fig("policies_skipped_by_layout", len(skips))
    by_policy = {str(p): row for p, (_, row) in zip(df["policy"], df.iterrows(), strict=True)} if len(df) else {}
    worst_loss_drift, worst_grad_drift = 0.0, 0.0
    for p in policies:
        row = by_policy.get(p)
        if row is None:
            rep.fail(f"{p}: no training row")
            continue
        err = row.get("error")
        if p in skips:
            said = err.strip() if isinstance(err, str) else ""
            rep.check(skips[p] in said, f"{p}: expected the layout skip {skips[p]!r}, got error {said!r}")
            continue
        if isinstance(err, str) and err.strip():
            rep.fail(f"{p}: raised {err.strip()}")
        kind = row.get("peak_mem_kind")
        rep.check(kind == mem_kind, f"{p}: peak_mem_kind = {kind}, expected {mem_kind}")
        peak = _float(row.get("peak_mem_bytes"))
        rep.check(math.isfinite(peak) and peak > 0, f"{p}: peak_mem_bytes = {peak}")
        for col in ("final_loss", "final_loss_drift", "max_grad_norm_drift"):
            v = _float(row.get(col))
            rep.check(math.isfinite(v), f"{p}: {col} = {v} (not finite)")
        ld, gd = _float(row.get("final_loss_drift")), _float(row.get("max_grad_norm_drift"))
        if math.isfinite(ld):
            worst_loss_drift = max(worst_loss_drift, abs(ld))
        if math.isfinite(gd):
            worst_grad_drift = max(worst_grad_drift, abs(gd))
    rep.fig("max_abs_final_loss_drift", worst_loss_drift)
    rep.fig("max_grad_norm_drift", worst_grad_drift)
    if len(df) and "peak_mem_bytes" in df.columns:
        rep.fig("peak_mem_mib_max", float(df["peak_mem_bytes"].max()) / MIB)


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def layout_skips(suite_toml: str, world_size: int) -> dict[str, str]:
    """Policy name -> why a world of ``world_size`` ranks cannot form its layout (asked of each policy's sharding,
    as the runner asks it), for the training table of ``suite_toml``."""
    import tomllib

    from commbench.training.config import TrainingConfig
    from commbench.training.policies import get_policy

    section = TrainingConfig.from_dict(tomllib.loads(suite_toml)["training"])
    out: dict[str, str] = {}
    for name in section.policies:
        reason = get_policy(name).configure(section).sharding.layout_error(world_size, 1)
        if reason:
            out[name] = reason
    return out
