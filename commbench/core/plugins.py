"""The one plugin loader: what fills commbench's registries, built-in or not.

A registry (collectives, precisions and codecs, group kinds, training policies, figures, suite tables) never imports
its implementations: it asks :func:`load` first, which imports, once per process,

1. the built-in plugin modules (:data:`BUILTINS`, by name: they register what commbench ships),
2. every entry point of the group ``commbench.plugins`` of the installed distributions (a module, registering at
   import, or a callable taking no argument), and
3. the modules named by ``--plugin MODULE`` or by ``COMMBENCH_PLUGINS`` (comma-separated), which the CLI sets so that
   spawned ranks, torchrun's children and emulated nodes load the same plugins as the process that started them.

A plugin that cannot be imported is a :class:`PluginError`, one line naming it, where it came from and why.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass

ENTRY_POINT_GROUP = "commbench.plugins"
ENV = "COMMBENCH_PLUGINS"

BUILTINS: tuple[str, ...] = (
    "commbench.measure.collectives",
    "commbench.measure.groups",
    "commbench.measure.precision",
    "commbench.measure.fp8_ops",
    "commbench.measure.raw_codec",
    "commbench.training.models",
    "commbench.training.policies",
    "commbench.training.config",
    "commbench.views.plots",
)
"""Modules that register what commbench ships, in an order where each finds what it builds on."""


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
_state = {"builtins": False, "external": False, "busy": False}


def _import(module: str, source: str) -> None:
    if module in _DONE:
        return
    try:
        importlib.import_module(module)
    except Exception as e:  # any failure of a user's module is reported as one line
        raise PluginError(f"cannot load plugin {module!r} ({source}): {type(e).__name__}: {e}") from None
    _DONE.add(module)
    _LOADED.append(Loaded(source, module))


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


def load(*, builtins: bool = True) -> list[Loaded]:
    """Load the plugins (idempotent; re-entrant calls made while a plugin imports return at once). With
    ``builtins=False`` only the external plugins (entry points, ``--plugin``): for views, whose built-in figures are
    already imported and which must not pull in torch through the measurement built-ins."""
    if _state["busy"]:
        return list(_LOADED)
    _state["busy"] = True
    try:
        if builtins and not _state["builtins"]:
            for m in BUILTINS:
                _import(m, "builtin")
            _state["builtins"] = True
        if not _state["external"]:
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
