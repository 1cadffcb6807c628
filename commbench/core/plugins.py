"""The one plugin loader: what fills commbench's registries, built-in or not.

A registry (collectives, precisions and codecs, group kinds, training policies, figures, suite tables) never imports
its implementations: it asks :func:`load` first, which imports, once per process,

1. the built-in plugin modules (:data:`KINDS`, by name: they register what commbench ships; a registry loads those
   of its own kind, so listing the precisions imports neither the training models nor the figures),
2. every entry point of the group ``commbench.plugins`` of the installed distributions (a module, registering at
   import, or a callable taking no argument), and
3. the modules named by ``--plugin MODULE`` or by ``COMMBENCH_PLUGINS`` (comma-separated), which the CLI sets so that
   spawned ranks, torchrun's children and emulated nodes load the same plugins as the process that started them.

A plugin that cannot be imported is a :class:`PluginError`, one line naming it, where it came from and why.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

ENTRY_POINT_GROUP = "commbench.plugins"
ENV = "COMMBENCH_PLUGINS"

KINDS: dict[str, tuple[str, ...]] = {
    "collective": ("commbench.measure.collectives", "commbench.measure.collectives_rooted", "commbench.measure.p2p"),
    "chunked algorithm": ("commbench.measure.chunked", "commbench.measure.chunked_rooted"),
    "group": ("commbench.measure.groups",),
    "precision": ("commbench.measure.precision", "commbench.measure.fp8_ops", "commbench.measure.raw_codec"),
    "codec": ("commbench.measure.fp8_ops", "commbench.measure.raw_codec"),
    "model": ("commbench.training.models",),
    "policy": ("commbench.training.policies", "commbench.training.tensor_parallel", "commbench.training.pipeline_parallel",
               "commbench.training.context_parallel", "commbench.training.tp_pp_dp", "commbench.training.float8"),
    "suite table": ("commbench.training.config",),
    "figure": ("commbench.views.plots",),
}
"""The built-in plugin modules of each registry kind, in an order where each finds what it builds on (a codec
module registers sweep precisions too, so it fills both kinds)."""

BUILTINS: tuple[str, ...] = tuple(dict.fromkeys(m for modules in KINDS.values() for m in modules))
"""Every built-in plugin module, once (what ``load()`` with no kind imports)."""


class PluginError(ValueError):
    """A plugin module or entry point that cannot be loaded (the CLI: one line, exit 2)."""


@dataclass(frozen=True)
class Loaded:
    """One loaded plugin: ``source`` is ``builtin``, ``entry point <dist>`` or ``--plugin``; ``name`` its module
    (or ``name = value`` of the entry point)."""

    source: str
    name: str


_LOADED: list[Loaded] = []
_DONE: set[str] = set()
_IMPORTING: set[str] = set()
_state = {"external": False, "busy": False}


def _import(module: str, source: str) -> None:
    """Import ``module`` once. A built-in's failure propagates as it is (a bug of commbench wants its traceback);
    an external plugin's is a :class:`PluginError`. A module already being imported (a plugin whose import looks
    a registry up) is left to finish."""
    if module in _DONE or module in _IMPORTING:
        return
    _IMPORTING.add(module)
    try:
        importlib.import_module(module)
    except Exception as e:  # any failure of a user's module is reported as one line
        if source == "builtin":
            raise
        raise PluginError(f"cannot load plugin {module!r} ({source}): {type(e).__name__}: {e}") from None
    finally:
        _IMPORTING.discard(module)
    _DONE.add(module)
    _LOADED.append(Loaded(source, module))


def _initializing(module: str) -> bool:
    """Whether `module` is being imported right now (its code still running: importlib marks its spec so)."""
    spec = getattr(sys.modules.get(module), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def requested() -> list[str]:
    """The modules ``--plugin`` / ``COMMBENCH_PLUGINS`` name, in order."""
    return [m.strip() for m in os.environ.get(ENV, "").split(",") if m.strip()]


def request(modules: Iterable[str]) -> None:
    """Add modules (``--plugin``) to :data:`ENV`, so that this process and every process it starts load them."""
    names = requested()
    for m in modules:
        if m not in names:
            names.append(m)
    if names:
        os.environ[ENV] = ",".join(names)
    if _state["external"]:
        for m in names:
            _import(m, "--plugin")


def _entry_points() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        key = f"{ep.name} = {ep.value}"
        if key in _DONE:
            continue
        dist = getattr(getattr(ep, "dist", None), "name", None) or "?"
        try:
            obj = ep.load()
            if callable(obj):
                obj()
        except Exception as e:
            raise PluginError(
                f"cannot load plugin entry point {key!r} of {dist} (group {ENTRY_POINT_GROUP}): {type(e).__name__}: {e}"
            ) from None
        _DONE.add(key)
        _LOADED.append(Loaded(f"entry point {dist}", key))


def load(*, builtins: bool = True, kind: str | None = None) -> list[Loaded]:
    """Load the plugins, each module once per process (idempotent): the built-ins of registry ``kind`` (all of
    them when None; none with ``builtins=False``: for views, which must not pull in torch through the measurement
    built-ins), then, on the first call, every external plugin (entry points, then ``--plugin`` modules). A call
    made while the external plugins load (a plugin's import looking a registry up) loads built-ins only."""
    if builtins:
        for m in BUILTINS if kind is None else KINDS.get(kind, ()):
            if m in _IMPORTING or _initializing(m):
                # a built-in whose import looks a registry up (through this loop, or imported directly, before any
                # load): the modules listed after it are loaded after it (by the call importing it, or the next
                # lookup), so registries keep the listed order
                break
            _import(m, "builtin")
    if not _state["external"] and not _state["busy"]:
        _state["busy"] = True
        try:
            _entry_points()
            for m in requested():
                _import(m, "--plugin")
            _state["external"] = True
        finally:
            _state["busy"] = False
    return list(_LOADED)


def loaded() -> list[Loaded]:
    """What has been loaded so far (for ``commbench list`` and the run metadata)."""
    return list(_LOADED)
