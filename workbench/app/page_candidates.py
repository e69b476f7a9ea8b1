"""Candidates page: the top-K rPrograms of the finished construction and their estimates."""

from __future__ import annotations

import streamlit as st

from workbench.app.state import selection, stepper


def page() -> None:
    st.title("Candidates")
    s = stepper()
    if s is None:
        return
    if not s.done:
        with st.spinner("constructing..."):
            s.run_to_end()
    rows = []
    for c in s.candidates():
        row = {"rank": c.rank, "predicted us": round(c.predicted_seconds * 1e6, 3), "bottleneck": c.estimate.bottleneck, "grid": c.program.grid, "waves": c.estimate.waves}
        row.update({name: "x".join(map(str, t)) for name, t in zip(c.program.layers, c.program.tiles)})
        rows.append(row)
    st.caption(f"{selection().workload.describe()} on {s.space.device.name}")
    st.dataframe(rows, hide_index=True)


page()
