"""``python -m commbench``: the only place that turns errors into exit codes."""

from commbench.cli import main
from commbench.launch import exit_process

if __name__ == "__main__":
    exit_process(main())
