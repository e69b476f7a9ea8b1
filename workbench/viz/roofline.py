"""The device's roofline with the candidates on it.

x: arithmetic intensity, flops per byte read from the bottom layer (DRAM / global memory), as in
the roofline model; y: GFLOP/s. Each memory layer contributes a ceiling `min(bandwidth x
intensity, peak)` (its bandwidth is the aggregate read bandwidth of the spec), and so does a
CPU's last-level cache (`DeviceSpec.ceilings`), so a candidate under the bottom layer's slope is
bound by that layer's loads, and one between it and the LLC's reads from the LLC. A candidate is
plotted at the speed the model predicts (flops / predicted seconds) and, once profiled, at the
measured speed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import log10

import plotly.graph_objects as go

from workbench.fmt import gbps, gflops, significant
from workbench.viz.axes import labelled, legend_below, legend_height, log_ticks

LAYER_DASHES = ("dot", "dashdot", "dash", "solid")
RANGE_MARGIN = 4.0  # the x range extends this factor beyond the points and ridge points
PLOT_PX = 360  # the plotting area and the title; the axis and the legend below add theirs
LEGEND_PER_ROW = 3  # ceilings and point kinds have short names
Y_DECADES = 1.5  # the y range reaches this many decades below the slowest point (or the peak)


@dataclass(frozen=True)
class RooflinePoint:
    rank: int
    intensity: float  # flop / byte from the bottom layer
    gflops: float
    kind: str = "predicted"  # "predicted" | "measured"


def roofline_points(candidates: Sequence, bottom_layer: str, measured: Mapping[int, float] | None = None) -> tuple[RooflinePoint, ...]:
    """Points of `candidates` (core `Candidate`s): predicted, plus measured where `measured`
    (rank -> seconds) has a time. A candidate that reads nothing from the bottom is left out."""
    out = []
    for c in candidates:
        est = c.estimate
        moved = dict(est.bytes_per_layer).get(bottom_layer, 0)
        if not moved or c.predicted_seconds <= 0:
            continue
        intensity = est.flops / moved
        out.append(RooflinePoint(c.rank, intensity, est.flops / c.predicted_seconds / 1e9))
        seconds = (measured or {}).get(c.rank)
        if seconds:
            out.append(RooflinePoint(c.rank, intensity, est.flops / seconds / 1e9, "measured"))
    return tuple(out)


def _x_range(layers: Sequence[tuple[str, float]], peak: float, points: Sequence[RooflinePoint]) -> tuple[float, float]:
    xs = [p.intensity for p in points] + [peak / bw for _, bw in layers if bw > 0]
    return min(xs) / RANGE_MARGIN, max(xs) * RANGE_MARGIN


def roofline_figure(layers: Sequence[tuple[str, float]], peak_gflops: float, points: Sequence[RooflinePoint] = ()) -> go.Figure:
    """Log-log roofline: a ceiling per (layer name, bandwidth GB/s), the compute peak, and the
    predicted (and measured) candidates; `customdata` of a point is its rank."""
    lo, hi = _x_range(layers, peak_gflops, points)
    slowest = min([p.gflops for p in points] + [peak_gflops])
    y_lo, y_hi = slowest / 10**Y_DECADES, peak_gflops * 2
    traces = []
    for i, (name, bw) in enumerate(layers):
        ridge = peak_gflops / bw
        xs = sorted({lo, hi, min(max(ridge, lo), hi)})
        traces.append(go.Scatter(
            x=xs, y=[min(bw * x, peak_gflops) for x in xs], mode="lines", name=f"{name} {gbps(bw)}",
            line={"dash": LAYER_DASHES[min(i, len(LAYER_DASHES) - 1)], "color": "#777"}, hoverinfo="name",
        ))
    traces.append(go.Scatter(x=[lo, hi], y=[peak_gflops, peak_gflops], mode="lines", name=f"peak {gflops(peak_gflops)}",
                             line={"color": "black", "width": 2}, hoverinfo="name"))
    for kind, symbol in (("predicted", "circle"), ("measured", "diamond")):
        chosen = [p for p in points if p.kind == kind]
        if chosen:
            # Ranks as labels where they overlap no other label (best ranks first); all on hover.
            chosen = sorted(chosen, key=lambda p: p.rank)
            labels = labelled([p.intensity for p in chosen], [p.gflops for p in chosen], (lo, hi), (y_lo, y_hi))
            traces.append(go.Scatter(
                x=[p.intensity for p in chosen], y=[p.gflops for p in chosen], name=kind,
                mode="markers+text" if any(labels) else "markers",
                text=[f"#{p.rank}" if show else "" for p, show in zip(chosen, labels)], textposition="top center",
                customdata=[p.rank for p in chosen], marker={"symbol": symbol, "size": 10}, hoverinfo="text",
                hovertext=[f"#{p.rank} {kind}: {significant(p.intensity)} flop/B, {gflops(p.gflops)}" for p in chosen],
            ))
    x_ticks, x_text = log_ticks(lo, hi, significant)  # the unit is in the axis title
    y_ticks, y_text = log_ticks(y_lo, y_hi, gflops)
    fig = go.Figure(traces)
    legend, bottom = legend_below(len(traces), LEGEND_PER_ROW)
    fig.update_layout(
        height=legend_height(PLOT_PX, len(traces), LEGEND_PER_ROW), margin={"l": 10, "r": 10, "t": 30, "b": bottom},
        legend=legend,
        xaxis={"type": "log", "title": "arithmetic intensity (flop/B read from the bottom layer)",
               "range": [log10(lo), log10(hi)], "tickvals": x_ticks, "ticktext": x_text},
        yaxis={"type": "log", "title": "speed", "range": [log10(y_lo), log10(y_hi)],
               "tickvals": y_ticks, "ticktext": y_text},
        title={"text": "roofline", "font": {"size": 13}},
    )
    return fig
