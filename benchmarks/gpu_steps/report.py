"""Step records: what each step found (`StepReport`), written as JSON per step, gathered into summary.txt and summary.json, and the driver's table of exit codes and wall times."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


def size_text(nbytes: int) -> str:
    from commbench.core.units import format_size

    return format_size(int(nbytes))
