"""The steps of ``benchmarks/gpu_check.sh``: each one asserts, and what it measured lands in a summary.

None of commbench's CUDA path runs on a CPU machine, so this is the test of that path: it fails (never
"skips") where there is no CUDA, and every step names the figure that failed. The bash driver runs each step
as ``python benchmarks/gpu_check.py step NAME --out DIR --limit S`` under its own timeout, so a hang in one
step cannot eat the next one's time; ``summary`` then gathers every step's record into ``summary.txt`` and
``summary.json`` and exits non-zero if any step failed. The checks are plain functions over data frames and
tensors, so the tests run them on CPU (a synthetic results frame, the codec with the C kernel on and off, the
hook on a 1-rank gloo world); only the figures a GPU produces need the GPU. What each step proves is in
``docs/gpu.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere: the checkout's commbench, not an installed one
    sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    import pandas as pd
    import torch
    import torch.distributed as dist

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
PRECISIONS = (
    "fp32", "fp16", "bf16", "fp16_compress", "bf16_compress",
    "fp8_e4m3", "fp8_e4m3:block128", "fp8_e4m3:none", "fp8_e5m2", "fp8_e5m2:block32", "fp8_e5m2:none",
    "fp8_e4m3_native", "fp8_e5m2_native",
)  # fmt: skip
NATIVE_PRECISIONS = ("fp8_e4m3_native", "fp8_e5m2_native", "fp8_e4m3_native:block128")
MIB = 2**20
BIG_BYTES = 256 * MIB
"""The one large point of the sweep, the hook's bucket and the codec throughput tensor (fp32 bytes)."""
FAST_TIMING = ("--warmup", "1", "--min-time", "0.001", "--min-iters", "2", "--repeats", "3", "--passes", "1",
               "--max-time", "0.5", "--target-ci", "0.5")  # fmt: skip
"""Timing flags that measure little: the sweep steps are about correctness on CUDA, not about the figures."""
SWEEP_SIZES = ("4K", "1M", "256")
"""-b, -e, -f of the small sweep: 4K and 1M."""
BIG_SWEEP_SIZES = ("256M", "256M", "2")
"""-b, -e, -f of the large sweep: the one 256M point."""
HOOK_CODECS = ("fp8_e4m3", "fp8_e5m2:block128")
"""Scaled codecs: codes and scales travel as two buffers, the case that raced on NCCL."""
CODEC_CASES = tuple((fmt, scaling) for fmt in ("e4m3", "e5m2") for scaling in ("tensor", "block", "none"))
CODEC_BLOCK = 128
MIN_COPY_FRACTION = 0.3
CLI_GRACE_S = 12.0
"""Seconds of a step's limit kept back from a CLI run it starts, to stop that run and still write the record."""

TRAINING_TOML = """\
name = "gpu-check-training"
collectives = []

[training]
model = "gpt"
policies = "all"
steps = 3
warmup_steps = 1
batch_size = 8
seq_len = 64
d_model = 128
n_layers = 2
n_heads = 4
vocab = 512
measure_memory = true
comm_timed_steps = 2
"""


class NoCuda(RuntimeError):
    """No CUDA device visible to torch: the check cannot test anything."""


# ------------------------------------------------------------------------------------------- step records


@dataclass
class StepReport:
    """What one step found: key figures, and one line per failed assertion (naming the failing figure)."""

    name: str
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    wall_s: float = math.nan
    limit_s: float | None = None
    rc: int | None = None
    """The step process's exit status, as the driver saw it (124/137: its timeout)."""

    @property
    def ok(self) -> bool:
        return not self.failures and self.rc in (None, 0)

    def fig(self, key: str, value: Any) -> None:
        self.figures[key] = value

    def fail(self, message: str) -> None:
        self.failures.append(message)

    def check(self, condition: bool, message: str) -> None:
        if not condition:
            self.fail(message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "wall_s": _jsonable(self.wall_s),
            "limit_s": self.limit_s,
            "rc": self.rc,
            "figures": {k: _jsonable(v) for k, v in self.figures.items()},
            "failures": list(self.failures),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepReport:
        wall = d.get("wall_s")
        return cls(
            name=str(d["name"]),
            figures=dict(d.get("figures") or {}),
            failures=list(d.get("failures") or []),
            wall_s=math.nan if wall is None else float(wall),
            limit_s=d.get("limit_s"),
            rc=d.get("rc"),
        )


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else str(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if hasattr(v, "item") and callable(v.item):  # numpy / torch scalars
        return _jsonable(v.item())
    return v


def record_path(out: Path, name: str) -> Path:
    return out / "steps" / f"{name}.json"


def write_record(out: Path, report: StepReport) -> Path:
    path = record_path(out, report.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    tmp.replace(path)
    return path


def read_driver_table(path: Path) -> list[tuple[str, float, int, float]]:
    """The driver's ``steps.tsv``: (name, limit s, exit status, wall s) per step, in the order run."""
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 4:
                rows.append((parts[0], float(parts[1]), int(parts[2]), float(parts[3])))
    return rows


def collect(out: Path) -> list[StepReport]:
    """Every step the driver ran, its own record merged with the driver's exit status and wall time: a step
    killed by its timeout, or one that died before writing its record, fails with that said."""
    reports = []
    for name, limit, rc, wall in read_driver_table(out / "steps.tsv"):
        path = record_path(out, name)
        try:
            rep = StepReport.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError):
            rep = StepReport(name)
            if rc in (124, 137):
                rep.fail(f"timed out after its {limit:g} s limit (see logs/{name}.log)")
            else:
                rep.fail(f"exited with status {rc} and wrote no record (see logs/{name}.log)")
        else:
            if rc in (124, 137):
                rep.fail(f"timed out after its {limit:g} s limit after writing its record")
            elif rc != 0 and not rep.failures:
                rep.fail(f"exited with status {rc}")
        # the driver's clock: the step's process from start to exit, imports and teardown included
        rep.rc, rep.limit_s, rep.wall_s = rc, limit, wall
        reports.append(rep)
    return reports


def summary_text(reports: Sequence[StepReport], out: Path | None = None, max_failures: int = 20) -> str:
    passed = sum(r.ok for r in reports)
    total_s = sum(r.wall_s for r in reports if math.isfinite(r.wall_s))
    where = f" ({out})" if out is not None else ""
    lines = [f"gpu_check summary{where}: {passed} of {len(reports)} steps passed, {total_s:.0f} s of steps"]
    for r in reports:
        limit = f" of {r.limit_s:g}" if r.limit_s is not None else ""
        lines.append(f"{r.name:<12} {'pass' if r.ok else 'FAIL':<4} {r.wall_s:6.1f}{limit} s")
        for k, v in r.figures.items():
            lines.append(f"    {k}: {_show(v)}")
        for msg in r.failures[:max_failures]:
            lines.append(f"  FAIL {msg}")
        if len(r.failures) > max_failures:
            lines.append(f"  FAIL ... and {len(r.failures) - max_failures} more (summary.json has them all)")
    lines.append("gpu_check: " + ("PASSED" if reports and passed == len(reports) else "FAILED"))
    return "\n".join(lines) + "\n"


def _show(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_show(x)}" for k, x in v.items())
    return str(v)


def write_summary(out: Path, reports: Sequence[StepReport]) -> str:
    """Write ``summary.txt`` and ``summary.json`` into ``out``; return the text."""
    text = summary_text(reports, out)
    ok = bool(reports) and all(r.ok for r in reports)
    data = {"ok": ok, "steps": [r.to_dict() for r in reports]}
    (out / "summary.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "summary.txt").write_text(text)
    return text


# ---------------------------------------------------------------------------------------------- checkers


def _size(nbytes: int) -> str:
    from commbench.core.units import format_size

    return format_size(int(nbytes))


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
        rep.fail(f"{c} x {p} at {_size(s)}: no result row")
    wrong = df["wrong"]
    unchecked = df[wrong.isna()]
    for _, row in unchecked.iterrows():
        rep.fail(f"{row['collective']} x {row['precision']} at {_size(row['fp32_bytes'])}: #wrong not measured")
    bad = df[wrong.notna() & (wrong != 0)]
    for _, row in bad.iterrows():
        rep.fail(
            f"{row['collective']} x {row['precision']} at {_size(row['fp32_bytes'])}: #wrong = {int(row['wrong'])} "
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


# ------------------------------------------------------------------------------------------------ codec


@dataclass
class CodecResult:
    """Codes, scales and decoded values of one encode + decode, on the CPU."""

    codes: torch.Tensor
    scales: torch.Tensor
    decoded: torch.Tensor


def special_values(n: int, seed: int, block: int = CODEC_BLOCK) -> torch.Tensor:
    """float32 data that reaches every branch of the codec: magnitudes spread over 2**-140..2**120 (tiny scales
    clamp, float32 subnormals, fp8 subnormals after scaling), NaN, +-inf, +-0, the formats' max and their
    rounding seams, an all-zero, an all-NaN and an inf-only block, and a last block shorter than ``block``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-40, 40, (n,), generator=g).float())
    specials = torch.tensor(
        [math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-40, -3e-42, 1.4e-45, 1.2e-38, 3.4e38, -3.4e38,
         448.0, 464.0, 480.0, -448.0, 57344.0, 61440.0, 65536.0, 2.0**-9, 2.0**-10, 2.0**-16, 2.0**-17],
        dtype=torch.float32,
    )  # fmt: skip
    idx = torch.randint(0, n, (n // 50,), generator=g)
    x[idx] = specials[torch.randint(0, len(specials), (len(idx),), generator=g)]
    x[: len(specials)] = specials
    if n >= 5 * block:
        x[block : 2 * block] = 0.0
        x[2 * block : 3 * block] = math.nan
        x[3 * block : 4 * block] = 0.0
        x[3 * block + 7] = -math.inf
        x[4 * block : 5 * block] *= 2.0**-100  # a block of tiny values: its scale clamps at 2**-126
    return x.contiguous()


def codec_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    """Named CPU float32 inputs for the bit-exact comparison."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    return {
        "mixed": special_values(2**20 + 77, seed),
        "tiny": (torch.rand(4099, generator=g) * 2.0**-130).contiguous(),
        "huge": (torch.randn(4099, generator=g) * 2.0**120).contiguous(),
        "zeros": torch.zeros(1000),
        "nan": torch.full((300,), math.nan),
    }


def codec_roundtrip(x: torch.Tensor, fmt: str, scaling: str, block: int, device: torch.device) -> CodecResult:
    """Encode ``x`` (on ``device``) with :func:`commbench.measure.fp8.quantize`, decode it, bring all three to the CPU."""
    from commbench.measure import fp8

    xd = x.to(device)
    q, s = fp8.quantize(xd, fmt, scaling, block)
    d = fp8.dequantize(q, s, fmt, scaling, block)
    return CodecResult(q.cpu(), s.cpu(), d.cpu())


def codec_decode_all(fmt: str, scaling: str, block: int, device: torch.device, seed: int = 0) -> CodecResult:
    """Decode every code (each of the 256 many times over) with random power-of-two scales, accumulating into
    a random float32 tensor as the reduce-scatter does: the decode path on its own."""
    import torch

    from commbench.measure import fp8

    g = torch.Generator().manual_seed(seed + 2)
    n = 256 * 41 + 5
    codes = torch.arange(n, dtype=torch.int64).remainder(256).to(torch.uint8)
    ns = fp8.num_scales(n, scaling, block)
    scales = torch.exp2(torch.randint(-20, 20, (ns,), generator=g).float()) if scaling != "none" else torch.ones(ns)
    base = torch.randn(n, generator=g)
    plain = fp8.dequantize(codes.to(device), scales.to(device), fmt, scaling, block)
    acc = base.to(device).clone()
    fp8.dequantize(codes.to(device), scales.to(device), fmt, scaling, block, out=acc, accumulate=True)
    return CodecResult(codes, scales, torch.cat([plain.cpu(), acc.cpu()]))


def _bits(t: torch.Tensor) -> torch.Tensor:
    import torch

    return t.contiguous().view(torch.int32)


def _nan_codes_in_both(a: CodecResult, b: CodecResult) -> torch.Tensor | None:
    """Where both results hold a NaN code (their decoded values are NaN), when codes and decoded values align."""
    import torch

    if not (a.codes.shape == b.codes.shape == a.decoded.shape == b.decoded.shape):
        return None
    return torch.isnan(a.decoded) & torch.isnan(b.decoded)


def nan_code_differences(a: CodecResult, b: CodecResult) -> int:
    """Elements both results encode as NaN, with different NaN codes (the sign of a NaN: the C kernel keeps a
    NaN input's sign, the vectorised torch path does not promise it). Reported, not failed: a NaN's sign
    carries no value, and both decode to NaN."""
    both = _nan_codes_in_both(a, b)
    return 0 if both is None else int((both & (a.codes != b.codes)).sum())


def compare_codec(a: CodecResult, b: CodecResult) -> list[str]:
    """What differs between two results, one item per kind: codes bit for bit (any NaN code matching any NaN
    code: :func:`nan_code_differences`), scales bit for bit, decoded values bit for bit where not NaN, and the
    NaN positions."""
    import torch

    out = []
    for what, x, y in (("codes", a.codes, b.codes), ("scales", a.scales, b.scales)):
        if x.shape != y.shape:
            out.append(f"{what}: shape {tuple(x.shape)} vs {tuple(y.shape)}")
            continue
        diff = (x != y) if x.dtype == torch.uint8 else (_bits(x) != _bits(y))
        nan_both = _nan_codes_in_both(a, b) if what == "codes" else None
        if nan_both is not None:
            diff &= ~nan_both
        if bool(diff.any()):
            i = int(diff.nonzero()[0, 0])
            out.append(
                f"{what}: {int(diff.sum())} of {x.numel()} differ (first at {i}: {x[i].item()} vs {y[i].item()})"
            )
    if a.decoded.shape != b.decoded.shape:
        out.append(f"decoded: shape {tuple(a.decoded.shape)} vs {tuple(b.decoded.shape)}")
        return out
    na, nb = torch.isnan(a.decoded), torch.isnan(b.decoded)
    if not torch.equal(na, nb):
        out.append(f"decoded: NaN at {int((na != nb).sum())} positions of one and not the other")
    both = ~(na | nb)
    diff = both & (_bits(a.decoded) != _bits(b.decoded))
    if bool(diff.any()):
        i = int(diff.nonzero()[0, 0])
        out.append(
            f"decoded: {int(diff.sum())} of {a.decoded.numel()} differ "
            f"(first at {i}: {a.decoded[i].item()!r} vs {b.decoded[i].item()!r})"
        )
    return out


def codec_exact_cases(
    rep: StepReport,
    make_a: Callable[[Callable[[], CodecResult]], CodecResult],
    make_b: Callable[[Callable[[], CodecResult]], CodecResult],
    device_a: torch.device,
    device_b: torch.device,
    labels: tuple[str, str],
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Every format x scaling on every input, encoded and decoded by path A and path B, bit for bit.

    ``make_a(thunk)`` runs ``thunk`` under path A's conditions (the kernel switched on, say) and returns its
    result; ``device_a`` is where path A's tensors live."""
    inputs = codec_inputs() if inputs is None else inputs
    cases, nan_codes = 0, 0
    for fmt, scaling in CODEC_CASES:
        for name, x in inputs.items():
            a = make_a(partial(codec_roundtrip, x, fmt, scaling, CODEC_BLOCK, device_a))
            b = make_b(partial(codec_roundtrip, x, fmt, scaling, CODEC_BLOCK, device_b))
            for d in compare_codec(a, b):
                rep.fail(f"{fmt} {scaling} on {name} ({x.numel()} elements), {labels[0]} vs {labels[1]}: {d}")
            nan_codes += nan_code_differences(a, b)
            cases += 1
        a = make_a(partial(codec_decode_all, fmt, scaling, CODEC_BLOCK, device_a))
        b = make_b(partial(codec_decode_all, fmt, scaling, CODEC_BLOCK, device_b))
        for d in compare_codec(a, b):
            rep.fail(f"{fmt} {scaling} decode of every code, {labels[0]} vs {labels[1]}: {d}")
        cases += 1
    rep.fig("cases", cases)
    rep.fig("elements_per_case", {k: v.numel() for k, v in inputs.items()})
    rep.fig("nan_codes_differing_in_sign", nan_codes)


def copy_fraction(encode_s: float, decode_s: float, copy_s: float, numel: int) -> dict[str, float]:
    """Encode and decode throughput against the device copy, with one byte definition for all three:
    bytes read plus bytes written. A float32 copy moves 8 bytes per element; an encode reads 4 and writes 1
    (fp32 -> fp8), a decode reads 1 and writes 4 (scales: a few bytes per block, not counted)."""
    copy_gbps = 8 * numel / copy_s / 1e9
    enc_gbps = 5 * numel / encode_s / 1e9
    dec_gbps = 5 * numel / decode_s / 1e9
    both_gbps = 10 * numel / (encode_s + decode_s) / 1e9
    return {
        "copy_gbps": copy_gbps,
        "encode_gbps": enc_gbps,
        "decode_gbps": dec_gbps,
        "encode_decode_gbps": both_gbps,
        "fraction": both_gbps / copy_gbps,
    }


# ------------------------------------------------------------------------------------------------- hook


class DuckBucket:
    """What the codec hook reads of DDP's ``GradBucket``: the flat buffer and the bucket index."""

    def __init__(self, buffer: torch.Tensor, index: int) -> None:
        self._buffer, self._index = buffer, index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return False


def sync_chunked_all_reduce(codec_name: str, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The synchronous reference: the sweep's chunked all_reduce stage by stage on ``x`` divided by the world
    (the hook's mean), in the split layout the hook uses."""
    import torch.distributed as dist

    from commbench.measure.chunked import ChunkedAllReduce
    from commbench.measure.codec import get_codec

    n = dist.get_world_size(group)
    op = ChunkedAllReduce(get_codec(codec_name), x.numel(), group, x.device, packed=False, gather_by_all_to_all=False)
    op.load(x)
    op.x.div_(n)
    op.encode()
    op.comm()
    op.decode()
    return op.result().clone()


def gradient_like(numel: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Random gradients whose magnitude changes every 4096 elements (so chunks and blocks get other scales)."""
    import torch

    x = torch.randn(numel, generator=generator, device=device)
    runs = -(-numel // 4096)
    mag = torch.exp2(torch.randint(-20, 0, (runs,), generator=generator, device=device).float())
    return (x * mag.repeat_interleave(4096)[:numel]).contiguous()


def hook_vs_sync(
    codec_name: str,
    numel: int,
    device: torch.device,
    group: dist.ProcessGroup | None = None,
    steps: Sequence[Sequence[int]] = ((0, 1), (0, 0)),
    seed: int = 0,
) -> dict[str, int]:
    """Elements where the codec DDP hook's result differs from the synchronous chunked all_reduce's, per
    (step, call). ``steps`` lists the bucket index of each call of a step; every call of a step is in flight
    before any is waited, so each must own its buffers (the default: two buckets, then one bucket twice, and
    the second step reuses what the first left). The future's ``wait()`` is how DDP consumes it: on CUDA it
    makes the current stream wait on the events the hook recorded."""
    import torch

    from commbench.training.hooks import codec_hook

    hook = codec_hook(codec_name)
    gen = torch.Generator(device=device).manual_seed(seed)
    mismatches: dict[str, int] = {}
    for step, indices in enumerate(steps):
        grads = [gradient_like(numel, gen, device) for _ in indices]
        flat = [g.clone() for g in grads]
        futs = [hook(group, DuckBucket(b, i)) for i, b in zip(indices, flat, strict=True)]  # type: ignore[arg-type]
        results = [f.wait() for f in futs]
        for k, (g, got) in enumerate(zip(grads, results, strict=True)):
            got = got[0] if isinstance(got, (list, tuple)) else got
            ref = sync_chunked_all_reduce(codec_name, g, group)
            where = f"step{step}.call{k}(bucket {indices[k]})"
            mismatches[where] = numel if got.shape != ref.shape else int((_bits(got) != _bits(ref)).sum())
    return mismatches


# ------------------------------------------------------------------------------------------------ steps


@dataclass
class Context:
    out: Path
    limit_s: float
    started: float = field(default_factory=time.monotonic)

    def left_s(self) -> float:
        return self.limit_s - (time.monotonic() - self.started)


def cuda_device() -> torch.device:
    import torch

    if not torch.cuda.is_available():
        raise NoCuda(f"no CUDA device visible to torch {torch.__version__} (built with CUDA {torch.version.cuda})")
    return torch.device("cuda", 0)


@dataclass
class CliRun:
    rc: int
    """Exit status; 124 when stopped at the deadline."""
    console: str
    pgid: int
    """Its process group (empty once it returned: the tests check that)."""


def run_cli(args: Sequence[str], log: Path, timeout_s: float) -> CliRun:
    """``python -m commbench ARGS`` with its console (stdout and stderr) teed into ``log`` and to stdout.

    It runs in a process group of its own so that, past ``timeout_s``, SIGINT reaches the launcher and its ranks
    at once (the launcher's Ctrl-C path stops the ranks and names the point), then SIGKILL reaches whatever is
    left; a SIGTERM to this process (the driver's timeout) does the same first, so no rank outlives the step
    holding the GPU."""
    import threading

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "commbench", *args]
    chunks: list[str] = []
    with log.open("w") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        p = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
            start_new_session=True, errors="replace",
        )  # fmt: skip

        def tee() -> None:
            if p.stdout is None:
                return
            for line in p.stdout:
                chunks.append(line)
                f.write(line)
                f.flush()
                sys.stdout.write(line)
                sys.stdout.flush()

        def stop() -> None:
            try:
                os.killpg(p.pid, signal.SIGINT)
                p.wait(timeout=8.0)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            kill()

        def kill() -> None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # what the launcher left behind, if anything
            except ProcessLookupError:
                pass
            p.wait()

        def terminated(signum: int, frame: Any) -> None:
            kill()  # the driver kills this process 2 s after its SIGTERM: no time for the launcher's own stop
            raise SystemExit(128 + signum)

        reader = threading.Thread(target=tee, daemon=True)
        reader.start()
        old = signal.signal(signal.SIGTERM, terminated)
        try:
            rc = p.wait(timeout=max(timeout_s, 1.0))
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            stop()
            rc = 124
        finally:
            signal.signal(signal.SIGTERM, old)
        kill()  # the launcher exited: nothing of its group may keep the GPU
        reader.join(timeout=5.0)
        if timed_out:
            note = f"gpu_check: stopped `commbench run` after {timeout_s:.0f} s (the step's limit less {CLI_GRACE_S:g})"
            note += "\n"
            chunks.append(note)
            f.write(note)
    return CliRun(rc, "".join(chunks), p.pid)


def group_skips(rep: StepReport, df: pd.DataFrame, console: str) -> None:
    """A run without rows says why when its console did: a communicator group it could not build (one rank)."""
    if not len(df):
        for line in console.splitlines():
            if line.startswith("# skipped group"):
                rep.fail(f"console: {line[2:]}")


def _fresh(path: Path) -> Path:
    """``path`` emptied (only directories this script names), so a rerun into the same OUT starts clean."""
    if path.exists():
        shutil.rmtree(path)
    return path


def sweep_args(run: Path, lo: str, hi: str, factor: str, extra: Sequence[str] = ()) -> list[str]:
    """`commbench run` of every collective x precision in a 1-rank NCCL world, checked, sizes ``lo..hi``."""
    return [
        "run", "--nproc", "1", "--backend", "nccl", "--groups", "world",
        "--collectives", ",".join(COLLECTIVES), "--precisions", ",".join(PRECISIONS),
        "-b", lo, "-e", hi, "-f", factor, *FAST_TIMING, "--check", "--no-training", "--no-report", "--quiet",
        *extra, "--out", str(run),
    ]  # fmt: skip


def native_args(run: Path) -> list[str]:
    """`commbench run` of the native fp8 precisions on the collectives that reduce (NCCL's init log kept)."""
    return [
        "run", "--nproc", "1", "--backend", "nccl", "--groups", "world", "--collectives", "all_reduce,reduce_scatter",
        "--precisions", ",".join(NATIVE_PRECISIONS), "-b", "4K", "-e", "64K", "-f", "16", *FAST_TIMING,
        "--check", "--no-training", "--no-report", "--quiet", "--nccl-debug", "--out", str(run),
    ]  # fmt: skip


def training_args(toml: Path, run: Path) -> list[str]:
    """`commbench run` of the training suite ``toml`` (every policy) in a 1-rank NCCL world."""
    return ["run", str(toml), "--nproc", "1", "--backend", "nccl", "--quiet", "--no-report", "--out", str(run)]


def step_device(ctx: Context, rep: StepReport) -> None:
    import torch
    import torch.distributed as dist

    from commbench.measure import fp8

    dev = cuda_device()
    props = torch.cuda.get_device_properties(dev)
    rep.fig("gpu", props.name)
    rep.fig("capability", f"{props.major}.{props.minor}")
    rep.fig("memory_gib", props.total_memory / 2**30)
    rep.fig("devices", torch.cuda.device_count())
    rep.fig("torch", torch.__version__)
    rep.fig("cuda", torch.version.cuda)
    rep.check(dist.is_available() and dist.is_nccl_available(), "torch.distributed has no NCCL backend")
    try:
        v = torch.cuda.nccl.version()
        rep.fig("nccl", ".".join(map(str, v)) if isinstance(v, tuple) else str(v))
    except (RuntimeError, AttributeError) as e:
        rep.fail(f"torch.cuda.nccl.version() failed: {e}")
    rep.fig("fp8_codec", fp8.codec_info(dev))
    rep.fig("cpu_codec", fp8.kernel_status())
    rep.fig("python", sys.version.split()[0])
    rep.fig("cpus", os.cpu_count())
    f = rep.figures
    print(
        f"{f['gpu']} (sm_{props.major}{props.minor}, {f['memory_gib']:.0f} GiB, {f['devices']} device(s)); "
        f"torch {f['torch']}, CUDA {f['cuda']}, NCCL {f.get('nccl', '?')}; fp8 codec on CUDA: {f['fp8_codec']}"
    )


def _sweep(ctx: Context, rep: StepReport, name: str, sizes: tuple[str, str, str], extra: Sequence[str] = ()) -> None:
    from commbench.core.units import parse_size, size_grid
    from commbench.store.results import load, load_metadata

    cuda_device()
    run = _fresh(ctx.out / name / "run")
    lo, hi, factor = sizes
    args = sweep_args(run, lo, hi, factor, extra)
    cli = run_cli(args, ctx.out / name / "console.log", ctx.left_s() - CLI_GRACE_S)
    rep.fig("cli_rc", cli.rc)
    rep.check(cli.rc == 0, f"`commbench run` exited with status {cli.rc} (see {name}/console.log)")
    try:
        df, meta = load(run), load_metadata(run)
    except Exception as e:  # noqa: BLE001 - a missing or broken run directory is this step's finding
        rep.fail(f"cannot read the run directory: {e}")
        return
    rep.fig("device", meta.get("device_name") or meta.get("device"))
    rep.fig("fp8_codec", meta.get("fp8_codec"))
    grid = size_grid(parse_size(lo), parse_size(hi), int(factor))
    group_skips(rep, df, cli.console)
    check_sweep(rep, df, expected_pairs(COLLECTIVES, PRECISIONS, "nccl"), grid, "nccl")
    big = df[df["fp32_bytes"] == max(grid)] if len(df) else df
    for prec in ("fp32", "fp8_e4m3"):
        row = big[(big["collective"] == "all_reduce") & (big["precision"] == prec)]
        if len(row):
            rep.fig(f"all_reduce {prec} {_size(max(grid))} total_us", float(row["total_us"].iloc[0]))


def step_sweep(ctx: Context, rep: StepReport) -> None:
    _sweep(ctx, rep, "sweep", SWEEP_SIZES)


def step_sweep_256m(ctx: Context, rep: StepReport) -> None:
    # CUDA events time this one (--device-timer events); the small sweep keeps the host clock
    _sweep(ctx, rep, "sweep_256m", BIG_SWEEP_SIZES, ("--device-timer", "events"))


def step_native(ctx: Context, rep: StepReport) -> None:
    from commbench.store.results import load, load_metadata

    cuda_device()
    run = _fresh(ctx.out / "native" / "run")
    args = native_args(run)
    cli = run_cli(args, ctx.out / "native" / "console.log", ctx.left_s() - CLI_GRACE_S)
    rep.fig("cli_rc", cli.rc)
    rep.check(
        cli.rc == 0, f"`commbench run` of native fp8 exited with status {cli.rc}: a failed probe must skip, not abort"
    )
    try:
        meta = load_metadata(run)
        df = load(run)
    except Exception as e:  # noqa: BLE001
        rep.fail(f"cannot read the run directory: {e}")
        return
    group_skips(rep, df, cli.console)
    check_native(rep, df, meta, cli.console, NATIVE_PRECISIONS)
    rep.fig("nccl_debug_logs", len(list((run / "logs").glob("nccl*"))) if (run / "logs").is_dir() else 0)
    native = df[df["impl"] == "fp8_native"] if len(df) else df
    if len(native):
        bad = native[native["wrong"].isna() | (native["wrong"] != 0)]
        for _, row in bad.iterrows():
            rep.fail(f"{row['collective']} x {row['precision']} at {_size(row['fp32_bytes'])}: #wrong = {row['wrong']}")


def step_hook(ctx: Context, rep: StepReport) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    dev = cuda_device()
    torch.cuda.set_device(dev)
    store = _fresh(ctx.out / "hook") / "rendezvous"
    store.parent.mkdir(parents=True, exist_ok=True)
    dist.init_process_group(
        "nccl", init_method=f"file://{store}", rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=max(30.0, ctx.left_s())), device_id=dev,
    )  # fmt: skip
    try:
        numel = BIG_BYTES // 4
        rep.fig("bucket_fp32_bytes", BIG_BYTES)
        for name in HOOK_CODECS:
            t0 = time.monotonic()
            found = hook_vs_sync(name, numel, dev)
            torch.cuda.synchronize()
            rep.fig(f"{name} s", time.monotonic() - t0)
            rep.fig(f"{name} differing elements", sum(found.values()))
            for where, bad in found.items():
                rep.check(
                    bad == 0,
                    f"{name} {where}: {bad} of {numel} elements differ from the synchronous chunked all_reduce",
                )
    finally:
        dist.destroy_process_group()


def step_codec_exact(ctx: Context, rep: StepReport) -> None:
    import torch

    from commbench.measure import fp8

    dev = cuda_device()
    cpu = torch.device("cpu")
    rep.fig("cpu_path", fp8.kernel_status())
    rep.fig("cuda_path", fp8.codec_info(dev))

    def plain(thunk: Callable[[], CodecResult]) -> CodecResult:
        return thunk()

    codec_exact_cases(rep, plain, plain, cpu, dev, ("CPU", "CUDA"))


def time_cuda(fn: Callable[[], Any], reps: int = 10, trials: int = 3, warmup: int = 3) -> tuple[float, float]:
    """(seconds per call of ``fn`` on the current stream by CUDA events, seconds of its first call by the host
    clock). Per call: the best of ``trials`` means over ``reps`` back-to-back calls, after ``warmup`` calls
    (first-call costs: allocation, compilation, which the second figure shows)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3 / reps)
    return best, first


def step_codec_speed(ctx: Context, rep: StepReport) -> None:
    import torch

    from commbench.measure import fp8

    dev = cuda_device()
    n = BIG_BYTES // 4
    x = torch.randn(n, device=dev)
    y = torch.empty_like(x)
    q = torch.empty(n, dtype=torch.uint8, device=dev)
    copy_s, _ = time_cuda(lambda: y.copy_(x))
    rep.fig("tensor_fp32_bytes", BIG_BYTES)
    rep.fig("copy_gbps", 8 * n / copy_s / 1e9)
    for fmt, scaling in CODEC_CASES:
        s = torch.empty(fp8.num_scales(n, scaling, CODEC_BLOCK), dtype=torch.float32, device=dev)
        enc_s, enc_first = time_cuda(partial(fp8.quantize, x, fmt, scaling, CODEC_BLOCK, out=(q, s)))
        dec_s, dec_first = time_cuda(partial(fp8.dequantize, q, s, fmt, scaling, CODEC_BLOCK, out=y))
        f = copy_fraction(enc_s, dec_s, copy_s, n)
        label = f"{fmt} {scaling}"
        shown = {k: round(v, 3) for k, v in f.items() if k != "copy_gbps"}
        rep.fig(label, {**shown, "first_calls_s": round(enc_first + dec_first, 3)})
        rep.check(
            f["fraction"] >= MIN_COPY_FRACTION,
            f"{label}: encode + decode at {f['encode_decode_gbps']:.0f} GB/s is {f['fraction']:.2f} of the device copy "
            f"({f['copy_gbps']:.0f} GB/s), below {MIN_COPY_FRACTION}",
        )


def step_training(ctx: Context, rep: StepReport) -> None:
    from commbench.store.results import load_training
    from commbench.training.policies import list_policies

    cuda_device()
    base = ctx.out / "training"
    run = _fresh(base / "run")
    base.mkdir(parents=True, exist_ok=True)
    toml = base / "train.toml"
    toml.write_text(TRAINING_TOML)
    args = training_args(toml, run)
    cli = run_cli(args, base / "console.log", ctx.left_s() - CLI_GRACE_S)
    rep.fig("cli_rc", cli.rc)
    rep.check(
        cli.rc == 0, f"`commbench run` of the training suite exited with status {cli.rc} (see training/console.log)"
    )
    try:
        df = load_training(run)
    except Exception as e:  # noqa: BLE001
        rep.fail(f"cannot read the run directory: {e}")
        return
    check_training(rep, df, list_policies(), "cuda_allocator", layout_skips(TRAINING_TOML, world_size=1))


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


STEPS: dict[str, Callable[[Context, StepReport], None]] = {
    "device": step_device,
    "sweep": step_sweep,
    "sweep_256m": step_sweep_256m,
    "native": step_native,
    "hook": step_hook,
    "codec_exact": step_codec_exact,
    "codec_speed": step_codec_speed,
    "training": step_training,
}
"""The steps in the order the driver runs them (``gpu_check.sh`` lists them with their timeouts)."""


def run_step(name: str, out: Path, limit_s: float) -> StepReport:
    """Run one step and write its record; an exception is a failure that names itself."""
    rep = StepReport(name, limit_s=limit_s)
    ctx = Context(out, limit_s)
    t0 = time.monotonic()
    try:
        STEPS[name](ctx, rep)
    except NoCuda as e:
        rep.fail(str(e))
    except Exception as e:  # noqa: BLE001 - the step's finding, with where it came from
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
        rep.fail(f"raised {type(e).__name__}{where}: {e}")
        traceback.print_exc()
    rep.wall_s = time.monotonic() - t0
    write_record(out, rep)
    return rep


def preflight() -> str | None:
    """Why this machine cannot run the check (one line), or None."""
    try:
        import torch
    except ImportError as e:
        return f"gpu_check: cannot import torch ({e}): nothing was tested"
    if not torch.cuda.is_available():
        return (
            f"gpu_check: no CUDA device visible to torch {torch.__version__} (built with CUDA {torch.version.cuda}): "
            "nothing was tested"
        )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("preflight", help="exit 0 if torch sees a CUDA device, else one line and exit 2")
    s = sub.add_parser("step", help="run one step and write OUT/steps/NAME.json")
    s.add_argument("name", choices=list(STEPS))
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--limit", type=float, required=True, help="the step's timeout in the driver, seconds")
    m = sub.add_parser("summary", help="write OUT/summary.txt and summary.json; exit 1 if any step failed")
    m.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.command == "preflight":
        why = preflight()
        if why:
            print(why, file=sys.stderr)
            return 2
        return 0
    if args.command == "step":
        # SIGINT as a Python handler here means the commands a step starts get SIGINT's default, even when the
        # driver was started as a background job (which ignores it): the launcher's Ctrl-C path must work.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        rep = run_step(args.name, args.out, args.limit)
        for msg in rep.failures:
            print(f"gpu_check: {args.name}: FAIL {msg}", file=sys.stderr)
        return 0 if rep.ok else 1
    reports = collect(args.out)
    text = write_summary(args.out, reports)
    print(text, end="")
    return 0 if reports and all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
