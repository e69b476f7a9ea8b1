"""Models page: every operator of an ONNX model constructed, its operator graph coloured by
predicted time, the Rammer co-schedule as a Gantt chart; an operator opens in Construction."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import streamlit as st

from workbench.app import views
from workbench.app.messages import message
from workbench.app.state import selection, set_selection
from workbench.errors import UserError
from workbench.files import check_size, read_user_file
from workbench import pipeline
from workbench.pipeline import MAX_MODEL_BYTES, Request
from workbench.viz.dataflow import dataflow_figure
from workbench.viz.fmt import duration
from workbench.viz.gantt import gantt_figure
from workbench.workload import Workload

SAMPLES = Path(__file__).resolve().parents[2] / "sample_models"


@st.cache_resource(show_spinner=False, max_entries=8)
def _constructed(path: str, digest: str, device, policy: str, options):
    """A model's construction, shared by sessions; keyed by the file's content digest."""
    return pipeline.construct_model(path, device, policy, options)


def _uploaded(upload) -> str:
    data = upload.getvalue()
    check_size(len(data), f"model {upload.name}", MAX_MODEL_BYTES)
    digest = hashlib.sha256(data).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"workbench-upload-{digest}.onnx"
    path.write_bytes(data)
    return str(path)


def _model_path() -> str | None:
    samples = sorted(p.name for p in SAMPLES.glob("*.onnx"))
    choice = st.radio("Model", ["Sample model", "Upload"], horizontal=True)
    if choice == "Sample model":
        return str(SAMPLES / st.selectbox("Sample", samples))
    upload = st.file_uploader("ONNX model", type=["onnx"])
    return _uploaded(upload) if upload is not None else None


def _open_operator(sel: Request, path: str, index: int) -> None:
    new = Request(Workload(model=path, operator=index), sel.device, sel.policy, sel.options)
    new.expr()  # refuse an unsupported operator before the selection changes
    set_selection(new)


def page() -> None:
    st.title("Models")
    sel = selection()
    st.caption(f"device {sel.device.name}, policy {sel.policy}, top-{sel.options.topk} (change them on the Workload page)")
    try:
        path = _model_path()
        if path is None:
            st.info("Choose a sample model or upload an .onnx file.")
            return
        digest = hashlib.sha256(read_user_file(path, "model", MAX_MODEL_BYTES)).hexdigest()
        with st.spinner("importing and constructing every operator..."):
            mc = _constructed(path, digest, sel.device, sel.policy, sel.options)
    except UserError as err:
        st.error(message(err))
        return
    names = [r.operator.name for r in mc.results]
    seconds = [r.predicted_seconds for r in mc.results]
    cols = st.columns(3)
    cols[0].metric("operators", len(names))
    cols[1].metric("predicted, one by one", duration(mc.sum_seconds))
    cols[2].metric("predicted, co-scheduled", duration(mc.plan.seconds))
    event = st.plotly_chart(dataflow_figure(names, [r.operator.preds for r in mc.results], seconds),
                            on_select="rerun", key="model-graph")
    picked = [p["customdata"] for p in event.selection.points] if event and event.selection.points else []
    rows = [{"#": i, "operator": n, "kind": r.operator.kind, "candidates": len(r.candidates),
             "predicted us": None if s is None else s * 1e6, "unsupported": r.reason}
            for i, (n, r, s) in enumerate(zip(names, mc.results, seconds))]
    views.time_table(rows)
    supported = [i for i, r in enumerate(mc.results) if r.supported]
    if supported:
        default = supported.index(picked[0]) if picked and picked[0] in supported else 0
        index = st.selectbox("Operator", supported, index=default, format_func=lambda i: f"{i}: {names[i]}")
        if st.button("Open in Construction"):
            try:
                _open_operator(sel, path, index)
                st.switch_page("workbench/app/page_construction.py")  # relative to app.py
            except UserError as err:
                st.error(message(err))
    st.subheader("Co-schedule (Rammer wavefront)")
    st.plotly_chart(gantt_figure(mc.plan, names), key="model-gantt")


page()
