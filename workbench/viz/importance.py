"""The space of measured candidates, Optuna-dashboard style: parameter importance bars, a slice
(time against one parameter) and parallel coordinates of every parameter and the time."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

from workbench.fmt import duration, significant, whole
from workbench.profile.importance import Importance, SlicePoint, Trial
from workbench.viz.axes import log_axis, log_ticks

BAR_HEIGHT = 26  # pixels per parameter on the importance chart
MARGIN = {"l": 10, "r": 10, "t": 40, "b": 40}
# Ticks per parallel axis: an axis is about 300 px tall and a dozen axes stand side by side, so a
# tick per distinct tile size (often 10-20 of them) prints labels over each other.
PARALLEL_TICKS = 6
LABEL_ANGLE = -25  # degrees: a dozen labels like `registers.i` side by side overlap when level


def importance_figure(found: Sequence[Importance]) -> go.Figure:
    """One horizontal bar per parameter, the most important on top: the share of the variance of
    log(time) its values account for, adjusted for its number of values (epsilon squared; the
    raw eta squared in the hover). A parameter with a value per trial has no bar, only "n/a"."""
    shown = list(reversed(found))  # plotly draws the first category at the bottom
    fig = go.Figure(go.Bar(
        x=[f.adjusted or 0.0 for f in shown], y=[f.parameter for f in shown], orientation="h",
        text=[significant(f.adjusted) if f.adjusted is not None else "n/a (a value per trial)" for f in shown],
        textposition="outside", cliponaxis=False, marker={"color": "#1f77b4"},
        customdata=[[significant(f.eta_squared), f.groups, f.trials] for f in shown],
        hovertemplate="%{y}: %{text} of the log-time variance (eta squared %{customdata[0]}, "
                      "%{customdata[1]} values over %{customdata[2]} measurements)<extra></extra>",
    ))
    fig.update_layout(
        height=120 + BAR_HEIGHT * len(shown), margin=MARGIN,
        title={"text": "parameter importance (marginal, epsilon squared of log time)", "font": {"size": 13}},
        xaxis={"title": "share of log-time variance", "range": [0, 1.15], "tickvals": [0, 0.25, 0.5, 0.75, 1]},
        yaxis={"automargin": True},
    )
    return fig


def _value_axis(values: Sequence[int], title: str) -> dict:
    """Tile extents and grids are mostly powers of two spanning decades: a log axis with a tick
    at each value where they span more than a factor of 4, else a linear one."""
    distinct = sorted(set(values))
    if distinct and distinct[0] > 0 and distinct[-1] >= 4 * distinct[0]:
        return {"type": "log", "title": title, "tickvals": distinct, "ticktext": [str(v) for v in distinct]}
    return {"title": title, "tickvals": distinct, "ticktext": [str(v) for v in distinct]}


def slice_figure(points: Sequence[SlicePoint], parameter: str) -> go.Figure:
    """Measured time (log axis) against the values of `parameter`: one marker per measurement
    and a line through the fastest at each value."""
    best: dict[int, float] = {}
    for p in points:
        best[p.value] = min(best.get(p.value, math.inf), p.seconds)
    traces = [go.Scatter(
        x=[p.value for p in points], y=[p.seconds for p in points], mode="markers", name="measured",
        marker={"size": 9, "opacity": 0.7}, customdata=[[p.run_id, p.rank, duration(p.seconds)] for p in points],
        hovertemplate=f"run %{{customdata[0]}} #%{{customdata[1]}}: {parameter} = %{{x}}, %{{customdata[2]}}"
                      "<extra></extra>",
    ), go.Scatter(
        x=list(best), y=list(best.values()), mode="lines", name="fastest at each value", hoverinfo="skip",
        line={"color": "black", "dash": "dot"},
    )]
    fig = go.Figure(traces)
    times = [p.seconds for p in points]
    fig.update_layout(
        height=420, margin=MARGIN, title={"text": f"slice: time against {parameter}", "font": {"size": 13}},
        legend={"orientation": "h", "y": -0.25}, xaxis=_value_axis([p.value for p in points], parameter),
        yaxis=log_axis(min(times), max(times), duration, "best measured") if times else {"title": "best measured"},
    )
    return fig


def _spread(distinct: Sequence[int], at, most: int) -> list[int]:
    """At most `most` of the sorted `distinct` values: the smallest, the largest, and between them
    those nearest to evenly spaced positions `at(value)` on the axis."""
    if len(distinct) <= most:
        return list(distinct)
    lo, hi = at(distinct[0]), at(distinct[-1])
    targets = [lo + (hi - lo) * i / (most - 1) for i in range(most)]
    return sorted({min(distinct, key=lambda v: abs(at(v) - target)) for target in targets})


def _parallel_axis(name: str, values: Sequence[int]) -> dict:
    """A parallel axis of one parameter: on a log scale where its values span more than a factor
    of 4 (tile sizes and grids are mostly powers of two: evenly spaced, not crowded at the foot),
    with at most `PARALLEL_TICKS` ticks at values it takes."""
    distinct = sorted(set(values))
    at = math.log2 if distinct[0] > 0 and distinct[-1] >= 4 * distinct[0] else float
    ticks = _spread(distinct, at, PARALLEL_TICKS)
    return {"label": name, "values": [at(v) for v in values], "tickvals": [at(v) for v in ticks],
            "ticktext": [whole(v) for v in ticks]}


def parallel_figure(trials: Sequence[Trial], parameters: Sequence[str]) -> go.Figure:
    """Parallel coordinates: an axis per parameter (in the order given) and a last one of the
    time (log scale), one line per measurement coloured by its time (dark: fast); a few ticks per
    axis and slanted axis labels, so that neither overlaps its neighbours."""
    logs = [math.log10(t.seconds) for t in trials]
    dimensions = [_parallel_axis(name, [t.value(name) for t in trials]) for name in parameters] if trials else []
    times = [t.seconds for t in trials]
    ticks, texts = log_ticks(min(times), max(times), duration, PARALLEL_TICKS) if times else ([], [])
    dimensions.append({"label": "best measured", "values": logs, "tickvals": [math.log10(v) for v in ticks],
                       "ticktext": texts})
    fig = go.Figure(go.Parcoords(
        dimensions=dimensions, line={"color": logs, "colorscale": "Viridis", "showscale": False},
        labelangle=LABEL_ANGLE, labelside="top", labelfont={"size": 11}, tickfont={"size": 10},
    ))
    # The axis labels sit above the axes, where a title at the usual height would cover them.
    fig.update_layout(height=440, margin={"l": 60, "r": 60, "t": 100, "b": 30},
                      title={"text": f"the space: {len(trials)} measurements", "font": {"size": 13}})
    return fig
