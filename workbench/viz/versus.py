"""Two sets of runs compared: a forest plot of each workload's ratio B / A with its interval
(`profile.versus`), coloured by verdict."""

from __future__ import annotations

from collections.abc import Sequence
from math import log10

import plotly.graph_objects as go

from workbench.profile.versus import FASTER, MARGIN, SAME, SLOWER, WorkloadComparison

VERDICT_COLOURS = {FASTER: "#2ca02c", SLOWER: "#d62728", SAME: "#7f7f7f"}
ROW_PX = 26  # one workload's row
FRAME_PX = 120  # title, axis and legend


def forest_figure(rows: Sequence[WorkloadComparison], title: str = "") -> go.Figure:
    """One row per comparable workload (first at the top): the ratio B / A (log scale) with its
    interval as error bars (the hover names the runs pooled a side and the noise model), a trace per verdict, the line of no change and the band of changes
    too small to count (`versus.MARGIN`). Rows without a ratio are left out; the title says how
    many."""
    shown = [w for w in rows if w.interval is not None]
    traces = []
    for verdict, colour in VERDICT_COLOURS.items():
        mine = [w for w in shown if w.verdict == verdict]
        if not mine:
            continue
        traces.append(go.Scatter(
            x=[w.interval.ratio for w in mine], y=[w.workload for w in mine], mode="markers", name=verdict,
            marker={"color": colour, "size": 9, "symbol": "square"},
            error_x={"type": "data", "symmetric": False, "color": colour,
                     "array": [w.interval.high - w.interval.ratio for w in mine],
                     "arrayminus": [w.interval.ratio - w.interval.low for w in mine]},
            hoverinfo="text",
            hovertext=[f"{w.workload}: B/A {w.interval.ratio:.3f} [{w.interval.low:.3f}, {w.interval.high:.3f}] "
                       f"({w.interval.level:.1%}; runs {w.interval.runs_a} / {w.interval.runs_b}, "
                       f"{w.interval.model} {w.interval.spread:.1%}): {w.verdict}" for w in mine],
        ))
    left = [w.interval.low for w in shown] or [1 / 1.1]
    right = [w.interval.high for w in shown] or [1.1]
    lo, hi = min(min(left), 1 / (1 + 2 * MARGIN)) / 1.02, max(max(right), 1 + 2 * MARGIN) * 1.02
    missing = len(rows) - len(shown)
    heading = title or ("B / A per workload with its interval" + (f" ({missing} not comparable, not drawn)"
                                                                   if missing else ""))
    fig = go.Figure(traces)
    fig.add_vline(x=1.0, line={"color": "black", "dash": "dash"})
    fig.add_vrect(x0=1 / (1 + MARGIN), x1=1 + MARGIN, fillcolor="#bbbbbb", opacity=0.3, line_width=0)
    names = list(dict.fromkeys(w.workload for w in shown))
    fig.update_layout(
        height=FRAME_PX + ROW_PX * max(len(names), 3), margin={"l": 10, "r": 10, "t": 40, "b": 40},
        title={"text": heading, "font": {"size": 13}},
        xaxis={"type": "log", "title": "B / A (time: > 1 is slower)", "range": [log10(lo), log10(hi)]},
        yaxis={"categoryorder": "array", "categoryarray": names[::-1], "automargin": True},
        legend={"orientation": "h", "y": -0.15 if names else -0.3},
    )
    return fig
