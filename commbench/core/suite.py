"""Suite configuration: validated dataclasses and TOML loading.

A suite is the collective x precision x size grid, the groups to run it in, how to time it (``[timing]``) and
optionally training steps (``[training]``). Sizes are nccl-tests size strings (:mod:`commbench.core.units`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from commbench.core.names import ALL, did_you_mean, unknown
from commbench.core.nccl_tests import REDUCE_OPS
from commbench.core.registry import Registry, canonical_name, lookup, names_of
from commbench.core.settings import check_settings, count, positive, setting
from commbench.core.units import parse_size, size_grid

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, published as tomli (a dependency there)
    import tomli as tomllib  # type: ignore[no-redef]


class SuiteTable(Protocol):
    """A validated table of a suite file other than ``[timing]`` (``[training]``: ``training.config.TrainingConfig``)."""

    def to_dict(self) -> dict[str, Any]:
        """The table with every default filled in (what metadata records)."""
        ...


SUITE_TABLES: Registry[Callable[[Mapping[str, Any]], SuiteTable]] = Registry("suite table")
"""Suite-file tables by key -> the parser of the raw table, which raises ValueError (one line) on bad input. The
suite knows no table's implementation: ``commbench.training.config`` registers ``training``, a plugin its own
(kept in :attr:`SuiteConfig.tables`)."""

PAYLOADS = ("normal", "gradient", "outliers")
BACKENDS = ("auto", "gloo", "nccl")


TIMING_MODES = ("stream", "isolated")
DEVICE_TIMERS = ("host", "events")
"""How a sample's ops are timed on a GPU (``timing.device_timer``; ``commbench.measure.timing`` documents both protocols)."""


@dataclass(kw_only=True, slots=True)
class TimingConfig:
    """The timing protocol: warm up, calibrate k back-to-back ops per sample, then sample every precision of a
    size in alternating rounds until each one's 95 % interval is narrow enough or the size's budget is spent."""

    warmup: int = count(2, "untimed calls per phase before calibration (first-call costs: allocations, connections)")
    # Only for ops so fast that 20 of them last under 1 ms (GPU small messages), so barrier skew and the clock stay
    # under ~1 % of a sample. It is not longer: per-op time grows with the length of the stream, so a longer
    # sample would time more ops than nccl-tests' loop of 20 and print a longer time
    # (figures: benchmarks/results/2026-12-01_2core-vm_gloo.md).
    min_time_s: float = positive(0.001, "seconds a sample of k back-to-back ops lasts at least (k grows until it does)")
    # The first op after the barrier that starts a sample runs faster than ops in a steady stream, so samples of
    # one or a few ops print more bandwidth than back-to-back collectives get (figures: the results file above).
    min_iters: int = count(20, "smallest k: at least 20 back-to-back ops per sample, as nccl-tests' loop times")
    repeats: int = count(6, "minimum samples (rounds) per point; 6 is the fewest whose median's interval reaches 95 %")
    max_samples: int = count(60, "rounds after which a size stops sampling, target reached or not (>= repeats)")
    target_ci: float = positive(
        0.05, "target relative half-width of each point's 95 % interval, e.g. 0.05 for ±5 %", below=1
    )
    budget_s: float = positive(4.0, "seconds of sampling per size (all its precisions together) before giving up")
    max_iters: int = count(1000, "largest k (>= min_iters)")
    # What a training step issues is not a stream: one collective per bucket, after milliseconds of compute, each
    # rank arriving when its backward gets there, and such an op does not take a streamed op's time
    # (benchmarks/bench_isolated_calls.py; figures: benchmarks/results/2026-12-01_2core-vm_gloo.md).
    mode: str = setting(
        "stream", "what a sample times: 'stream' (k back-to-back ops after a barrier, nccl-tests' loop) or 'isolated' "
        "(one op after gap_s of compute on every rank; per sample the fastest rank's duration: the one that waited "
        "least for the others)", accepts=lambda v: v in TIMING_MODES, expect=" or ".join(repr(m) for m in TIMING_MODES),
    )  # fmt: skip
    gap_s: float = positive(0.02, "isolated mode: seconds of compute (small matmuls) between the barrier and the op")
    device_timer: str = setting(
        "host", "how a sample's ops are timed: 'host' (host clock around the k ops and one device synchronize, as "
        "nccl-tests' BenchTime) or 'events' (CUDA events recorded on the current stream before and after them; CUDA "
        "only)", accepts=lambda v: v in DEVICE_TIMERS, expect=" or ".join(repr(m) for m in DEVICE_TIMERS),
    )  # fmt: skip
    # A shared machine drifts over seconds to minutes: sampled in one stretch, a point caught in a slow spell is
    # slow in every round and its interval (of the samples it has) does not show it, so two identical runs
    # "differ" there (an A/A pair before passes: benchmarks/results/2026-12-01_2core-vm_gloo.md).
    passes: int = count(
        3, "visits of the whole grid: each point samples its share of rounds and budget in every pass, so a slow "
        "spell lands on part of every point's rounds (1: each point in one stretch, its rows printed as it ends)"
    )  # fmt: skip

    cuda_graph: int = count(
        0, "CUDA-graph mode (nccl-tests -G): each sample's k ops are captured in one CUDA graph, launched this many "
        "times, and the time is per op of the launches (0: eager ops; NCCL on CUDA only, eager elsewhere)", least=0,
    )  # fmt: skip

    def __post_init__(self) -> None:
        check_settings(self, "timing")
        if self.max_iters < self.min_iters:
            raise ValueError(f"timing.max_iters must be >= timing.min_iters ({self.min_iters}), got {self.max_iters}")
        if self.cuda_graph and self.mode != "stream":
            raise ValueError(
                f"-G {self.cuda_graph} (timing.cuda_graph) times back-to-back launches of a graph of the sample's ops; "
                f"timing mode {self.mode!r} times one op after compute: use one or the other"
            )


@dataclass(kw_only=True, slots=True)
class SuiteConfig:
    """One benchmark suite: the collective x precision x size grid and how to time it."""

    name: str = "custom"
    collectives: list[str] = field(default_factory=lambda: ["all_reduce", "all_gather", "reduce_scatter"])
    precisions: list[str] = field(default_factory=lambda: ["fp32", "fp16", "bf16"])
    min_bytes: int = 1024
    """Smallest fp32 size of the user's tensor (nccl-tests ``-b``)."""
    max_bytes: int = 16 * 1024**2
    """Largest fp32 size (nccl-tests ``-e``)."""
    factor: int = 2
    """Multiplicative step (nccl-tests ``-f``)."""
    payload: str = "normal"
    """Value distribution for the error measurement: normal, gradient (tiny values), outliers."""
    check: bool = True
    """Count wrong elements on exactly representable inputs (nccl-tests ``-c``)."""
    seed: int = 1234
    groups: list[str] = field(default_factory=lambda: ["world"])
    """Communicator groups to run every point in (``world``, ``intra``: one per node, ``inter``: one per
    local-rank index across nodes; like nccl-tests' NCCL_TESTS_SPLIT). See ``commbench.measure.groups``."""
    root: int = 0
    """Root rank, inside each group, of broadcast, reduce, gather and scatter (nccl-tests ``-r``)."""
    op: str = "sum"
    """Reduction op of all_reduce, reduce_scatter and reduce: sum, prod, min, max or avg (nccl-tests ``-o``)."""
    timing: TimingConfig = field(default_factory=TimingConfig)
    training: SuiteTable | None = None
    """Optional ``[training]`` table (DDP/FSDP steps): a ``commbench.training.config.TrainingConfig``, validated at
    load by the parser :data:`SUITE_TABLES` has for it (the suite sits below training: the run driver coerces it)."""
    tables: dict[str, SuiteTable] = field(default_factory=dict)
    """The other registered tables of the suite file (a plugin's), validated at load; not in :meth:`to_dict`
    when empty, so metadata.json has the keys it always had."""

    def __post_init__(self) -> None:
        if not self.collectives and self.training is None:
            raise ValueError("suite lists no collectives (and no [training] section)")
        # other tools' names (nccl-tests' -d bfloat16, torch's float32, alltoall) become commbench's, so metadata,
        # --resume and the rows carry one name; 'all' is every registered one (nccl-tests' -d all)
        self.collectives = _canonical_list("collective", self.collectives)
        self.precisions = _canonical_list("precision", self.precisions)
        if self.collectives and not self.precisions:
            raise ValueError("suite lists collectives but no precisions")
        if self.payload not in PAYLOADS:
            raise ValueError(unknown("payload", self.payload, PAYLOADS))
        size_grid(self.min_bytes, self.max_bytes, self.factor)
        if not isinstance(self.root, int) or isinstance(self.root, bool) or self.root < 0:
            raise ValueError(f"root must be a rank >= 0 (nccl-tests -r), got {self.root!r}")
        if self.op not in REDUCE_OPS:
            raise ValueError(unknown("reduction op", self.op, REDUCE_OPS))
        if not self.groups:
            raise ValueError("suite lists no groups (e.g. groups = [\"world\"])")
        for g in self.groups:
            lookup("group", g)
        if len(set(self.groups)) != len(self.groups):
            raise ValueError("suite lists a group twice")
        if len(set(self.collectives)) != len(self.collectives) or len(set(self.precisions)) != len(self.precisions):
            raise ValueError("suite lists a collective or precision twice")

    def sizes(self) -> list[int]:
        return size_grid(self.min_bytes, self.max_bytes, self.factor)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.training is not None:
            d["training"] = self.training.to_dict()
        d.pop("tables")
        if self.tables:
            d["tables"] = {key: table.to_dict() for key, table in self.tables.items()}
        return d

    def with_overrides(self, **kw: Any) -> SuiteConfig:
        """A copy with the given fields replaced (CLI flags override the suite file), re-validated."""
        timing = kw.pop("timing", None)
        out = replace(self, **{k: v for k, v in kw.items() if v is not None})
        if timing:
            out = replace(out, timing=replace(out.timing, **timing))
        return out


_SUITE_KEYS = {"name", "collectives", "precisions", "min_bytes", "max_bytes", "factor", "payload", "check", "seed", "groups", "root", "op", "timing"}
"""The suite's own keys; the tables of :data:`SUITE_TABLES` (``training``) join them."""
_TIMING_KEYS = {
    "warmup", "min_time_s", "min_iters", "repeats", "max_samples", "target_ci", "budget_s", "max_iters", "passes", "mode",
    "gap_s", "device_timer", "cuda_graph",
}


def _canonical_list(kind: str, names: list[str]) -> list[str]:
    """``names`` in commbench's spelling, each checked (one line naming the closest valid ones when unknown);
    ``["all"]`` is every registered name of ``kind``."""
    if [n.strip().lower() for n in names] == [ALL]:
        return names_of(kind)
    return [canonical_name(kind, n) for n in names]


def _as_list(key: str, value: Any) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ValueError(f"suite key {key!r} must be a list of strings or a comma-separated string, got {value!r}")


def suite_from_dict(data: dict[str, Any], *, name: str = "custom") -> SuiteConfig:
    """Validate a parsed suite table (TOML layout: top-level keys plus ``[timing]`` and ``[training]``)."""
    tables = [key for key in data if key not in _SUITE_KEYS]
    unknown = sorted(key for key in tables if key not in SUITE_TABLES)
    if unknown:
        valid = sorted(_SUITE_KEYS | set(SUITE_TABLES.names()))
        near = did_you_mean(unknown[0], valid) if len(unknown) == 1 else ""
        raise ValueError(f"unknown suite key(s) {', '.join(unknown)}; valid keys: {', '.join(valid)}{near}")
    kw: dict[str, Any] = {"name": str(data.get("name", name))}
    for key in ("collectives", "precisions"):
        if key in data:
            kw[key] = _as_list(key, data[key])
    for key in ("min_bytes", "max_bytes"):
        if key in data:
            kw[key] = parse_size(data[key])
    if "factor" in data:
        if not isinstance(data["factor"], int) or isinstance(data["factor"], bool):
            raise ValueError(f"suite key 'factor' must be an integer >= 2, got {data['factor']!r}")
        kw["factor"] = data["factor"]
    for key, typ in (("payload", str), ("check", bool), ("seed", int), ("root", int), ("op", str)):
        if key in data:
            if not isinstance(data[key], typ):
                raise ValueError(f"suite key {key!r} must be a {typ.__name__}, got {data[key]!r}")
            kw[key] = data[key]
    timing = data.get("timing", {})
    if not isinstance(timing, dict):
        raise ValueError("suite key 'timing' must be a table")
    bad = set(timing) - _TIMING_KEYS
    if bad:
        near = did_you_mean(min(bad), _TIMING_KEYS) if len(bad) == 1 else ""
        raise ValueError(f"unknown timing key(s) {', '.join(sorted(bad))}; valid keys: {', '.join(sorted(_TIMING_KEYS))}{near}")
    try:
        kw["timing"] = TimingConfig(**timing)
    except TypeError as e:
        raise ValueError(f"bad [timing] table: {e}") from None
    parsed: dict[str, SuiteTable] = {}
    for key in tables:
        if not isinstance(data[key], dict):
            raise ValueError(f"suite key {key!r} must be a table")
        parsed[key] = SUITE_TABLES.get(key)(data[key])
    if "training" in parsed:
        kw["training"] = parsed.pop("training")
        if "collectives" not in data:
            kw["collectives"] = []
    kw["tables"] = parsed
    return SuiteConfig(**kw)


def suite_dirs() -> list[Path]:
    """Where bare suite names are looked up: ./suites, the package's bundled copy, the source checkout."""
    package = Path(__file__).resolve().parents[1]
    return [Path.cwd() / "suites", package / "suites", package.parent / "suites"]


def available_suites() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in suite_dirs():
        if d.is_dir():
            for p in sorted(d.glob("*.toml")):
                found.setdefault(p.stem, p)
    return found


def looks_like_path(spec: str) -> bool:
    """True for a suite argument written as a path (``./quick``, ``~/s.toml``, ``suites/x``, ``run.toml``): a path
    is read as a file, anything else is a suite name first."""
    return spec.endswith(".toml") or "/" in spec or "\\" in spec or spec.startswith(("~", "."))


def resolve_suite_path(spec: str) -> Path:
    """The TOML file a suite argument names. A built-in suite name (``quick``, :func:`available_suites`) wins over a
    same-named file or folder in the working directory (a ``quick/`` run directory left by ``--out quick``), unless
    the argument looks like a path (:func:`looks_like_path`); a file that matches no name is read as a path."""
    suites = available_suites()
    known = f"known suites: {', '.join(suites) or 'none'}"
    p = Path(spec).expanduser()
    if not looks_like_path(spec) and spec in suites:
        return suites[spec]
    if p.is_file():
        return p
    if p.is_dir():
        raise ValueError(f"suite {spec!r} is a directory, not a suite file (a .toml file); {known}")
    if looks_like_path(spec):
        raise ValueError(f"suite file {spec!r} does not exist; {known}")
    raise ValueError(f"unknown suite {spec!r}; {known} (or give a path to a .toml file){did_you_mean(spec, suites)}")


def load_suite(spec: str) -> SuiteConfig:
    path = resolve_suite_path(spec)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"broken suite file {path}: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read suite file {path}: {e}") from None
    try:
        return suite_from_dict(data, name=path.stem)
    except ValueError as e:
        raise ValueError(f"suite file {path}: {e}") from None
