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


def test_compare_and_check_return_tables(tmp_path: Path) -> None:
    import pandas as pd
    import pytest

    from commbench.store.nccl_import import import_nccl_tests
    from tests import nccl_writers as w

    sizes = [1 << 16, 1 << 20]
    for name, scale in (("a", 1.0), ("b", 3.0)):
        ms = [w.Measure(s, {"out-of-place": 10.0 * scale * (1 + s / 1e5), "in-place": 10.0 * scale * (1 + s / 1e5)}) for s in sizes]
        (tmp_path / f"{name}.txt").write_text(w.nccl_text("all_reduce", ms, w.Layout(procs=1, ngpus=4)))
        import_nccl_tests(tmp_path / f"{name}.txt", tmp_path / name)
    cmp = commbench.compare(tmp_path / "a", tmp_path / "b", labels=["A", "B"], threshold="50%")
    assert isinstance(cmp, pd.DataFrame) and len(cmp) == 4  # 2 sizes x 2 placements
    assert cmp["time_ratio"].tolist() == pytest.approx([3.0] * 4, rel=1e-3)
    assert set(cmp["verdict"]) == {"B slower (threshold 50%, point estimates)"}
    assert isinstance(cmp.attrs["warnings"], list)
    gate = commbench.check(tmp_path / "b", max_slowdown="250%", baseline=tmp_path / "a")  # 3x is below 1 + 250 %
    assert isinstance(gate, pd.DataFrame) and len(gate) == 4 and gate["passed"].all()
    gate = commbench.check(tmp_path / "b", max_slowdown=1.5, baseline=tmp_path / "a")
    assert not gate["passed"].any() and len(gate.attrs["failures"]) == 4
    assert set(gate["bar"]) == {"slowdown"} and gate["limit"].tolist() == [2.5] * 4
    bus = commbench.check(tmp_path / "a", min_busbw=1e9)  # the largest size of each placement, below any such bar
    assert len(bus) == 2 and not bus["passed"].any() and set(bus["size_bytes"]) == {1 << 20}
    try:
        commbench.check(tmp_path / "a")
    except ValueError as e:
        assert "at least one bar" in str(e)
    else:
        raise AssertionError("check without a bar must raise")


def test_figures_are_the_report_s_figures(tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    from tests.views_util import fabricate_run

    run = fabricate_run(tmp_path / "run", training=False)
    figs = commbench.figures(run, names=["busbw", "latency"])
    assert list(figs) == ["busbw", "latency"] and all(isinstance(f, Figure) for f in figs.values())
    try:
        commbench.figures(run, names=["nope"])
    except ValueError as e:
        assert "unknown figure(s) nope" in str(e) and "busbw" in str(e)
    else:
        raise AssertionError("an unknown figure must raise")
