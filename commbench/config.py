"""Suite configuration: validated dataclasses, TOML loading, and nccl-tests size strings.

Sizes use nccl-tests syntax: an integer number of bytes with an optional binary suffix K, M or G
(1K = 1024 bytes). The sweep grid is over the *fp32 size of the user's tensor* (``fp32_bytes``): every
precision at one grid point moves the same number of elements, so precisions compare on the same tensor;
the reported ``size_bytes`` is what crossed the wire.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, published as tomli (a dependency there)
    import tomli as tomllib  # type: ignore[no-redef]

if TYPE_CHECKING:
    from commbench.training.config import TrainingConfig

# nccl-tests' K/M/G are 1024-based; KB and KiB are accepted as other spellings of the same unit (never 1000),
# so `-b 1MB` means what a nccl-tests user means by `-b 1M`.
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(?:([KMG])(?:i?B)?|B)?\s*$", re.IGNORECASE)
SIZE_HELP = "bytes, or K/KB/KiB, M/MB/MiB, G/GB/GiB: all 1024-based like nccl-tests' K/M/G (1M = 1MB = 1MiB = 1048576)"
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
PAYLOADS = ("normal", "gradient", "outliers")
BACKENDS = ("auto", "gloo", "nccl")


def parse_size(text: str | int) -> int:
    """Parse ``8``, ``8B``, ``64K``, ``1MB``, ``4GiB`` into bytes (> 0): every unit is 1024-based, as nccl-tests."""
    if isinstance(text, bool):
        raise ValueError(f"malformed size {text!r}: expected bytes like 8, 64K, 1M, 4G")
    if isinstance(text, int):
        if text <= 0:
            raise ValueError(f"size must be positive, got {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"malformed size {text!r}: expected {SIZE_HELP}, e.g. 8, 64K, 1MB, 4GiB")
    value = int(m.group(1)) * _UNITS[(m.group(2) or "").upper()]
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return value


def format_size(nbytes: int) -> str:
    """Inverse of :func:`parse_size` for exact multiples, else plain bytes (``1536`` -> ``1536``)."""
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)


def size_grid(min_bytes: int, max_bytes: int, factor: int = 2, step: int = 0) -> list[int]:
    """nccl-tests' grid: multiply by ``factor`` (``-f``) or, when ``step`` > 0, add ``step`` (``-i``)."""
    if min_bytes > max_bytes:
        raise ValueError(f"minimum size {format_size(min_bytes)} is larger than maximum size {format_size(max_bytes)}")
    if step <= 0 and factor < 2:
        raise ValueError(f"size factor must be an integer >= 2, got {factor}")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s = s + step if step > 0 else s * factor
    return sizes


@dataclass(kw_only=True, slots=True)
class TimingConfig:
    """The timing protocol: warm up, calibrate k back-to-back ops per sample, then sample every precision of a
    size in alternating rounds until each one's 95 % interval is narrow enough or the size's budget is spent."""

    warmup: int = 2
    """Untimed calls per phase before calibration (first-call costs: allocations, connection set-up)."""
    min_time_s: float = 0.01
    """A sample of k back-to-back ops lasts at least this long (k grows until it does)."""
    min_iters: int = 20
    """k is at least this: nccl-tests times 20 back-to-back ops, and so does a sample here. The first op after
    the barrier that starts a sample runs faster than ops in a steady stream (measured on gloo: 1 MiB all_reduce
    ~0.6-0.7x), so samples of one or a few ops print more bandwidth than a training step's back-to-back
    collectives see."""
    repeats: int = 6
    """Minimum samples (rounds) per point; 6 is the fewest whose interval of the median reaches 95 %."""
    max_samples: int = 60
    """Stop sampling a size after this many rounds even when the target is not reached (never below ``repeats``)."""
    target_ci: float = 0.05
    """Target relative half-width of each point's 95 % interval (0.05 = ±5 %); a point that misses it is noisy."""
    budget_s: float = 4.0
    """Seconds of sampling per size (all its precisions together) before giving up on the target."""
    max_iters: int = 1000
    """Upper bound on k."""

    def __post_init__(self) -> None:
        if self.warmup < 1:
            raise ValueError(f"timing.warmup must be >= 1, got {self.warmup}")
        if not self.min_time_s > 0:
            raise ValueError(f"timing.min_time_s must be > 0, got {self.min_time_s}")
        if self.min_iters < 1:
            raise ValueError(f"timing.min_iters must be >= 1, got {self.min_iters}")
        if self.repeats < 1:
            raise ValueError(f"timing.repeats must be >= 1, got {self.repeats}")
        if self.max_samples < 1:
            raise ValueError(f"timing.max_samples must be >= 1, got {self.max_samples}")
        if not 0 < self.target_ci < 1:
            raise ValueError(f"timing.target_ci must be in (0, 1), e.g. 0.05 for ±5 %, got {self.target_ci}")
        if not self.budget_s > 0:
            raise ValueError(f"timing.budget_s must be > 0, got {self.budget_s}")
        if self.max_iters < self.min_iters:
            raise ValueError(f"timing.max_iters must be >= timing.min_iters ({self.min_iters}), got {self.max_iters}")


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
    local-rank index across nodes; like nccl-tests' NCCL_TESTS_SPLIT). See ``commbench.groups``."""
    timing: TimingConfig = field(default_factory=TimingConfig)
    training: TrainingConfig | None = None
    """Optional ``[training]`` table (DDP/FSDP steps), validated at load (commbench.training.config)."""

    def __post_init__(self) -> None:
        from commbench.collectives import get_collective
        from commbench.precision import get_precision

        if not self.collectives and self.training is None:
            raise ValueError("suite lists no collectives (and no [training] section)")
        for c in self.collectives:
            get_collective(c)
        for p in self.precisions:
            get_precision(p)
        if self.collectives and not self.precisions:
            raise ValueError("suite lists collectives but no precisions")
        if self.payload not in PAYLOADS:
            raise ValueError(f"unknown payload {self.payload!r}; valid choices: {', '.join(PAYLOADS)}")
        size_grid(self.min_bytes, self.max_bytes, self.factor)
        from commbench.groups import get_group_kind

        if not self.groups:
            raise ValueError("suite lists no groups (e.g. groups = [\"world\"])")
        for g in self.groups:
            get_group_kind(g)
        if len(set(self.groups)) != len(self.groups):
            raise ValueError("suite lists a group twice")
        if len(set(self.collectives)) != len(self.collectives) or len(set(self.precisions)) != len(self.precisions):
            raise ValueError("suite lists a collective or precision twice")

    def sizes(self) -> list[int]:
        return size_grid(self.min_bytes, self.max_bytes, self.factor)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_overrides(self, **kw: Any) -> SuiteConfig:
        """A copy with the given fields replaced (CLI flags override the suite file), re-validated."""
        timing = kw.pop("timing", None)
        out = replace(self, **{k: v for k, v in kw.items() if v is not None})
        if timing:
            out = replace(out, timing=replace(out.timing, **timing))
        return out


_SUITE_KEYS = {"name", "collectives", "precisions", "min_bytes", "max_bytes", "factor", "payload", "check", "seed", "groups", "timing", "training"}
_TIMING_KEYS = {"warmup", "min_time_s", "min_iters", "repeats", "max_samples", "target_ci", "budget_s", "max_iters"}


def _as_list(key: str, value: Any) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ValueError(f"suite key {key!r} must be a list of strings or a comma-separated string, got {value!r}")


def suite_from_dict(data: dict[str, Any], *, name: str = "custom") -> SuiteConfig:
    """Validate a parsed suite table (TOML layout: top-level keys plus ``[timing]`` and ``[training]``)."""
    unknown = set(data) - _SUITE_KEYS
    if unknown:
        raise ValueError(f"unknown suite key(s) {', '.join(sorted(unknown))}; valid keys: {', '.join(sorted(_SUITE_KEYS))}")
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
    for key, typ in (("payload", str), ("check", bool), ("seed", int)):
        if key in data:
            if not isinstance(data[key], typ):
                raise ValueError(f"suite key {key!r} must be a {typ.__name__}, got {data[key]!r}")
            kw[key] = data[key]
    timing = data.get("timing", {})
    if not isinstance(timing, dict):
        raise ValueError("suite key 'timing' must be a table")
    bad = set(timing) - _TIMING_KEYS
    if bad:
        raise ValueError(f"unknown timing key(s) {', '.join(sorted(bad))}; valid keys: {', '.join(sorted(_TIMING_KEYS))}")
    try:
        kw["timing"] = TimingConfig(**timing)
    except TypeError as e:
        raise ValueError(f"bad [timing] table: {e}") from None
    if "training" in data:
        if not isinstance(data["training"], dict):
            raise ValueError("suite key 'training' must be a table")
        from commbench.training.config import TrainingConfig

        kw["training"] = TrainingConfig.from_dict(data["training"])
        if "collectives" not in data:
            kw["collectives"] = []
    return SuiteConfig(**kw)


def suite_dirs() -> list[Path]:
    """Where bare suite names are looked up: ./suites, the package's bundled copy, the source checkout."""
    here = Path(__file__).resolve().parent
    return [Path.cwd() / "suites", here / "suites", here.parent / "suites"]


def available_suites() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in suite_dirs():
        if d.is_dir():
            for p in sorted(d.glob("*.toml")):
                found.setdefault(p.stem, p)
    return found


def resolve_suite_path(spec: str) -> Path:
    """A path to a TOML file, or a bare name (``quick``) found in :func:`suite_dirs`."""
    p = Path(spec)
    if p.suffix == ".toml" or p.exists() or "/" in spec:
        if not p.is_file():
            raise ValueError(f"suite file {spec!r} does not exist; known suites: {', '.join(available_suites()) or 'none'}")
        return p
    suites = available_suites()
    if spec not in suites:
        raise ValueError(f"unknown suite {spec!r}; known suites: {', '.join(suites) or 'none'} (or give a path to a .toml file)")
    return suites[spec]


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
