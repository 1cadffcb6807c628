"""nccl-tests' flags on ``run``, with nccl-tests' meanings (nccl-tests ``src/common.cu``: its getopt table and usage).

The flags that name one of commbench's own settings are spellings of it, declared with that flag in
``commbench.cli`` (``-n/--min-iters``, ``-w/--warmup``, ``-N/--passes``, ``-d/--precisions``, ``-T/--timeout``).
This module adds the rest: ``-c N`` (nccl-tests' check count: 0 = ``--no-check``), and the flags whose nccl-tests
value either is what commbench always does (accepted: ``-a 1``, ``-z 0``, ``-g 1``) or has no meaning here (one
line saying why, exit 2). docs/running.md has the whole mapping as one table.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from commbench.cli.common import CLIError


@dataclass(frozen=True, slots=True)
class NoMeaningFlag:
    """An nccl-tests flag whose value ``same`` is what commbench always does; any other value is refused with
    ``why``."""

    short: str
    long: str
    metavar: str
    same: int
    nccl: str
    """What the flag does in nccl-tests."""
    why: str
    """Why no other value has a meaning here (and what to use instead)."""

    @property
    def dest(self) -> str:
        return "nccl_" + self.long.removeprefix("--")

    def check(self, value: int | None) -> None:
        if value is not None and value != self.same:
            raise CLIError(f"{self.short} {value} ({self.nccl}) has no meaning here: {self.why}")


ONE_RANK_PER_GPU = "commbench runs one process per GPU: --nproc N spawns N local ranks, torchrun/srun/mpirun start more"

NO_MEANING: tuple[NoMeaningFlag, ...] = (
    NoMeaningFlag(
        "-a", "--average", "0|1|2|3", 1, "nccl-tests reports rank 0's (0), the average (1), min (2) or max (3) time",
        "commbench's time_us averages the ranks' times of each sample as nccl-tests' default -a 1 does; the slowest "
        "rank's time is results.csv's time_us_max and each rank's median is in ranks.csv",
    ),
    NoMeaningFlag(
        "-z", "--blocking", "0|1", 0, "the host waits for every collective before issuing the next",
        "commbench issues k back-to-back ops and synchronizes once, as nccl-tests' default -z 0 (a gloo collective "
        "blocks on its own); --timing-mode isolated times one op at a time, after compute",
    ),
    NoMeaningFlag("-g", "--ngpus", "N", 1, "GPUs per thread", ONE_RANK_PER_GPU),
    NoMeaningFlag("-t", "--nthreads", "N", 1, "threads per process", ONE_RANK_PER_GPU),
    NoMeaningFlag(
        "-m", "--agg_iters", "N", 1, "ops aggregated into one NCCL group per iteration",
        "torch.distributed issues each collective on its own; -n sets the back-to-back ops per sample",
    ),
    NoMeaningFlag(
        "-C", "--report_cputime", "0|1", 0, "the host's time to launch the ops",
        "commbench times every op to its completion on the device, as nccl-tests' default -C 0",
    ),
)
"""nccl-tests flags whose default is what commbench always does; another value is one line, exit 2."""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _check_count(text: str) -> bool:
    """nccl-tests' ``-c N``: check N iterations; 0 turns the check off."""
    n = _int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0 = no check), got {n}")
    return n > 0


def add_nccl_tests_flags(r: argparse.ArgumentParser) -> None:
    """Add nccl-tests' ``-c`` and the flags of :data:`NO_MEANING` to the ``run`` parser."""
    g = r.add_argument_group(
        "nccl-tests flags",
        "nccl-tests' spellings: -b -e -f -n -w -N -d -T are given with commbench's flags above; these take nccl-tests' "
        "values (docs/running.md maps every flag)",
    )
    g.add_argument(
        "-c", "--check-count", dest="check", type=_check_count, metavar="N",
        help="nccl-tests' -c: 0 = --no-check, N >= 1 = --check (commbench checks each point once) (default: the "
        "suite's check)",
    )  # fmt: skip
    for f in NO_MEANING:
        g.add_argument(
            f.short, f.long, dest=f.dest, type=_int, metavar=f.metavar,
            help=f"nccl-tests' {f.short}: {f.nccl}; only {f.same}, what commbench does, is accepted (default: {f.same})",
        )  # fmt: skip


def check_nccl_tests_flags(args: argparse.Namespace) -> None:
    """One line, exit 2, for an nccl-tests flag whose value has no meaning here; ``-N 0`` (nccl-tests: cycle forever)
    too."""
    for f in NO_MEANING:
        f.check(getattr(args, f.dest, None))


def nccl_tests_notes(args: argparse.Namespace, argv: list[str]) -> list[str]:
    """What an nccl-tests flag given here does differently, in one line each (the supervisor prints them)."""
    notes = []
    given = set(argv)
    if "-c" in given and args.check:
        notes.append("-c N: commbench checks each point once (nccl-tests checks N iterations)")
    if "-N" in given and (args.passes or 1) > 1:
        notes.append(
            f"-N {args.passes}: {args.passes} passes over the grid (--passes), each taking its share of every point's "
            "rounds; a point's row pools its passes (nccl-tests repeats the whole measurement per cycle)"
        )
    return notes


__all__ = ["NO_MEANING", "NoMeaningFlag", "add_nccl_tests_flags", "check_nccl_tests_flags", "nccl_tests_notes"]
