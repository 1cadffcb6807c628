"""``python -m commbench``: the only place that turns errors into exit codes."""

import sys

from commbench.cli import main


def _exit(code: int) -> None:
    # launch (and torch with it) is imported only by commands that use it: `--help` and `list` stay instant.
    # A process that never imported it never joined a world, so a plain exit is the right one.
    launch = sys.modules.get("commbench.cluster.launch")
    if launch is None:
        sys.exit(code)
    launch.exit_process(code)


def _run() -> int:
    try:
        return main()
    except BrokenPipeError:
        # `python -m commbench list | head`: the reader left; say nothing more (Python docs, "Note on SIGPIPE").
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    _exit(_run())
