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
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _path in (HERE.parent, HERE):  # run as a script from anywhere: the checkout's commbench and the steps package
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from gpu_steps.checks import (  # noqa: E402, F401 - re-exported: the tests and the driver ask gpu_check
    SKIP_WORDS,
    check_native,
    check_sweep,
    check_training,
    expected_pairs,
    layout_skips,
    skip_notes,
    walk_strings,
)
from gpu_steps.codec import (  # noqa: E402, F401 - re-exported: the tests and the driver ask gpu_check
    CodecResult,
    bits_of,
    codec_decode_all,
    codec_exact_cases,
    codec_inputs,
    codec_roundtrip,
    compare_codec,
    copy_fraction,
    nan_code_differences,
    special_values,
    time_cuda,
)
from gpu_steps.constants import (  # noqa: E402, F401 - re-exported: the tests and the driver ask gpu_check
    BIG_BYTES,
    BIG_SWEEP_SIZES,
    CLI_GRACE_S,
    CODEC_BLOCK,
    CODEC_CASES,
    COLLECTIVES,
    FAST_TIMING,
    HOOK_CODECS,
    MIB,
    MIN_COPY_FRACTION,
    NATIVE_PRECISIONS,
    PRECISIONS,
    REPO,
    SWEEP_SIZES,
    TRAINING_TOML,
    NoCuda,
)
from gpu_steps.hook import (  # noqa: E402, F401 - re-exported: the tests and the driver ask gpu_check
    DuckBucket,
    gradient_like,
    hook_control,
    hook_vs_sync,
    sync_chunked_all_reduce,
)
from gpu_steps.probes import (  # noqa: E402, F401 - re-exported: the tests and the driver ask gpu_check
    agree,
    events_vs_host,
    kernels_of,
    step_counts,
    step_cuda_graph,
    step_launch,
    step_memory,
)
from gpu_steps.report import (  # noqa: E402, F401 - re-exported: the tests and the driver ask gpu_check
    StepReport,
    collect,
    read_driver_table,
    record_path,
    size_text,
    summary_text,
    write_record,
    write_summary,
)
from gpu_steps.runs import (  # noqa: E402, F401 - re-exported: the tests and the driver ask gpu_check
    CliRun,
    Context,
    cuda_device,
    fresh_dir,
    group_skips,
    native_args,
    run_cli,
    sweep_args,
    training_args,
)
from gpu_steps.steps import (  # noqa: E402, F401 - re-exported: the tests and the driver ask gpu_check
    step_codec_exact,
    step_codec_speed,
    step_device,
    step_hook,
    step_native,
    step_sweep,
    step_sweep_256m,
    step_training,
)

STEPS: dict[str, Callable[[Context, StepReport], None]] = {
    "device": step_device,
    "sweep": step_sweep,
    "codec_exact": step_codec_exact,
    "codec_speed": step_codec_speed,
    "sweep_256m": step_sweep_256m,
    "native": step_native,
    "hook": step_hook,
    "counts": step_counts,
    "training": step_training,
    "memory": step_memory,
    "launch": step_launch,
    "cuda_graph": step_cuda_graph,
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
