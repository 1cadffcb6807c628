"""Session set-up shared by every test module."""

import os

# pytest-xdist's workers export COLUMNS=80 (the controller's terminal width): the CLI that tests start would then
# draw an 80-column table, not the piped one (measure/table.PIPED_WIDTH) a user's log gets. Tests that want a width
# set it themselves (monkeypatch.setenv or the child's env).
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)
