"""Rendering the views' documents: one self-contained HTML page (figures embedded) and its Markdown twin.

Both renderings read the same `Table` objects, so they never disagree. Every string that comes from a run
(metadata, file names, table cells) is escaped: HTML through jinja2's autoescape, Markdown through `md_escape`.
The run report and `commbench compare` render through here; so does the plan.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jinja2

from commbench.views.tables import Table

__all__ = ["TEMPLATES", "md_escape", "md_table", "render_html", "render_markdown", "report_title"]

TEMPLATES = Path(__file__).parent / "templates"


def md_escape(s: str) -> str:
    """Markdown-safe text: '&' and '<' as entities (renderers pass raw HTML through; '>' alone opens no tag and
    stays readable), pipes and backslashes escaped so a cell cannot break the table, newlines flattened."""
    s = str(s).replace("&", "&amp;").replace("<", "&lt;")
    for ch in "\\|`$*":
        s = s.replace(ch, "\\" + ch)
    return s.replace("\n", " ").replace("\r", " ")


def md_table(t: Table) -> str:
    """A `Table` as a Markdown section: its title as a heading, the pipe table, its note in italics."""
    lines = [f"### {md_escape(t.title)}", ""]
    if not t.rows:
        return "\n".join([*lines, "(no rows)", ""])
    lines.append("| " + " | ".join(md_escape(c) for c in t.columns) + " |")
    lines.append("|" + "|".join("---" for _ in t.columns) + "|")
    for r in t.rows:
        lines.append("| " + " | ".join(md_escape(c) for c in r) + " |")
    if t.note:
        lines += ["", f"_{md_escape(t.note)}_"]
    lines.append("")
    return "\n".join(lines)


def _env() -> jinja2.Environment:
    # autoescape everything: hosts, device names, paths and cells come from users and files.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.tests["numeric_cell"] = lambda c: bool(_NUMERIC.match(str(c)))
    return env


_NUMERIC = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?( @ \S+)?$")
"""Cells right-aligned in HTML: numbers, and 'number @ size' pairs."""


def _data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def report_title(meta: dict[str, Any]) -> str:
    """The run report's title: backend, ranks, nodes and host, from metadata.json."""
    return (
        f"commbench report: {meta.get('backend', '?')}, {meta.get('world_size', '?')} ranks on "
        f"{meta.get('nodes', 1)} node(s), host {meta.get('host', '?')}"
    )


def render_html(
    title: str,
    sections: Sequence[tuple[str, str, Sequence[Table]]],
    figures: Iterable[tuple[str, str, Path, Path | None]],
    pitfall_list: Sequence[str] | None,
    warnings: Sequence[str] = (),
    template: str = "report.html.j2",
    *,
    findings: Sequence[str] | None = None,
    suite: str = "",
) -> str:
    """sections: (anchor, heading, tables); figures: (name, caption, png, svg).

    With `findings` (the run report) the page reads: warnings, Findings (with the pitfalls), Figures, the
    sections in order, the suite last. Without (compare) the figures follow the 'summary' section.
    """
    figs = [
        {"name": n, "caption": c, "src": _data_uri(png), "svg": svg.name if svg else None} for n, c, png, svg in figures
    ]
    return (
        _env()
        .get_template(template)
        .render(
            title=title, sections=sections, figures=figs, pitfalls=pitfall_list, warnings=warnings,
            findings=findings, suite=suite,
        )
    )  # fmt: skip


def _md_figures(figures: list[tuple[str, str, Path, Path | None]], base: Path) -> list[str]:
    out = ["## Figures", ""]
    for _name, cap, png, _svg in figures:
        rel = png.relative_to(base).as_posix() if png.is_relative_to(base) else png.as_posix()
        out += [f"![{md_escape(cap)}]({rel.replace(' ', '%20')})", "", f"_{md_escape(cap)}_", ""]
    return out


def _md_pitfalls(pitfall_list: Sequence[str]) -> list[str]:
    out = ["### Pitfalls found", ""]
    out += [f"- {md_escape(p)}" for p in pitfall_list] if pitfall_list else ["None found."]
    return [*out, ""]


def render_markdown(
    title: str,
    sections: Sequence[tuple[str, str, Sequence[Table]]],
    figures: Iterable[tuple[str, str, Path, Path | None]],
    pitfall_list: Sequence[str] | None,
    base: Path,
    warnings: Sequence[str] = (),
    *,
    findings: Sequence[str] | None = None,
    suite: str = "",
) -> str:
    """The same document as `render_html`, in Markdown (figures as relative links to plots/)."""
    out = [f"# {md_escape(title)}", ""]
    if warnings:
        out += ["## Warnings", ""] + [f"- {md_escape(w)}" for w in warnings] + [""]
    figs = list(figures)
    if findings is not None:
        out += ["## Findings", ""]
        out += [f"- {md_escape(f)}" for f in findings] if findings else ["No result to state."]
        out.append("")
        if pitfall_list is not None:
            out += _md_pitfalls(pitfall_list)
        if figs:
            out += _md_figures(figs, base)
    for anchor, heading, tables in sections:
        out += [f"## {md_escape(heading)}", ""]
        for t in tables:
            out.append(md_table(t))
        if anchor == "summary" and findings is None:
            if pitfall_list is not None:
                out += _md_pitfalls(pitfall_list)
            if figs:
                out += _md_figures(figs, base)
    if suite:
        # a fenced block: the suite stays readable and copyable, and nothing in it is Markdown
        fence = "````" if "```" in suite else "```"
        out += ["## Suite (resolved)", "", f"{fence}toml", suite, fence, ""]
    return "\n".join(out) + "\n"
