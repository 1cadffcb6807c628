"""A registry of one kind of thing (collective, precision, codec, group kind, policy, figure, suite table) by name.

A registry knows no implementation: looking a name up, listing or iterating first asks the plugin loader
(:func:`commbench.core.plugins.load`) for the built-ins of its kind and the external plugins, so built-ins and
plugins are found the same way. Every registry made here is also known by its kind (:func:`lookup`), which lets
the layer below the implementations (the suite) validate a name without importing them. An unknown name is one
``ValueError`` line naming the kind and the valid choices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from commbench.core import plugins
from commbench.core.names import canonical, unknown

T = TypeVar("T")
D = TypeVar("D")

REGISTRIES: dict[str, Registry[Any]] = {}
"""Every registry by kind (filled as the modules that make them are imported)."""

_MISSING: Any = object()


class Registry(Generic[T]):
    """Name -> object, in registration order (the order lists and tables show). Subclasses may override
    :meth:`resolve` for names with options (:class:`OptionRegistry`: ``fp8_e4m3:block128``).

    ``builtins=False``: a lookup loads the external plugins only (the figures of the views, which must not pull
    in torch through a measurement built-in)."""

    def __init__(self, kind: str, *, builtins: bool = True) -> None:
        self.kind = kind
        self._builtins = builtins
        self._items: dict[str, T] = {}
        REGISTRIES[kind] = self

    def _ready(self) -> None:
        plugins.load(builtins=self._builtins, kind=self.kind)

    def register(self, name: str, obj: T, *, replace: bool = False) -> T:
        """Add ``obj`` under ``name``; registering a taken name twice is an error unless ``replace``."""
        if name in self._items and not replace and self._items[name] is not obj:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = obj
        return obj

    def unregister(self, name: str) -> None:
        self._items.pop(name, None)

    def resolve(self, name: str) -> T:
        """The object for ``name`` (plugins already loaded); KeyError when unknown."""
        return self._items[name]

    @overload
    def get(self, name: str) -> T: ...
    @overload
    def get(self, name: str, default: D) -> T | D: ...

    def get(self, name: str, default: Any = _MISSING) -> Any:
        """The object ``name``; an unknown name raises ``ValueError`` naming the valid choices, or, given a
        ``default`` (as ``dict.get``), returns it. A bad option of a known name raises either way."""
        self._ready()
        try:
            return self.resolve(canonical(self.kind, name))
        except KeyError:
            if default is not _MISSING:
                return default
            raise ValueError(unknown(self.kind, name, self.names())) from None

    def names(self) -> list[str]:
        self._ready()
        return list(self._items)

    def items(self) -> list[tuple[str, T]]:
        self._ready()
        return list(self._items.items())

    def values(self) -> list[T]:
        return [obj for _, obj in self.items()]

    def __contains__(self, name: object) -> bool:
        self._ready()
        try:
            self.resolve(canonical(self.kind, str(name)))
        except (KeyError, ValueError):
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __setitem__(self, name: str, obj: T) -> None:
        """``registry[name] = obj`` registers, replacing (what ``monkeypatch.setitem`` does in tests)."""
        self.register(name, obj, replace=True)

    def __delitem__(self, name: str) -> None:
        self.unregister(name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind!r}: {', '.join(self._items)})"


@dataclass(frozen=True, slots=True)
class Family(Generic[T]):
    """The objects of one base name of an :class:`OptionRegistry`: ``build(option)`` makes the one that
    ``base:option`` names (``option`` None for the bare name); ``options_help`` says which options it accepts."""

    build: Callable[[str | None], T]
    options_help: str = ""


class OptionRegistry(Registry[T]):
    """A registry whose names carry an option after a colon (``fp8_e4m3:block128``): each base name is a
    :class:`Family` that builds the object for an option. ``names()`` lists the base names; ``get`` and
    ``items`` build (``items`` with no option); an unknown base and an empty option are one ``ValueError`` line,
    a bad option is the family's own ``ValueError``."""

    def __init__(self, kind: str, *, builtins: bool = True) -> None:
        super().__init__(kind, builtins=builtins)
        self._families: dict[str, Family[T]] = {}

    def register_family(
        self, base: str, build: Callable[[str | None], T], options_help: str = "", *, replace: bool = False
    ) -> None:
        """Add the family ``base`` (``build(option)``; ``options_help`` documents the ``:option`` values)."""
        if ":" in base or not base.strip():
            raise ValueError(f"{self.kind} name {base!r} must be non-empty and without ':'")
        if base in self._families and not replace:
            raise ValueError(f"{self.kind} {base!r} is already registered")
        self._families[base] = Family(build, options_help)

    def register(self, name: str, obj: T, *, replace: bool = False) -> T:
        """A family of one object, which takes no option."""

        def build(option: str | None) -> T:
            if option is not None:
                raise ValueError(f"{self.kind} {name!r} takes no ':{option}' option")
            return obj

        self.register_family(name, build, replace=replace)
        return obj

    def unregister(self, name: str) -> None:
        self._families.pop(name, None)

    def resolve(self, name: str) -> T:
        base, sep, option = name.strip().partition(":")
        family = self._families[base]
        if sep and not option:
            raise ValueError(f"{self.kind} {name!r} has an empty option after ':'")
        return family.build(option if sep else None)

    def family(self, base: str) -> Family[T]:
        """The family of ``base`` (a ``ValueError`` naming the valid choices when unknown)."""
        self._ready()
        base = canonical(self.kind, base)
        if base not in self._families:
            raise ValueError(unknown(self.kind, base, self._families))
        return self._families[base]

    def options_help(self) -> dict[str, str]:
        """Base name -> the options it accepts, in words ("" for none)."""
        self._ready()
        return {base: f.options_help for base, f in self._families.items()}

    def names(self) -> list[str]:
        self._ready()
        return list(self._families)

    def items(self) -> list[tuple[str, T]]:
        return [(base, self.resolve(base)) for base in self.names()]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind!r}: {', '.join(self._families)})"


def lookup(kind: str, name: str) -> Any:
    """The object ``name`` of the registry of ``kind`` (its built-ins and the plugins loaded first); ValueError
    when either is unknown."""
    plugins.load(kind=kind)
    if kind not in REGISTRIES:
        raise ValueError(unknown("registry", kind, sorted(set(REGISTRIES) | set(plugins.KINDS))))
    return REGISTRIES[kind].get(name)


def names_of(kind: str) -> list[str]:
    """Every name the registry of ``kind`` holds (its built-ins and the plugins loaded first), in its order."""
    plugins.load(kind=kind)
    if kind not in REGISTRIES:
        raise ValueError(unknown("registry", kind, sorted(set(REGISTRIES) | set(plugins.KINDS))))
    return REGISTRIES[kind].names()


def canonical_name(kind: str, name: str) -> str:
    """commbench's own name for ``name`` of ``kind`` (another tool's alias resolved, an option kept), checked: a
    ``ValueError`` line (valid choices, the closest ones) when the registry of ``kind`` has no such thing."""
    lookup(kind, name)
    return canonical(kind, name)
