"""A model's operators with their predicted times: one horizontal bar per operator, in dataflow
order; an operator without a prediction (unsupported) gets an empty bar and the reason."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from workbench.fmt import duration, time_unit

ROW_PX = 22


def operator_times_figure(names: Sequence[str], kinds: Sequence[str], seconds: Sequence[float | None],
                          reasons: Sequence[str] = ()) -> go.Figure:
    """Predicted time of each operator's fastest candidate (`seconds[i]` None when the operator is
    unsupported; `reasons[i]` then says why), in the unit of the slowest."""
    reasons = tuple(reasons) or ("",) * len(names)
    labels = [f"{i}: {n}" for i, n in enumerate(names)]
    unit, scale = time_unit(max((s for s in seconds if s is not None), default=1e-6))
    values = [s / scale if s is not None else 0.0 for s in seconds]
    text = [duration(s) if s is not None else f"unsupported: {r}"[:60] for s, r in zip(seconds, reasons)]
    fig = go.Figure(go.Bar(
        orientation="h", x=values, y=labels, text=text, textposition="auto", customdata=list(kinds),
        marker={"color": ["#1f77b4" if s is not None else "#bbbbbb" for s in seconds]}, name="predicted",
        hovertemplate="%{y} (%{customdata}): %{text}<extra></extra>",
    ))
    total = sum(s for s in seconds if s is not None)
    fig.update_layout(
        height=80 + ROW_PX * len(names), margin={"l": 10, "r": 10, "t": 40, "b": 40},
        title={"text": f"predicted time per operator (sum {duration(total)})", "font": {"size": 13}},
        xaxis={"title": f"predicted ({unit}), fastest candidate"}, yaxis={"autorange": "reversed"},
    )
    return fig
