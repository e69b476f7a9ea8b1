"""Kernel page: what codegen made of a candidate. Generated source (CUDA C, or LLVM IR and
assembly on CPUs), the scheduled TVMScript and the schedule trace, a side-by-side diff of two
candidates, and on GPU devices the ptxas register / spill report where nvcc is installed.
Kernels are built in a worker process (`views.kernel`, `pipeline.build`) and never run here."""

from __future__ import annotations

import streamlit as st

from workbench import pipeline
from workbench.app import views
from workbench.app.state import candidates_page, ordered_ranks, selection
from workbench.fmt import duration, human_bytes, target_text
from workbench.viz.figures import changed_lines, entry_line, side_by_side_diff

CODE_HEIGHT = 520  # px: long kernels scroll inside the block
ARTIFACTS = ("scheduled TVMScript", "schedule trace", "main source")


def built_kernel(construction, rank: int):
    with st.spinner(f"building candidate {rank}..."):
        return views.kernel(selection(), rank, construction)


def _artifact(kernel, which: str) -> str:
    return {ARTIFACTS[0]: kernel.tvmscript, ARTIFACTS[1]: kernel.trace_python}.get(which, kernel.source)


def _sources(kernel) -> None:
    names = [pipeline.source_label(suffix)[0] for suffix, _ in kernel.sources]
    names += ["scheduled TVMScript", "schedule trace"]
    tabs = st.tabs(names)
    for tab, (suffix, text) in zip(tabs, kernel.sources):
        with tab:
            _source(kernel, suffix, text)
    tabs[-2].code(kernel.tvmscript, language="python", height=CODE_HEIGHT)
    tabs[-1].code(kernel.trace_python, language="python", height=CODE_HEIGHT)


def _source(kernel, suffix: str, text: str) -> None:
    """A source opened at the kernel's computation (`viz.source.entry_line`), the whole text in an
    expander and as a download."""
    start = entry_line(text, suffix, kernel.entry)
    name, language = pipeline.source_label(suffix)
    lines = text.splitlines()
    if start:
        st.caption(f"from line {start + 1} of {len(lines)}, where the computation is defined; the whole file below")
    st.code("\n".join(lines[start:]), language=language, line_numbers=True, height=CODE_HEIGHT)
    if start:
        with st.expander(f"the whole {name} ({len(lines)} lines)"):
            st.code(text, language=language, line_numbers=True, height=CODE_HEIGHT)
    st.download_button(f"Download {kernel.entry}.{suffix}", text, file_name=f"{kernel.entry}.{suffix}",
                       key=f"download_{suffix}")


def _diff(construction, ranks: list[int]) -> None:
    st.subheader("Diff of two candidates")
    if len(ranks) < 2:
        st.caption("Only one candidate: nothing to compare.")
        return
    cols = st.columns(3)
    a = cols[0].selectbox("left", ranks, index=0, format_func=lambda r: f"#{r}")
    b = cols[1].selectbox("right", ranks, index=1, format_func=lambda r: f"#{r}")
    which = cols[2].selectbox("compare", ARTIFACTS)
    ka, kb = built_kernel(construction, a), built_kernel(construction, b)
    if not (ka.ok and kb.ok):
        st.error("; ".join(f"#{r}: {k.error}" for r, k in ((a, ka), (b, kb)) if not k.ok))
        return
    left, right = _artifact(ka, which), _artifact(kb, which)
    st.caption(f"{changed_lines(left, right)} lines differ")
    st.html(side_by_side_diff(left, right, f"#{a} {which}", f"#{b} {which}"))


@st.cache_data(show_spinner=False, max_entries=32)
def _ptxas(source: str, arch: str):
    return pipeline.ptx_report(source, arch)


def _ptxas_report(kernel, device) -> None:
    if not device.launches_thread_blocks:
        return
    st.subheader("ptxas report")
    if not pipeline.has_nvcc():
        st.info("nvcc is not on PATH here: no register / spill report.")
        return
    arch = str(device.target_dict().get("arch", "sm_80"))
    with st.spinner("nvcc --ptx, ptxas -v..."):
        result = _ptxas(kernel.source, arch)
    if not result.ok or result.ptxas_report is None:
        st.error(result.error or "ptxas gave no report")
        return
    r = result.ptxas_report
    st.dataframe([{"arch": result.arch, "registers / thread": r.registers, "spill stores": human_bytes(r.spill_store_bytes),
                   "spill loads": human_bytes(r.spill_load_bytes), "stack": human_bytes(r.stack_bytes),
                   "shared": human_bytes(r.shared_bytes)}], hide_index=True)


def page() -> None:
    head = candidates_page("Kernel")
    if head is None:
        return
    sel, construction = head
    ranks = ordered_ranks(construction.candidates)
    rank = st.selectbox("Candidate", ranks, format_func=lambda r: f"#{r}: predicted {duration(construction.candidate(r).predicted_seconds)}")
    st.markdown(f"**Plan:** {construction.candidate(rank).plan_text}")
    kernel = built_kernel(construction, rank)
    if not kernel.ok:
        st.error(f"candidate {rank} did not build: {kernel.error}")
    else:
        st.caption(f"template {kernel.template}, target {target_text(kernel.target)}, built in {duration(kernel.build_seconds)}")
        _sources(kernel)
        _ptxas_report(kernel, sel.device)
    _diff(construction, ranks)


page()
