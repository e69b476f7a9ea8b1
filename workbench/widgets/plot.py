"""A plotly figure inside an ipywidgets `Output`.

Plotly 6+ needs `anywidget` for `go.FigureWidget`; the project depends on ipywidgets only, so a
figure is shown as plotly's own mime bundle (`application/vnd.plotly.v1+json`, drawn by the
jupyterlab-plotly renderer that ships with plotly) in an Output widget's outputs. Replacing the
outputs redraws the figure; `figure` is the `go.Figure` last shown, for code and tests to read.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

_RENDERER = pio.renderers["plotly_mimetype"]


class PlotView(widgets.Output):
    """An Output widget that shows one plotly figure at a time."""

    def __init__(self, figure: go.Figure | None = None, **kwargs):
        super().__init__(**kwargs)
        self.figure: go.Figure | None = None
        if figure is not None:
            self.show(figure)

    def show(self, figure: go.Figure) -> None:
        """Replace the figure shown."""
        self.figure = figure
        bundle = _RENDERER.to_mimebundle(figure.to_dict())
        title = figure.layout.title.text or "figure"
        data = {**bundle, "text/plain": f"<plotly figure: {title}>"}
        self.outputs = ({"output_type": "display_data", "data": data, "metadata": {}},)

    def clear(self) -> None:
        """Show nothing."""
        self.figure = None
        self.outputs = ()
