"""The README and docs/ hold together: every relative link resolves, the README stays a README.

Links are checked as GitHub renders them: a path relative to the linking file, and for ``#anchor`` links into a
Markdown file a heading whose GitHub slug is the anchor. ``.ci/run`` executes the second command of the README's
first ``bash`` block, so that block must keep exactly two.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 120

# [text](target) and [text]: target; images too. Targets with a scheme (http:, mailto:) are external.
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_FENCE = re.compile(r"^(```|~~~)")


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [f for f in files if f.exists()]


def _unfenced(text: str) -> str:
    """The text with fenced code blocks blanked (a ``# comment`` there is no heading, a link no link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return "\n".join(out)


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", _unfenced(text))


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.strip().lower().replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    """Every anchor a Markdown file offers: its headings' slugs, numbered like GitHub when repeated."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _unfenced(md.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", md.read_text(encoding="utf-8")))
    return out


def links(md: Path) -> list[str]:
    text = _prose(md.read_text(encoding="utf-8"))
    return _INLINE.findall(text) + _REFDEF.findall(text)


def broken_links(md: Path) -> list[str]:
    """Each relative link of ``md`` that does not resolve, as 'target: why'."""
    bad = []
    for target in links(md):
        if _SCHEME.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (md.parent / path_part).resolve() if path_part else md
        if not dest.exists():
            bad.append(f"{target}: no such file {dest}")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    return bad


def first_bash_block(md: Path) -> list[str]:
    """The lines of the first ```bash block, as .ci/run's awk reads them."""
    lines, inside = [], False
    for line in md.read_text(encoding="utf-8").splitlines():
        if not inside and line.startswith("```bash"):
            inside = True
            continue
        if inside:
            if line.startswith("```"):
                return lines
            lines.append(line)
    return lines


@pytest.mark.parametrize("md", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md: Path) -> None:
    assert broken_links(md) == []


def test_docs_exist() -> None:
    names = {p.name for p in doc_files()}
    for page in (
        "running",
        "metrics",
        "methodology",
        "precisions",
        "training",
        "analysis",
        "api",
        "extending",
        "architecture",
        "development",
        "gpu",
        "timing",
    ):
        assert f"{page}.md" in names


def test_readme_is_short() -> None:
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines, at most {README_MAX_LINES}"


def test_readme_carries_no_time_stamps() -> None:
    # measurements of a machine, with their times, go to benchmarks/results/<date>_<machine>_<backend>.md
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not re.findall(r"\b\d{1,2}:\d{2}(?:[-–]\d{1,2}:\d{2})? ?UTC", text)


def test_readme_first_bash_block_is_install_and_tests() -> None:
    block = [line for line in first_bash_block(ROOT / "README.md") if line.strip()]
    assert len(block) == 2, block
    assert "python -m commbench" in block[0]
    assert "pytest" in block[1]


def test_api_page_documents_exactly_the_public_names() -> None:
    import commbench

    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^##+\s+`([A-Za-z_][A-Za-z0-9_]*)", text, re.MULTILINE))
    assert documented == set(commbench.__all__)


def test_checker_finds_broken_links(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# A Title: with `code`, punctuation!\n\n## Twice\n## Twice\n", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    md = tmp_path / "page.md"
    md.write_text(
        "# Page\n"
        "[ok](other.md) [ok anchor](other.md#a-title-with-code-punctuation) [second](other.md#twice-1)\n"
        "[self](#page) [dir](sub/) [web](https://example.com/missing) `[code](missing.md)`\n"
        "```\n[fenced](missing-too.md)\n```\n"
        "[missing](nope.md) [bad anchor](other.md#no-such-heading)\n"
        "[ref]: gone/file.md\n",
        encoding="utf-8",
    )
    bad = broken_links(md)
    assert [b.split(":")[0] for b in bad] == ["nope.md", "other.md#no-such-heading", "gone/file.md"]


def test_first_bash_block_reader(tmp_path: Path) -> None:
    md = tmp_path / "r.md"
    md.write_text("x\n```\nnot this\n```\n```bash\none\ntwo\nthree\n```\n```bash\nlater\n```\n", encoding="utf-8")
    assert first_bash_block(md) == ["one", "two", "three"]
