"""Figures and kernels the pages share, cached by value so a rerun (a Next click) rebuilds only
what changed.

The construction at a step is a function of (selection, step index): the stepper replays the same
steps for the same workload, device, policy and options (the Markov walk is seeded). So a graph
figure cached under (selection, position) is right for every session, and stepping back to a step
seen before costs a cache lookup. The stepper itself is passed unhashed (`_s`).
"""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from workbench.app.state import Selection
from workbench.construct.graph import ConstructionGraph
from workbench.construct.stepper import Stepper
from workbench.viz.graph import first_steps, graph_figure

FIGURES_KEPT = 64  # graph figures kept over all sessions (up to a few MB each for thousands of nodes)
KERNELS_KEPT = 32


@st.cache_resource(show_spinner=False, max_entries=FIGURES_KEPT)
def graph_view(sel: Selection, position: int, _s: Stepper) -> tuple[ConstructionGraph, go.Figure]:
    """The construction graph at `position` (the stepper's current position) and its figure."""
    graph = _s.graph()
    step = _s.current
    current = step.node.key if step is not None and step.node is not None else None
    figure = graph_figure(graph, first_steps(_s.steps[:position]), current, visits_as_size=sel.policy == "markov")
    return graph, figure


@st.cache_resource(show_spinner=False, max_entries=KERNELS_KEPT)
def kernel(sel: Selection, rank: int, _s: Stepper, _candidate):
    """The built kernel (`codegen.build.Kernel`, ok or failed, without its executable) of
    candidate `rank`, built in a worker process: a compiler crash fails this kernel, not the
    server. Nothing here runs a kernel."""
    from workbench.codegen.export import build_apart

    return build_apart(_s.space.expr, _candidate, sel.device)
