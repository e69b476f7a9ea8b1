"""Small HTML tables and messages for the widgets' `HTML` children (escaped, compact)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

from workbench.fmt import significant

_STYLE = ("border-collapse: collapse; font-size: 12px; font-family: var(--jp-code-font-family, monospace)")
_CELL = "padding: 1px 8px; border-bottom: 1px solid #ddd; text-align: left"
_MARKED = "background-color: #fff3bf"


def cell_text(value: object) -> str:
    """A cell's text: floats with four significant figures and no exponent (107427.73 -> 107400,
    not 1.074e+05), None and NaN as empty."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, float):
        return significant(value, 4)
    return str(value)


def html_table(rows: Sequence[Mapping[str, object]], marked: Sequence[bool] = (), drop_empty: bool = True) -> str:
    """`rows` as an HTML table (columns from the first row); a row whose `marked` entry is True
    is highlighted; columns that are None in every row are left out when `drop_empty`."""
    if not rows:
        return "<p><i>nothing to show</i></p>"
    columns = [k for k in rows[0] if not (drop_empty and all(r.get(k) is None for r in rows))]
    head = "".join(f'<th style="{_CELL}">{escape(c)}</th>' for c in columns)
    body = []
    for i, row in enumerate(rows):
        style = f' style="{_MARKED}"' if i < len(marked) and marked[i] else ""
        cells = "".join(f'<td style="{_CELL}">{escape(cell_text(row.get(c)))}</td>' for c in columns)
        body.append(f"<tr{style}>{cells}</tr>")
    return f'<table style="{_STYLE}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def message(text: str, kind: str = "info") -> str:
    """One line of text, coloured by `kind` ("info", "ok", "error")."""
    colour = {"info": "#444", "ok": "#2b8a3e", "error": "#c92a2a"}[kind]
    return f'<p style="color: {colour}; margin: 2px 0">{escape(text)}</p>'
