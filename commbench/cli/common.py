"""What every sub-command's parsing shares: the one-line error (exit 2), the parser that raises it, and the argument
types."""

from __future__ import annotations

import argparse
import re
from typing import Any

from commbench.core.names import did_you_mean
from commbench.core.units import parse_size


class CLIError(ValueError):
    """Bad input: printed as one line, exit code 2."""


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's default exits itself; we want one line and code 2
        bad = _INVALID_CHOICE.search(message)  # argparse names no close choice before Python 3.14: we do
        near = did_you_mean(bad[1], re.findall(r"'([^']*)'", bad[2])) if bad else ""
        raise CLIError(f"{message}{near} (see `{self.prog} --help`)")


def csv_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return items


def size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v
