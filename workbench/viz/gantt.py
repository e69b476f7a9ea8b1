"""The Rammer co-schedule of a model as a Gantt chart: one row per vEU, one bar per rTask.

Times are from the start of the plan, in the unit of the plan's length (ms, us...); each operator
has one colour (and one legend entry, in rows below the chart), and a dotted line marks where each
wave ends. `customdata` of a bar is (wave, rTask).
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from workbench.fmt import duration, time_unit
from workbench.models.rammer import Placement, Plan
from workbench.viz.axes import legend_below, legend_height

# Twenty distinct colours (the tab10 palette, then its light halves): a model has up to ~20 kernels.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
           "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")
ROW_PX = 40  # height of one vEU's row while they are few (a CPU has 2-64 vEUs)
MIN_PLOT_PX = 180  # a plan on one or two vEUs still gets a readable plot
MAX_PLOT_PX = 900  # beyond this the rows shrink (a GPU has 80-132 vEUs)
LEGEND_PER_ROW = 4  # operator names are short; the chart spans the page


def _by_operator(plan: Plan) -> dict[int, list[tuple[int, Placement]]]:
    out: dict[int, list[tuple[int, Placement]]] = {}
    for wave in plan.waves:
        for p in wave.placements:
            out.setdefault(p.op, []).append((wave.index, p))
    return dict(sorted(out.items()))


def gantt_figure(plan: Plan, names: Sequence[str]) -> go.Figure:
    """Bars of every rTask of `plan` (`names[i]` names rOperator i) on their vEUs, and the
    co-scheduled time against one kernel at a time in the title."""
    unit, scale = time_unit(plan.seconds or 1e-6)
    traces = []
    for op, placed in _by_operator(plan).items():
        traces.append(go.Bar(
            orientation="h", y=[p.veu for _, p in placed], base=[p.start / scale for _, p in placed],
            x=[(p.end - p.start) / scale for _, p in placed], name=names[op],
            marker={"color": COLOURS[op % len(COLOURS)], "line": {"width": 0.5, "color": "white"}},
            customdata=[(w, p.task) for w, p in placed], hoverinfo="text",
            hovertext=[f"{names[op]}<br>wave {w}, rTask {p.task} on vEU {p.veu}<br>{duration(p.start)} to "
                       f"{duration(p.end)} ({duration(p.end - p.start)})" for w, p in placed],
        ))
    fig = go.Figure(traces)
    for wave in plan.waves:
        fig.add_vline(x=wave.end / scale, line={"dash": "dot", "color": "#555", "width": 1})
    title = (f"co-scheduled {duration(plan.seconds)} on {plan.veus} vEUs in {len(plan.waves)} waves "
             f"(one kernel at a time: {duration(plan.sequential_seconds)})")
    plot_px = min(MAX_PLOT_PX, max(MIN_PLOT_PX, ROW_PX * plan.veus))
    legend, bottom = legend_below(len(traces), LEGEND_PER_ROW)
    fig.update_layout(
        barmode="overlay", bargap=0.15, height=legend_height(plot_px + 40, len(traces), LEGEND_PER_ROW),
        margin={"l": 10, "r": 10, "t": 40, "b": bottom}, title={"text": title, "font": {"size": 13}},
        legend=legend, xaxis={"title": f"time ({unit})", "rangemode": "tozero"},
        yaxis={"title": "vEU", "autorange": "reversed", "dtick": max(1, plan.veus // 16)},
    )
    return fig
