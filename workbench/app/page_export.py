"""Export page: a candidate's bundle, written by `export_candidate` as `workbench export` writes
it (built and checked in a worker process, refused when it fails), downloaded as a zip or written
to a directory inside the workspace. Any refusal is an error message; the session stays."""

from __future__ import annotations

import tempfile
from pathlib import Path

import streamlit as st

from workbench.app.state import Selection, candidates_page, in_workspace, ordered_ranks, profile, workspace
from workbench.codegen.export import ExportResult, bundle_name, export_candidate
from workbench.errors import UserError
from workbench.viz.fmt import micros


def selection_bundle_name(sel: Selection, rank: int) -> str:
    return bundle_name(sel.workload.describe(), sel.device.name, sel.policy, f"rank{rank}")


def export(sel: Selection, s, cand, out: Path, zip: bool) -> ExportResult:
    """Build, check and export `cand` to `out`, with its measured time if the session's profile has
    one; UserError (KernelRejected included) when the path or the kernel is refused."""
    measured = {m.rank: m.best_seconds for m in profile().measurements if m.ok} if profile() else {}
    return export_candidate(s.space.expr, cand, sel.device, out, policy=sel.policy,
                            measured_seconds=measured.get(cand.rank), zip=zip)


def _zip_bytes(sel: Selection, s, cand) -> tuple[str, bytes]:
    """The zipped bundle, made in a temporary directory of the server's (nothing typed)."""
    with tempfile.TemporaryDirectory(prefix="workbench-bundle-") as folder:
        result = export(sel, s, cand, Path(folder) / selection_bundle_name(sel, cand.rank), zip=True)
        return result.path.name, result.path.read_bytes()


def _download(sel: Selection, s, cand) -> None:
    st.subheader("Download")
    if st.button("Build the bundle"):
        try:
            with st.spinner(f"building and checking candidate {cand.rank}..."):
                st.session_state.bundle = (sel, cand.rank) + _zip_bytes(sel, s, cand)
        except UserError as err:
            st.error(str(err))
        except OSError as err:  # reading the zip back
            st.error(f"cannot read the bundle: {err.strerror or err}")
    bundle = st.session_state.get("bundle")
    if bundle is not None and bundle[:2] == (sel, cand.rank):
        name, data = bundle[2:]
        st.download_button(f"Download {name} ({len(data) / 1024:.0f} KiB)", data=data, file_name=name, mime="application/zip")


def _write(sel: Selection, s, cand) -> None:
    st.subheader("Write to a directory")
    try:
        root = workspace()
    except UserError as err:
        st.error(str(err))
        return
    st.caption(f"inside the workspace {root}")
    out = st.text_input("Bundle directory (new, or empty)", value=f"bundles/{selection_bundle_name(sel, cand.rank)}")
    if st.button("Write the bundle"):
        try:
            path = in_workspace(out)
            with st.spinner(f"building and checking candidate {cand.rank}..."):
                result = export(sel, s, cand, path, zip=False)
        except UserError as err:
            st.error(str(err))
            return
        st.success(f"Wrote {result.path}: {result.summary()}")


def page() -> None:
    head = candidates_page("Export")
    if head is None:
        return
    s, sel, cands = head
    by_rank = {c.rank: c for c in cands}
    rank = st.selectbox("Candidate", ordered_ranks(cands), format_func=lambda r: f"#{r}: predicted {micros(by_rank[r].predicted_seconds)}")
    left, right = st.columns(2)
    with left:
        _download(sel, s, by_rank[rank])
    with right:
        _write(sel, s, by_rank[rank])


page()
