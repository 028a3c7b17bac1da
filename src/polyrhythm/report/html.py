"""The HTML report: one self-contained file (inline CSS, figures as data: URIs, no script)."""

from __future__ import annotations

import base64
from html import escape

from polyrhythm.report.figures import Rendered
from polyrhythm.report.tables import Table

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       margin: 0 auto; max-width: 1100px; padding: 1.5em; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
h3 { margin: 0 0 0.4em; font-size: 1.05em; }
.meta, figcaption, .caption { color: #555; font-size: 0.92em; }
nav ol { columns: 2; padding-left: 1.4em; }
a { color: #1f5fa8; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.86em; margin: 0.6em 0; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.55em; text-align: right; vertical-align: top; }
th { background: #f3f5f8; }
td:first-child, th:first-child, td.text { text-align: left; }
tr:nth-child(even) td { background: #fafbfc; }
td.error { color: #a02020; text-align: left; max-width: 28em; }
td.id { white-space: nowrap; font-family: ui-monospace, monospace; font-size: 0.95em; }
tr.failed td, tr.running td { color: #777; }
figure { margin: 1.8em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
.nodata { color: #777; font-style: italic; padding: 1em; background: #f7f7f7; }
"""

_TEXT_COLUMNS = {"run id", "status", "group", "strategy", "error", "compressor",
                 "error feedback"}


def _table(table: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in table.headers)
    rows = []
    for row in table.rows:
        cells = []
        for header, cell in zip(table.headers, row, strict=True):
            kind = {"error": "error", "run id": "id"}.get(header,
                                                          "text" if header in _TEXT_COLUMNS else "")
            cells.append(f'<td class="{kind}">{escape(cell)}</td>' if kind
                         else f"<td>{escape(cell)}</td>")
        status = row[table.headers.index("status")] if "status" in table.headers else ""
        attr = f' class="{escape(status)}"' if status in ("failed", "running") else ""
        rows.append(f"<tr{attr}>{''.join(cells)}</tr>")
    return (f'<h2 id="{table.id}-title">{escape(table.title)}</h2>\n'
            f'<p class="caption">{escape(table.caption)}</p>\n'
            f'<div class="scroll"><table id="{table.id}">\n<thead><tr>{head}</tr></thead>\n'
            f"<tbody>\n" + "\n".join(rows) + "\n</tbody></table></div>")


def _figure(figure: Rendered) -> str:
    spec = figure.spec
    if figure.png is None:
        return (f'<figure id="{spec.name}"><h3>{escape(spec.title)}</h3>\n'
                f'<p class="nodata">No data: {escape(figure.reason or "")}.</p></figure>')
    data = base64.b64encode(figure.png).decode("ascii")  # the image carries its own title
    return (f'<figure id="{spec.name}">\n'
            f'<img src="data:image/png;base64,{data}" alt="{escape(spec.title)}">\n'
            f"<figcaption>{escape(spec.caption)} Also saved as "
            f"<code>{escape(figure.file_name)}</code>.</figcaption></figure>")


def render_html(title: str, intro: str, tables: list[Table], figures: list[Rendered]) -> str:
    contents = [f'<li><a href="#{t.id}">{escape(t.title)}</a></li>' for t in tables]
    contents += [f'<li><a href="#{f.spec.name}">{escape(f.spec.title)}</a>'
                 f'{"" if f.png else " (no data)"}</li>' for f in figures]
    body = "\n".join([
        f"<h1>{escape(title)}</h1>",
        f'<p class="meta">{escape(intro)}</p>',
        "<nav><h2>Contents</h2><ol>" + "".join(contents) + "</ol></nav>",
        *(_table(t) for t in tables),
        "<h2>Figures</h2>",
        *(_figure(f) for f in figures),
    ])
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            "<link rel=\"icon\" href=\"data:,\">\n"
            f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            f"{body}\n</body>\n</html>\n")
