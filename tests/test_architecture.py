"""The package layout holds: layers import downward only, views never import torch.distributed, no module below
the top imports the top-level package (the contracts in pyproject.toml, run by import-linter), and no two commbench
modules import each other, directly or through others (grimp's graph, imports inside functions and under
TYPE_CHECKING included). Each checker is also shown to fail on a tiny package that breaks its rule."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]

LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"
"""``lint-imports`` in this interpreter (its console script may be on no PATH)."""


def lint_imports(cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the contracts of ``cwd/pyproject.toml``, with ``pythonpath`` first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache", "--no-logo"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The strongly connected components of more than one module among ``package``'s modules (Tarjan's
    algorithm, iterative): every import cycle lies inside one, and there is none when the list is empty."""
    mods = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    inside = set(mods)
    succ = {m: sorted(graph.find_modules_directly_imported_by(m) & inside) for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in mods:
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(succ[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(iter(it), None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp: list[str] = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    """One cycle of ``component`` as ``a -> b (l.12) -> a (l.40)``: what to cut."""
    first = component[0]
    others = [m for m in component if m != first]
    path: list[str] | None = None
    for m in others:
        there = graph.find_shortest_chain(importer=first, imported=m)
        back = graph.find_shortest_chain(importer=m, imported=first)
        if there and back:
            path = [*there, *back[1:]]
            break
    if path is None:
        return ", ".join(component)
    hops = []
    for a, b in zip(path[:-1], path[1:], strict=True):
        lines = sorted({d["line_number"] for d in graph.get_import_details(importer=a, imported=b)})
        hops.append(f"{b} (l.{','.join(map(str, lines))})")
    return " -> ".join([path[0], *hops])


def _graph(package: str) -> grimp.ImportGraph:
    return grimp.build_graph(package, cache_dir=None)


def test_commbench_is_this_checkout() -> None:
    """The graph below is of the working tree's modules, not of another installed copy."""
    import commbench

    assert commbench.__file__ is not None and Path(commbench.__file__).resolve().parent == ROOT / "commbench"


def test_import_contracts_hold() -> None:
    r = lint_imports(ROOT, ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 kept, 0 broken" in r.stdout, r.stdout


def test_no_import_cycles() -> None:
    graph = _graph("commbench")
    assert len(graph.modules) > 40  # the package was found, not an empty namespace
    found = cycles(graph, "commbench")
    assert len(found) == 0, f"{len(found)} import cycle(s):\n" + "\n".join(describe(graph, c) for c in found)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_contracts_catch_an_upward_import_inside_a_function(tmp_path: Path) -> None:
    _write(tmp_path, {
        "toy_layers/__init__.py": "",
        "toy_layers/high.py": "from toy_layers import low\n",
        "toy_layers/low.py": "def f():\n    from toy_layers import high\n    return high\n",
        "pyproject.toml": (
            '[tool.importlinter]\nroot_package = "toy_layers"\n\n[[tool.importlinter.contracts]]\nid = "l"\n'
            'name = "toy layers"\ntype = "layers"\nlayers = ["toy_layers.high", "toy_layers.low"]\n'
        ),
    })  # fmt: skip
    r = lint_imports(tmp_path, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "0 kept, 1 broken" in r.stdout and "toy_layers.low -> toy_layers.high (l.2)" in r.stdout, r.stdout


def test_the_cycle_count_sees_a_cycle_through_a_function_and_type_checking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, {
        "toy_cycle/__init__.py": "",
        "toy_cycle/a.py": "def f():\n    from toy_cycle import b\n    return b\n",
        "toy_cycle/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from toy_cycle import c\n",
        "toy_cycle/c.py": "import toy_cycle.a\n",
        "toy_cycle/d.py": "import toy_cycle.a\n",
    })  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = _graph("toy_cycle")
    found = cycles(graph, "toy_cycle")
    assert found == [["toy_cycle.a", "toy_cycle.b", "toy_cycle.c"]]
    assert describe(graph, found[0]) == "toy_cycle.a -> toy_cycle.b (l.2) -> toy_cycle.c (l.3) -> toy_cycle.a (l.1)"


def test_loading_the_quick_suite_imports_no_torch() -> None:
    """Validating a suite (collective, precision and group names, the [training] table) asks the registries,
    which know no implementation: no torch for `--help`, `list` or a supervisor that only reads the suite."""
    code = (
        "import sys\nfrom commbench.core.suite import load_suite\ns = load_suite('quick')\n"
        "assert s.training is not None and s.training.policies, s\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:5])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
