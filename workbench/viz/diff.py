"""Side-by-side diff of two texts (kernel sources, TVMScript, schedule traces) as an HTML table."""

from __future__ import annotations

import difflib
import re

CONTEXT_LINES = 3  # unchanged lines shown around each change
# Column widths (navigation link, line number, text; per side): a fixed layout, so a long line
# wraps (in the browser, at the pane's width) inside its half instead of pushing the right pane
# off the page.
_COLUMNS = ('<col style="width: 1.5em"><col style="width: 3.5em"><col style="width: calc(50% - 5em)">' * 2)


def side_by_side_diff(a: str, b: str, a_name: str, b_name: str) -> str:
    """An HTML table with `a` left and `b` right, changed lines highlighted, unchanged stretches
    folded to `CONTEXT_LINES` around each change; a note instead when the texts are equal."""
    if a == b:
        return f"<p>{_escape(a_name)} and {_escape(b_name)} are identical.</p>"
    table = difflib.HtmlDiff(tabsize=4).make_table(
        a.splitlines(), b.splitlines(), _escape(a_name), _escape(b_name), context=True, numlines=CONTEXT_LINES
    )
    table = re.sub(r"(\s*<colgroup></colgroup>){6}", _COLUMNS, table, count=1).replace(' nowrap="nowrap"', "")
    return f"{_STYLE}{table}"


def changed_lines(a: str, b: str) -> int:
    """Lines added or removed between `a` and `b`."""
    diff = difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
    return sum(1 for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---")))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# difflib's own legend CSS classes; monospace and compact so long kernels stay readable.
_STYLE = """<style>
table.diff {font-family: monospace; font-size: 12px; border-collapse: collapse; width: 100%; table-layout: fixed}
table.diff td {padding: 0 4px; vertical-align: top; white-space: pre-wrap; overflow-wrap: anywhere}
table.diff th {overflow: hidden; text-overflow: ellipsis; white-space: nowrap}
.diff_header {background-color: #e0e0e0; text-align: right}
.diff_next {background-color: #c0c0c0}
.diff_add {background-color: #aaffaa}
.diff_chg {background-color: #ffff77}
.diff_sub {background-color: #ffaaaa}
</style>
"""
