"""Typed records: one dataclass per table, the single source of its columns, dtypes and documentation.

A table's row type subclasses :class:`Record` and declares each column with :func:`col`, whose docstring
becomes the column's documentation. Column order, pandas dtypes and the parquet schema derive from the
fields, so adding a column is one line here (plus whatever fills it):

    @dataclass(kw_only=True, slots=True)
    class MyRow(Record):
        TABLE: ClassVar[str] = "my_table"
        latency_us: float = col("per-op latency, microseconds")

Records are written by ``results.RunWriter`` and read back by ``results.load_table``; views only see the
DataFrames. This module imports neither torch nor pandas at import time.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin

R = TypeVar("R", bound="Record")

SCHEMA_VERSION = 2
"""The run directory's schema (``metadata.json``'s ``schema_version``). 2: every table also as parquet, dtypes
from the records; version 1 directories load unchanged."""

COMMBENCH_VERSION = "0.1.0"
"""The version of commbench that writes a run directory (``commbench_version``; ``commbench.__version__``)."""

NAN = math.nan
"""Default of a float column a source may not have (an imported nccl-tests log has no interval)."""

# pandas dtype per Python type, (required, optional). Required ints stay numpy int64 (what pandas gives a
# column without gaps, as runs always wrote); a column that may be None uses the nullable Int64/boolean so a
# missing value stays missing instead of turning the column into floats. Strings are left to pandas
# ("object": no cast), whose own inference (pandas >= 3: its NaN-aware str dtype) the views were written for.
_PANDAS_DTYPES: dict[Any, tuple[str, str]] = {
    int: ("int64", "Int64"),
    float: ("float64", "float64"),
    str: ("object", "object"),
    bool: ("bool", "boolean"),
}

_TABLES: dict[str, type[Record]] = {}


def col(doc: str, default: Any = MISSING) -> Any:
    """A column: ``doc`` is its one-line documentation (with the unit when the name does not carry it)."""
    if default is MISSING:
        return dataclasses.field(metadata={"doc": doc})
    return dataclasses.field(default=default, metadata={"doc": doc})


def _base_type(tp: Any) -> Any:
    """``int`` for ``int``, ``int | None`` and ``Optional[int]``."""
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else object
    return tp


def _optional(tp: Any) -> bool:
    """True for ``X | None`` and ``Optional[X]``."""
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


@dataclass(kw_only=True, slots=True)
class Record:
    """Base of every table row. Subclasses set ``TABLE`` and declare columns with :func:`col`."""

    TABLE: ClassVar[str] = ""
    """The table's name in a run directory (``<TABLE>.csv``, ``<TABLE>.parquet``, ``<TABLE>.jsonl``)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The first class that names a table is its row type (a subclass that adds columns to the same table,
        # such as the nccl-tests import's, does not replace it): the loader can then order and type a table
        # by name once this module is imported: every table's row type lives here, so a view process (which
        # never imports commbench.training and its torch) types the training tables like the run wrote them.
        # dataclass(slots=True) re-creates the class, so the same class arrives twice: keep the last one. No
        # super() call: the zero-argument form breaks on slots-recreated classes and object's takes nothing.
        prev = _TABLES.get(cls.TABLE)
        if cls.TABLE and (prev is None or (prev.__module__, prev.__qualname__) == (cls.__module__, cls.__qualname__)):
            _TABLES[cls.TABLE] = cls

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """Column order of the table."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def column_types(cls) -> dict[str, Any]:
        """Python type of each column (``int``, ``float``, ``str``, ``bool``)."""
        hints = typing.get_type_hints(cls)
        return {f.name: _base_type(hints[f.name]) for f in dataclasses.fields(cls)}

    @classmethod
    def dtypes(cls) -> dict[str, str]:
        """pandas dtype of each column: ``int`` -> int64, ``int | None`` -> nullable Int64, ``float`` -> float64,
        ``bool`` -> bool (``bool | None`` -> boolean); ``str`` -> object, meaning pandas' own string inference."""
        hints = typing.get_type_hints(cls)
        out = {}
        for f in dataclasses.fields(cls):
            pair = _PANDAS_DTYPES.get(_base_type(hints[f.name]), ("object", "object"))
            out[f.name] = pair[1] if _optional(hints[f.name]) else pair[0]
        return out

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Default value of each column that has one."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not MISSING}

    @classmethod
    def docs(cls) -> dict[str, str]:
        """One line of documentation per column."""
        return {f.name: str(f.metadata.get("doc", "")) for f in dataclasses.fields(cls)}

    @classmethod
    def from_row(cls: type[R], row: dict[str, Any]) -> R:
        """Build a record from a mapping (extra keys are ignored, missing columns take their defaults).

        A missing value (None or NaN: a journal writes NaN as null, CSV reads None back as NaN) becomes NaN
        in a float column and None in any other."""
        types_ = cls.column_types()
        return cls(
            **{k: (math.nan if types_[k] is float else None) if is_missing(v) else v for k, v in row.items() if k in types_}
        )

    def as_dict(self) -> dict[str, Any]:
        """The row as a plain dict in column order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def record_for_table(table: str) -> type[Record] | None:
    """The row type registered for ``table`` (None when the module defining it has not been imported)."""
    return _TABLES.get(table)


def frame_dtypes(record: type[Record], present: list[str]) -> dict[str, str]:
    """dtypes to apply to the columns of ``record`` that are ``present`` in a frame ("object" ones are left)."""
    dt = record.dtypes()
    return {c: dt[c] for c in present if c in dt and dt[c] != "object"}


def is_missing(v: Any) -> bool:
    """True for ``None`` and NaN (how a missing value reads back from CSV or parquet)."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def crossover_phrase(row: Mapping[str, Any], size: Callable[[float], str]) -> str:
    """A crossover row in words, sizes written by ``size``: the console and the report say the same thing."""

    def num(key: str) -> float:
        try:
            v = float(row.get(key))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return math.nan
        return v

    cross, low = num("crossover_bytes"), num("crossover_low_bytes")
    if not math.isnan(cross):
        if row.get("significant") is True or str(row.get("significant")) == "True":
            return f"faster from {size(cross)}"
        if not math.isnan(low):
            return f"faster from {size(cross)}; crossover between {size(low)} and {size(cross)}"
        return f"faster from {size(cross)}; crossover at or below it (no significant loss below)"
    note = str(row.get("note") or "")
    if note == "not significant":
        return "never significant (no significant difference at the largest size)"
    return "never: fp32 is faster at the largest size"


def link_phrase(row: Mapping[str, Any], size: Callable[[float], str]) -> str:
    """A point's ``link_util`` in words, sizes written by ``size`` (the report and ``check`` say the same thing):
    ``inter-node all_reduce fp32 reaches 0.92 [0.90-0.93] of 8 × 400 Gb/s (ib0, ...) on n3 at 1G``; the interval
    is busbw's divided by the link rate. "" where the point has no link rate."""

    def num(key: str) -> float:
        try:
            return float(row.get(key))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return math.nan

    rate, util = num("link_gbps"), num("link_util")
    if not (rate > 0) or math.isnan(util):
        return ""
    lo, hi = num("busbw_ci_low_gbps") / rate, num("busbw_ci_high_gbps") / rate
    ci = f" [{lo:.2f}-{hi:.2f}]" if not (math.isnan(lo) or math.isnan(hi)) else ""
    scope, _, what = str(row.get("link") or "").partition(": ")
    group = row.get("group")
    grp = "" if group in (None, "", "world") or is_missing(group) else f" [{group}]"
    return f"{scope} {row.get('collective')}{grp} {row.get('precision')} reaches {util:.2f}{ci} of {what} at {size(num('size_bytes'))}"


@dataclass(kw_only=True, slots=True)
class CollectivePoint(Record):
    """One measured (collective, precision, payload, size) point: a row of ``results.csv``.

    Sizes follow nccl-tests (see ``commbench.measure.collectives``); GB/s are 1e9 bytes per second."""

    TABLE: ClassVar[str] = "results"
    KEY: ClassVar[tuple[str, ...]] = ("collective", "precision", "payload", "fp32_bytes", "group")
    """Columns that identify a point (``--resume`` skips rows already present under this key)."""

    collective: str = col("collective name (all_reduce, all_gather, ...)")
    precision: str = col("precision name as given to --precisions (fp32, bf16, fp8_e4m3, ...)")
    impl: str = col("implementation of the precision (native, a byte-moving fp8 codec, nccl-tests, ...)")
    backend: str = col("torch.distributed backend (gloo, nccl)")
    device: str = col("device name of rank 0")
    world_size: int = col("ranks in the group")
    nodes: int = col("hosts in the group")
    group: str = col("communicator group kind: world, intra (one per node) or inter (one per local rank across nodes)", "world")
    group_size: int | None = col("ranks in each group of that kind (busbw uses it)", None)
    n_groups: int | None = col("groups of that kind running the collective at the same time", None)
    payload: str = col("input distribution (normal, gradient, outliers)")
    dtype: str = col("nccl-tests type name of the wire data (float, bfloat16, uint8, ...)")
    size_bytes: int = col("nccl-tests size of the call, bytes on the wire (as wire_bytes)")
    count: int = col("nccl-tests count column: elements per call parameter")
    redop: str = col("nccl-tests redop column: the reduction op (sum, prod, min, max, avg; run -o) or none", "none")
    root: int = col("nccl-tests root column: the root rank of broadcast, reduce, gather, scatter (run -r), else -1", -1)
    fp32_bytes: int = col("the same size in fp32 bytes: what the user's tensor holds")
    wire_bytes: int = col("bytes the collective moved per nccl-tests size definition, scales included")
    time_us: float = col("per-op collective time, microseconds: median over samples of the mean over ranks of each sample (timing_mode isolated: of the fastest rank's)")
    time_us_max: float = col("median over samples of the slowest rank's per-op time, microseconds (>= time_us)")
    time_ci_low_us: float = col("lower end of the 95 % confidence interval of time_us, microseconds", NAN)
    time_ci_high_us: float = col("upper end of the 95 % confidence interval of time_us, microseconds", NAN)
    p50_us: float = col("median per-op time over every sample of every rank, microseconds")
    p95_us: float = col("95th percentile per-op time over every sample of every rank, microseconds")
    cv: float = col("coefficient of variation of the pooled samples (fraction, not %)")
    rank_spread: float = col("slowest over fastest rank median minus one (fraction)")
    iters: int = col("back-to-back ops per timed sample (calibrated; 1 in timing_mode isolated)")
    timing_mode: str = col("stream: k back-to-back ops per sample after a barrier; isolated: one op after timing.gap_s of compute; graph: a sample's k ops captured in one CUDA graph, launched timing.cuda_graph times (nccl-tests -G)", "stream")
    samples: int = col("timed samples per rank")
    ci_coverage: float = col("actual coverage of the order-statistic intervals (>= 0.95 from 6 samples on)", NAN)
    noisy: bool | None = col("True when the total time's interval stayed wider than the target (timing.target_ci)", None)
    algbw_gbps: float = col("algorithm bandwidth, GB/s: size_bytes / time_us")
    busbw_gbps: float = col("bus bandwidth, GB/s: algbw times the collective's nccl-tests bus factor")
    busbw_ci_low_gbps: float = col("lower end of busbw's 95 % interval, GB/s (from time_ci_high_us)", NAN)
    busbw_ci_high_gbps: float = col("upper end of busbw's 95 % interval, GB/s (from time_ci_low_us)", NAN)
    link_gbps: float = col("rate of the link the group's traffic is limited by, GB/s per direction: the slowest node's NICs (line or tbf rate) shared among the groups crossing it, or within a node the GPUs' NVLink / PCIe; NaN where none (CPU ranks on one host)", NAN)
    link_util: float = col("busbw_gbps / link_gbps: the fraction of the link the point reaches (NaN without a link)", NAN)
    link: str = col("that link in words (inter-node: 8 × 400 Gb/s (ib0, ...) on host; intra-node: 18 × NVLink; or why there is none)", "")
    link_host: str = col("the node whose link limits the group (its slowest), empty within a node", "")
    encode_us: float = col("per-op encode time, microseconds (0 for native precisions)")
    comm_us: float = col("per-op collective time, microseconds (= time_us)")
    decode_us: float = col("per-op decode time, microseconds (0 for native precisions)")
    total_us: float = col("encode + collective + decode, microseconds")
    total_ci_low_us: float = col("lower end of total_us's 95 % interval, microseconds", NAN)
    total_ci_high_us: float = col("upper end of total_us's 95 % interval, microseconds", NAN)
    effective_gbps: float = col("fp32-equivalent bandwidth, GB/s: fp32_bytes / total_us")
    effective_ci_low_gbps: float = col("lower end of effective_gbps' 95 % interval, GB/s", NAN)
    effective_ci_high_gbps: float = col("upper end of effective_gbps' 95 % interval, GB/s", NAN)
    gain_vs_fp32: float = col("fp32 total time / this total time at the same size, median of pairs timed in the same round (>1: faster)", NAN)
    gain_ci_low: float = col("lower end of gain_vs_fp32's 95 % interval", NAN)
    gain_ci_high: float = col("upper end of gain_vs_fp32's 95 % interval", NAN)
    gain_significant: bool | None = col("True when gain_vs_fp32's interval excludes 1 (None without an fp32 pair)", None)
    algo_gain: float = col("fp32 / fp32_chunked total time: the part of the gain due to the algorithm (codec precisions of reductions)", NAN)
    algo_gain_ci_low: float = col("lower end of algo_gain's 95 % interval", NAN)
    algo_gain_ci_high: float = col("upper end of algo_gain's 95 % interval", NAN)
    precision_gain: float = col("fp32_chunked / this total time: the part of the gain due to fewer bytes (same algorithm)", NAN)
    precision_gain_ci_low: float = col("lower end of precision_gain's 95 % interval", NAN)
    precision_gain_ci_high: float = col("upper end of precision_gain's 95 % interval", NAN)
    wrong: int = col("elements outside the error bound on exactly representable inputs (nccl-tests #wrong)")
    tolerance: float = col("largest error bound used by the wrong check (absolute, in the data's unit)")
    rel_err: float = col("relative L2 error of the result against a float64 reference (fraction)")
    comm_rel_err: float = col(
        "relative L2 error the communication adds: against the float64 result of the inputs as given, "
        "rounded to the input dtype (fraction; 0 for a lossless collective, NaN where not measured)",
        default=math.nan,
    )
    max_abs_err: float = col("largest absolute error against the float64 reference (in the data's unit)")
    timestamp: str = col("when the point finished, ISO 8601 UTC")
    passes_done: int | None = col("visits of the grid (timing.passes) whose rounds this row holds; None in runs from before rows were written after every pass", None)
    partial: bool = col("True for a provisional row: written after a pass that was not the point's last (an interrupted run's estimate from its passes so far; --resume completes it)", False)


@dataclass(kw_only=True, slots=True)
class RankPoint(Record):
    """One rank at one measured point: a row of ``ranks.csv`` (per-rank timings, to find stragglers)."""

    TABLE: ClassVar[str] = "ranks"

    collective: str = col("collective name")
    precision: str = col("precision name")
    group: str = col("communicator group kind (world, intra, inter)", "world")
    payload: str = col("input distribution")
    fp32_bytes: int = col("fp32 size of the user's tensor, bytes")
    rank: int = col("global rank")
    host: str = col("host the rank ran on")
    time_us: float = col("median over samples of this rank's per-op collective time, microseconds")
    wait_us: float = col(
        "median over rounds of the time this rank waited in the round's barriers, microseconds "
        "(the rank the others wait for waits least)"
    )


@dataclass(kw_only=True, slots=True)
class Crossover(Record):
    """Per collective, payload and precision: from which size the precision beats fp32 (``crossover.csv``)."""

    TABLE: ClassVar[str] = "crossover"

    collective: str = col("collective name")
    payload: str = col("input distribution")
    group: str = col("communicator group kind (world, intra, inter)", "world")
    precision: str = col("the precision compared with fp32")
    crossover_bytes: int | None = col(
        "smallest fp32 size, bytes, from which the precision is significantly faster than fp32 (total time, "
        "paired interval above 1) at that and every larger size; empty if none"
    )
    note: str = col(
        '"" when crossover_bytes is set; else "not significant" (the largest size shows no significant '
        'difference) or "never in range" (fp32 is faster at the largest size)'
    )
    crossover_low_bytes: int | None = col(
        "largest size below crossover_bytes at which fp32 is significantly faster: the crossover lies between it "
        "(excluded) and crossover_bytes; empty when no smaller size is significantly slower",
        None,
    )
    significant: bool = col(
        "True when the crossover is located to one step of the sweep: crossover_bytes is the smallest size "
        "measured, or fp32 is significantly faster at the size just below it",
        False,
    )
    gain_at_largest: float = col("total-time speed-up over fp32 at the largest size measured", NAN)
    gain_at_largest_ci_low: float = col("lower end of its 95 % interval", NAN)
    gain_at_largest_ci_high: float = col("upper end of its 95 % interval", NAN)


# ---------------------------------------------------------------------------------------------- training
# Here with the collective tables, not in commbench.training (whose package imports torch): the views load
# these tables too, and the loader types a table only by a row type already imported.


@dataclass(kw_only=True, slots=True)
class TrainingSummary(Record):
    """One policy's run: speed, memory, communication and numerics against the fp32 baseline."""

    TABLE: ClassVar[str] = "training"

    policy: str = col("stable policy name (commbench.training.policies)")
    family: str = col("policy family: ddp, fsdp1, fsdp2, hsdp or zero")
    parallelism: str | None = col(
        "what splits the work over the ranks: dp (data parallel), tp (tensor), pp (pipeline), tp+dp or pp+dp", None
    )
    reference_policy: str | None = col(
        "full-precision policy this one's low-precision gain is measured against, of the same parallelism (the fp32 "
        "DDP baseline where the policy has no full-precision twin); empty for a full-precision policy",
        None,
    )
    description: str = col("one-line description of the policy")
    comm_dtype: str = col("dtype the gradients are communicated in (fp32, bf16, fp16, fp8_e4m3)")
    model: str = col("model trained: gpt, mlp or convnet")
    params: int | None = col("trainable parameters, Psi (count)", None)
    world_size: int = col("ranks in the group (count)")
    backend: str = col("torch.distributed backend (gloo, nccl)")
    device: str = col("torch device the ranks trained on")
    steps: int = col("measured (non-warm-up) steps (count)")
    warmup_steps: int | None = col("warm-up steps before the measured ones (count)", None)
    step_time_us_p50: float = col("median step time over measured steps, max over ranks, microseconds", NAN)
    step_time_us_p95: float = col("95th percentile step time, max over ranks, microseconds", NAN)
    step_time_us_ci_low: float = col("lower end of the 95 % interval of step_time_us_p50, microseconds", NAN)
    step_time_us_ci_high: float = col("upper end of the 95 % interval of step_time_us_p50, microseconds", NAN)
    samples_per_s: float = col("samples per second over all ranks at the median step time", NAN)
    tokens_per_s: float = col("tokens per second over all ranks at the median step time", NAN)
    peak_mem_bytes: float = col("measured peak memory of one step over a baseline taken right before the policy starts (what the process held before is not counted), max over ranks, bytes", NAN)
    peak_mem_kind: str | None = col("how peak_mem_bytes was measured (cuda_allocator, cpu_heap, cpu_memtracker)", None)
    model_state_bytes: int | None = col("analytic model-state bytes per rank (params + grads + optimizer)", None)
    model_state_kind: str | None = col("how model_state_bytes was obtained (analytic)", None)
    comm_bytes_per_step: float = col("measured bus bytes per measured step, per rank, bytes", NAN)
    comm_bytes_expected: float = col("formula bus bytes per step, per rank, bytes", NAN)
    comm_wire_bytes_per_step: float = col("bytes a rank really sends per step on this backend, bytes", NAN)
    nodes: int | None = col("nodes the ranks ran on (distinct host names) (count)", None)
    comm_bytes_intra_per_step: float = col(
        "measured bus bytes per step of collectives whose group stays on one node, per rank, bytes", NAN
    )
    comm_bytes_inter_per_step: float = col(
        "measured bus bytes per step of collectives whose group spans nodes, per rank, bytes", NAN
    )
    comm_bytes_inter_expected: float = col("formula bus bytes per step crossing nodes, per rank, bytes", NAN)
    comm_inter_by_op: str | None = col('measured inter-node bus bytes per step by "op:dtype", JSON', None)
    comm_by_op: str | None = col('measured bus bytes per step by "op:dtype", JSON', None)
    comm_expected_by_op: str | None = col('formula bus bytes per step by "op:dtype", JSON', None)
    comm_time_us: float = col(
        "communication time per step, median over the comm_timed_steps extra steps (collectives made synchronous, "
        "no overlap; per call the minimum over ranks, summed per step; codec encode/decode excluded), microseconds",
        NAN,
    )
    comm_time_ci_low_us: float = col("lower end of the 95 % interval of comm_time_us, microseconds", NAN)
    comm_time_ci_high_us: float = col("upper end of the 95 % interval of comm_time_us, microseconds", NAN)
    p2p_time_us: str | None = col(
        'pipeline: point-to-point send time per step by "stage:direction" (fwd to the next stage, bwd to the previous), '
        "each transfer timed synchronously after the step, mean over the stage's ranks, microseconds, JSON",
        None,
    )
    bubble_frac_measured: float = col(
        "pipeline: measured idle fraction of a step (step wall time minus the stage's forward/backward compute, over "
        "the step), median over measured steps, mean over ranks (0..1)",
        NAN,
    )
    bubble_frac_theory: float = col(
        "pipeline: the schedule's bubble fraction for equal stages, (p-1)/(m+p-1), (p-1)/(v*m+p-1) interleaved (0..1)",
        NAN,
    )
    stage_busy_us: str | None = col('pipeline: compute time per step by stage, median over steps, "stage": us, JSON', None)
    stage_idle_us: str | None = col('pipeline: idle time per step by stage (step minus compute), "stage": us, JSON', None)
    final_loss: float = col("loss of the last step (mean over ranks)", NAN)
    final_loss_drift: float = col("final_loss minus the fp32 baseline's at the same step", NAN)
    max_grad_norm_drift: float = col("largest |relative gradient-norm drift| against fp32 over the steps", NAN)
    skipped_steps: int | None = col("steps the loss scaler skipped (count)", None)
    nonfinite_steps: int | None = col("steps with a non-finite loss or gradient (count)", None)
    underflow_frac: float = col("mean fraction of gradient elements lost to underflow (0..1)", NAN)
    speedup_vs_fp32: float = col("fp32 baseline median step time over this one's (ratio)", NAN)
    speedup_ci_low: float = col("lower end of speedup_vs_fp32's 95 % interval", NAN)
    speedup_ci_high: float = col("upper end of speedup_vs_fp32's 95 % interval", NAN)
    speedup_significant: bool | None = col("True when speedup_vs_fp32's interval excludes 1", None)
    speedup_vs_reference: float = col(
        "reference_policy's step time over this one's from paired rounds interleaved in the same processes "
        "(median of per-round ratios of medians; training/pairing.py)",
        NAN,
    )
    speedup_ref_ci_low: float = col("lower end of speedup_vs_reference's 95 % interval (none below 6 rounds)", NAN)
    speedup_ref_ci_high: float = col("upper end of speedup_vs_reference's 95 % interval (none below 6 rounds)", NAN)
    speedup_ref_rounds: int | None = col("paired rounds behind speedup_vs_reference", None)
    speedup_ref_basis: str | None = col(
        '"paired rounds", or "n too small: ..." (no interval, with the measured steps a 95 % interval needs)', None
    )
    speedup_ref_times_us: str | None = col(
        "the reference's step times in the paired rounds (max over ranks, step order, microseconds, JSON): with this "
        "policy's measured steps they give speedup_vs_reference again",
        None,
    )
    mem_saved_vs_fp32: float = col("1 - peak memory / the fp32 baseline's (fraction)", NAN)
    comm_saved_vs_fp32: float = col("1 - comm bytes per step / the fp32 baseline's (fraction)", NAN)
    warnings: str = col("pitfalls detected, '; '-separated")
    notes: str = col("remarks on the run (codec source, backend quirks), '; '-separated")
    error: str = col("why this policy was skipped on every rank: each failing rank, its exception and phase, or empty")


@dataclass(kw_only=True, slots=True)
class TrainingStep(Record):
    """One training step of one policy."""

    TABLE: ClassVar[str] = "training_steps"

    policy: str = col("stable policy name")
    step: int = col("step index from 0, warm-up steps included")
    warmup: bool = col("a warm-up step (not timed into the summary)")
    loss: float = col("loss, mean over ranks")
    grad_norm: float = col("global gradient L2 norm after communication")
    step_time_us: float = col("forward + backward + optimizer step, max over ranks, microseconds")
    skipped: bool = col("the loss scaler skipped this step (lowered its scale)")
    nonfinite: bool = col("non-finite loss or gradient at this step")
    underflow_frac: float = col("fraction of gradient elements lost to underflow in the lowest precision (0..1)")
    loss_drift: float = col("loss minus the fp32 baseline's at the same step")
    grad_norm_drift: float = col("(grad_norm - fp32 grad_norm) / fp32 grad_norm at the same step")
    comm_bytes: float = col("bus bytes counted this step, per rank, bytes")
