"""Export page: a candidate's bundle, as `workbench export` writes it (build, verify on CPU, then
`export_bundle`), downloaded as a zip or written to a directory. A kernel that fails to build or
gives wrong results is never exported; an existing non-empty directory is refused."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import streamlit as st

from workbench.app import views
from workbench.app.state import Selection, candidates_page, ordered_ranks, preset, profile
from workbench.codegen.export import export_bundle
from workbench.codegen.verify import Verification, verify
from workbench.errors import UserError
from workbench.hardware.loader import LOCAL_CPU
from workbench.profile.local import measure_library, thread_env
from workbench.profile.runner import Timing
from workbench.profile.session import BUILD_TIMEOUT_S, build_library
from workbench.profile.workers import Worker
from workbench.viz.fmt import micros

CHECK_ONLY = Timing(repeat=1, min_repeat_ms=0)  # the check runs once; its time is not used


def bundle_name(sel: Selection, rank: int) -> str:
    """A file-system-safe bundle name: workload, device, policy, rank."""
    raw = f"{sel.workload.describe()}-{sel.device.name}-{sel.policy}-rank{rank}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.")[:120]


def export_candidate(sel: Selection, s, cand, out: Path, zip: bool) -> tuple[Path, bool]:
    """Build (cached), verify on CPU devices, and export; (bundle path, verified). UserError when
    the kernel fails or the target is refused."""
    kernel = views.kernel(sel, cand.rank, s, cand)
    if not kernel.ok:
        raise UserError(f"candidate {cand.rank} did not build, nothing exported: {kernel.error}")
    # As `workbench export`: a CPU kernel is checked against numpy; a GPU kernel built on a machine
    # without that GPU is exported unverified, and the manifest says so (no measured time).
    checked = None
    if sel.device.kind == "cpu":
        checked = verify(kernel, s.space.expr) if sel.device.target == preset(LOCAL_CPU).target else _verify_apart(sel, s, cand)
    if checked is not None and not checked.correct:
        raise UserError(f"candidate {cand.rank} gives wrong results, nothing exported: {checked.error}")
    measured = {m.rank: m.best_seconds for m in profile().measurements if m.ok} if profile() else {}
    path = export_bundle(kernel, s.space.expr, cand.program, sel.device, out, policy=sel.policy, rank=cand.rank,
                         predicted_seconds=cand.predicted_seconds, measured_seconds=measured.get(cand.rank), zip=zip)
    return path, checked is not None


def _verify_apart(sel: Selection, s, cand) -> Verification:
    """Build and check a kernel for another CPU in a worker process, as the local runner does: it
    may use instructions this CPU lacks, and an illegal instruction must not kill the dashboard."""
    with tempfile.TemporaryDirectory(prefix="workbench-check-") as folder:
        worker = Worker(thread_env(sel.device))
        try:
            args = (s.space.expr, cand.program, sel.device, cand.rank, cand.predicted_seconds, f"{folder}/k.so")
            built = worker.call(build_library, args, BUILD_TIMEOUT_S)
            if built.error or not built.value.ok:
                return Verification(False, error=built.error or built.value.error)
            ran = worker.call(measure_library, (built.value, s.space.expr, CHECK_ONLY, "export"), CHECK_ONLY.timeout_s)
        finally:
            worker.close()
    if ran.error:
        return Verification(False, error=f"cannot run on this machine: {ran.error}")
    return Verification(ran.value.correct is True, error=ran.value.error)


def _zip_bytes(sel: Selection, s, cand) -> tuple[str, bytes]:
    name = bundle_name(sel, cand.rank)
    with tempfile.TemporaryDirectory(prefix="workbench-bundle-") as folder:
        path, _ = export_candidate(sel, s, cand, Path(folder) / name, zip=True)
        return path.name, path.read_bytes()


def _download(sel: Selection, s, cand) -> None:
    st.subheader("Download")
    if st.button("Build the bundle"):
        try:
            with st.spinner(f"building and verifying candidate {cand.rank}..."):
                st.session_state.bundle = (sel, cand.rank) + _zip_bytes(sel, s, cand)
        except UserError as err:
            st.error(str(err))
        except OSError as err:
            st.error(f"cannot write the bundle: {err.strerror or err}")
    bundle = st.session_state.get("bundle")
    if bundle is not None and bundle[:2] == (sel, cand.rank):
        name, data = bundle[2:]
        st.download_button(f"Download {name} ({len(data) / 1024:.0f} KiB)", data=data, file_name=name, mime="application/zip")


def _write(sel: Selection, s, cand) -> None:
    st.subheader("Write to a directory")
    out = st.text_input("Bundle directory (new, or empty)", value=str(Path.cwd() / "bundles" / bundle_name(sel, cand.rank)))
    if st.button("Write the bundle"):
        if not out.strip():
            st.error("give a directory path")
            return
        try:
            with st.spinner(f"building and verifying candidate {cand.rank}..."):
                path, verified = export_candidate(sel, s, cand, Path(out.strip()).expanduser(), zip=False)
        except UserError as err:
            st.error(str(err))
            return
        except OSError as err:
            st.error(f"{out}: {err.strerror or err}")
            return
        st.success(f"Wrote {path}" + ("" if verified else " (not run: no such device here)"))


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
