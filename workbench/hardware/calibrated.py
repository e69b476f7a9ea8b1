"""A calibration's results stored in the spec (`apply_measurements`), each number with a source
saying how and when it was measured, and where the calibrated `local-cpu` spec is kept
(`calibrated_spec_path`).

The register layer's bandwidth is derived, not measured: each FMA reads 3 operands, so it is the
measured float32 FMA rate x 3 x 4 B. Capacities and latencies are not measured and keep their
values and sources.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from workbench.hardware.microbench import ACCUMULATORS, FMA_ACCUMULATORS, LLC, MICRO_ROUNDS, ONE_CORE_DRAM, ProbeResult
from workbench.hardware.spec import DeviceSpec, MemoryLayer, MicroKernel


def calibrated_spec_path() -> Path:
    """Where `workbench device detect --calibrate` keeps the calibrated `local-cpu` spec:
    `$XDG_DATA_HOME/tile-workbench/local-cpu.toml` (default `~/.local/share/...`)."""
    base = os.environ.get("XDG_DATA_HOME", "")
    # The XDG spec says a relative (or empty) value is invalid and must be ignored.
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share"
    return root / "tile-workbench" / "local-cpu.toml"


def apply_measurements(spec: DeviceSpec, results: tuple[ProbeResult, ...], day: str) -> DeviceSpec:
    """`spec` with the measured numbers and sources saying how and when they were measured."""
    by_label = {r.probe.label: r for r in results}
    fma32 = by_label["float32"]
    layers = tuple(_calibrated_layer(layer, by_label, fma32, day) for layer in spec.layers)
    measured_peaks = {r.probe.label: round(r.value, 1) for r in results if r.probe.kind == "fma"}
    peak = tuple(sorted((dict(spec.peak_gflops) | measured_peaks).items()))
    peak_source = f"measured by workbench calibrate on {day}: {_fma_method(fma32)}; " + ", ".join(
        f"{dtype} {value} GFLOP/s" for dtype, value in sorted(measured_peaks.items())
    )
    new_sources = {"peak_gflops": peak_source}
    micro = [r for r in results if r.probe.kind == "micro"]
    kernels = spec.micro_kernels
    if micro:
        kernels = tuple(sorted(
            (MicroKernel(r.probe.dtype, r.probe.rows, r.probe.cols, round(r.value, 1)) for r in micro),
            key=lambda k: (k.dtype, k.rows, k.cols),
        ))
        new_sources["micro_kernels"] = f"measured by workbench calibrate on {day}: {_micro_method(micro)}"
    llc = by_label.get(LLC)
    llc_gbps = spec.llc_gbps
    if llc is not None:
        llc_gbps = round(llc.value, 1)
        new_sources["llc_gbps"] = f"measured by workbench calibrate on {day}: {_stream_method(llc)}"
    core_dram = spec.core_dram_gbps
    one = by_label.get(ONE_CORE_DRAM)
    if one is not None:  # one core reads no faster than all: a faster run was a quieter moment
        core_dram = round(min(one.value, layers[-1].bandwidth_gbps), 1)
        new_sources["core_dram_gbps"] = (f"measured by workbench calibrate on {day}: {_stream_method(one)}; "
                                         f"at most the bottom layer's all-core figure")
    launch = by_label.get("launch")
    launch_us = spec.launch_overhead_us
    if launch is not None:
        launch_us = round(launch.value, 2)
        new_sources["launch_overhead_us"] = f"measured by workbench calibrate on {day}: {_launch_method(launch)}"
    sources = tuple(sorted((dict(spec.sources) | new_sources).items()))
    parts = ["bandwidths", "peak compute"] + ["register micro-kernels"] * bool(micro) + ["kernel launch"] * bool(launch)
    what = ", ".join(parts[:-1]) + " and " + parts[-1]
    source = f"{what} measured by workbench calibrate on {day}; before that: {spec.source}"
    return replace(
        spec, layers=layers, peak_gflops=peak, micro_kernels=kernels, sources=sources, source=source, calibrated=True,
        launch_overhead_us=launch_us, llc_gbps=llc_gbps, core_dram_gbps=core_dram,
    )


def _calibrated_layer(layer: MemoryLayer, by_label: dict, fma32: ProbeResult, day: str) -> MemoryLayer:
    before = f"capacity and latency as before calibration: {layer.source}"
    if layer.scope == "thread":
        # Each FMA reads 3 operands of 4 B from registers: peak/2 FMAs per second x 12 B.
        gbps = round(fma32.value / 2 * 3 * 4, 1)
        how = f"derived from the float32 FMA rate measured by workbench calibrate on {day} x 3 operands x 4 B"
        return replace(layer, bandwidth_gbps=gbps, source=f"bandwidth {how}; {before}")
    if layer.name not in by_label:
        return layer
    result = by_label[layer.name]
    how = f"measured by workbench calibrate on {day}: {_stream_method(result)}"
    return replace(layer, bandwidth_gbps=round(result.value, 1), source=f"bandwidth {how}; {before}")


def _stream_method(result: ProbeResult) -> str:
    return (
        f"TVM-built streaming read on {result.threads} threads, each summing its own "
        f"{size_text(result.probe.bytes_per_core)} into {ACCUMULATORS} vector accumulators, "
        f"best of {result.runs} runs"
    )


def _fma_method(result: ProbeResult) -> str:
    return (
        f"TVM-built register-resident FMA kernel ({FMA_ACCUMULATORS} vector accumulators) on "
        f"{result.threads} threads, best of {result.runs} runs"
    )


def _micro_method(micro: list[ProbeResult]) -> str:
    depths = sorted({r.probe.depth for r in micro})
    return (
        f"TVM-built register micro-kernels C[r, n] += A[r, k] * B[k, n] (r x n accumulators, "
        f"vectorised along n, unrolled) over packed L1-resident panels of {depths[0]}-{depths[-1]} "
        f"reduction steps, on {micro[0].threads} threads, best of at least {min(r.runs for r in micro)} runs each "
        f"in {MICRO_ROUNDS} interleaved rounds"
    )


def _launch_method(result: ProbeResult) -> str:
    return (
        f"an empty TVM-built parallel kernel over {result.threads} threads called from Python, one call's "
        f"time (the call and the thread pool's fork and join), best of {result.runs} runs of many calls"
    )


def size_text(nbytes: int) -> str:
    for unit, scale in (("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"
