"""The runs history: the best measured time of a (workload, device) over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

import plotly.graph_objects as go

from workbench.profile.store import BestPoint

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def best_so_far_figure(series: Mapping[str, Sequence[BestPoint]]) -> go.Figure:
    """Per series (a label such as `workload on device`): a step line of the best time so far and
    open markers at each run's own best (microseconds, log scale; runs with no correct kernel
    have no marker)."""
    traces = []
    for i, (label, points) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        when = [datetime.fromtimestamp(p.started_at) for p in points]
        traces.append(go.Scatter(
            x=when, y=[p.best_so_far * 1e6 if p.best_so_far else None for p in points], mode="lines+markers",
            line={"shape": "hv", "color": colour}, name=f"{label}: best so far", legendgroup=label, customdata=[p.run_id for p in points],
            hovertemplate="run %{customdata}: best so far %{y:.3g} us<extra></extra>",
        ))
        traces.append(go.Scatter(
            x=when, y=[p.run_best_seconds * 1e6 if p.run_best_seconds else None for p in points], mode="markers",
            marker={"symbol": "circle-open", "size": 9, "color": colour}, name=f"{label}: run best", legendgroup=label,
            customdata=[p.run_id for p in points], hovertemplate="run %{customdata}: %{y:.3g} us<extra></extra>",
        ))
    fig = go.Figure(traces)
    fig.update_layout(
        height=460, margin={"l": 10, "r": 10, "t": 40, "b": 40}, title={"text": "best so far", "font": {"size": 13}},
        legend={"orientation": "h", "y": -0.25},
        xaxis={"title": "run started"}, yaxis={"type": "log", "title": "best measured (us)"},
    )
    return fig
