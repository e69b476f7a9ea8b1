"""Models page: every operator of an ONNX model constructed (its symbolic input dims bound to
the values typed in, 1 where none is; the operators depending on each and their Vortex command
lines shown), its operator graph coloured by predicted time, the operators not constructed, the
Rammer co-schedule as a Gantt chart and its gain over one kernel at a time with the device's
launch overhead; an operator opens in Construction. On a CPU device that runs here, a button runs the whole model (`workbench model
--run`, with each operator's rank 1 or the measured best of its top K, `--pick measured`, whose
profiles go to the runs store of the Candidates and Runs pages): outputs against ONNX Runtime,
per-operator time measured beside predicted, beside ONNX Runtime's profiled nodes of the same
operator, and the rank run, a warning naming every operator that ran TVM's default lowering and
why, end to end beside ONNX Runtime and TVM's default build."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import streamlit as st

from workbench import pipeline
from workbench.app import views
from workbench.app.messages import message
from workbench.app.profile_controls import store_path
from workbench.app.state import selection, set_selection
from workbench.errors import UserError, first_line
from workbench.fmt import duration
from workbench.pipeline import Request, RunStore, Workload
from workbench.viz.figures import dataflow_figure, gantt_figure

SAMPLES = Path(__file__).resolve().parents[2] / "sample_models"


@st.cache_resource(show_spinner=False, max_entries=8)
def _constructed(path: str, digest: str, dims: str, device, policy: str, options):
    """A model's construction at the symbolic dims `dims` (`--dim` text), shared by sessions;
    keyed by the file's content digest."""
    return pipeline.construct_model(pipeline.import_onnx(path, dims), device, policy, options)


def _uploaded(upload) -> str:
    data = upload.getvalue()
    pipeline.check_model_upload(data, upload.name)
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


def _dims_input(path: str) -> str:
    """The values of the model's symbolic input dims as `--dim` text ("" when it has none): a
    dim left out is bound to 1, as in `workbench model`."""
    names = pipeline.model_symbolic_dims(path)
    if not names:
        return ""
    return st.text_input(f"Symbolic dims ({', '.join(names)})", placeholder=",".join(f"{n}=1" for n in names),
                         key=f"model-dims-{path}", help="NAME=VALUE,... (e.g. " + ",".join(f"{n}=4" for n in names)
                         + "); each dim left out is bound to 1 (the default)")


def _symbolic_dims(mc) -> None:
    """Each symbolic dim's value, the operators that depend on it and the `workbench vortex
    compile` line of each matmul among them (or why there is none)."""
    dims = pipeline.report_dict(mc)["symbolic_dims"]
    if not dims:
        return
    st.caption("symbolic dims: " + ", ".join(f"{n}={d['value']}" + (" (default)" if d["default"] else "")
                                            for n, d in dims.items()))
    for name, d in dims.items():
        if d["operators"] is None:
            st.caption(f"{name}: {d['note']}")
            continue
        st.caption(f"{name}: {len(d['operators'])} operators depend on it: {', '.join(d['operators']) or 'none'}")
        for w in d["vortex"]:
            if w["command"]:
                st.code(w["command"], language="bash")
            else:
                st.caption(f"{w['operator']}: no Vortex command ({w['reason']})")


def _open_operator(sel: Request, path: str, index: int, mc) -> None:
    """Construction opens the operator at the symbolic dims the model was constructed at."""
    dims = tuple((d.name, d.value) for d in mc.model.dims)
    new = Request(Workload(model=path, operator=index, dims=dims), sel.device, sel.policy, sel.options)
    new.expr()  # refuse an unsupported operator before the selection changes
    set_selection(new)


def _rammer(mc) -> None:
    """One kernel at a time against the co-schedule, both with the device's launches."""
    launch = mc.device.launch_seconds
    cols = st.columns(4)
    cols[0].metric("operators", len(mc.results))
    cols[1].metric("predicted, one by one", duration(mc.sum_seconds),
                   help=f"{mc.plan.sequential_launches} kernel launches of {duration(launch)} included")
    cols[2].metric("predicted, co-scheduled", duration(mc.plan.seconds),
                   help=f"one rProgram: {mc.plan.launches} launch of {duration(launch)} included")
    cols[3].metric("Rammer gain", f"{mc.rammer_gain:.2f}x")
    source = dict(mc.device.sources).get("launch_overhead_us", "")
    st.caption(f"kernel launch on {mc.device.name}: {duration(launch)}" + (f" ({source})" if source else ""))


def _run_key(path: str, digest: str, dims: str, sel: Request, pick: str) -> tuple:
    return (path, digest, dims, sel.device, sel.policy, sel.options, pick)


def _run(mc, path: str, pick: str):
    """`workbench model --run [--pick measured]`: the measured pick stores its profiles in the
    runs store the Candidates and Runs pages show."""
    if pick == "rank1":
        return pipeline.run_model_report(mc, path)
    with RunStore(store_path()) as store:
        return pipeline.run_model_report(mc, path, pick=pick, store=store)


def _run_section(mc, path: str, digest: str, dims: str, sel: Request) -> None:
    """The whole model run on this CPU, behind a button (it builds every kernel: seconds)."""
    st.subheader("Run on this CPU")
    if not sel.device.runs_on_cpu:
        st.info(f"Running a model needs a CPU device; {sel.device.name} is a {sel.device.kind}.")
        return
    picks = {"rank 1": "rank1", f"measured best of top {sel.options.topk}": "measured"}
    pick = picks[st.radio("Kernels", list(picks), horizontal=True, key="model-pick",
                          help="rank 1: each operator's best predicted candidate; measured: build, verify and time "
                          "each distinct operator's top K here first (as Profile does, stored in the runs store) "
                          "and run the fastest correct one")]
    key = _run_key(path, digest, dims, sel, pick)
    if st.button("Run the model", help="build every kernel, check the outputs against ONNX Runtime, time it"):
        try:
            with st.spinner("building every kernel, running against ONNX Runtime and TVM's default build..."):
                st.session_state["model_run"] = (key, _run(mc, path, pick))
        except UserError as err:
            st.error(message(err))
            return
        except RuntimeError as err:  # a kernel that failed at run time (named by execute), TVM's own errors
            st.error(f"the run failed: {first_line(err)}")
            return
    done = st.session_state.get("model_run")
    if done is None or done[0] != key:
        st.caption("Builds every operator's kernel (rank 1 or the measured best), runs it on random inputs and times it.")
        return
    run = done[1]
    st.caption(run.pick_text())
    if run.outputs_constant:
        st.warning(run.check_text())
    elif run.outputs_match:
        st.success(f"outputs match ONNX Runtime (max abs error {run.max_abs_error:.2e})")
    else:
        st.error(f"outputs DO NOT match ONNX Runtime (max abs error {run.max_abs_error:.2e})")
    cols = st.columns(4)
    cols[0].metric(f"workbench ({run.kernel_threads} threads)", duration(run.seconds))
    cols[1].metric("predicted, one by one", duration(mc.sum_seconds))
    cols[2].metric(f"ONNX Runtime ({run.threads} threads)", duration(run.onnxruntime_seconds),
                   f"{run.onnxruntime_seconds / run.seconds:.2f}x ours", delta_color="off")
    if run.tvm_default_seconds is not None:
        cols[3].metric("TVM default build", duration(run.tvm_default_seconds),
                       f"{run.tvm_default_seconds / run.seconds:.2f}x ours", delta_color="off")
    else:
        cols[3].metric("TVM default build", "failed", help=run.tvm_default_error)
    names = [o.name for o in run.operators]
    st.bar_chart({"measured us": [o.measured_seconds * 1e6 for o in run.operators],
                  "predicted us": [(o.predicted_seconds or 0.0) * 1e6 for o in run.operators]},
                 x_label="operator (dataflow order)", y_label="us", stack=False)
    fell_back = run.not_scheduled
    if fell_back:
        st.warning(f"{len(fell_back)} operators ran TVM's default lowering instead of a constructed kernel:\n"
                   + "\n".join(f"- {o.name}: {o.reason}" for o in fell_back))
    st.caption("ours against ONNX Runtime per operator: ONNX Runtime's own per-node profile, its nodes mapped "
               "to the operator that computes their outputs")
    views.time_table([{"#": i, "operator": n, "measured us": o.measured_seconds * 1e6,
                       "predicted us": None if o.predicted_seconds is None else o.predicted_seconds * 1e6,
                       "ORT us": None if o.onnxruntime_seconds is None else o.onnxruntime_seconds * 1e6,
                       "ORT / ours": None if o.onnxruntime_seconds is None else o.onnxruntime_seconds / o.measured_seconds,
                       "ORT nodes": ", ".join(o.onnxruntime_nodes),
                       "kernel": ("scheduled" if o.scheduled else "TVM default lowering")
                       + (", in place: not run in the whole model" if o.in_place else ""), "rank": o.rank}
                      for i, (n, o) in enumerate(zip(names, run.operators))])
    if run.onnxruntime_unmatched:
        st.caption(f"ONNX Runtime nodes no operator computes: "
                   + ", ".join(f"{n} ({t}, {duration(sec)}: {why})" for n, t, sec, why in run.onnxruntime_unmatched))


def page() -> None:
    st.title("Models")
    sel = selection()
    st.caption(f"device {sel.device.name}, policy {sel.policy}, top-{sel.options.topk} (change them on the Workload page)")
    try:
        path = _model_path()
        if path is None:
            st.info("Choose a sample model or upload an .onnx file.")
            return
        digest = hashlib.sha256(pipeline.model_bytes(path)).hexdigest()
        dims = _dims_input(path)
        with st.spinner("importing and constructing every operator..."):
            mc = _constructed(path, digest, dims, sel.device, sel.policy, sel.options)
    except UserError as err:
        st.error(message(err, {"--dim": "Symbolic dims"}))
        return
    names = [r.operator.name for r in mc.results]
    seconds = [r.predicted_seconds for r in mc.results]
    _symbolic_dims(mc)
    _rammer(mc)
    missing = [r for r in mc.results if not r.supported]
    if missing:
        st.warning(f"{len(missing)} of {len(names)} operators not constructed, left out of the predicted times: "
                   + "; ".join(f"{r.operator.name} ({r.reason})" for r in missing))
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
                _open_operator(sel, path, index, mc)
                st.switch_page("workbench/app/page_construction.py")  # relative to app.py
            except UserError as err:
                st.error(message(err))
    st.subheader("Co-schedule (Rammer wavefront)")
    st.plotly_chart(gantt_figure(mc.plan, [r.operator.name for r in mc.results if r.supported]), key="model-gantt")
    _run_section(mc, path, digest, dims, sel)


page()
