"""Run ``python -m commbench`` in a subprocess the way a user does (shared by the CLI tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FAST = ["--min-time", "0.002", "--min-iters", "1", "--repeats", "3", "--warmup", "1", "--max-time", "0.3", "--quiet", "--no-report",
        "--no-training"]  # sampling bounded: the suite's adaptive --max-time would sample a noisy point for 3 s


def commbench(*args: str, cwd: Path, timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "commbench", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env
    )
