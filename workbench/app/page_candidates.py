"""Candidates page: the top-K rPrograms (with the prediction corrected by what the runs store
learnt about the device, where it holds a correction), the device's roofline with them on it,
profiling, and predicted vs measured; the model's estimate of a picked candidate, measured and
modelled parts apart; a stored profile's report as one HTML file to download. Selecting points
(or the multiselect) picks candidates for the Kernel and Export pages."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import streamlit as st

from workbench import pipeline
from workbench.app import views
from workbench.app.profile_controls import profile_controls, store_path
from workbench.app.state import candidates_page, picked, profile, set_picked
from workbench.errors import UserError
from workbench.fmt import duration, estimate_parts, significant
from workbench.pipeline import RunStore
from workbench.report import run_html
from workbench.viz.figures import (
    compared_points,
    predicted_vs_measured_figure,
    ranks_from_selection,
    roofline_figure,
    roofline_points,
    stored_text,
)

CHART_KEYS = ("roofline_chart", "compare_chart")


def _on_chart_select(key: str) -> None:
    ranks = ranks_from_selection(st.session_state[key].selection.points)
    if ranks:
        set_picked(ranks)
        st.session_state.picked_ranks = list(picked())


def _selectable(fig, key: str) -> None:
    """A chart whose selected points (click, box or lasso; dragging selects) pick candidates."""
    fig.update_layout(dragmode="select")
    st.plotly_chart(fig, key=key, on_select=lambda: _on_chart_select(key), selection_mode=("points", "box", "lasso"))


def _on_multiselect() -> None:
    set_picked(st.session_state.picked_ranks)


def _measured(result) -> dict[int, float]:
    """rank -> best measured seconds of the correct kernels of a profile result."""
    if result is None:
        return {}
    return {m.rank: m.best_seconds for m in result.measurements if m.ok}


def _stored_correction(device_name: str):
    """The runs store's correction of the device (a `StoredCorrection`), or None: no store yet, no
    correction of this device, or a store that cannot be read (the profile controls say why)."""
    try:
        path = Path(store_path())
        if not path.is_file():
            return None
        with RunStore(path) as store:
            return store.correction(device_name)
    except UserError:
        return None


def _table(construction, result) -> None:
    stored = _stored_correction(construction.device.name)
    rows = pipeline.candidate_rows(construction.candidates, result.measurements if result is not None else None,
                                   correction=stored.correction if stored is not None else None)
    axes = [a.name for a in construction.expr.axes]
    st.caption("tiles per layer as " + " x ".join(axes) + "; selected points pick candidates; compute: the "
               "compute term measured (a calibrated register micro-kernel) or modelled")
    if stored is not None:
        fitted = stored_text(stored.fitted_at, stored.measurements, stored.evaluation)
        st.caption(f"corrected: the model's prediction corrected by what the runs store learnt about "
                   f"{construction.device.name}, {fitted}; the Runs page fits it again")
    views.time_table(rows)


def _estimate(construction) -> None:
    """The model's estimate of the first picked candidate: its stage times, and which of its
    parts were measured on the device and which modelled (Vortex's hybrid analyzer)."""
    ranks = [r for r in picked() if any(c.rank == r for c in construction.candidates)] or [1]
    cand = construction.candidate(ranks[0])
    est = cand.estimate
    with st.expander(f"The model's estimate of #{cand.rank}: {duration(est.predicted_seconds)}, bound by "
                     f"{est.bottleneck}"):
        loads = ", ".join(f"{layer} {duration(t)}" for layer, t in est.load_seconds)
        st.markdown(f"compute {duration(est.compute_seconds)}" + (f"; loads from {loads}" if loads else ""))
        measured, modelled = estimate_parts(est)
        st.markdown(f"**measured on the device:** {measured}  \n**modelled:** {modelled}")


def _roofline(construction, result) -> None:
    device = construction.device
    points = roofline_points(construction.candidates, device.layers[-1].name, _measured(result))
    _selectable(roofline_figure(device.ceilings(), construction.peak_gflops, points), CHART_KEYS[0])


def _comparison(result) -> None:
    _selectable(predicted_vs_measured_figure(compared_points(result.candidates, result.measurements)), CHART_KEYS[1])
    c = result.comparison
    ratio = f"; measured / predicted geomean {significant(c.error_ratio)}" if math.isfinite(c.error_ratio) else ""
    st.caption(f"run {result.run_id} ({result.runner} runner, {duration(result.seconds)}): {result.best_note()}{ratio}")
    for note in (result.load_note(), result.noise_note()):
        if note:
            st.warning(note)
    if result.run_id is not None:  # stored: its report reads the run back from the store
        st.download_button(f"Download the report of run {result.run_id} (HTML)",
                           partial(run_html, Path(store_path()), result.run_id),
                           file_name=f"run-{result.run_id}-report.html", mime="text/html", key="candidates_report",
                           on_click="ignore")


def _diagnosis(result) -> None:
    """Each correct kernel against the roofs: what it achieved, what binds, why (profile.diagnose)."""
    rows = pipeline.diagnosis_rows(result)
    if not rows:
        return
    st.subheader("Diagnosis")
    st.caption("achieved rates of the best repeat against the device's roofs; a roof binds from "
               "60% of it on, below that the time goes to latency and overhead")
    st.dataframe(rows, hide_index=True, width="stretch",
                 column_config={"achieved GFLOP/s": st.column_config.NumberColumn(format=views.FIGURES),
                                "% of peak": st.column_config.NumberColumn(format=views.FIGURES)})


def _picker(cands) -> None:
    ranks = [c.rank for c in cands]
    st.session_state.picked_ranks = [r for r in picked() if r in ranks] or ranks[:1]
    st.multiselect("Picked candidates (for the Kernel and Export pages)", ranks, key="picked_ranks", on_change=_on_multiselect)


def page() -> None:
    head = candidates_page("Candidates", "The construction found no candidates: raise eps or top-K on the Workload page.")
    if head is None:
        return
    sel, construction = head
    profile_controls(sel, construction)
    result = profile()
    _table(construction, result)
    _picker(construction.candidates)
    _estimate(construction)
    left, right = st.columns(2)
    with left:
        _roofline(construction, result)
    with right:
        if result is not None:
            _comparison(result)
        else:
            st.info("Profile the candidates to compare predicted with measured times.")
    if result is not None:
        _diagnosis(result)


page()
