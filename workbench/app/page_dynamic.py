"""Dynamic shapes page (Vortex, docs/vortex.md): a catalog matmul / gemv with one `dyn` extent,
the few kernels `workbench vortex compile` keeps from the hardware hierarchy, each one's
predicted time against the dynamic extent with their lower envelope (the run-time dispatcher),
DietCode's sample positions, and the kernel the dispatcher picks for a typed value. Behind a
button, on a CPU device that runs here: the bundle compiled into the workspace and run at a few
values, measured and verified, drawn over the predictions."""

from __future__ import annotations

import hashlib

import streamlit as st

from workbench import pipeline
from workbench.app import views
from workbench.app.messages import message
from workbench.app.state import in_workspace, selection
from workbench.errors import UserError, first_line
from workbench.fmt import duration, shape_text
from workbench.pipeline import DYNAMIC_PARAMS, Workload
from workbench.viz.figures import MeasuredPoint, dynamic_figure, lower_envelope

# The paper's BERT GEMM (M = batch x sequence varies; K, N the hidden sizes) and the LLaMA-7B
# projection of the catalog's gemv, each with M dynamic.
DEFAULT_SHAPES = {"matmul": "M=dyn,K=768,N=2304", "gemv": "M=dyn,K=4096"}
DEFAULT_MAX = 2048
MAX_EXTENT_LIMIT = 1 << 16  # the curves price every step of every kernel up to the bound
DEFAULT_VALUE = 77  # a typical BERT batch x sequence that is no sample and no tile multiple
MAX_MEASURED = 12  # runs behind the button (each times repeats of at least 25 ms)


@st.cache_resource(show_spinner=False, max_entries=16)
def _plan(workload: Workload, device, max_extent: int) -> pipeline.VortexPlan:
    """The offline choice and its curves, shared by sessions (pure: no TVM build, a few seconds)."""
    return pipeline.vortex_plan(workload, device, max_extent)


def _measure_values(max_extent: int) -> str:
    """1, primes inside and outside DietCode's samples, a sample, and the bound."""
    picks = (1, 13, DEFAULT_VALUE, *pipeline.DIETCODE_SAMPLES[:1], 509, max_extent)
    return ",".join(str(v) for v in sorted(set(picks)))


def _parse_values(text: str) -> list[int]:
    """The comma-separated positive integers of `text`; UserError naming the first bad one."""
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit() or int(item) < 1:
            raise UserError(f"values to measure: {item!r} is not a positive integer")
        values.append(int(item))
    if not values:
        raise UserError("values to measure: give at least one value, e.g. 1,77,509")
    if len(values) > MAX_MEASURED:
        raise UserError(f"values to measure: at most {MAX_MEASURED}, got {len(values)}")
    return values


def _bundle(workload: Workload, device, max_extent: int):
    """The bundle for this workload, device and bound in the workspace: loaded where an earlier
    compile wrote it (its directory is named by a digest of all three), else compiled there."""
    digest = hashlib.sha256(repr((workload, device, max_extent)).encode()).hexdigest()[:12]
    params = "-".join(f"{k}{v}" for k, v in workload.params)
    path = in_workspace(f"vortex/{workload.op}-{params}-max{max_extent}-{digest}")
    if (path / "manifest.json").is_file():
        return pipeline.vortex_load(path)
    return pipeline.vortex_compile(workload, device, path, max_extent)


def _inputs() -> tuple[Workload, int] | None:
    cols = st.columns([1, 2, 1])
    op = cols[0].selectbox("Operator", list(DYNAMIC_PARAMS))
    text = cols[1].text_input("Parameters (one of them dyn)", DEFAULT_SHAPES[op], key=f"dynamic-params-{op}",
                              help=f"{op}: {', '.join(DYNAMIC_PARAMS[op])} may be dyn")
    max_extent = int(cols[2].number_input("Largest value covered", 1, MAX_EXTENT_LIMIT, DEFAULT_MAX, step=1,
                                          help="the offline choice covers 1..this; larger values run padded"))
    try:
        workload = pipeline.parse_workload(op, text)
    except UserError as err:
        st.error(message(err, {"--shape": "parameters"}))
        return None
    return workload, max_extent


def _kernel_rows(plan: pipeline.VortexPlan, value: int | None) -> list[dict]:
    """One row per kept kernel: its outer tile, its tile per layer, how many values of 1..max
    the dispatcher gives it (each step of the envelope covers the values up to the next one)
    and, for a typed value, its predicted time there."""
    _, on_envelope = lower_envelope(dict(zip((k for k, _ in plan.table.kernels), plan.curves)))
    ends = [*plan.values[1:], plan.values[-1] + 1]
    covered = {k: 0 for k, _ in plan.table.kernels}
    for kernel, start, end in zip(on_envelope, plan.values, ends):
        covered[kernel] += end - start
    rows = []
    for kernel, program in plan.table.kernels:
        row = {"kernel": kernel, f"outer tile ({plan.dyn.param})": plan.outer(kernel)}
        row |= {layer: shape_text(tile) for layer, tile in zip(program.layers, program.tiles)}
        row[f"values picked (of 1..{plan.dyn.max_extent})"] = covered[kernel]
        if value is not None:
            row[f"predicted at {plan.dyn.param}={value}"] = duration(plan.seconds(kernel, value))
        rows.append(row)
    return rows


def _measure_section(plan: pipeline.VortexPlan, workload: Workload, device, max_extent: int, key: tuple) -> None:
    """Compile the bundle and run it at a few values, behind a button (builds: seconds)."""
    st.subheader("Compile and measure on this CPU")
    if not device.runs_on_cpu:
        st.info(f"Compiling a bundle needs a CPU device that runs here; {device.name} is a {device.kind}.")
        return
    text = st.text_input("Values to measure", _measure_values(max_extent), key=f"dynamic-measure-{max_extent}")
    if st.button("Compile and measure", help="compile the bundle into the workspace (seconds), then run, verify "
                                             "and time the dispatcher's kernel at each value"):
        try:
            values = _parse_values(text)
            with st.spinner("compiling the bundle: each kernel built and verified against numpy..."):
                bundle = _bundle(workload, device, max_extent)
            with st.spinner(f"running at {len(values)} values..."):
                runs = [pipeline.vortex_run(bundle, v) for v in values]
            st.session_state["dynamic_run"] = (key, str(bundle.path), bundle.manifest, runs)
        except UserError as err:  # the last measurements, if any, stay below
            st.error(message(err))
        except RuntimeError as err:  # TVM's own errors at run time
            st.error(f"the run failed: {first_line(err)}")
    done = st.session_state.get("dynamic_run")
    if done is None or done[0] != key:
        st.caption("Builds each kernel once with a symbolic outer extent (seconds), then runs the dispatcher's "
                   "choice at each value on random inputs, checks it against numpy and times it.")
        return
    _, path, manifest, runs = done
    st.caption(f"bundle {path}: {len(manifest['kernels'])} kernels, compiled in "
               f"{manifest['compile_seconds']:.1f} s" + (f", {len(manifest['failed'])} failed" if manifest["failed"] else ""))
    wrong = [r for r in runs if not r["correct"]]
    if wrong:
        st.error(f"{len(wrong)} of {len(runs)} runs gave a WRONG result: "
                 + "; ".join(f"{plan.dyn.param}={r['shape'][plan.dyn.param]}: {r['error']}" for r in wrong))
    else:
        st.success(f"all {len(runs)} runs verified against numpy")
    views.time_table([{plan.dyn.param: r["shape"][plan.dyn.param], "kernel": r["kernel"],
                       "predicted us": r["predicted_seconds"] * 1e6,
                       "measured us": None if r["measured_seconds"] is None else r["measured_seconds"] * 1e6,
                       "correct": r["correct"]} for r in runs])


def _measured(plan: pipeline.VortexPlan, key: tuple) -> list[MeasuredPoint]:
    done = st.session_state.get("dynamic_run")
    if done is None or done[0] != key:
        return []
    return [MeasuredPoint(r["shape"][plan.dyn.param], r["kernel"], r["measured_seconds"], r["correct"])
            for r in done[3]]


def page() -> None:
    st.title("Dynamic shapes")
    device = selection().device
    st.caption(f"Vortex on {device.name} (change the device on the Workload page): kernels built once without "
               "shape samples, one picked per shape at run time by predicted cost")
    chosen = _inputs()
    if chosen is None:
        return
    workload, max_extent = chosen
    try:
        with st.spinner("building the hierarchy's candidates and pricing them over every value..."):
            plan = _plan(workload, device, max_extent)
    except UserError as err:
        st.error(message(err, {"--shape": "parameters"}))
        return
    param = plan.dyn.param
    key = (workload, device, max_extent)
    cols = st.columns(3)
    cols[0].metric("hierarchy candidates", plan.candidates)
    cols[1].metric("kernels kept", len(plan.table.kernels), help="the greedy cover of the candidates' lower envelope")
    value = int(st.number_input("shape", value=DEFAULT_VALUE, step=1,
                                help=f"a value of {param}: which kernel does the dispatcher pick?"))
    picked = None
    try:
        kernel, seconds = pipeline.vortex_pick(plan, value)
        outer, padded = plan.outer(kernel), plan.padded(kernel, value)
        beyond = f"; beyond the largest value covered ({max_extent})" if value > max_extent else ""
        st.success(f"{param}={value}: the dispatcher picks {kernel} (outer tile {outer}, runs {param}={padded}), "
                   f"predicted {duration(seconds)}{beyond}")
        picked = (value, kernel, seconds)
    except UserError as err:
        st.error(f"shape: {message(err)}")
    chart = st.container()  # drawn last: a click below adds its measured points
    samples = ", ".join(map(str, pipeline.DIETCODE_SAMPLES))
    low, high = pipeline.DIETCODE_SAMPLES[0], pipeline.DIETCODE_SAMPLES[-1]
    st.caption(f"Triangles: DietCode's samples ({param} = {samples}, Vortex's Table 6). DietCode tunes on those and "
               f"picks by the nearest sample: every {param} below {low} runs the kernel chosen at {low}, every one "
               f"above {high} the kernel chosen at {high}. Vortex prices every kernel at the actual value: no samples.")
    views.time_table(_kernel_rows(plan, value if picked else None))
    _measure_section(plan, workload, device, max_extent, key)
    curves = {k: row for (k, _), row in zip(plan.table.kernels, plan.curves)}
    chart.plotly_chart(dynamic_figure(plan.values, curves, param, pipeline.DIETCODE_SAMPLES, _measured(plan, key),
                                      picked), key="dynamic-curves")


page()
