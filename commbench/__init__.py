"""commbench: communication-precision benchmarking for distributed PyTorch.

Public API (documented in docs/api.md): load a run directory into pandas (:func:`load`, :func:`load_metadata`,
:func:`load_training`, :func:`load_training_steps`, :func:`load_crossover`), the views as tables and figures
(:func:`compare` runs, :func:`check` a run against bars, the report's :func:`figures`), the size helpers, capacity planning
(:func:`fit` a cost model, :func:`plan` a training configuration), and what an extension needs: the base classes and
registration functions of collectives, precisions, codecs and training policies, the report's figure registry, the
generic :class:`Registry` and the plugin loader (:func:`load_plugins`).
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from commbench.core.records import COMMBENCH_VERSION as __version__
from commbench.core.units import format_size, parse_size

if _TYPE_CHECKING:
    from commbench.core.plugins import load as load_plugins
    from commbench.core.registry import Registry
    from commbench.measure.codec import Codec, register_codec
    from commbench.measure.collectives import Collective, register_collective
    from commbench.measure.precision import Precision, register_precision
    from commbench.planning.fitting import fit
    from commbench.planning.plan import plan
    from commbench.store.results import (
        RunDirError,
        load,
        load_crossover,
        load_metadata,
        load_training,
        load_training_steps,
    )
    from commbench.training.policies import Policy, register_policy
    from commbench.views.api import check, compare, figures
    from commbench.views.plots import FIGURES

# Lazy (name -> module, attribute): the loaders pull in pandas, `fit`/`plan` numpy and the strategy formulas, the
# figures matplotlib, so `python -m commbench --help` pays for none of them.
_LAZY: dict[str, tuple[str, str]] = {
    **{n: ("commbench.store.results", n) for n in ("RunDirError", "load", "load_crossover", "load_metadata")},
    **{n: ("commbench.store.results", n) for n in ("load_training", "load_training_steps")},
    "fit": ("commbench.planning.fitting", "fit"),
    "plan": ("commbench.planning.plan", "plan"),
    "load_plugins": ("commbench.core.plugins", "load"),
    "Registry": ("commbench.core.registry", "Registry"),
    "Collective": ("commbench.measure.collectives", "Collective"),
    "register_collective": ("commbench.measure.collectives", "register_collective"),
    "Precision": ("commbench.measure.precision", "Precision"),
    "register_precision": ("commbench.measure.precision", "register_precision"),
    "Codec": ("commbench.measure.codec", "Codec"),
    "register_codec": ("commbench.measure.codec", "register_codec"),
    "Policy": ("commbench.training.policies", "Policy"),
    "register_policy": ("commbench.training.policies", "register_policy"),
    "FIGURES": ("commbench.views.plots", "FIGURES"),
    **{n: ("commbench.views.api", n) for n in ("check", "compare", "figures")},
}


def __getattr__(name: str) -> _Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'commbench' has no attribute {name!r}")


__all__ = [
    "Codec",
    "Collective",
    "FIGURES",
    "Policy",
    "Precision",
    "Registry",
    "RunDirError",
    "__version__",
    "check",
    "compare",
    "figures",
    "fit",
    "format_size",
    "load",
    "load_crossover",
    "load_metadata",
    "load_plugins",
    "load_training",
    "load_training_steps",
    "parse_size",
    "plan",
    "register_codec",
    "register_collective",
    "register_policy",
    "register_precision",
]


def __dir__() -> list[str]:
    # the public API (lazy names included), not the typing helpers or the submodules imported on the way
    return sorted(__all__)
