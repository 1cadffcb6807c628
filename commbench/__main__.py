"""``python -m commbench``: the only place that turns errors into exit codes."""

import sys

from commbench.cli import main

if __name__ == "__main__":
    sys.exit(main())
