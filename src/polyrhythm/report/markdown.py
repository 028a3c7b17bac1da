"""The Markdown report: the tables for terminals and READMEs, and the figures by file name."""

from __future__ import annotations

from polyrhythm.report.figures import Rendered
from polyrhythm.report.tables import Table


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|") or " "


def _table(table: Table) -> str:
    lines = [f"## {table.title}", "", table.caption, "",
             "| " + " | ".join(_cell(h) for h in table.headers) + " |",
             "|" + "|".join("---" for _ in table.headers) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def _figure(figure: Rendered) -> str:
    spec = figure.spec
    if figure.png is None:
        return f"### {spec.title}\n\nNo data: {figure.reason}."
    return f"### {spec.title}\n\n![{spec.title}]({figure.file_name})\n\n{spec.caption}"


def render_markdown(title: str, intro: str, tables: list[Table],
                    figures: list[Rendered]) -> str:
    parts = [f"# {title}", intro, *(_table(t) for t in tables), "## Figures",
             *(_figure(f) for f in figures)]
    return "\n\n".join(parts) + "\n"
