"""A registry of one kind of thing (collective, precision, group kind, policy, figure, suite table) by name.

A registry knows no implementation: looking a name up, listing or iterating first asks the plugin loader
(:func:`commbench.core.plugins.load`), so built-ins and plugins are found the same way. Every registry made here is
also known by its kind (:func:`lookup`), which lets the layer below the implementations (the suite) validate a name
without importing them. An unknown name is one ``ValueError`` line naming the kind and the valid choices.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from commbench.core import plugins

T = TypeVar("T")

REGISTRIES: dict[str, Registry[Any]] = {}


class Registry(Generic[T]):
    """Name -> object, in registration order (the order lists and tables show). Subclasses may override
    :meth:`resolve` for names with options (``fp8_e4m3:block128``)."""

    def __init__(self, kind: str, *, builtins: bool = True) -> None:
        self.kind = kind
        self._builtins = builtins
        self._items: dict[str, T] = {}
        REGISTRIES[kind] = self

    def _ready(self) -> None:
        plugins.load(builtins=self._builtins)

    def register(self, name: str, obj: T, *, replace: bool = False) -> T:
        """Add ``obj`` under ``name``; registering a taken name twice is an error unless ``replace``."""
        if name in self._items and not replace and self._items[name] is not obj:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = obj
        return obj

    def unregister(self, name: str) -> None:
        self._items.pop(name, None)

    def resolve(self, name: str) -> T:
        """The object for ``name`` (already loaded); KeyError when unknown."""
        return self._items[name]

    def get(self, name: str) -> T:
        self._ready()
        try:
            return self.resolve(name)
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; valid choices: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        self._ready()
        return list(self._items)

    def items(self) -> list[tuple[str, T]]:
        self._ready()
        return list(self._items.items())

    def values(self) -> list[T]:
        self._ready()
        return list(self._items.values())

    def __contains__(self, name: object) -> bool:
        self._ready()
        try:
            self.resolve(str(name))
        except (KeyError, ValueError):
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __getitem__(self, name: str) -> T:
        return self.get(name)


def lookup(kind: str, name: str) -> Any:
    """The object ``name`` of the registry of ``kind`` (plugins loaded first); ValueError when either is unknown."""
    plugins.load()
    if kind not in REGISTRIES:
        raise ValueError(f"unknown registry {kind!r}; valid: {', '.join(sorted(REGISTRIES))}")
    return REGISTRIES[kind].get(name)
