"""Figures and kernels the pages share, cached by value so a rerun (a Next click) rebuilds only
what changed.

The construction at a step is a function of (request, step index): the stepper replays the same
steps for the same workload, device, policy and options (the Markov walk is seeded). So a graph
figure cached under (request, position) is right for every session, and stepping back to a step
seen before costs a cache lookup; likewise a kernel under (request, rank). The stepper and the
construction themselves are passed unhashed (`_s`, `_construction`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from workbench import pipeline
from workbench.fmt import time_columns
from workbench.pipeline import Construction, Request, Stepper
from workbench.viz.figures import first_steps, graph_figure

if TYPE_CHECKING:  # annotations only
    import plotly.graph_objects as go

    from workbench.pipeline import ConstructionGraph

FIGURES_KEPT = 64  # graph figures kept over all sessions (up to a few MB each for thousands of nodes)
KERNELS_KEPT = 32
# Three significant figures, never an exponent (sprintf's %g in the browser: 107427 -> 107000).
FIGURES = "%.3g"


def time_table(rows: list[dict]) -> None:
    """A table whose `<what> us` columns (microseconds) are shown in one unit chosen from the data
    (`fmt.time_columns`: `predicted (ms)` 107, not `predicted us` 107427.73; the candidate table
    comes in its unit already), every fractional number with three figures."""
    shown, _ = time_columns(rows)
    numbers = {k for row in shown for k, v in row.items() if isinstance(v, float)}
    config = {name: st.column_config.NumberColumn(format=FIGURES) for name in numbers}
    st.dataframe(shown, hide_index=True, width="stretch", column_config=config)


@st.cache_resource(show_spinner=False, max_entries=FIGURES_KEPT)
def graph_view(req: Request, position: int, _s: Stepper) -> tuple[ConstructionGraph, go.Figure]:
    """The construction graph at `position` (the stepper's current position) and its figure."""
    graph = _s.graph()
    step = _s.current
    current = step.node.key if step is not None and step.node is not None else None
    figure = graph_figure(graph, first_steps(_s.steps[:position]), current, visits_as_size=req.policy == "markov")
    return graph, figure


@st.cache_resource(show_spinner=False, max_entries=KERNELS_KEPT)
def kernel(req: Request, rank: int, _construction: Construction):
    """Candidate `rank` of the request's construction built (`pipeline.build`: a kernel ok or
    failed, without its executable), in a worker process: a compiler crash fails this kernel,
    not the server. Nothing here runs a kernel."""
    return pipeline.build(_construction, rank)
