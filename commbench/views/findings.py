"""The report's analysis: which results are significant enough to state (findings) and what went wrong (pitfalls).

`findings` builds sentences from significant results only (a winner, a crossover or a speed-up is stated only
where its 95 % interval excludes 1); `pitfalls` lists wrong results, large errors, noisy timings, skipped points,
compression that never pays (with `slower_cause`) and the training section's own warnings. Both return plain
strings; `commbench.views.render` escapes them.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from commbench.core import stats
from commbench.core.records import link_phrase
from commbench.core.units import human_bytes
from commbench.views.rundata import (
    COLLECTIVE_ORDER,
    FP32_PRECISION,
    WORLD_GROUP,
    RunData,
    as_tuple,
    has_intervals,
    has_values,
    numeric,
    order,
    primary_payload,
    reference_precisions,
    speed_rows,
)
from commbench.views.tables import NO_WINNER, as_float, fmt, interval, ratio_text, verdict
from commbench.views.training_tables import (
    CPU_TIMING_NOTE,
    DEFAULT_PARALLELISM,
    TOO_FEW,
    gain_by_parallelism,
    timed_on_cpu,
    training_speed,
)

__all__ = ["CV_WARN", "RANK_SPREAD_WARN", "REL_ERR_WARN", "findings", "link_findings", "pitfalls", "slower_cause"]

# pyperf's thresholds: a coefficient of variation of 10 % or more makes a number untrustworthy.
CV_WARN = 0.10
RANK_SPREAD_WARN = 0.25
REL_ERR_WARN = 0.10


def _largest_row(df: pd.DataFrame, coll: str, payload: Any, prec: str) -> pd.Series | None:
    sel = (df["collective"].astype(str) == coll) & (df["precision"].astype(str) == prec)
    if payload is not None and "payload" in df.columns and isinstance(payload, str) and payload:
        sel &= df["payload"].astype(str) == payload
    d = df[sel]
    if d.empty or "fp32_bytes" not in d.columns:
        return None
    return d.loc[numeric(d, "fp32_bytes").idxmax()]


def slower_cause(df: pd.DataFrame, coll: str, payload: Any, prec: str) -> str:
    """Why a precision is slower than fp32 at the largest size, from what its row measured: the algorithm it
    reduces through (its algorithm part significantly below 1), encode/decode time that eats the faster
    collective, or a collective that is itself no faster with this dtype (a native dtype has no encode/decode:
    the backend's kernels for it cost more than the bytes saved)."""
    r = _largest_row(df, coll, payload, prec)
    base = _largest_row(df, coll, payload, FP32_PRECISION)
    if r is None or base is None:
        return ""
    enc = (as_float(r.get("encode_us")) if pd.notna(r.get("encode_us")) else 0.0) + (
        as_float(r.get("decode_us")) if pd.notna(r.get("decode_us")) else 0.0
    )
    total = as_float(r.get("total_us"))
    comm = as_float(r.get("comm_us")) if pd.notna(r.get("comm_us")) else as_float(r.get("time_us"))
    base_comm = as_float(base.get("comm_us")) if pd.notna(base.get("comm_us")) else as_float(base.get("time_us"))
    comm_speedup = base_comm / comm if comm > 0 else math.nan
    parts: list[str] = []
    if as_float(r.get("algo_gain_ci_high")) < 1.0:
        parts.append(
            "the chunked algorithm it reduces through is slower than fp32's native collective "
            f"(fp32 through it: {interval(r.get('algo_gain'), r.get('algo_gain_ci_low'), r.get('algo_gain_ci_high'))})"
        )
    if comm_speedup < 1.0 and not parts:
        alone = "" if enc == 0 else " without encode/decode"  # a native dtype has none to mention
        parts.append(
            f"the collective itself is slower with this data type ({ratio_text(comm_speedup)}× fp32's speed{alone}): "
            "the backend's kernels for it cost more than the bytes saved"
        )
    if enc > 0 and total > 0 and (comm_speedup >= 1.0 or parts):
        share = enc / total
        if comm_speedup >= 1.0 and not parts:
            parts.append(
                f"encode + decode take {share:.0%} of its time and outweigh the faster collective "
                f"({ratio_text(comm_speedup)}× fp32's speed without them)"
            )
        elif share >= 0.1:
            parts.append(f"encode + decode add {share:.0%} of its time")
    return "; ".join(parts)


def pitfalls(run: RunData) -> list[str]:
    """Plain-language problems found in the run: wrong results, large errors, noisy timings, compression that
    never pays (with the cause that applies), and the training section's own warnings."""
    out: list[str] = []
    df = run.results
    if not df.empty:
        label_cols = [c for c in ("collective", "precision", "payload") if c in df.columns]

        def where(r: Any) -> str:
            return " ".join(str(r[c]) for c in label_cols) + f" at {human_bytes(float(r['size_bytes']))}"

        wrong = df[numeric(df, "wrong") > 0]
        for _, r in wrong.head(10).iterrows():
            out.append(f"{where(r)}: {int(r['wrong'])} wrong element(s) on exactly representable inputs.")
        if len(wrong) > 10:
            out.append(f"... and {len(wrong) - 10} more point(s) with wrong elements.")
        err = numeric(df, "rel_err")
        big = df[err >= REL_ERR_WARN]
        for k, g in big.groupby(label_cols, sort=False):
            k = as_tuple(k)
            out.append(
                f"{' '.join(map(str, k))}: relative error up to {fmt(float(numeric(g, 'rel_err').max()))} "
                "(>= 10 %): this precision/payload combination loses the signal (underflow or outliers?)."
            )
        if not ("noisy" in df.columns and df["noisy"].notna().any()):  # else: counted in the findings
            noisy_cv = df[numeric(df, "cv") >= CV_WARN]
            if len(noisy_cv):
                out.append(
                    f"{len(noisy_cv)} of {len(df)} point(s) have a coefficient of variation >= {CV_WARN:.0%}: "
                    "their times are noisy (other load on the machine, too few samples)."
                )
        skew = df[numeric(df, "rank_spread") >= RANK_SPREAD_WARN]
        if len(skew):
            out.append(
                f"{len(skew)} point(s) have ranks disagreeing by >= {RANK_SPREAD_WARN:.0%} "
                "(rank_spread): a slow rank or link dominates those numbers."
            )
    cx = run.crossover
    refs = reference_precisions(run)
    if not cx.empty and "note" in cx.columns and not df.empty:
        payload = primary_payload(df)  # speed does not depend on the values sent: one payload speaks for all
        if payload is not None and "payload" in cx.columns:
            cx = cx[cx["payload"].astype(str) == payload]
        for _, r in cx[cx["note"].astype(str) == "never in range"].iterrows():
            if str(r["precision"]) in refs:
                continue
            cause = slower_cause(df, str(r["collective"]), r.get("payload"), str(r["precision"]))
            out.append(
                f"{r['collective']} {r['precision']}: slower than fp32 end to end at the largest size "
                f"({interval(r.get('gain_at_largest'), r.get('gain_at_largest_ci_low'), r.get('gain_at_largest_ci_high'))})"
                + (f": {cause}." if cause else ".")
            )
    for e in run.metadata.get("skipped") or []:  # refused at run time on some rank, so skipped on all
        group = e.get("group", WORLD_GROUP)
        where = e.get("collective", "?") + ("" if group in (None, WORLD_GROUP) else f" [{group}]")
        out.append(f"{where} {e.get('precision', '?')}: skipped, {e.get('reason', 'not usable here')}.")
    t = run.training
    if not t.empty and "warnings" in t.columns:
        for _, r in t.iterrows():
            w = r["warnings"]
            if isinstance(w, str) and w.strip():
                out.append(f"training policy {r['policy']}: {w}")
    return out


def _is_true(v: Any) -> bool:
    return v is True or str(v) == "True"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _sweep_findings(run: RunData) -> list[str]:
    df = run.results
    cx = run.crossover
    if df.empty or cx.empty or "note" not in cx.columns:
        return []
    out: list[str] = []
    payload = primary_payload(df)
    if payload is not None and "payload" in cx.columns:
        cx = cx[cx["payload"].astype(str) == payload]
    refs = reference_precisions(run)
    ci = has_intervals(df)
    if not ci:
        out.append(
            "This run carries no confidence intervals (an imported or older run): the comparisons below are not "
            "tested for significance."
        )
    speed = speed_rows(df)
    for coll in order(cx["collective"].unique(), COLLECTIVE_ORDER):
        c = cx[(cx["collective"] == coll) & ~cx["precision"].astype(str).isin(refs)]
        sizes = numeric(speed[speed["collective"] == coll], "fp32_bytes")
        if c.empty or sizes.isna().all():
            continue
        smallest, largest = float(sizes.min()), float(sizes.max())
        wins: list[tuple[float, str]] = []
        ties: list[str] = []
        losses: list[tuple[str, str]] = []
        for _, r in c.iterrows():
            prec = str(r["precision"])
            g = interval(r.get("gain_at_largest"), r.get("gain_at_largest_ci_low"), r.get("gain_at_largest_ci_high"))
            b = as_float(r.get("crossover_bytes"))
            if not math.isnan(b):
                text = (
                    f"{prec} {coll} is faster than fp32 from {human_bytes(b)}: {g} at {human_bytes(largest)}"
                    if b < largest
                    else f"{prec} {coll} is faster than fp32 at {human_bytes(b)}, the largest size measured: {g}"
                )
                low = as_float(r.get("crossover_low_bytes"))
                if _is_true(r.get("significant")) and b > smallest:
                    text += f"; at {human_bytes(low)} fp32 is significantly faster"
                elif not math.isnan(low):
                    text += f" (the crossover lies between {human_bytes(low)} and {human_bytes(b)})"
                elif b > smallest:
                    text += f" (below {human_bytes(b)} no significant difference either way)"
                wins.append((as_float(r.get("gain_at_largest")), text + "."))
            elif str(r.get("note")) == "never in range":
                losses.append((prec, g))
            else:
                ties.append(prec)
        out += [t for _, t in sorted(wins, key=lambda w: -w[0] if not math.isnan(w[0]) else 0.0)]
        if losses:
            out.append(
                f"{_join([p for p, _ in losses])} {'does' if len(losses) == 1 else 'do'} not pay for {coll} in the "
                f"measured range ({human_bytes(smallest)} – {human_bytes(largest)}): fp32 is faster at "
                f"{human_bytes(largest)} (speed-up {_join([f'{p} {g}' if len(losses) > 1 else g for p, g in losses])})."
            )
        if ties:
            out.append(f"{coll}: no significant difference from fp32 at {human_bytes(largest)} for {_join(ties)}.")
    out += _split_findings(speed, refs)
    return out


def _split_findings(speed: pd.DataFrame, refs: set[str]) -> list[str]:
    """Where a precision reduces through the chunked algorithm: how much of its speed-up is the algorithm and
    how much the fewer bytes, at the largest size (stated only for the parts whose interval excludes 1)."""
    if not has_values(speed, "algo_gain"):
        return []
    out: list[str] = []
    d = speed[numeric(speed, "algo_gain").notna() & ~speed["precision"].astype(str).isin(refs)]
    for (coll, prec), g in d.groupby(["collective", "precision"], sort=False):
        last = g.loc[numeric(g, "fp32_bytes").idxmax()]
        algo = verdict(last.get("algo_gain_ci_low"), last.get("algo_gain_ci_high"))
        prec_part = verdict(last.get("precision_gain_ci_low"), last.get("precision_gain_ci_high"))
        if algo in ("", NO_WINNER) and prec_part in ("", NO_WINNER):
            continue
        total = interval(last.get("gain_vs_fp32"), last.get("gain_ci_low"), last.get("gain_ci_high"))
        a = interval(last.get("algo_gain"), last.get("algo_gain_ci_low"), last.get("algo_gain_ci_high"))
        p = interval(last.get("precision_gain"), last.get("precision_gain_ci_low"), last.get("precision_gain_ci_high"))
        ns = " (not significant)"
        at = human_bytes(float(last["fp32_bytes"]))
        if verdict(last.get("gain_ci_low"), last.get("gain_ci_high")) == "faster":
            out.append(
                f"Of {prec}'s {total} on {coll} at {at}, {a}{ns if algo == NO_WINNER else ''} comes from the "
                f"chunked all_to_all algorithm and {p}{ns if prec_part == NO_WINNER else ''} from fewer bytes."
            )
        else:
            out.append(
                f"{prec} {coll} at {at}: {total} against fp32 = {a}{ns if algo == NO_WINNER else ''} from the "
                f"chunked all_to_all algorithm × {p}{ns if prec_part == NO_WINNER else ''} from fewer bytes."
            )
    return out


def _training_findings(t: pd.DataFrame) -> list[str]:
    if t.empty or "policy" not in t.columns or not has_values(t, "speedup_vs_fp32"):
        return []
    out: list[str] = []
    same: list[str] = []
    few: list[str] = []
    has_ci = has_values(t, "speedup_ci_low")
    for _, r in t.iterrows():
        pol = str(r["policy"])
        s = as_float(r.get("speedup_vs_fp32"))
        if pol == FP32_PRECISION or math.isnan(s):
            continue
        speed, word = training_speed(r)
        if word == "faster":
            out.append(f"Training: {pol} steps are {speed} faster than fp32.")
        elif word == "slower":
            note = str(r.get("notes") or "").strip()
            out.append(f"Training: {pol} steps are slower than fp32 ({speed})" + (f": {note}." if note else "."))
        elif word == TOO_FEW:
            few.append(pol)
        elif has_ci:
            same.append(pol)
    if same:
        out.append(f"Training: no significant step-time difference from fp32 for {_join(same)}.")
    if few:
        out.append(
            f"Training: too few measured steps to judge the step time against fp32 for {_join(few)} "
            f"(a 95 % interval needs {stats.MIN_SAMPLES_95})."
        )
    saved = [
        (str(r["policy"]), as_float(r.get("comm_saved_vs_fp32")))
        for _, r in t.iterrows()
        if as_float(r.get("comm_saved_vs_fp32")) > 0.005
    ]
    if saved:
        out.append(
            "Training: "
            + _join([f"{p} sends {v:.0%} fewer bytes" for p, v in saved])
            + " per step than fp32 (counted, not timed)."
        )
    return out


def _parallelism_findings(run: RunData) -> list[str]:
    """The low-precision gain of each parallelism against its own full-precision reference, side by side in one
    sentence: bytes saved (counted, so any difference is real) and a speed-up only where its interval excludes 1.
    Said when the run compares something besides DDP policies against fp32 (the sentences above say those)."""
    g = gain_by_parallelism(run.training, run.training_steps)
    g = g[g["note"].astype(str) == ""] if not g.empty else g
    if g.empty or not (
        (g["parallelism"] != DEFAULT_PARALLELISM).any() or (g["reference_policy"] != FP32_PRECISION).any()
    ):
        return []
    parts: list[str] = []
    for par, rows in g.groupby("parallelism", sort=False):
        said: list[str] = []
        for _, r in rows.iterrows():
            pol, ref = str(r["policy"]), str(r["reference_policy"])
            saved, speed = as_float(r["comm_saved"]), interval(r["speedup"], r["speedup_ci_low"], r["speedup_ci_high"])
            if saved > 0.005:
                moved = f"saves {saved:.0%} of {ref}'s bytes per step"
            elif saved < -0.005:
                moved = f"sends {-saved:.0%} more bytes per step than {ref}"
            elif math.isnan(saved):
                moved = f"against {ref}"
            else:
                moved = f"sends as many bytes per step as {ref}"
            if r["verdict"] == "faster":
                said.append(f"{pol} {moved} and is {speed} faster")
            elif r["verdict"] == "slower":
                said.append(f"{pol} {moved} but is slower ({speed})")
            elif r["verdict"] == TOO_FEW:
                said.append(f"{pol} {moved}; too few paired rounds to judge its step time ({speed}, n too small)")
            else:
                said.append(f"{pol} {moved}, with no significant step-time difference")
        parts.append(f"{str(par).upper()}: {'; '.join(said)}.")
    text = (
        "Training, low-precision gain by parallelism (each policy against its full-precision reference, same "
        "model and world): " + " ".join(parts)
    )
    return [text + (" " + CPU_TIMING_NOTE if timed_on_cpu(run.training) else "")]


def link_findings(df: pd.DataFrame) -> list[str]:
    """How much of its link each collective reaches ("is my number good?"): per collective, group and precision
    the largest size's ``link_util`` with its interval (``core.records.link_phrase``); where a group crosses no
    link with a rate, why once per reason."""
    if df.empty or "link" not in df.columns:
        return []
    out: list[str] = []
    speed = speed_rows(df)
    have = speed[numeric(speed, "link_util").notna()]
    keys = [c for c in ("collective", "group", "precision") if c in have.columns]
    for _, g in have.groupby(keys, sort=False) if len(have) else []:
        phrase = link_phrase(g.loc[numeric(g, "size_bytes").idxmax()], human_bytes)
        if phrase:
            out.append(phrase[0].upper() + phrase[1:] + ".")
    missing = speed[numeric(speed, "link_util").isna() & speed["link"].notna() & (speed["link"].astype(str) != "")]
    group = missing["group"].fillna(WORLD_GROUP) if "group" in missing.columns else WORLD_GROUP
    for (grp, why), _g in missing.assign(group=group).groupby(["group", "link"], sort=False):
        out.append(f"No link_util for the {grp} group ({why}).")
    return out


def findings(run: RunData) -> list[str]:
    """The report's first section: sentences built from significant results only (a winner, a crossover, a
    speed-up is stated only where its 95 % interval excludes 1), then the noisy points counted, then how much of
    its link each collective reaches."""
    out = _sweep_findings(run) + _training_findings(run.training) + _parallelism_findings(run)
    df = run.results
    if not df.empty and "noisy" in df.columns and df["noisy"].notna().any():
        noisy = int(df["noisy"].map(_is_true).sum())
        out.append(
            f"{noisy} of {len(df)} points are noisy (their 95 % interval stayed wider than the target): "
            "comparisons involving them are less often significant; raise --max-time or run on a quieter machine."
            if noisy
            else f"All {len(df)} points reached the target interval."
        )
    return out + link_findings(df)
