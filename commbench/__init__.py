"""commbench: communication-precision benchmarking for distributed PyTorch.

Public API: load a run directory into pandas (:func:`load`, :func:`load_metadata`, :func:`load_training`,
:func:`load_training_steps`, :func:`load_crossover`), the size helpers, the registries, and capacity planning (:func:`fit` a cost model,
:func:`plan` a training configuration).
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from commbench.core.units import format_size, parse_size

if _TYPE_CHECKING:
    from commbench.store.results import (
        RunDirError,
        load,
        load_crossover,
        load_metadata,
        load_training,
        load_training_steps,
    )

_FROM_RESULTS = ("RunDirError", "load", "load_crossover", "load_metadata", "load_training", "load_training_steps")

__version__ = "0.1.0"


def __getattr__(name: str) -> _Any:
    # Lazy: the loaders pull in pandas (so `python -m commbench --help` does not pay for them); `fit` and `plan`
    # pull in numpy fitting and torch (the strategy formulas). `commbench.plan` is the plan module made callable
    # (see commbench/plan.py), so it is the function's stand-in whether or not the submodule was imported first.
    if name in _FROM_RESULTS:
        from commbench.store import results

        return getattr(results, name)
    if name == "fit":
        from commbench.planning.costmodel import fit

        return fit
    if name == "plan":
        import importlib

        return importlib.import_module("commbench.planning.plan")
    raise AttributeError(f"module 'commbench' has no attribute {name!r}")


__all__ = [
    "RunDirError",
    "__version__",
    "fit",
    "format_size",
    "load",
    "load_crossover",
    "load_metadata",
    "load_training",
    "load_training_steps",
    "parse_size",
    "plan",
]


def __dir__() -> list[str]:
    # the public API (lazy names included), not the typing helpers or the submodules imported on the way
    return sorted(__all__)
