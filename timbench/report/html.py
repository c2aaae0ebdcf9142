"""One self-contained HTML leaderboard: inline CSS, figures as base64 PNG data URIs, no external links.

It opens offline from a single file (mail it, attach it to a CI run). Every text value is escaped. A leaderboard
page puts its figures right after the ranking, before the long per-condition and per-cell tables, and opens with
a contents line linking every section (headings carry ids).
Tables are any objects with `title`, `headers`, `rows` (lists of strings) and `note`. Numeric cells never
wrap (`0.417 [0.271, 0.563]` stays on one line); a table wider than the page scrolls inside its own box
instead of overflowing the viewport; rows of failed / nothing-trained cells are greyed and marked.
"""

from __future__ import annotations

import base64
import re
from html import escape

CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; line-height: 1.4; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; } th { background: #f3f3f3; vertical-align: bottom; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.collapsed td { background: #fde8e8; }
tr.failed td { background: #eeeeee; color: #555; } td.failed { color: #b00020; font-weight: 600; }
code { background: #f5f5f5; padding: 1px 4px; }
.note { color: #555; font-size: 0.85em; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #444; }
"""


_NUM = re.compile(r"^[-+]?(\d|\.\d)[\d.eE+\-%/]*( \[[^\]]*\])?$")
"""A number, a fraction (3/3) or a number with its interval (0.417 [0.271, 0.563]): right-aligned, one line."""


def _is_num(text: str) -> bool:
    return bool(_NUM.match(text))


def anchor(title: str) -> str:
    """The id of a section heading: its title in lower case, runs of other characters as one '-'."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def table_html(t) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in t.headers)
    body = []
    for row in t.rows:
        failed = any(str(v).startswith("failed") for v in row)
        cls = (
            ' class="failed"'
            if failed
            else (' class="collapsed"' if any(str(v).startswith("collapsed") for v in row) else "")
        )
        tds = "".join(
            f'<td class="num">{escape(str(v))}</td>'
            if _is_num(str(v))
            else f'<td class="failed">{escape(str(v))}</td>'
            if str(v).startswith("failed")
            else f"<td>{escape(str(v))}</td>"
            for v in row
        )
        body.append(f"<tr{cls}>{tds}</tr>")
    note = f'<p class="note">{escape(t.note)}</p>' if t.note else ""
    return (
        f'<h2 id="{anchor(t.title)}">{escape(t.title)}</h2>\n{note}\n'
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead>\n'
        "<tbody>\n" + "\n".join(body) + "\n</tbody></table></div>"
    )


def figure_html(caption: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img alt="{escape(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{escape(caption)}</figcaption></figure>"
    )


def page(title: str, preamble: list[str], body: list[str], links: list[tuple[str, str]] = ()) -> str:
    """A whole page: title, links to sibling pages ((text, href)), preamble lines (escaped here), then `body`'s
    already-rendered HTML parts."""
    pre = "\n".join(f"<p>{escape(line)}</p>" for line in preamble)
    if links:
        pre = (
            '<p class="nav">See also: '
            + ", ".join(f'<a href="{escape(href)}">{escape(text)}</a>' for text, href in links)
            + "</p>\n"
            + pre
        )
    parts = [
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        pre,
    ]
    return "\n".join(parts + body + ["</body></html>\n"])


def render_html(
    title: str, preamble: list[str], tables: list, figures: list[tuple[str, bytes]], links: list[tuple[str, str]] = ()
) -> str:
    """The leaderboard page: title, preamble lines (task versions, the regenerating command), a contents line,
    the first table (the ranking, one row per remedy), the figures, then the other tables: a grid's per-cell
    table has a row per cell (144 in results/paper), and figures after it started ~9,000 px down the page."""
    sections = [(t.title, anchor(t.title), len(t.rows)) for t in tables]
    if figures:
        sections.insert(1, ("Figures", "figures", len(figures)))
    contents = (
        '<p class="nav">On this page: '
        + ", ".join(
            f'<a href="#{a}">{escape(name)}</a> ({n} {"figures" if a == "figures" else "rows"})'
            for name, a, n in sections
        )
        + "</p>"
    )
    body = [contents] + [table_html(t) for t in tables[:1]]
    if figures:
        body.append('<h2 id="figures">Figures</h2>')
        body += [figure_html(caption, png) for caption, png in figures]
    body += [table_html(t) for t in tables[1:]]
    return page(title, preamble, body, links)
