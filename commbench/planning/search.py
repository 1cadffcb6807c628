"""The search over layouts: for a model and one or more GPU counts (or a target throughput), every TP x PP (virtual
stages) x CP x DP x micro-batch x data-parallel strategy x precision, each priced exactly as a fixed layout is
(:func:`commbench.planning.steptime.price_layout`: compute at the kernel efficiency, the schedule's bubble, every
collective at its call size with latency, exposure per collective, optimizer, stage imbalance), ranked by tokens
per second; every option ruled out says by which rule (``ruled_out``).

The space (each overridable by a list): TP every divisor of the heads and kv heads that divides the GPUs per node; PP every
divisor of the GPUs left up to the layers (uneven splits balanced, :func:`commbench.planning.layout.stage_split`);
virtual stages 1 and 2; CP 1 (and 2, 4, 8 from 16k-token sequences); micro-batches of 1, 2 and 4 sequences; the
global batch (``global_batch`` sequences, or ``global_batch_tokens``, default 4M tokens) rounded per layout to whole
micro-batches per DP rank (the ``global_batch`` column says what each row ran; more than
:data:`BATCH_TOLERANCE` off is ruled out). Rules: the layout's own
(:func:`commbench.planning.layout.check_layout`), the strategy's (fp8 gradient communication only through DDP's
hook), and the memory of the most loaded GPU against the device less the headroom.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from commbench.planning.activations import RECOMPUTES
from commbench.planning.calls import Pricer
from commbench.planning.compute import GPU, check_fp8
from commbench.planning.costmodel import CostModel
from commbench.planning.layout import Parallel, check_layout, round_batch
from commbench.planning.layout_plan import (
    GLOBAL_BATCH_TOKENS,
    LAYOUT_COLUMNS,
    efficiency,
    fmt_gb,
    fmt_time,
    layout_name,
    resolve_gpu,
)
from commbench.planning.options import OPTIMIZERS, PRECISIONS, STRATEGIES, check_choices
from commbench.planning.presets import MODELS, ModelShape, model_shape
from commbench.planning.steptime import CP_COMMS, HEADROOM, Setup, price_layout

MAX_GPUS = 2**17
"""The largest GPU count a target search tries."""
BATCH_TOLERANCE = 0.10
"""A layout whose whole micro-batches move the global batch by more than this fraction is ruled out (the search
compares layouts at the batch asked)."""

SEARCH_COLUMNS = {
    **LAYOUT_COLUMNS,
    "rank": "rank: options that fit, by tokens/s; then those ruled out",
    "ruled_out": "the rule that rules the option out (empty: it is an option)",
    "tokens_per_s_low": "tokens per second at the step time's slow end",
    "tokens_per_s_high": "tokens per second at the step time's fast end",
}
"""search.csv columns."""


@dataclass(frozen=True, slots=True)
class Setting:
    """What a search is run on: the model, GPU, compute rule, batch and the choices it crosses."""

    model: ModelShape
    gpu: GPU
    gpus_per_node: int
    efficiency: tuple[float, float, float]
    compute: str
    mfu: float | None
    overlap: float | None
    global_batch: int
    recompute: str
    optimizer: str
    attention: str
    device_memory: float
    headroom: float
    tp_comm_overlap: bool = False
    """Every layout priced with TP's collectives pipelined with its matmuls (``--tp-comm-overlap``)."""
    overlap_param_gather: bool = False
    """Every layout's ZeRO-1/2 parameter gather during the next forward (``--overlap-param-gather``)."""
    fp8_gemms: bool = False
    """Every layout's linear layers as FP8 GEMMs (``--fp8-gemms``)."""
    cp_comm: str = "ring"
    """How CP exchanges K/V in every layout (``--cp-comm``)."""
    fp8_param_gather: bool = False
    """Every layout's weights held and gathered in FP8 (``--fp8-param-gather``)."""


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _options(s: Setting, n: int, tps: Sequence[int] | None, pps: Sequence[int] | None, cps: Sequence[int] | None,
             vpps: Sequence[int] | None, mbs: Sequence[int]) -> list[tuple[int, int, int, int, int]]:  # fmt: skip
    """(tp, pp, cp, vpp, micro_batch) of every layout of ``n`` GPUs in the space (module docstring)."""
    m = s.model
    heads = math.gcd(m.heads, m.kv_heads)
    out = []
    # by default a TP group fills a whole part of a node: TP divides the GPUs per node
    for t in tps or [d for d in _divisors(heads, min(s.gpus_per_node, n)) if s.gpus_per_node % d == 0]:
        if n % t:
            continue
        for c in cps or ([1, 2, 4, 8] if m.seq >= 16384 else [1]):
            if n % (t * c):
                continue
            for p in pps or _divisors(n // (t * c), m.layers):
                if n % (t * c * p):
                    continue
                for v in vpps or ([1, 2] if p > 1 else [1]):
                    for b in mbs:
                        out.append((t, p, c, v, b))
    return out


def _row(s: Setting, n: int, t: int, p: int, c: int, v: int, b: int, sname: str, pname: str,
         pricer: Pricer) -> dict[str, Any]:  # fmt: skip
    dp = n // (t * p * c)
    base0 = {"tp": t, "pp": p, "dp": dp, "cp": c, "vpp": v, "micro_batch": b, "strategy": sname, "precision": pname,
             "gpus": n, "recompute": s.recompute}  # fmt: skip
    try:
        gb, _ = round_batch(s.global_batch, dp, b, p if v > 1 else 1)
    except ValueError as e:
        return {**base0, "ruled_out": str(e)}
    if abs(gb - s.global_batch) > BATCH_TOLERANCE * s.global_batch:
        return {**base0, "ruled_out": f"global batch {s.global_batch} is {gb} in whole micro-batches of {b} x "
                                      f"{dp} DP ranks: more than {BATCH_TOLERANCE:.0%} off"}  # fmt: skip
    lay = Parallel(t, p, dp, c, v, b, gb, RECOMPUTES[s.recompute], sp=t > 1)  # sequence parallel with TP
    base = {"tp": t, "pp": p, "dp": dp, "cp": c, "vpp": v, "micro_batch": b, "global_batch": gb,
            "strategy": sname, "precision": pname, "gpus": n, "recompute": s.recompute}  # fmt: skip
    try:
        check_layout(lay, s.model, n)
        setup = Setup(s.model, s.gpu, s.gpus_per_node, STRATEGIES[sname], sname, PRECISIONS[pname], pname,
                      OPTIMIZERS[s.optimizer], s.efficiency, s.mfu, None, s.overlap, s.device_memory, s.headroom,
                      s.attention, s.compute, s.tp_comm_overlap, s.fp8_gemms, s.cp_comm,
                      s.overlap_param_gather, s.fp8_param_gather)  # fmt: skip
        row = price_layout(setup, lay, pricer)
    except ValueError as e:
        return {**base, "ruled_out": str(e)}
    row["ruled_out"] = "" if row["fits"] else (
        f"does not fit: {fmt_gb(row['mem_total_bytes'])} > {fmt_gb(s.device_memory * (1 - s.headroom))} usable")
    row["tokens_per_s_low"] = row["global_batch"] * s.model.seq / row["step_time_high_s"]
    row["tokens_per_s_high"] = row["global_batch"] * s.model.seq / row["step_time_low_s"]
    return row


def search(
    *,
    model_preset: str | None = None,
    gpus: Sequence[int] | None = None,
    target_tokens_per_s: float | None = None,
    gpu: str = "h100",
    mfu: float | None = None,
    kernel_efficiency: float | None = None,
    tflops: float | None = None,
    overlap: float | None = None,
    strategies: Sequence[str] = tuple(STRATEGIES),
    precisions: Sequence[str] = ("bf16", "fp8"),
    optimizer: str = "adam",
    micro_batch: int | Sequence[int] = (1, 2, 4),
    global_batch: int | None = None,
    global_batch_tokens: int = GLOBAL_BATCH_TOKENS,
    attention: str = "flash",
    recompute: str = "selective",
    device_memory: float | None = None,
    headroom: float = HEADROOM,
    model: CostModel | str | os.PathLike[str] | None = None,
    tp: Sequence[int] | None = None,
    pp: Sequence[int] | None = None,
    cp: Sequence[int] | None = None,
    vpp: Sequence[int] | None = None,
    gpus_per_node: int | None = None,
    tp_comm_overlap: bool = False,
    overlap_param_gather: bool = False,
    fp8_gemms: bool = False,
    cp_comm: str = "ring",
    fp8_param_gather: bool = False,
    **shape_fields: Any,
) -> pd.DataFrame:
    """Every option over the GPU counts ``gpus`` (or, with ``target_tokens_per_s``, powers of two of nodes until an
    option reaches the target, then bisected to a whole node), ranked: options that fit by tokens/s, then the others
    with the rule that rules each out. ``df.attrs``: "answer" (the first line to print), "per_count" (the best option
    per GPU count, one line each), "assumptions". ValueError for bad input."""
    from commbench.planning.plan import load_model

    shape = model_shape(model_preset, **shape_fields)
    if shape is None:
        raise ValueError(f"the search needs a model: --model-preset {' | '.join(MODELS)} (or the full shape)")
    g = resolve_gpu(gpu, tflops)
    effs, compute = efficiency(g, kernel_efficiency, None, mfu)
    check_choices(
        strategies=strategies, precisions=precisions, optimizer=optimizer, attention=attention, recompute=recompute
    )
    if overlap is not None and not (isinstance(overlap, (int, float)) and 0 <= overlap <= 1):
        raise ValueError(f"overlap must be in [0, 1], got {overlap!r}")
    if not (isinstance(headroom, (int, float)) and 0 <= headroom < 1):
        raise ValueError(f"headroom must be a fraction in [0, 1), got {headroom!r}")
    gpn = gpus_per_node or g.gpus_per_node
    if (gpus is None) == (target_tokens_per_s is None):
        raise ValueError("give either GPU counts (--gpus 64,128) or a target (--target-tokens-per-s), not both")
    if gpus is not None:
        for count in gpus:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"GPU counts must be integers >= 1, got {count!r}")
            if count > gpn and count % gpn:
                raise ValueError(f"{count} GPUs is not a whole number of {g.name} nodes ({gpn} GPUs each)")
    if target_tokens_per_s is not None and not (math.isfinite(target_tokens_per_s) and target_tokens_per_s > 0):
        raise ValueError(f"target tokens/s must be a positive number, got {target_tokens_per_s!r}")
    mbs = [micro_batch] if isinstance(micro_batch, int) else list(micro_batch)
    for name, vals in (("micro_batch", mbs), ("tp", tp or []), ("pp", pp or []), ("cp", cp or []),
                       ("vpp", vpp or []), ("global_batch_tokens", [global_batch_tokens]),
                       ("global_batch", [global_batch] if global_batch is not None else [])):  # fmt: skip
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    for t in tp or []:  # a degree the user lists must exist for the model: one line, not every layout ruled out
        check_layout(Parallel(tp=t), shape)
    for p_ in pp or []:
        check_layout(Parallel(pp=p_), shape)
    for c_ in cp or []:
        check_layout(Parallel(cp=c_), shape)
    gb = global_batch if global_batch is not None else max(1, round(global_batch_tokens / shape.seq))
    pricer = Pricer(g, gpn, load_model(model))
    if cp_comm not in CP_COMMS:
        raise ValueError(f"unknown cp_comm {cp_comm!r}; valid: {', '.join(CP_COMMS)}")
    check_fp8(g, fp8_gemms, fp8_param_gather)
    setting = Setting(shape, g, gpn, effs, compute, mfu, overlap, gb, recompute, optimizer, attention,
                      float(device_memory or g.memory_bytes), float(headroom), bool(tp_comm_overlap),
                      bool(overlap_param_gather), bool(fp8_gemms), cp_comm, bool(fp8_param_gather))  # fmt: skip

    def one_count(n: int) -> list[dict[str, Any]]:
        return [_row(setting, n, t, p, c, v, b, sname, pname, pricer)
                for t, p, c, v, b in _options(setting, n, tp, pp, cp, vpp, mbs)
                for sname in strategies for pname in precisions]  # fmt: skip

    rows: list[dict[str, Any]] = []
    counts = list(gpus) if gpus is not None else []
    reached = None
    if target_tokens_per_s is not None:
        best_at: dict[int, float] = {}

        def best(n: int) -> float:
            if n not in best_at:
                new = one_count(n)
                rows.extend(new)
                counts.append(n)
                best_at[n] = max((r["tokens_per_s"] for r in new if not r["ruled_out"]), default=math.nan)
            return best_at[n]

        # double the nodes until the target is reached, then bisect on whole nodes between the last two counts
        lo, n = 0, gpn
        while n <= MAX_GPUS and not best(n) >= target_tokens_per_s:
            lo, n = n, n * 2
        if n <= MAX_GPUS:
            hi = n
            while hi - lo > gpn and lo:
                mid = (lo + hi) // 2 // gpn * gpn
                if best(mid) >= target_tokens_per_s:
                    hi = mid
                else:
                    lo = mid
            reached = hi
        counts.sort()
    else:
        for n in counts:
            rows += one_count(n)
    df = pd.DataFrame(rows)
    for c in SEARCH_COLUMNS:
        if c not in df.columns:
            df[c] = math.nan
    df = _rank_search(df[[c for c in SEARCH_COLUMNS if c != "rank"]])
    df.attrs.update(_answers(df, setting, counts, target_tokens_per_s, reached))
    df.attrs["assumptions"].append(
        f"Searched: TP {', '.join(map(str, tp)) if tp else 'divisors of the heads'} x PP "
        f"{', '.join(map(str, pp)) if pp else 'divisors up to the layers'} x CP {', '.join(map(str, cp or [1]))} x "
        f"virtual stages {', '.join(map(str, vpp or [1, 2]))} x micro-batches {', '.join(map(str, mbs))} x "
        f"strategies {', '.join(strategies)} x precisions {', '.join(precisions)}; {len(df)} layouts."
    )
    return df


def _rank_search(df: pd.DataFrame) -> pd.DataFrame:
    ok = df["ruled_out"] == ""
    speed = df["tokens_per_s"].astype(float).fillna(-1.0)  # ruled-out rows may have no price
    key = pd.DataFrame({"out": (~ok).astype(int), "speed": -speed, "mem": df["mem_total_bytes"].astype(float)})
    order = key.sort_values(["out", "speed", "mem"], kind="stable").index
    df = df.loc[order].reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    return df


def describe_option(r: Any, s: Setting) -> str:
    """One option in a line: GPUs, the layout, throughput with its interval, MFU, memory, batch and bubble."""
    return (
        f"{r['gpus']} x {s.gpu.name.upper()}, {layout_name(r)}: {r['tokens_per_s'] / 1e6:.3g} M tokens/s "
        f"({r['tokens_per_s_low'] / 1e6:.3g}-{r['tokens_per_s_high'] / 1e6:.3g} M), step {fmt_time(r['step_time_s'])}, "
        f"MFU {r['mfu']:.0%}, {fmt_gb(r['mem_total_bytes'])} per GPU, {int(r['microbatches'])} micro-batches, bubble "
        f"{r['bubble_frac']:.0%}"
    )


def _answers(
    df: pd.DataFrame, s: Setting, counts: list[int], target: float | None, reached: int | None
) -> dict[str, Any]:
    ok = df[df["ruled_out"] == ""]
    per_count = []
    for n in counts:
        sub = ok[ok["gpus"] == n]
        if not sub.empty:
            per_count.append(f"{n} GPUs: {describe_option(sub.iloc[0], s)}")
            continue
        here = df[df["gpus"] == n]
        sized = here[here["mem_total_bytes"].notna()]
        if not sized.empty:  # the option closest to fitting says what rules this count out
            r = sized.loc[sized["mem_total_bytes"].astype(float).idxmin()]
            per_count.append(f"{n} GPUs: no option; the least memory, {layout_name(r)}: {r['ruled_out']}")
        else:
            why = here["ruled_out"].value_counts()
            per_count.append(f"{n} GPUs: no option ({'; '.join(f'{k}: {v}' for k, v in why.head(3).items())})")
    name = s.model.name
    if ok.empty:
        answer = f"{name}: no option fits on {', '.join(map(str, counts))} x {s.gpu.name.upper()} (see ruled_out)"
    elif target is not None:
        if reached is None:
            answer = (f"{name} at {target / 1e6:.3g} M tokens/s: not reached up to {max(counts)} GPUs; best: "
                      f"{describe_option(ok.iloc[0], s)}")  # fmt: skip
        else:
            answer = f"{name} at {target / 1e6:.3g} M tokens/s: {describe_option(ok[ok['gpus'] == reached].iloc[0], s)}"
    else:
        answer = f"{name}: {describe_option(ok.iloc[0], s)}"
    m = s.model
    assumptions = [
        f"Model: {m.name} ({m.source}), Psi = {m.params:.4g}; seq {m.seq}; global batch {s.global_batch} sequences, "
        f"rounded per layout to whole micro-batches (the global_batch column); optimizer "
        f"{OPTIMIZERS[s.optimizer].description}.",
        f"GPU: {s.gpu.name} ({s.gpu.source}), {fmt_gb(s.device_memory)}, {s.headroom:.0%} kept free (--headroom), "
        f"{s.gpus_per_node} per node.",
        f"Compute: {s.compute}.",
        f"Activations: attention {s.attention}, recompute {s.recompute}, sequence parallel with TP "
        "(Megatron-LM theoretical_memory_usage.py / Korthikanti et al. 2022).",
        "Time: each layout priced as a fixed layout is (commbench.planning.steptime): calls at their size with "
        "NCCL's ring latency, exposure per collective (comm_exposure), bubble (p-1)/(v*m), optimizer, imbalance.",
    ]
    return {"answer": answer, "per_count": per_count, "assumptions": assumptions, "setting": s}


__all__ = ["BATCH_TOLERANCE", "MAX_GPUS", "SEARCH_COLUMNS", "Setting", "describe_option", "search"]
