"""The public API: what ``dir(commbench)`` shows is ``__all__``, every name resolves, and the package is typed."""

from pathlib import Path

import commbench


def test_dir_is_the_public_api_and_every_name_resolves() -> None:
    assert dir(commbench) == sorted(commbench.__all__)
    assert not {"Any", "TYPE_CHECKING"} & set(dir(commbench))
    for name in commbench.__all__:
        assert getattr(commbench, name) is not None, name


def test_package_ships_py_typed() -> None:
    # PEP 561: without the marker a user's mypy ignores commbench's annotations
    assert (Path(commbench.__file__).parent / "py.typed").is_file()


def test_every_lazy_name_is_public() -> None:
    # a name the package resolves lazily but leaves out of __all__ would be undocumented (docs/api.md is __all__)
    assert set(commbench._LAZY) | {"__version__", "format_size", "parse_size"} == set(commbench.__all__)
