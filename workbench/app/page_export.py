"""Export page: a candidate's bundle, written by `pipeline.export` as `workbench export` writes
it (built and checked in a worker process, refused when it fails), downloaded as a zip or written
to a directory inside the workspace. Any refusal is an error message; the session stays."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from workbench import pipeline
from workbench.app.messages import message
from workbench.app.state import candidates_page, in_workspace, ordered_ranks, profile, workspace
from workbench.errors import UserError
from workbench.fmt import duration, human_bytes
from workbench.pipeline import Construction, Request

if TYPE_CHECKING:  # annotations only
    from workbench.pipeline import ExportResult


def export(sel: Request, construction: Construction, rank: int, out: Path, zip: bool) -> ExportResult:
    """Build, check and export candidate `rank` to `out`, with its measured time if the session's
    profile has one (an operator of a model checked in a run of the model); UserError
    (KernelRejected included) when the path or the kernel is refused."""
    measured = {m.rank: m.best_seconds for m in profile().measurements if m.ok} if profile() else {}
    return pipeline.export(construction, rank, out, zip=zip, measured_seconds=measured.get(rank), workload=sel.workload)


def _zip_bytes(sel: Request, construction: Construction, rank: int) -> tuple[str, bytes]:
    """The zipped bundle, made in a temporary directory of the server's (nothing typed)."""
    with tempfile.TemporaryDirectory(prefix="workbench-bundle-") as folder:
        result = export(sel, construction, rank, Path(folder) / pipeline.bundle_name_for(construction, rank, sel.label), zip=True)
        return result.path.name, result.path.read_bytes()


def _download(sel: Request, construction: Construction, rank: int) -> None:
    st.subheader("Download")
    if st.button("Build the bundle"):
        try:
            with st.spinner(f"building and checking candidate {rank}..."):
                st.session_state.bundle = (sel, rank) + _zip_bytes(sel, construction, rank)
        except UserError as err:
            st.error(message(err))
        except OSError as err:  # reading the zip back
            st.error(f"cannot read the bundle: {err.strerror or err}")
    bundle = st.session_state.get("bundle")
    if bundle is not None and bundle[:2] == (sel, rank):
        name, data = bundle[2:]
        st.download_button(f"Download {name} ({human_bytes(len(data))})", data=data, file_name=name, mime="application/zip")


def _write(sel: Request, construction: Construction, rank: int) -> None:
    st.subheader("Write to a directory")
    try:
        root = workspace()
    except UserError as err:
        st.error(message(err))
        return
    st.caption(f"inside the workspace {root}")
    out = st.text_input("Bundle directory (new, or empty)", value=f"bundles/{pipeline.bundle_name_for(construction, rank, sel.label)}")
    if st.button("Write the bundle"):
        try:
            path = in_workspace(out)
            with st.spinner(f"building and checking candidate {rank}..."):
                result = export(sel, construction, rank, path, zip=False)
        except UserError as err:
            st.error(message(err))
            return
        st.success(f"Wrote {result.path}: {result.summary()}")


def page() -> None:
    head = candidates_page("Export")
    if head is None:
        return
    sel, construction = head
    rank = st.selectbox("Candidate", ordered_ranks(construction.candidates), format_func=lambda r: f"#{r}: predicted {duration(construction.candidate(r).predicted_seconds)}")
    left, right = st.columns(2)
    with left:
        _download(sel, construction, rank)
    with right:
        _write(sel, construction, rank)


page()
