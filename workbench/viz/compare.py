"""Predicted vs measured: a log-log scatter with the y = x line and the rank correlations.

One trace per group (one profile run, or one run of many in the runs history); a candidate
without a correct measurement has no point. `customdata` of a point is the candidate's rank, so a
selection of points picks candidates (`ranks_from_selection`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from workbench.fmt import duration
from workbench.profile.compare import compare
from workbench.viz.axes import labelled, legend_below, legend_height, log_axis

PAD = 1.5  # the axes reach this factor beyond the points
PLOT_PX = 380  # the plotting area and the title; the axis and the legend below add theirs


@dataclass(frozen=True)
class ComparedPoint:
    rank: int
    predicted_seconds: float
    measured_seconds: float | None  # None: no correct measurement
    group: str = ""


def compared_points(candidates: Iterable, measurements: Iterable) -> list[ComparedPoint]:
    """One point per measurement (a profile's, or those that have arrived so far) of the
    candidate of its rank: predicted against the best repeat of a correct kernel."""
    predicted = {c.rank: c.predicted_seconds for c in candidates}
    return [ComparedPoint(m.rank, predicted[m.rank], m.best_seconds if m.ok else None) for m in measurements]


def _correlation_text(points: Sequence[ComparedPoint]) -> str:
    c = compare([p.rank for p in points], [p.predicted_seconds for p in points], [p.measured_seconds for p in points])
    if c.n < 2:
        return f"{c.n} measured"
    if math.isnan(c.spearman):  # constant predictions or measurements: ranks say nothing
        return f"rank correlation undefined (ties) over {c.n} measured"
    return f"Spearman {c.spearman:.2f}, Kendall {c.kendall:.2f} over {c.n} measured"


def predicted_vs_measured_figure(points: Sequence[ComparedPoint], title: str = "") -> go.Figure:
    """Measured against predicted seconds (log-log, ticks in s / ms / us), a trace per group, the
    y = x line over the range of the points, and the rank correlation per group. With one group
    the points carry their rank where the label overlaps no other; every point has it on hover."""
    groups: dict[str, list[ComparedPoint]] = {}
    for p in points:
        groups.setdefault(p.group, []).append(p)
    values = [v for p in points for v in (p.predicted_seconds, p.measured_seconds) if v]
    lo, hi = (min(values), max(values)) if values else (1e-6, 1e-5)
    span = (lo / PAD, hi * PAD)  # both axes: the y = x line is the diagonal
    traces = []
    for group, members in groups.items():
        shown = sorted((p for p in members if p.measured_seconds), key=lambda p: p.rank)
        name = f"{group} ({_correlation_text(members)})" if group else "candidates"
        xs, ys = [p.predicted_seconds for p in shown], [p.measured_seconds for p in shown]
        labels = labelled(xs, ys, span, span) if len(groups) == 1 else [False] * len(shown)
        traces.append(go.Scatter(
            x=xs, y=ys, mode="markers+text" if any(labels) else "markers", name=name,
            text=[f"#{p.rank}" if show else "" for p, show in zip(shown, labels)], textposition="top center",
            customdata=[p.rank for p in shown], marker={"size": 10}, hoverinfo="text",
            hovertext=[f"#{p.rank}: predicted {duration(p.predicted_seconds)}, measured {duration(p.measured_seconds)}"
                       + (f" ({group})" if group else "") for p in shown],
        ))
    traces.append(go.Scatter(x=list(span), y=list(span), mode="lines", name="y = x",
                             hoverinfo="skip", line={"dash": "dash", "color": "black"}))
    heading = title or (_correlation_text(points) if len(groups) <= 1 else f"{len(groups)} runs")
    fig = go.Figure(traces)
    legend, bottom = legend_below(len(traces))
    fig.update_layout(
        height=legend_height(PLOT_PX, len(traces)), margin={"l": 10, "r": 10, "t": 40, "b": bottom},
        title={"text": heading, "font": {"size": 13}}, legend=legend,
        xaxis=log_axis(lo, hi, duration, "predicted", PAD), yaxis=log_axis(lo, hi, duration, "measured", PAD),
    )
    return fig


def live_figure(candidates: Sequence, measurements: Sequence) -> go.Figure:
    """Predicted vs measured while a profile runs: the measurements arrived so far, redrawn as
    each arrives; the title says how many of the candidates are in."""
    points = compared_points(candidates, measurements)
    return predicted_vs_measured_figure(points, f"{len(measurements)} of {len(candidates)} so far: {_correlation_text(points)}")


def ranks_from_selection(points: Iterable[Mapping]) -> tuple[int, ...]:
    """Candidate ranks of selected plotly points (their `customdata`), sorted, without repeats;
    points of traces without ranks (lines, ceilings) are ignored."""
    ranks = set()
    for point in points:
        value = point.get("customdata")
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if isinstance(value, int) and not isinstance(value, bool):
            ranks.add(value)
        elif isinstance(value, float) and value.is_integer():
            ranks.add(int(value))
    return tuple(sorted(ranks))
