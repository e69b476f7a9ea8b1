"""A model's operators with their predicted times: one horizontal bar per operator, in dataflow
order; an operator without a prediction (unsupported) gets an empty bar and the reason."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

ROW_PX = 22


def operator_times_figure(names: Sequence[str], kinds: Sequence[str], seconds: Sequence[float | None],
                          reasons: Sequence[str] = ()) -> go.Figure:
    """Predicted microseconds of each operator's fastest candidate (`seconds[i]` None when the
    operator is unsupported; `reasons[i]` then says why)."""
    reasons = tuple(reasons) or ("",) * len(names)
    labels = [f"{i}: {n}" for i, n in enumerate(names)]
    micros = [s * 1e6 if s is not None else 0.0 for s in seconds]
    text = [f"{m:.3g} us" if s is not None else f"unsupported: {r}"[:60] for m, s, r in zip(micros, seconds, reasons)]
    fig = go.Figure(go.Bar(
        orientation="h", x=micros, y=labels, text=text, textposition="auto", customdata=list(kinds),
        marker={"color": ["#1f77b4" if s is not None else "#bbbbbb" for s in seconds]}, name="predicted",
        hovertemplate="%{y} (%{customdata}): %{text}<extra></extra>",
    ))
    fig.update_layout(
        height=80 + ROW_PX * len(names), margin={"l": 10, "r": 10, "t": 40, "b": 40},
        title={"text": f"predicted time per operator (sum {sum(micros):.3g} us)", "font": {"size": 13}},
        xaxis={"title": "predicted (us), fastest candidate"}, yaxis={"autorange": "reversed"},
    )
    return fig
