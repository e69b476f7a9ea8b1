"""Axes and labels every figure shares: log axes whose ticks read as real values with units
(`1.87 ms`, `20 GFLOP/s`), and point labels that never overlap.

Plotly labels the minor ticks of a short log axis with their leading digit only ("2", "5"), so a
time of 2 ms reads as "2"; the figures here set tick values and texts themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

MANTISSAS = ((1,), (1, 3), (1, 2, 5), tuple(range(1, 10)))  # ticks per decade, fewest first
MAX_TICKS = 9  # more ticks than this on one axis crowd its labels
# A label is about this share of the plot's width and height: two labelled points closer than
# this on both axes would draw their labels over each other.
LABEL_WIDTH = 0.07
LABEL_HEIGHT = 0.06


def log_ticks(lo: float, hi: float, text: Callable[[float], str], most: int = MAX_TICKS) -> tuple[list[float], list[str]]:
    """Tick values within [lo, hi] (lo > 0) at every digit, 1-2-5, 1-3 or 1 of each decade, the
    densest that gives at most `most` ticks (at least two: else the ends), and their texts
    `text(value)`."""
    if not (lo > 0 and hi > 0):
        return [], []
    lo, hi = min(lo, hi), max(lo, hi)
    chosen: list[float] = []
    for mantissas in reversed(MANTISSAS):
        values = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                  for m in mantissas]
        chosen = [v for v in values if lo <= v <= hi]
        if len(chosen) <= most:
            break
    else:  # more decades than ticks: every few decades
        chosen = chosen[:: math.ceil(len(chosen) / most)]
    if len(chosen) < 2:  # a range within one step: its ends
        chosen = [lo, hi] if hi > lo else [lo]
    return chosen, [text(v) for v in chosen]


def log_axis(lo: float, hi: float, text: Callable[[float], str], title: str, pad: float = 1.5) -> dict:
    """A plotly log axis over the values [lo, hi] widened by `pad` either side, labelled by `text`."""
    lo, hi = lo / pad, hi * pad
    values, texts = log_ticks(lo, hi, text)
    return {"type": "log", "title": title, "range": [math.log10(lo), math.log10(hi)],
            "tickvals": values, "ticktext": texts}


def labelled(xs: Sequence[float], ys: Sequence[float], x_range: tuple[float, float] | None = None,
             y_range: tuple[float, float] | None = None) -> list[bool]:
    """Which points of a log-log chart get a permanent label: greedily, in the order given (the
    most important first), each point whose label would not overlap one already placed; the
    others keep their hover text. Distances are shares of the axis ranges (`x_range`, `y_range`
    in data units; default: the points' own spread), in decades."""
    def scaled(values: Sequence[float], span: tuple[float, float] | None) -> list[float]:
        logs = [math.log10(v) for v in values]
        lo, hi = (math.log10(span[0]), math.log10(span[1])) if span else (min(logs, default=0), max(logs, default=0))
        return [(v - lo) / (hi - lo) if hi > lo else 0.0 for v in logs]

    px, py = scaled(xs, x_range), scaled(ys, y_range)
    placed: list[int] = []
    out = []
    for i in range(len(px)):
        free = all(abs(px[i] - px[j]) > LABEL_WIDTH or abs(py[i] - py[j]) > LABEL_HEIGHT for j in placed)
        out.append(free)
        if free:
            placed.append(i)
    return out


# A legend below the plot, in rows: never taller than the plot beside a chart, never over it. It
# sits at the bottom of the figure (container coordinates), under a bottom margin that holds the
# x axis's tick labels and title and then the legend's rows.
AXIS_PX = 60  # x tick labels and the axis title
LEGEND_ROW_PX = 22
LEGEND_PER_ROW = 2  # entries per legend row at half the page's width (names are long)


def legend_rows(entries: int, per_row: int = LEGEND_PER_ROW) -> int:
    return math.ceil(entries / per_row)


def legend_below(entries: int, per_row: int = LEGEND_PER_ROW) -> tuple[dict, int]:
    """(the legend's layout, the bottom margin in pixels) for `entries` legend entries in rows
    of `per_row` under the x axis."""
    legend = {"orientation": "h", "yref": "container", "yanchor": "bottom", "y": 0.0, "xanchor": "left", "x": 0}
    return legend, AXIS_PX + LEGEND_ROW_PX * legend_rows(entries, per_row)


def legend_height(plot_px: int, entries: int, per_row: int = LEGEND_PER_ROW) -> int:
    """The figure height that keeps `plot_px` for the plot and its top margin when a legend of
    `entries` sits below (`legend_below`)."""
    return plot_px + legend_below(entries, per_row)[1]
