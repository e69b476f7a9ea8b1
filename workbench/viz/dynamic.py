"""Dynamic shapes (Vortex): each kernel's predicted time against the dynamic extent, their lower
envelope (what the run-time dispatcher picks), DietCode's sample positions, measured runs and
the kernel picked for one typed value."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from workbench.fmt import duration
from workbench.viz.axes import legend_below, legend_height, log_axis
from workbench.viz.runs import COLOURS

PLOT_PX = 420
ENVELOPE = "dispatcher (lower envelope)"
SAMPLES = "DietCode's samples"


@dataclass(frozen=True)
class MeasuredPoint:
    """One run of a compiled bundle: the value, the kernel the dispatcher ran, its measured
    seconds (None when the result was wrong: nothing is timed then) and whether it was correct."""

    value: int
    kernel: str
    seconds: float | None
    correct: bool


def lower_envelope(curves: Mapping[str, Sequence[float]]) -> tuple[list[float], list[str]]:
    """Per value, the least predicted time over the kernels and the kernel that has it (on a tie
    the kernel listed first, as the dispatcher breaks ties)."""
    names = list(curves)
    if not names:
        return [], []
    best = [min(range(len(names)), key=lambda k: (column[k], k)) for column in zip(*(curves[n] for n in names))]
    return [curves[names[k]][i] for i, k in enumerate(best)], [names[k] for k in best]


def dynamic_figure(values: Sequence[int], curves: Mapping[str, Sequence[float]], param: str,
                   samples: Sequence[int] = (), measured: Sequence[MeasuredPoint] = (),
                   picked: tuple[int, str, float] | None = None) -> go.Figure:
    """Predicted seconds of each kernel (`curves`, name -> one time per value) against the
    dynamic extent `param` (log x), each a step line (a kernel's time changes only where its
    padded extent does); the lower envelope drawn over them as the dispatcher; DietCode's sample
    values as dotted vertical lines with a marker on the envelope; `measured` runs as points
    in their kernel's colour (a cross where the result was wrong, drawn on the envelope since it
    has no time); `picked` (value, kernel, predicted seconds) as a star."""
    colour = {name: COLOURS[i % len(COLOURS)] for i, name in enumerate(curves)}
    traces = [go.Scatter(x=list(values), y=list(row), mode="lines", name=name, line={"shape": "hv", "color": colour[name],
                                                                                      "width": 1.5},
                         hovertemplate=f"{name}<br>{param}=%{{x}}: %{{text}}<extra></extra>",
                         text=[duration(s) for s in row])
              for name, row in curves.items()]
    envelope, chosen = lower_envelope(curves)
    traces.append(go.Scatter(x=list(values), y=envelope, mode="lines", name=ENVELOPE,
                             line={"shape": "hv", "color": "black", "width": 3, "dash": "dot"},
                             customdata=chosen, text=[duration(s) for s in envelope],
                             hovertemplate=f"{param}=%{{x}}: %{{customdata}}, %{{text}}<extra>dispatcher</extra>"))
    shown = [v for v in samples if values and values[0] <= v <= values[-1]]
    if shown:
        traces.append(go.Scatter(x=shown, y=[_envelope_at(values, envelope, v) for v in shown], mode="markers",
                                 name=SAMPLES, marker={"symbol": "triangle-up", "size": 11, "color": "#7f7f7f"},
                                 hovertemplate=f"DietCode sample {param}=%{{x}}<extra></extra>"))
    for ok in (True, False):
        points = [p for p in measured if p.correct == ok]
        if points:
            traces.append(go.Scatter(
                x=[p.value for p in points],
                y=[p.seconds if ok else _envelope_at(values, envelope, p.value) for p in points],
                mode="markers", name="measured" if ok else "measured: WRONG result",
                marker={"symbol": "circle" if ok else "x", "size": 10, "color": [colour.get(p.kernel, "black") for p in points],
                        "line": {"color": "black", "width": 1}},
                customdata=[p.kernel for p in points], text=[duration(p.seconds) for p in points],
                hovertemplate=f"{param}=%{{x}}: %{{customdata}} measured %{{text}}<extra></extra>"))
    if picked is not None:
        value, kernel, seconds = picked
        traces.append(go.Scatter(x=[value], y=[seconds], mode="markers", name=f"picked at {param}={value}: {kernel}",
                                 marker={"symbol": "star", "size": 16, "color": colour.get(kernel, "black"),
                                         "line": {"color": "black", "width": 1}},
                                 hovertemplate=f"{param}={value}: {kernel}, {duration(seconds)}<extra></extra>"))
    fig = go.Figure(traces)
    for v in shown:
        fig.add_vline(x=v, line={"dash": "dot", "color": "#7f7f7f", "width": 1})
    times = [t for row in curves.values() for t in row] + [p.seconds for p in measured if p.seconds]
    times += [picked[2]] if picked is not None else []
    xs = list(values) + [p.value for p in measured] + ([picked[0]] if picked is not None else [])
    lo, hi = (min(times), max(times)) if times else (1e-6, 1e-5)
    legend, bottom = legend_below(len(traces), per_row=4)
    fig.update_layout(
        height=legend_height(PLOT_PX, len(traces), per_row=4), margin={"l": 10, "r": 10, "t": 40, "b": bottom},
        title={"text": f"predicted time against {param} (steps: whole outer tiles), the dispatcher on the envelope",
               "font": {"size": 13}},
        legend=legend, hovermode="closest",
        xaxis=log_axis(min(xs, default=1), max(xs, default=10), lambda v: f"{v:g}", param, pad=1.1),
        yaxis=log_axis(lo, hi, duration, "predicted / measured", pad=1.3),
    )
    return fig


def _envelope_at(values: Sequence[int], envelope: Sequence[float], value: int) -> float:
    """The envelope's time at `value`: the step that covers it (the last value at or below it)."""
    i = max((k for k, v in enumerate(values) if v <= value), default=0)
    return envelope[i]
