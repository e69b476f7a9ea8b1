"""A model's operator graph: operators placed by dataflow depth (x) and order within a depth (y),
edges from producer to consumer, each operator coloured by its predicted time. `customdata` of a
marker is the operator's index, so a selection names operators."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from workbench.fmt import duration, time_unit


def depths(preds: Sequence[Sequence[int]]) -> list[int]:
    """Longest-path depth of each operator (operators are in dataflow order)."""
    out: list[int] = []
    for ps in preds:
        out.append(1 + max((out[p] for p in ps), default=-1))
    return out


def dataflow_figure(names: Sequence[str], preds: Sequence[Sequence[int]], seconds: Sequence[float | None]) -> go.Figure:
    """Operators as markers (grey when unsupported), edges as lines, colour = predicted time (in
    the unit of the slowest)."""
    x = depths(preds)
    row: dict[int, int] = {}
    y = []
    for d in x:
        y.append(row.get(d, 0))
        row[d] = y[-1] + 1
    ex, ey = [], []
    for i, ps in enumerate(preds):
        for p in ps:
            ex += [x[p], x[i], None]
            ey += [y[p], y[i], None]
    unit, scale = time_unit(max((s for s in seconds if s is not None), default=1e-6))
    values = [s / scale if s is not None else None for s in seconds]
    known = [v for v in values if v is not None]
    fig = go.Figure([
        go.Scatter(x=ex, y=ey, mode="lines", line={"color": "#aaa", "width": 1}, hoverinfo="skip", showlegend=False),
        go.Scatter(
            x=x, y=y, mode="markers+text", text=[f"{i}" for i in range(len(names))], textposition="top center",
            customdata=list(range(len(names))), showlegend=False,
            marker={
                "size": 18,
                "color": [v if v is not None else 0.0 for v in values],
                "colorscale": "Viridis", "cmin": 0.0, "cmax": max(known, default=1.0),
                "colorbar": {"title": unit},
                "line": {"color": ["#000" if v is not None else "#bbb" for v in values], "width": 1},
            },
            hovertext=[f"{i}: {n}<br>" + (f"{duration(s)} predicted" if s is not None else "unsupported")
                       for i, (n, s) in enumerate(zip(names, seconds))],
            hoverinfo="text",
        ),
    ])
    fig.update_layout(
        height=max(260, 60 * (max(row.values(), default=1) + 1)), margin={"l": 10, "r": 10, "t": 30, "b": 30},
        xaxis={"title": "dataflow depth", "dtick": 1}, yaxis={"visible": False}, dragmode="select",
        title={"text": "operators (colour: predicted time of the fastest candidate)", "font": {"size": 13}},
    )
    return fig
