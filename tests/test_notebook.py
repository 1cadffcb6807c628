"""notebooks/analysis.ipynb, executed with nbclient against a real small run made in the test."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pandas as pd
import pytest

from tests.views_util import REPO, real_run

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = REPO / "notebooks" / "analysis.ipynb"


@pytest.fixture(scope="session")
def real_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_run(tmp_path_factory.getbasetemp() / "views")


@pytest.mark.timeout(240)
def test_notebook_runs_on_a_real_run(real_run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the kernel inherits the environment: the run to analyse, and this checkout on the path
    monkeypatch.setenv("COMMBENCH_RUN_DIR", str(real_run_dir))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    csv = pd.read_csv(real_run_dir / "results.csv")
    # the notebook read the same run: its point count and the four collective figures
    assert f"{len(csv)} points; {csv['collective'].nunique()} collectives" in text
    assert "figures drawn: ['busbw', 'effective_bw', 'latency', 'error']" in text
    # compare and check through the public API: the run against itself (A/A) differs nowhere, and passes the gate
    assert f"verdicts: {{'no significant difference': {len(csv)}}}" in text
    assert f"check: 0 of {len(csv)} points fail the 10 % slowdown bar" in text
    images = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 4  # each key plot shown once
    for img in images:
        assert base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n"
    # the peak busbw table shown equals the CSV's max per collective x precision
    html = "\n".join(o["data"].get("text/html", "") for o in outputs if "data" in o)
    peak = csv.pivot_table(index="collective", columns="precision", values="busbw_gbps", aggfunc="max")
    for v in peak.to_numpy().ravel():
        assert f"{v:.6f}" in html


def test_notebook_imports_only_the_public_package() -> None:
    # every import of the notebook's code cells: commbench itself, never a commbench.* module (internal, may move)
    import ast

    nb = nbformat.read(NOTEBOOK, as_version=4)
    names: list[str] = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        code = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))  # IPython magics
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names.append(node.module or "")
    ours = [n for n in names if n == "commbench" or n.startswith("commbench.")]
    assert ours == ["commbench"], names
    text = NOTEBOOK.read_text()
    for used in ("commbench.figures(", "commbench.compare(", "commbench.check("):
        assert used in text
