"""The views the faces draw with, in one import: the figure builders of `viz/` and the text views
(a side-by-side diff, a source's entry line) the dashboard pages and the notebook widgets call.

A face imports this module and `workbench.fmt` (text formatting, which the core uses too), not
each view module: the faces depend on the views as one layer, as they depend on the core through
`workbench.pipeline`, so moving or renaming a view module touches this file, not every page.
Not `viz/__init__`, which stays empty so that importing one view module does not load them all.
"""

from workbench.viz.compare import (
    ComparedPoint,
    compared_points,
    live_figure,
    predicted_vs_measured_figure,
    ranks_from_selection,
)
from workbench.viz.correction import before_after_figure, coefficient_rows, evaluation_text, stored_text, worse
from workbench.viz.dataflow import dataflow_figure
from workbench.viz.diff import changed_lines, side_by_side_diff
from workbench.viz.dynamic import MeasuredPoint, dynamic_figure, lower_envelope
from workbench.viz.gantt import gantt_figure
from workbench.viz.graph import LAYOUT_NOTE, first_steps, graph_figure
from workbench.viz.importance import importance_figure, parallel_figure, slice_figure
from workbench.viz.operator_times import operator_times_figure
from workbench.viz.roofline import roofline_figure, roofline_points
from workbench.viz.runs import best_so_far_figure
from workbench.viz.source import entry_line
from workbench.viz.tiles import footprint_figure, rtile_figure, state_tiles
from workbench.viz.versus import forest_figure
from workbench.viz.whatif import (
    field_groups,
    field_text,
    suite_figure,
    suite_rows,
    sweep_figure,
    sweep_rows,
    tiles_text,
    top_rows,
)

__all__ = [
    "ComparedPoint", "compared_points", "live_figure", "predicted_vs_measured_figure", "ranks_from_selection",
    "before_after_figure", "coefficient_rows", "evaluation_text", "stored_text", "worse",
    "dataflow_figure",
    "changed_lines", "side_by_side_diff",
    "MeasuredPoint", "dynamic_figure", "lower_envelope",
    "gantt_figure",
    "LAYOUT_NOTE", "first_steps", "graph_figure",
    "importance_figure", "parallel_figure", "slice_figure",
    "operator_times_figure",
    "roofline_figure", "roofline_points",
    "best_so_far_figure",
    "entry_line",
    "footprint_figure", "rtile_figure", "state_tiles",
    "forest_figure",
    "field_groups", "field_text", "suite_figure", "suite_rows", "sweep_figure", "sweep_rows", "tiles_text", "top_rows",
]
