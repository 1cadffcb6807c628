"""Session set-up shared by every test module."""

import os
import sys

# pytest-xdist's workers export COLUMNS=80 (the controller's terminal width): the CLI that tests start would then
# draw an 80-column table, not the piped one (measure/table.PIPED_WIDTH) a user's log gets. Tests that want a width
# set it themselves (monkeypatch.setenv or the child's env).
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)

# Bytecode caches on, whatever PYTHONDONTWRITEBYTECODE says (this project's machines set it): without them every
# `python -m commbench` the tests start (a few hundred) compiles commbench's modules from source again, and pytest
# rewrites every test module's asserts again on each run (benchmarks/results/2026-12-04_2core-vm_gloo.md). The
# caches land in __pycache__ folders, which git ignores.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
