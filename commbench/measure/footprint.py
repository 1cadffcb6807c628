"""Will the suite fit? The memory each rank's largest points hold (ops and references) against what is free,
checked before the first point allocates anything: one line naming the largest size that fits, not an
out-of-memory error halfway through a run.

It sits above :mod:`~commbench.measure.check` (the references' bytes) and :mod:`~commbench.measure.sweep` (which
precisions a group runs), which know nothing of it.
"""

from __future__ import annotations

from commbench.core.suite import SuiteConfig
from commbench.core.units import format_size
from commbench.measure.check import check_bytes
from commbench.measure.collectives import Collective, Layout, get_collective
from commbench.measure.sweep import contenders


def _largest_layouts(suite: SuiteConfig, n: int) -> list[tuple[int, Collective, Layout]]:
    out = []
    for c in suite.collectives:
        coll = get_collective(c)
        for s in suite.sizes():
            total = coll.round_total(s // 4, n)
            if total >= n:
                out.append((s, coll, coll.layout(total, n)))
    return out


def point_memory(suite: SuiteConfig, n: int, backend: str) -> list[tuple[int, int, int]]:
    """(fp32 size, op bytes, check bytes) per rank at each size of the suite, worst collective; both live on
    the rank's device (the host's memory on a CPU device).

    Op bytes: the ops of every contender of the group (the suite's precisions the backend runs, and the
    ``fp32_chunked`` the sweep adds for the algorithm/precision split: :func:`commbench.measure.sweep.contenders`),
    alive at once (the timing keeps all precisions of one size interleaved). Check bytes: the references of
    the correctness and error passes, made once per group (:func:`commbench.measure.check.check_bytes`)."""
    per_size: dict[int, tuple[int, int]] = {}
    for size, coll, layout in _largest_layouts(suite, n):
        precs = contenders(suite.precisions, coll, backend)
        dev = sum(p.buffer_bytes(coll, layout, n) for p in precs)
        dtypes = len({p.input_dtype_name for p in precs})
        chk = check_bytes(coll, layout, n, dtypes, suite.check) if precs else 0
        d0, h0 = per_size.get(size, (0, 0))
        per_size[size] = (max(d0, dev), max(h0, chk))
    return [(s, d, h) for s, (d, h) in sorted(per_size.items())]


def _gb(b: float) -> str:
    return f"{b / 1e9:.1f} GB"


def host_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (what the kernel can hand out without swapping), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_problem(
    suite: SuiteConfig,
    n: int,
    backend: str,
    local_ranks: int,
    on_gpu: bool,
    host_free: int | None,
    device_free: int | None,
) -> str | None:
    """One line saying why the suite's largest sizes cannot fit, naming the largest size that does; None
    when everything fits (or nothing is known about free memory)."""
    rows = point_memory(suite, n, backend)
    if not rows:
        return None

    def fits(ops: int, refs: int) -> tuple[bool, str]:
        # ops and references live on the rank's device: a GPU's memory, or the host's for CPU ranks
        need = ops + refs
        host_total = 0 if on_gpu else local_ranks * need
        if host_free is not None and host_total > host_free:
            return (
                False,
                f"{local_ranks} rank(s) on this host need about {_gb(host_total)} of host memory, {_gb(host_free)} available",
            )
        if on_gpu and device_free is not None and need > device_free:
            return False, f"each rank needs about {_gb(need)} of device memory, {_gb(device_free)} free"
        return True, ""

    ok_sizes = [s for s, dv, h in rows if fits(dv, h)[0]]
    size, dev, host = rows[-1]
    good, why = fits(dev, host)
    if good:
        return None
    hint = f"use -e {format_size(max(ok_sizes))} or less" if ok_sizes else "no size of this suite fits"
    return f"-e {format_size(size)} cannot fit: at that size {why}; {hint}"
