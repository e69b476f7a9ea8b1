"""The Rammer co-schedule of a model as a Gantt chart: one row per vEU, one bar per rTask.

Times are microseconds from the start of the plan; each operator has one colour (and one legend
entry), and a dotted line marks where each wave ends. `customdata` of a bar is (wave, rTask,
start us, end us).
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from workbench.models.rammer import Placement, Plan
from workbench.viz.fmt import micros

# Twenty distinct colours (the tab10 palette, then its light halves): a model has up to ~20 kernels.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
           "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")
ROW_PX = 14  # height of one vEU's row
MAX_HEIGHT_PX = 900  # beyond this the rows shrink (a GPU has 80-132 vEUs)


def _by_operator(plan: Plan) -> dict[int, list[tuple[int, Placement]]]:
    out: dict[int, list[tuple[int, Placement]]] = {}
    for wave in plan.waves:
        for p in wave.placements:
            out.setdefault(p.op, []).append((wave.index, p))
    return dict(sorted(out.items()))


def gantt_figure(plan: Plan, names: Sequence[str]) -> go.Figure:
    """Bars of every rTask of `plan` (`names[i]` names rOperator i) on their vEUs, and the
    co-scheduled time against one kernel at a time in the title."""
    traces = []
    for op, placed in _by_operator(plan).items():
        traces.append(go.Bar(
            orientation="h", y=[p.veu for _, p in placed], base=[p.start * 1e6 for _, p in placed],
            x=[(p.end - p.start) * 1e6 for _, p in placed], name=names[op],
            marker={"color": COLOURS[op % len(COLOURS)], "line": {"width": 0.5, "color": "white"}},
            customdata=[(w, p.task, p.start * 1e6, p.end * 1e6) for w, p in placed],
            hovertemplate=f"{names[op]}<br>wave %{{customdata[0]}}, rTask %{{customdata[1]}} on vEU %{{y}}"
            "<br>%{customdata[2]:.3g} to %{customdata[3]:.3g} us<extra></extra>",
        ))
    fig = go.Figure(traces)
    for wave in plan.waves:
        fig.add_vline(x=wave.end * 1e6, line={"dash": "dot", "color": "#555", "width": 1})
    title = (f"co-scheduled {micros(plan.seconds)} on {plan.veus} vEUs in {len(plan.waves)} waves "
             f"(one kernel at a time: {micros(plan.sequential_seconds)})")
    fig.update_layout(
        barmode="overlay", bargap=0.15, height=min(MAX_HEIGHT_PX, 120 + ROW_PX * plan.veus),
        margin={"l": 10, "r": 10, "t": 40, "b": 40}, title={"text": title, "font": {"size": 13}},
        legend={"title": {"text": "operator"}}, xaxis={"title": "time (us)", "rangemode": "tozero"},
        yaxis={"title": "vEU", "autorange": "reversed", "dtick": max(1, plan.veus // 16)},
    )
    return fig
