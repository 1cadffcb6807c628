"""commbench: communication-precision benchmarking for distributed PyTorch.

Public API: load a run directory into pandas (:func:`load`, :func:`load_metadata`, :func:`load_training`,
:func:`load_training_steps`, :func:`load_crossover`), the size helpers, and the registries.
"""

from typing import TYPE_CHECKING, Any

from commbench.config import format_size, parse_size

if TYPE_CHECKING:
    from commbench.results import (
        RunDirError,
        load,
        load_crossover,
        load_metadata,
        load_training,
        load_training_steps,
    )

_FROM_RESULTS = ("RunDirError", "load", "load_crossover", "load_metadata", "load_training", "load_training_steps")

__version__ = "0.1.0"

__all__ = [
    "RunDirError",
    "__version__",
    "format_size",
    "load",
    "load_crossover",
    "load_metadata",
    "load_training",
    "load_training_steps",
    "parse_size",
]


def __getattr__(name: str) -> Any:
    # the loaders pull in pandas: imported on first use, so `python -m commbench --help` does not pay for them
    if name in _FROM_RESULTS:
        from commbench import results

        return getattr(results, name)
    raise AttributeError(f"module 'commbench' has no attribute {name!r}")
