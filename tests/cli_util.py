"""Run ``python -m commbench`` in a subprocess the way a user does (shared by the CLI tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

FAST = ["--min-time", "0.002", "--min-iters", "1", "--repeats", "3", "--warmup", "1", "--max-time", "0.3", "--quiet", "--no-report",
        "--no-training"]  # sampling bounded: the suite's adaptive --max-time would sample a noisy point for 3 s


def commbench(*args: str, cwd: Path, timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    full_env.update(env or {})
    # SIGINT back to its default in the child, as a terminal's foreground job has it: a shell that starts the suite
    # as a background job (`cmd &` without job control) hands every child SIGINT ignored, and the launcher of a run
    # would then never see the Ctrl-C that the tests inject (COMMBENCH_INJECT_SIGNAL)
    return subprocess.run(
        [sys.executable, "-m", "commbench", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env,
        preexec_fn=_sigint_default,
    )


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def commbench_here(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``commbench.cli.main(args)`` in this process, as `commbench` reports it (exit code, stdout, stderr): for input
    refused before anything is launched, without a fresh interpreter's 3 s of imports per case. The environment and
    the working directory are restored (main records its argv in COMMBENCH_ARGV)."""
    import contextlib
    import io

    from commbench.cli import main

    out, err, env, here = io.StringIO(), io.StringIO(), dict(os.environ), os.getcwd()
    try:
        os.chdir(cwd)  # contextlib.chdir is Python 3.11's
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's own refusals
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(env)
    return subprocess.CompletedProcess(["commbench", *args], code, out.getvalue(), err.getvalue())
