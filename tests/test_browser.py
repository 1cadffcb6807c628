"""The report in a real browser: headless Chromium (Debian's `chromium`) driven by playwright.

The page must load with no console errors, make no network request, show every figure with a
non-zero size, and run no script from hostile metadata; a screenshot is saved (to tmp_path, and to
$COMMBENCH_ARTIFACTS when set, for CI to keep). Skips, with the reason, where Chromium or
playwright is absent; `.ci/run` installs both.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from commbench.views import report
from tests.views_util import fabricate_run, real_run

CHROMIUM = os.environ.get("COMMBENCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
if not Path(CHROMIUM).is_file():
    pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="session")
def real_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_run(tmp_path_factory.getbasetemp() / "views")


@pytest.fixture(scope="module")
def browser() -> Any:
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


def open_page(browser: Any, html: Path) -> tuple[Any, dict[str, list[str]]]:
    seen: dict[str, list[str]] = {"console_errors": [], "page_errors": [], "dialogs": [], "requests": []}
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.on("console", lambda m: seen["console_errors"].append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
    page.on("request", lambda r: seen["requests"].append(r.url))

    def on_dialog(d: Any) -> None:
        seen["dialogs"].append(d.message)
        d.dismiss()

    page.on("dialog", on_dialog)
    page.goto(html.resolve().as_uri(), wait_until="load")
    return page, seen


def save_screenshot(page: Any, path: Path) -> None:
    page.screenshot(path=str(path), full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    artifacts = os.environ.get("COMMBENCH_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artifacts) / path.name)


@pytest.mark.timeout(240)
def test_report_renders_in_chromium(browser: Any, real_run_dir: Path, tmp_path: Path) -> None:
    out = report.write_report(real_run_dir, tmp_path)
    pngs = [k for k in out if k.endswith(".png")]
    page, seen = open_page(browser, out["html"])
    try:
        imgs = page.query_selector_all("figure img")
        assert len(imgs) == len(pngs) == 4
        for img in imgs:
            assert page.evaluate("(i) => i.complete && i.naturalWidth > 0 && i.naturalHeight > 0", img)
            box = img.bounding_box()
            assert box is not None and box["width"] > 0 and box["height"] > 0
        assert page.title().startswith("commbench report")
        assert page.query_selector_all("table")  # the summary and full tables rendered
        save_screenshot(page, tmp_path / "report_screenshot.png")
    finally:
        page.close()
    assert seen["console_errors"] == [] and seen["page_errors"] == []
    assert all(u.startswith(("file:", "data:")) for u in seen["requests"]), seen["requests"]


@pytest.mark.timeout(120)
def test_hostile_host_runs_no_script(browser: Any, tmp_path: Path) -> None:
    run = fabricate_run(tmp_path / "run", host="<script>alert('pwned')</script><img src=x onerror=alert(2)>")
    out = report.write_report(run)
    page, seen = open_page(browser, out["html"])
    try:
        assert "<script>alert('pwned')</script>" in page.inner_text("h1")  # shown as text
        assert len(page.query_selector_all("figure img")) == 7
        save_screenshot(page, tmp_path / "report_hostile_screenshot.png")
    finally:
        page.close()
    assert seen["dialogs"] == [] and seen["page_errors"] == [] and seen["console_errors"] == []


@pytest.mark.timeout(120)
def test_compare_page_renders(browser: Any, tmp_path: Path) -> None:
    from commbench.views.compare import compare_runs

    a = fabricate_run(tmp_path / "a", training=False)
    b = fabricate_run(tmp_path / "b", training=False, beta_gbps=4.0, world=4)
    out = compare_runs([a, b], ["A", "B"], tmp_path / "cmp")
    page, seen = open_page(browser, out["html"])
    try:
        imgs = page.query_selector_all("figure img")
        assert len(imgs) == 2
        for img in imgs:
            box = img.bounding_box()
            assert box is not None and box["width"] > 0 and box["height"] > 0
        assert "world_size (A=2, B=4)" in page.inner_text("#warnings")
        save_screenshot(page, tmp_path / "compare_screenshot.png")
    finally:
        page.close()
    assert seen["console_errors"] == [] and seen["page_errors"] == []


@pytest.mark.timeout(240)
def test_findings_above_the_fold_and_no_sideways_scroll(browser: Any, tmp_path: Path) -> None:
    """At 1280x800 the first screen shows the Findings heading; the page never scrolls sideways (wide tables
    scroll in their own container), and the training table's last column is inside the window."""
    run = fabricate_run(tmp_path / "run", host="a-rather-long-host-name.cluster.example.org")
    out = report.write_report(run)
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.goto(out["html"].resolve().as_uri(), wait_until="load")
        heading = page.query_selector("#findings h2")
        assert heading is not None and heading.inner_text() == "Findings"
        box = heading.bounding_box()
        assert box is not None and box["y"] + box["height"] <= 800
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= page.evaluate("window.innerWidth"), width
        last = page.query_selector("#table-training-gain + div table tr:first-child th:last-child")
        assert last is not None
        cell = last.bounding_box()
        assert cell is not None and cell["x"] + cell["width"] <= 1280
        page.screenshot(path=str(tmp_path / "report_1280x800.png"))
        save_screenshot(page, tmp_path / "report_1280_full.png")
        artifacts = os.environ.get("COMMBENCH_ARTIFACTS")
        if artifacts:
            shutil.copy(tmp_path / "report_1280x800.png", Path(artifacts) / "report_1280x800.png")
    finally:
        page.close()
