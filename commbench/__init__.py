"""commbench: communication-precision benchmarking for distributed PyTorch.

Public API: load a run directory into pandas (:func:`load`, :func:`load_metadata`, :func:`load_training`,
:func:`load_training_steps`, :func:`load_crossover`), the size helpers, and the registries.
"""

from commbench.config import format_size, parse_size
from commbench.results import (
    RunDirError,
    load,
    load_crossover,
    load_metadata,
    load_training,
    load_training_steps,
)

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
