"""rTiles drawn against the tensors, and footprint against capacity per memory layer.

`rtile_figure` shows, for each input and the output, the region one tile of every layer touches
(its data tile, `TensorExpr.data_tile_shape`), over the tensor's last two dimensions, anchored at
the tensor's first element: the register tile nested in the L1 tile nested in the L2 tile... A
tensor of more dimensions (a conv's NCHW input, its OIHW weights) also gets a row of bars below:
per dimension, the share of its extent each layer's data tile covers, so tiling along channels or
the batch shows too.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.fmt import human_bytes, shape_text
from workbench.ops.tensor_expr import TensorExpr

LAYER_COLOURS = ("#e41a1c", "#ff7f00", "#4daf4a", "#377eb8", "#984ea3", "#a65628")
ZOOM_MARGIN = 1.25  # zoomed view: the largest data tile plus a quarter


def state_tiles(state, n_tile_layers: int) -> tuple[tuple[int, ...], ...]:
    """The tiles a construction state holds, top layer first: the recorded ones plus the one being
    grown (a state at the bottom layer holds only recorded tiles)."""
    if state is None:
        return ()
    if state.layer < n_tile_layers and state.tile:
        return tuple(state.recorded) + (tuple(state.tile),)
    return tuple(state.recorded)


def _last_two(shape: Sequence[int]) -> tuple[int, int]:
    """(rows, columns) of a shape's last two dimensions; 1-D is one row, a scalar one element."""
    dims = (1, 1) + tuple(shape)
    return dims[-2], dims[-1]


def _rectangle(rows: int, cols: int) -> tuple[list, list]:
    return [0, cols, cols, 0, 0], [0, 0, rows, rows, 0]


def _dimension_bars(fig, expr: TensorExpr, col: int, tiles, layer_names) -> None:
    """Per dimension of tensor `col - 1`, one bar per layer: the share of the dimension's extent
    its data tile covers (100% = the whole dimension), largest tile first so smaller ones draw on top."""
    tensor = expr.tensors[col - 1]
    dims = [f"dim {d} ({n})" for d, n in enumerate(tensor.shape)]
    for layer in reversed(range(len(tiles))):
        data = expr.data_tile_shape(col - 1, tuple(tiles[layer]))
        colour = LAYER_COLOURS[layer % len(LAYER_COLOURS)]
        fig.add_trace(go.Bar(
            orientation="h", y=dims, x=[100.0 * d / n for d, n in zip(data, tensor.shape)], name=layer_names[layer],
            legendgroup=layer_names[layer], showlegend=False, marker={"color": colour}, opacity=0.6,
            hoverinfo="text", hovertext=[f"{layer_names[layer]}: {d} of {n}" for d, n in zip(data, tensor.shape)],
        ), row=2, col=col)
    fig.update_xaxes(range=[0, 100], ticksuffix="%", row=2, col=col)
    fig.update_yaxes(autorange="reversed", row=2, col=col)


def rtile_figure(expr: TensorExpr, tiles: Sequence[Sequence[int]], layer_names: Sequence[str], zoom: bool = False) -> go.Figure:
    """One panel per tensor (inputs, then the output): its outline and one filled rectangle per
    layer's data tile over the last two dimensions; where a tensor has more than two dimensions a
    second row of panels shows every dimension's covered share (`_dimension_bars`). `zoom` fits
    each rectangle panel to its largest data tile instead of the tensor."""
    titles = [f"{t.name} [{shape_text(t.shape)}]" + (" out" if t.role == "output" else "") for t in expr.tensors]
    deep = any(len(t.shape) > 2 for t in expr.tensors)
    fig = make_subplots(rows=2 if deep else 1, cols=len(expr.tensors), subplot_titles=titles, horizontal_spacing=0.06,
                        vertical_spacing=0.12, row_heights=[0.62, 0.38] if deep else None)
    for col, tensor in enumerate(expr.tensors, start=1):
        rows, cols = _last_two(tensor.shape)
        x, y = _rectangle(rows, cols)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name="tensor", legendgroup="tensor", showlegend=col == 1,
                                 line={"color": "black", "width": 1}, hoverinfo="text",
                                 hovertext=f"{tensor.name}: {shape_text(tensor.shape)}"), row=1, col=col)
        biggest = (1, 1)
        for layer in reversed(range(len(tiles))):  # largest first, so smaller tiles draw on top
            data = expr.data_tile_shape(col - 1, tuple(tiles[layer]))
            h, w = _last_two(data)
            biggest = (max(biggest[0], h), max(biggest[1], w))
            x, y = _rectangle(h, w)
            colour = LAYER_COLOURS[layer % len(LAYER_COLOURS)]
            fig.add_trace(go.Scatter(
                x=x, y=y, mode="lines", fill="toself", name=layer_names[layer], legendgroup=layer_names[layer],
                showlegend=col == 1, line={"color": colour, "width": 1}, fillcolor=colour, opacity=0.45,
                hoverinfo="text", hovertext=f"{layer_names[layer]} tile touches {tensor.name}[{shape_text(data)}]",
            ), row=1, col=col)
        if zoom:
            rows, cols = min(rows, biggest[0] * ZOOM_MARGIN), min(cols, biggest[1] * ZOOM_MARGIN)
        fig.update_xaxes(range=[0, cols], row=1, col=col)
        fig.update_yaxes(range=[rows, 0], row=1, col=col)
        if len(tensor.shape) > 2:
            _dimension_bars(fig, expr, col, tiles, layer_names)
    fig.update_annotations(font_size=12)  # the panel titles
    fig.update_layout(height=520 if deep else 340, margin={"l": 10, "r": 10, "t": 40, "b": 10}, barmode="overlay",
                      legend={"orientation": "h", "y": -0.08})
    return fig


def footprint_figure(layer_names: Sequence[str], footprints: Sequence[int], capacities: Sequence[int]) -> go.Figure:
    """Horizontal bars: each layer's tile footprint as a share of its capacity (100% = full)."""
    shares = [100.0 * f / c if c else 0.0 for f, c in zip(footprints, capacities)]
    colours = ["#d62728" if s > 100 else "#1f77b4" for s in shares]
    text = [f"{human_bytes(f)} of {human_bytes(c)}" for f, c in zip(footprints, capacities)]
    fig = go.Figure(go.Bar(x=shares, y=list(layer_names), orientation="h", marker={"color": colours}, text=text,
                           textposition="auto", name="footprint", hovertemplate="%{y}: %{x:.1f}% (%{text})<extra></extra>"))
    fig.add_vline(x=100, line={"dash": "dash", "color": "black"})
    fig.update_layout(height=60 + 40 * len(shares), margin={"l": 10, "r": 10, "t": 30, "b": 30},
                      xaxis={"title": "footprint / capacity (%)", "range": [0, max([110.0, *shares]) * 1.05]},
                      yaxis={"autorange": "reversed"}, title={"text": "footprint vs capacity", "font": {"size": 13}})
    return fig
