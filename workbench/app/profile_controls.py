"""Profile controls of the Candidates page: runner (this machine, or a TVM RPC tracker), the runs
store (a path inside the workspace), a progress bar fed by the session's ProgressEvents and, below
it, predicted against measured filling in as each measurement arrives. A failed session (bad tracker, unwritable store) shows an error
below what it measured before failing and keeps the previous result."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from workbench import pipeline
from workbench.app.messages import message
from workbench.app.state import in_workspace, workspace
from workbench.errors import UserError
from workbench.fmt import progress_text
from workbench.pipeline import Construction, Request, RunStore, Timing
from workbench.viz.figures import live_figure

if TYPE_CHECKING:  # annotations only
    from workbench.pipeline import Measurement, ProgressEvent

RUNNERS = {"This machine (local)": "local", "RPC tracker": "rpc"}
BUILD_SHARE = 0.5  # of the progress bar: building comes first, then measuring


def store_path() -> str:
    """The runs store path the Candidates and Runs pages share, always inside the workspace
    (default: the workspace's runs.sqlite3, the CLI's store unless $WORKBENCH_WORKSPACE moved it).
    UserError when the workspace cannot be made."""
    return st.session_state.get("store_path") or str(workspace() / pipeline.default_store_path().name)


def _on_store_path() -> None:
    """Take a typed store path if it is inside the workspace; else keep the last one, with why."""
    try:
        st.session_state.store_path = str(in_workspace(st.session_state.store_path_input))
        st.session_state.pop("store_path_error", None)
    except UserError as err:
        st.session_state.store_path_error = message(err)


def store_path_input() -> None:
    """The runs store box (relative paths are in the workspace); an error for a refused path."""
    try:
        st.session_state.store_path_input = store_path()
    except UserError as err:  # the workspace itself cannot be made
        st.error(message(err))
        return
    st.text_input("Runs store (SQLite)", key="store_path_input", on_change=_on_store_path,
                  help="a path inside the workspace (relative paths are taken from there)")
    if "store_path_error" in st.session_state:
        st.error(st.session_state.pop("store_path_error"))


@st.cache_resource(show_spinner=False, max_entries=32)
def _cannot_profile_here(device) -> str:
    """`pipeline.cannot_profile_here`, once per device for the server's life (it asks a worker
    process: about a second); the machine does not change while the server runs."""
    return pipeline.cannot_profile_here(device)


def _fraction(event: ProgressEvent) -> float:
    share = event.done / max(1, event.total)
    return BUILD_SHARE * share if event.phase == "build" else BUILD_SHARE + (1 - BUILD_SHARE) * share


def profile_controls(sel: Request, construction: Construction) -> None:
    """The profile form; a finished run is kept as the session's `profile`."""
    with st.expander("Profile", expanded=st.session_state.get("profile") is None):
        cols = st.columns([2, 1, 3])
        runner = RUNNERS[cols[0].radio("Runner", list(RUNNERS), horizontal=True)]
        repeat = int(cols[1].number_input("repeats per candidate", min_value=1, max_value=100, value=5))
        with cols[2]:
            store_path_input()
        tracker = key = None
        if runner == "rpc":
            cols = st.columns(2)
            tracker = cols[0].text_input("Tracker HOST:PORT", value="127.0.0.1:9190")
            key = cols[1].text_input("Device key", value="")
        refused = _cannot_profile_here(construction.device) if runner == "local" else ""
        if refused:
            st.warning(f"This machine cannot run {construction.device.name} kernels: {refused}. "
                       "Profile them with the RPC runner on a machine that can.")
        if st.button("Profile", type="primary", disabled=bool(refused)):
            _run(sel, construction, runner, tracker, key, repeat)


def _run(sel: Request, construction: Construction, runner: str, tracker, key, repeat: int) -> None:
    bar = st.progress(0.0, text="profiling: starting the build workers...")
    live = st.empty()  # redrawn on each measurement: predicted vs measured of those measured so far
    arrived: list[Measurement] = []

    def report(event: ProgressEvent) -> None:
        bar.progress(_fraction(event), text=progress_text(event)[:200])
        if event.measurement is not None:
            arrived.append(event.measurement)
            with live.container():
                st.plotly_chart(live_figure(construction.candidates, arrived), key=f"live_compare_{len(arrived)}")
                failed = [f"#{m.rank} {m.error or 'not checked'}" for m in arrived if not m.ok]
                if failed:
                    st.caption("no time: " + "; ".join(failed))

    try:
        with RunStore(store_path()) as store:
            result = pipeline.profile(construction, runner, label=sel.label, store=store, timing=Timing(repeat=repeat),
                                      progress=report, tracker=tracker, key=key, workload=sel.workload)
    except UserError as err:
        st.error(message(err) + (f" (the {len(arrived)} measured before are above, stored as a cancelled run)" if arrived else ""))
        return
    finally:
        bar.empty()
    live.empty()  # the candidate table now holds every measurement
    st.session_state.profile = result
    ok = sum(1 for m in result.measurements if m.ok)
    st.success(f"Profiled {len(result.measurements)} candidates ({ok} correct and timed) in {result.seconds:.1f} s; run {result.run_id}.")
