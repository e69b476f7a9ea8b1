"""Device controls of the Workload page: a preset, this machine (detected, or calibrated in this
session), or an uploaded spec TOML validated by the same loader as `specs/devices/*.toml`; and,
where the What-if page edited the device, that edited spec."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from workbench import pipeline
from workbench.app.messages import message
from workbench.app.state import edited, preset
from workbench.errors import UserError, first_line
from workbench.fmt import duration, gbps, gflops, human_bytes, micro_kernel_grid
from workbench.pipeline import LOCAL_CPU

if TYPE_CHECKING:  # annotations only
    from workbench.pipeline import DeviceSpec

SOURCES = ("Preset", "This machine (local-cpu)", "Upload a spec TOML")
EDITED = "Edited on the What-if page"


def _source_of(current: DeviceSpec) -> int:
    if any(current == preset(name) for name in pipeline.device_presets()):
        return 0
    if current.runs_on_cpu and current.name == preset(LOCAL_CPU).name:
        return 1
    return 2


def device_controls(current: DeviceSpec) -> DeviceSpec | None:
    """The device the user chose (None, with the reason shown, when there is none yet)."""
    edit = edited()
    if edit is not None and edit.spec == current:
        source = st.radio("Device", SOURCES + (EDITED,), index=len(SOURCES), horizontal=True)
    else:
        source = st.radio("Device", SOURCES, index=_source_of(current), horizontal=True)
    if source == EDITED:
        st.caption(f"{edit.base.name} with {', '.join(map(str, edit.edits))}")
        spec = edit.spec
    elif source == SOURCES[0]:
        names = pipeline.device_presets()
        index = names.index(current.name) if current.name in names else 0
        spec = preset(st.selectbox("Preset", names, index=index))
    elif source == SOURCES[1]:
        spec = _local_controls()
    else:
        spec = _upload_controls()
    if spec is not None:
        _summary(spec)
    return spec


def _local_controls() -> DeviceSpec | None:
    _calibrate_first_use()
    spec = st.session_state.get("calibrated") or preset(LOCAL_CPU)
    caption = st.empty()  # filled in last: a calibration below changes what it says
    cols = st.columns([1, 2])
    quick = cols[1].checkbox("quick (a few seconds: a smaller DRAM working set, three float32 micro-kernels; "
                             "the full calibration takes about 30 s)", value=True)
    if cols[0].button("Calibrate"):
        measured = _calibrate(quick)
        if measured is not None:
            st.session_state.calibrated = spec = measured
            st.success(f"Calibrated: bandwidths, peak compute and {_kernels(len(measured.micro_kernels))} "
                       "measured on this machine (used by this session).")
    caption.caption(f"{spec.name}: {spec.compute_units} cores, " + _calibration_text(spec))
    return spec


def _calibrate_first_use() -> None:
    """The quick calibration, run by itself the first time this machine is chosen here
    (`pipeline.calibrate_first_use`, stored where `local-cpu` loads it from), in one line."""
    line = st.empty()
    note = pipeline.calibrate_first_use(line.info)
    if note:
        preset.clear()  # the cached local-cpu is the detected spec: load the calibrated one
        line.caption(note)


def _kernels(n: int) -> str:
    return f"{n} register micro-kernel{'' if n == 1 else 's'}"


def _calibration_text(spec: DeviceSpec) -> str:
    if not spec.calibrated:
        return "detected (not calibrated)"
    return f"calibrated ({_kernels(len(spec.micro_kernels))} measured)" if spec.micro_kernels else "calibrated"


def _calibrate(quick: bool) -> DeviceSpec | None:
    detected = pipeline.detect_local_device()  # calibrate the fresh detection: sources would nest otherwise
    total = pipeline.calibration_size(detected, quick)
    bar = st.progress(0.0, text="calibrating: starting the benchmark process...")
    done = []

    def report(line: str) -> None:
        done.append(line)
        bar.progress(min(1.0, len(done) / total), text=f"calibrating: {line}")

    try:
        with st.spinner("calibrating..."):
            return pipeline.calibrate_device(detected, quick=quick, progress=report)
    except UserError as err:
        st.error(message(err))
    except Exception as err:  # the benchmark process can die in many ways; the session must not
        st.error(f"calibration failed: {first_line(err)}")
    finally:
        bar.empty()
    return None


def _upload_controls() -> DeviceSpec | None:
    upload = st.file_uploader("Device spec (TOML, as in specs/devices/)", type=["toml"])
    if upload is None:
        st.info("Upload a spec file; it is validated as the presets are.")
        return None
    try:
        # Checks the target with TVM and LLVM too: a triple LLVM cannot compile for would
        # otherwise crash the server when the Kernel page builds a candidate.
        return pipeline.device_from_toml(upload.getvalue(), upload.name)
    except UserError as err:
        st.error(message(err))
        return None


def _summary(spec: DeviceSpec) -> None:
    summary = pipeline.device_summary(spec)
    st.caption(f"**{spec.name}** ({spec.kind}, {spec.compute_units} units), peak "
               + ", ".join(f"{d} {gflops(g)}" for d, g in summary["peak_gflops"].items()))
    rows = [{"layer": l["name"], "scope": l["scope"], "capacity": human_bytes(l["capacity_bytes"]),
             "bandwidth": gbps(l["bandwidth_gbps"]), "latency": duration(l["latency_ns"] * 1e-9)}
            for l in summary["layers"]]
    st.dataframe(rows, hide_index=True, width="stretch")
    if spec.micro_kernels:
        _micro_kernels(spec)


def _micro_kernels(spec: DeviceSpec) -> None:
    """The measured register micro-kernels as a grid per dtype: rows of accumulators down,
    columns (elements along the vector axis) across, GFLOP/s of the whole device in each cell."""
    st.caption(f"{_kernels(len(spec.micro_kernels))} measured by calibration (Vortex's level 0): GFLOP/s of "
               "C[rows, columns] += A[rows, k] x B[k, columns] on every core, rows down, columns across; the "
               "model takes a register tile's compute rate from here where it was measured")
    dtypes = sorted({k.dtype for k in spec.micro_kernels})
    for col, dtype in zip(st.columns(len(dtypes)), dtypes):
        col.markdown(f"**{dtype}**")
        col.dataframe(micro_kernel_grid(spec.micro_kernels, dtype), hide_index=True)
