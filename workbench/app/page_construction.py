"""Construction page: step through the policy, see each step's alternatives and the graph size."""

from __future__ import annotations

import streamlit as st

from workbench.app.state import stepper


def _controls(s) -> None:
    cols = st.columns(4)
    if cols[0].button("Reset"):
        s.reset()
    if cols[1].button("Back"):
        s.back()
    if cols[2].button("Next"):
        s.next()
    if cols[3].button("Play to end"):
        with st.spinner("constructing..."):
            s.run_to_end()
            s.seek(len(s.steps))


def _alternatives(s, step) -> None:
    if not step.alternatives:
        return
    rows = [
        {
            "action": a.action.describe(s.space.axes, s.space.layer_names),
            "tile": "x".join(map(str, a.tile)),
            "score": a.score,
            "probability": a.probability,
            "": a.note,
        }
        for a in step.alternatives
    ]
    st.dataframe(rows, hide_index=True)


def page() -> None:
    st.title("Construction")
    s = stepper()
    if s is None:
        return
    _controls(s)
    step = s.current
    st.markdown(f"**Step {s.position}** of {len(s.steps)}{' (finished)' if s.done else ''}")
    if step is None:
        st.info("At the start. Press Next to take the first step.")
    else:
        st.markdown(f"`{step.action.describe(s.space.axes, s.space.layer_names)}`: {step.note}")
        _alternatives(s, step)
    counts = s.graph().counts()
    st.caption(f"graph: {counts['nodes']} nodes, {counts['edges']} edges; candidates so far: {len(s.candidates())}")


page()
