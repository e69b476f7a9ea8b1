"""The runs history: the best measured time of a (workload, device) over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

import plotly.graph_objects as go

from workbench.fmt import duration
from workbench.profile.store import BestPoint
from workbench.viz.axes import legend_below, legend_height, log_axis

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
PLOT_PX = 380  # the plotting area and the title; the axis and the legend below add theirs


def best_so_far_figure(series: Mapping[str, Sequence[BestPoint]]) -> go.Figure:
    """Per series (a label such as `workload on device`): a step line of the best time so far and
    open markers at each run's own best (seconds, log scale with ticks in s / ms / us; runs with
    no correct kernel have no marker). One legend entry per series: its markers go with its line."""
    traces = []
    for i, (label, points) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        when = [datetime.fromtimestamp(p.started_at) for p in points]
        traces.append(go.Scatter(
            x=when, y=[p.best_so_far or None for p in points], mode="lines+markers",
            line={"shape": "hv", "color": colour}, name=label, legendgroup=label, customdata=[p.run_id for p in points],
            hoverinfo="text", hovertext=[f"run {p.run_id}: best so far {duration(p.best_so_far)}" for p in points],
        ))
        traces.append(go.Scatter(
            x=when, y=[p.run_best_seconds or None for p in points], mode="markers", showlegend=False,
            marker={"symbol": "circle-open", "size": 9, "color": colour}, name=f"{label}: run best", legendgroup=label,
            customdata=[p.run_id for p in points], hoverinfo="text",
            hovertext=[f"run {p.run_id}: its best {duration(p.run_best_seconds)}" for p in points],
        ))
    times = [t for points in series.values() for p in points for t in (p.best_so_far, p.run_best_seconds) if t]
    lo, hi = (min(times), max(times)) if times else (1e-6, 1e-5)
    fig = go.Figure(traces)
    legend, bottom = legend_below(len(series))
    fig.update_layout(
        height=legend_height(PLOT_PX, len(series)), margin={"l": 10, "r": 10, "t": 40, "b": bottom},
        title={"text": "best so far (line) and each run's best (open circles)", "font": {"size": 13}},
        legend=legend, xaxis={"title": "run started"}, yaxis=log_axis(lo, hi, duration, "best measured"),
    )
    return fig
