"""TileView: one rTile per memory layer against the tensors it reads and writes, and each
layer's footprint against its capacity."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import ipywidgets as widgets
import traitlets

from workbench import pipeline
from workbench.construct.space import Space
from workbench.fmt import human_bytes, tile_text
from workbench.viz.figures import footprint_figure, rtile_figure
from workbench.widgets.plot import PlotView
from workbench.widgets.tables import html_table, message

if TYPE_CHECKING:  # annotations only
    from workbench.pipeline import Candidate, DeviceSpec, TensorExpr


class TileView(widgets.VBox):
    """The tiles of one construction state or rProgram, top layer first.

    `expr` is the expression as constructed (after axis fusion: `Stepper.space.expr`,
    `Construction.expr`); setting `tiles` (one tile per layer) or `zoom` redraws.
    """

    tiles = traitlets.Tuple()
    zoom = traitlets.Bool(True)

    def __init__(self, expr: TensorExpr, device: DeviceSpec | str, tiles: Sequence[Sequence[int]] = (), zoom: bool = True):
        self.space = Space(expr, pipeline.load_device(device))
        self.zoom_box = widgets.Checkbox(value=zoom, description="zoom to the tiles", indent=False)
        self.caption = widgets.HTML()
        self.footprint_view = PlotView()
        self.tensor_view = PlotView()
        super().__init__(children=[self.caption, self.footprint_view, self.zoom_box, self.tensor_view])
        traitlets.link((self, "zoom"), (self.zoom_box, "value"))
        self.tiles = tuple(tuple(int(s) for s in t) for t in tiles)
        self.observe(lambda _: self._render(), names=["tiles", "zoom"])
        self._render()

    @classmethod
    def from_candidate(cls, expr: TensorExpr, device: DeviceSpec | str, candidate: Candidate, **kwargs) -> TileView:
        """The tiles of a candidate's rProgram."""
        return cls(expr, device, candidate.program.tiles, **kwargs)

    def footprints(self) -> tuple[tuple[int, int], ...]:
        """(footprint, capacity) bytes of each layer's tile, padding included."""
        space, ones = self.space, self.space.ones()
        uppers = (ones, *self.tiles[:-1])
        return tuple((space.footprint(l, t, u), space.capacity(l)) for l, (t, u) in enumerate(zip(self.tiles, uppers)))

    def _render(self) -> None:
        if not self.tiles:
            self.caption.value = message("No tile at this step (a marker between walks or eps rounds, or axis fusion).")
            self.footprint_view.clear()
            self.tensor_view.clear()
            return
        names = self.space.layer_names[: len(self.tiles)]
        sizes = self.footprints()
        rows = [
            {"layer": n, "tile": tile_text(self.space.axes, t), "footprint": human_bytes(f), "capacity": human_bytes(c),
             "use": f"{f / c:.0%}" if c else ""}
            for n, t, (f, c) in zip(names, self.tiles, sizes)
        ]
        self.caption.value = html_table(rows, marked=[f > c for f, c in sizes])
        self.footprint_view.show(footprint_figure(names, [f for f, _ in sizes], [c for _, c in sizes]))
        self.tensor_view.show(rtile_figure(self.space.expr, self.tiles, self.space.layer_names, zoom=self.zoom))
