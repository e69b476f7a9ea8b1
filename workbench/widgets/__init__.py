"""Jupyter widgets (ipywidgets 8) over the core: each mirrors core state in traitlets, calls the
front door (`workbench.pipeline`: request, stepper, construct, profile, export, candidate rows),
and draws with the plotly builders of `workbench.viz`; none computes a model quantity.

    from workbench.widgets import ConstructionStepper
    ConstructionStepper("cpu-core:mm-512", "local-cpu")
"""

from workbench.widgets.candidates import CandidateTable, PredictedVsMeasured
from workbench.widgets.dynamic import DispatchSlider
from workbench.widgets.export import ExportButton
from workbench.widgets.model_view import ModelView
from workbench.widgets.plot import PlotView
from workbench.widgets.stepper import ConstructionStepper
from workbench.widgets.tiles import TileView
from workbench.widgets.whatif import DeviceEditor, SweepView, WhatIf

__all__ = [
    "CandidateTable", "ConstructionStepper", "DeviceEditor", "DispatchSlider", "ExportButton", "ModelView", "PlotView",
    "PredictedVsMeasured", "SweepView", "TileView", "WhatIf",
]
