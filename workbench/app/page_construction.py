"""Construction page: step through the policy and watch the construction graph grow.

Controls move the core stepper (Reset, Back, Next, Play to end, a step slider); the page shows the
step's action and every alternative it chose among, the graph, the rTiles against the tensors
and each layer's footprint against its capacity; for Markov also the temperature and visits, and
its pick against Roller's (predicted slower, and why; or predicted faster, and why that is only
predicted).
"""

from __future__ import annotations

import streamlit as st

from workbench.app import views
from workbench.app.state import construction, finish_with_progress, selection, stepper
from workbench.fmt import duration, estimate_parts, tile_text
from workbench.pipeline import Stepper, markov_versus_roller
from workbench.viz.figures import LAYOUT_NOTE, footprint_figure, rtile_figure, state_tiles

VISITS_SHOWN = 15  # most-visited states listed for a Markov walk


def _sync_slider(s: Stepper) -> None:
    st.session_state.step_slider = s.position


def _on_reset() -> None:
    st.session_state.stepper.reset()
    _sync_slider(st.session_state.stepper)


def _on_back() -> None:
    st.session_state.stepper.back()
    _sync_slider(st.session_state.stepper)


def _on_next() -> None:
    st.session_state.stepper.next()
    _sync_slider(st.session_state.stepper)


def _on_slide() -> None:
    st.session_state.stepper.seek(st.session_state.step_slider)


def _controls(s: Stepper) -> None:
    cols = st.columns([1, 1, 1, 1.4, 6])
    cols[0].button("Reset", on_click=_on_reset, disabled=s.position == 0)
    cols[1].button("Back", on_click=_on_back, disabled=s.position == 0)
    cols[2].button("Next", on_click=_on_next, disabled=s.done)
    if cols[3].button("Play to end", disabled=s.done):
        finish_with_progress(s)  # generates what is left (normally nothing) under a progress bar
        s.seek(len(s.steps))  # replaying recorded steps is instant
    if s.steps:
        _sync_slider(s)
        cols[4].slider("step", 0, len(s.steps), key="step_slider", on_change=_on_slide, label_visibility="collapsed")


def _step_text(s: Stepper) -> None:
    step = s.current
    st.markdown(f"**Step {s.position}** of {len(s.steps)}{' (finished)' if s.done else ''}")
    if step is None:
        st.markdown("At the start: press **Next** to take the first step.")
        return
    what = step.action.describe(s.space.axes, s.space.layer_names)
    temperature = f" (temperature {step.temperature:.3g})" if step.temperature is not None and s.policy_name == "markov" else ""
    note = _emitted(step.candidate) if step.candidate is not None else step.note
    st.markdown(f"`{what}`{temperature}: {note}")
    if step.candidate is not None:
        measured, modelled = estimate_parts(step.candidate.estimate)
        st.caption(f"its estimate: measured on the device: {measured}; modelled: {modelled}")


def _emitted(candidate) -> str:
    """An emitted program named by its rank in the finished top-K, the number every other page
    and the CLI give it (the policy's note counts emissions, which is another order)."""
    top = construction().candidates
    rank = next((c.rank for c in top if c.program == candidate.program), None)
    named = f"candidate #{rank} of the top-{len(top)}" if rank else f"a program outside the top-{len(top)}"
    est = candidate.estimate
    return (f"emits {named}: grid {candidate.program.grid}, {duration(candidate.predicted_seconds)} predicted, "
            f"bound by {est.bottleneck}")


def _alternatives(s: Stepper) -> None:
    step = s.current
    if step is None or not step.alternatives:
        st.caption("This step chose among no alternatives.")
        return
    rows = [
        {
            "action": a.action.describe(s.space.axes, s.space.layer_names),
            "tile": tile_text(s.space.axes, a.tile),
            "score": a.score,
            "probability": a.probability,
            "note": a.note,
        }
        for a in step.alternatives
    ]
    empty = [k for k in rows[0] if all(r[k] is None for r in rows)]  # Roller has no probabilities
    figures = st.column_config.NumberColumn(format=views.FIGURES)
    st.dataframe([{k: v for k, v in r.items() if k not in empty} for r in rows], hide_index=True, width="stretch",
                 column_config={"score": figures, "probability": figures})


def _tiles(s: Stepper) -> tuple | None:
    """Footprint against capacity per layer (right column) and the rTiles against the tensors
    (full width below)."""
    step = s.current
    tiles = state_tiles(step.state if step else None, s.space.n_tile_layers)
    if not tiles:
        st.caption("This step holds no tile (a marker between walks or eps rounds).")
        return None
    ones = s.space.ones()
    footprints = [s.space.footprint(l, t, tiles[l - 1] if l else ones) for l, t in enumerate(tiles)]
    capacities = [s.space.capacity(l) for l in range(len(tiles))]
    st.plotly_chart(footprint_figure(s.space.layer_names[: len(tiles)], footprints, capacities), key="footprint_chart")
    return tiles


def _tensors(s: Stepper, tiles) -> None:
    st.markdown("**The step's rTiles on the tensors**: the region one tile of each layer touches, over the last two "
                "dimensions; for tensors of more dimensions, the bars below give every dimension's covered share")
    zoom = st.checkbox("zoom to the tiles", value=True)
    st.plotly_chart(rtile_figure(s.space.expr, tiles, s.space.layer_names, zoom=zoom), key="rtile_chart")


def _visits(s: Stepper, graph) -> None:
    total = sum(graph.visits.values())
    if not total:
        return
    top = sorted(graph.visits.items(), key=lambda kv: -kv[1])[:VISITS_SHOWN]
    rows = [
        {"state": key, "layer": graph.nodes[key].layer_name, "tile": tile_text(graph.axes, graph.nodes[key].tile),
         "visits": n, "share": n / total}
        for key, n in top if key in graph.nodes
    ]
    st.markdown(f"**Visits** ({total} in all; the share is the walk's empirical stationary distribution so far)")
    st.dataframe(rows, hide_index=True, width="stretch",
                 column_config={"share": st.column_config.NumberColumn(format="percent")})


def _versus_roller() -> None:
    """A Markov construction's pick against Roller's, in words (`pipeline.markov_versus_roller`):
    a warning where it is predicted slower, a caution where it is predicted faster."""
    sel, c = selection(), construction()
    if c is None or c.policy != "markov":
        return
    key = ("versus_roller", sel)
    if st.session_state.get("versus_for") != key:
        st.session_state.versus, st.session_state.versus_for = markov_versus_roller(sel, c), key
    v = st.session_state.versus
    (st.warning if v.worse or v.ratio is not None and v.ratio < 1 else st.info)(v.text)


def page() -> None:
    st.title("Construction")
    s = stepper()
    if s is None:
        return
    st.caption(selection().describe())
    _versus_roller()
    if s.view.priced:  # a conv priced as its nest and as the GEMM over its gathered windows
        st.info(f"View: {s.view.text()}.")
    _controls(s)
    _step_text(s)
    graph, figure = views.graph_view(selection(), s.position, s)
    st.plotly_chart(figure, key="graph_chart")
    st.caption(LAYOUT_NOTE)
    left, right = st.columns([3, 2])
    with right:
        tiles = _tiles(s)
    with left:
        _alternatives(s)
        if s.policy_name == "markov":
            _visits(s, graph)
    if tiles:
        _tensors(s, tiles)


page()
