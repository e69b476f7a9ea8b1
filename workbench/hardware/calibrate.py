"""Calibration: Roller's micro-performance profiler, measuring this machine's CPU.

Roller (OSDI'22, section 4) fills its device description with measured numbers: the bandwidth of
each memory layer and the peak compute. `calibrate` does the same for a CPU spec with two small
TVM-built kernels, run on all `compute_units` cores at once through TVM's parallel runtime:

- streaming read: every core sums its own working set into 16 vector accumulators, over and over
  (the loop is repeated inside the kernel, so launch overhead does not count). A working set of
  half a cache layer's per-core capacity measures that layer; 256 MiB in all, far beyond any
  per-core cache, measures DRAM. The spec knows no L3, so that size is fixed here: a last-level
  cache of more than a few tens of MiB would inflate DRAM. Quick mode reads only 64 MiB, which a
  32 MiB L3 already inflates (55-67 instead of 36-43 GB/s on the development machine).
- register-resident FMA: every core updates 16 vector accumulators with `a = a * c + d` (LLVM
  contracts it to one FMA), no memory traffic at all. This is the ALU roof that Roller's model
  divides FLOPs by, rather than a BLAS sgemm, which also measures the library's blocking and the
  caches (on the development machine both reached the same ~270 GFLOP/s).

The register layer's bandwidth is derived, not measured: each FMA reads 3 operands, so it is the
measured float32 FMA rate x 3 x 4 B. Capacities and latencies are not measured and keep their
values and sources. Each measurement keeps the best of several runs (noise only slows a run).

The kernels run in a spawned process: TVM sizes its thread pool once per process from
TVM_NUM_THREADS (and otherwise assumes hyper-threading and uses half the logical CPUs), so the
child is started with it set to the spec's cores (capped at this machine's CPUs).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import date
from functools import cache
from multiprocessing import get_context
from pathlib import Path

from workbench.errors import UserError
from workbench.hardware.spec import DeviceSpec, MemoryLayer

DEFAULT_BUDGET_S = 10.0
QUICK_BUDGET_S = 1.5
# Spawning the child, importing TVM and compiling both kernels: about a second (2-core machine).
STARTUP_S = 1.0
# A working set fills this fraction of a cache layer's per-core capacity (room for the stack,
# page tables and the other data the core touches).
CACHE_FILL = 0.5
DRAM_WORKING_SET = 256 * 1024**2
QUICK_DRAM_WORKING_SET = 64 * 1024**2
# Vector accumulators: enough independent chains to hide 4-cycle FMA/add latency on two pipes
# (4 x 2 = 8) with margin, few enough to stay in the 16 registers of AVX2 with spares for loads.
ACCUMULATORS = 16
MIN_RUNS = 3
# A lower memory layer may measure at most this much faster than the layer above it before the
# results count as impossible: repeated best-of-N streaming reads of one layer agree within a few
# per cent on an idle machine, and cache layers of one core differ by 1.5-2x (L1 vs L2).
BANDWIDTH_SLACK = 1.15
RUNS_PER_SLOT = 8  # each timed call lasts about 1/8 of a measurement's time slot
FLOAT_DTYPES = ("float32", "float64")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Probe:
    """One micro-benchmark: a streaming read of `bytes_per_core` per core for layer `label`
    (kind "stream"), or the FMA kernel in dtype `label` (kind "fma")."""

    kind: str  # "stream" | "fma"
    label: str  # layer name (stream) or dtype (fma)
    bytes_per_core: int = 0


@dataclass(frozen=True)
class ProbeResult:
    probe: Probe
    value: float  # GB/s (stream) or GFLOP/s (fma), the best run
    runs: int
    threads: int


def calibrate(
    spec: DeviceSpec,
    *,
    budget_seconds: float = DEFAULT_BUDGET_S,
    quick: bool = False,
    progress: Progress | None = None,
) -> DeviceSpec:
    """`spec` with the bandwidths and peak compute measured on this machine (`calibrated=True`).

    Measures this machine's CPU with `spec`'s cores, SIMD width and TVM target, so `spec` should
    be `local-cpu`. Takes about `budget_seconds` (`quick=True`: about 2 s and a smaller DRAM
    working set, for tests). `progress` gets one line per measurement. GPU specs raise UserError.
    """
    if not spec.runs_on_cpu:
        _refuse_gpu(spec)
    budget = QUICK_BUDGET_S if quick else budget_seconds
    if budget <= 0:
        raise UserError(f"calibration budget must be positive, got {budget} s")
    threads = max(1, min(spec.compute_units, os.cpu_count() or 1))  # a core each, never oversubscribed
    todo = probes(spec, threads, quick)
    results = measure(spec, todo, threads, budget, progress)
    if impossible(results):  # a busy machine: measure once more before giving up
        if progress is not None:
            progress(f"impossible results ({impossible(results)[0]}): measuring again")
        results = measure(spec, todo, threads, budget, progress)
    problems = impossible(results)
    if problems:
        raise UserError(f"calibration refused, nothing stored: {'; '.join(problems)} "
                        f"(is another program using the CPU? run it again on a quiet machine)")
    return apply_measurements(spec, results, date.today().isoformat())


def impossible(results: tuple[ProbeResult, ...]) -> list[str]:
    """What no healthy CPU measures, one line each; empty when the results are plausible.

    - float32 FMA slower than float64: a vector register holds twice as many float32 lanes and
      every x86 and Arm core issues FMAs of either width at the same rate, so float32 is about 2x
      float64, never below it; a float32 run below float64 was slowed by something else.
    - a memory layer read faster than the layer above it (DRAM faster than L2, L2 than L1): each
      layer's streaming read is bounded by the layer above it, within BANDWIDTH_SLACK for noise.
    """
    problems = []
    fma = {r.probe.label: r.value for r in results if r.probe.kind == "fma"}
    if "float32" in fma and "float64" in fma and fma["float32"] < fma["float64"]:
        problems.append(f"float32 peak {fma['float32']:.1f} GFLOP/s below float64 {fma['float64']:.1f} GFLOP/s")
    stream = [r for r in results if r.probe.kind == "stream"]  # ordered top (L1) to bottom (DRAM)
    for upper, lower in zip(stream, stream[1:]):
        if lower.value > upper.value * BANDWIDTH_SLACK:
            problems.append(f"{lower.probe.label} read at {lower.value:.1f} GB/s, faster than "
                            f"{upper.probe.label} above it at {upper.value:.1f} GB/s")
    return problems


def calibrated_spec_path() -> Path:
    """Where `workbench device detect --calibrate` keeps the calibrated `local-cpu` spec:
    `$XDG_DATA_HOME/tile-workbench/local-cpu.toml` (default `~/.local/share/...`)."""
    base = os.environ.get("XDG_DATA_HOME", "")
    # The XDG spec says a relative (or empty) value is invalid and must be ignored.
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share"
    return root / "tile-workbench" / "local-cpu.toml"


def probes(spec: DeviceSpec, threads: int, quick: bool = False) -> tuple[Probe, ...]:
    """The measurements for `spec` on `threads` cores: a streaming read per cache layer and DRAM,
    the FMA kernel per dtype."""
    stream = []
    for layer in spec.layers:
        if layer.scope == "unit":
            stream.append(Probe("stream", layer.name, int(layer.capacity_bytes * CACHE_FILL)))
        elif layer.scope == "device":
            total = QUICK_DRAM_WORKING_SET if quick else DRAM_WORKING_SET
            total = min(total, layer.capacity_bytes // 4)
            stream.append(Probe("stream", layer.name, total // threads))
    return tuple(stream) + tuple(Probe("fma", dtype) for dtype in FLOAT_DTYPES)


def measure(
    spec: DeviceSpec, todo: tuple[Probe, ...], threads: int, budget_s: float, progress: Progress | None = None
) -> tuple[ProbeResult, ...]:
    """Run `todo` in a spawned process whose TVM thread pool has `threads` threads, within about
    `budget_s` seconds; a ProbeResult each, in order."""
    slot = max(0.05, (budget_s - STARTUP_S) / len(todo))
    target = spec.target_dict() | {"num-cores": threads}
    results = []
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_set_threads, initargs=(threads,)) as pool:
        for probe in todo:
            args = (probe, target, spec.warp_size, threads, slot)
            value, runs = pool.submit(run_probe, *args).result()
            results.append(ProbeResult(probe, value, runs, threads))
            if progress is not None:
                progress(f"{probe.label}: {value:.1f} {'GB/s' if probe.kind == 'stream' else 'GFLOP/s'}")
    return tuple(results)


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
    sources = tuple(sorted((dict(spec.sources) | {"peak_gflops": peak_source}).items()))
    source = f"bandwidths and peak compute measured by workbench calibrate on {day}; before that: {spec.source}"
    return replace(spec, layers=layers, peak_gflops=peak, sources=sources, source=source, calibrated=True)


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
        f"{_size(result.probe.bytes_per_core)} into {ACCUMULATORS} vector accumulators, "
        f"best of {result.runs} runs"
    )


def _fma_method(result: ProbeResult) -> str:
    return (
        f"TVM-built register-resident FMA kernel ({ACCUMULATORS} vector accumulators) on "
        f"{result.threads} threads, best of {result.runs} runs"
    )


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def _refuse_gpu(spec: DeviceSpec) -> None:
    import tvm

    kind = spec.target_dict().get("kind", "cuda")
    if not tvm.device(kind, 0).exist:
        raise UserError(f"no GPU present to calibrate {spec.name}: calibrate measures this machine's devices")
    raise UserError(f"cannot calibrate {spec.name}: GPU calibration is not implemented, only CPUs")


# ---- the child process -----------------------------------------------------------------------


def _set_threads(threads: int) -> None:
    # Runs before the child imports TVM, whose thread pool reads this once.
    os.environ["TVM_NUM_THREADS"] = str(threads)


def run_probe(probe: Probe, target: dict, lanes: int, threads: int, slot_s: float) -> tuple[float, int]:
    """Run one probe for about `slot_s` seconds; returns (best GB/s or GFLOP/s, timed runs)."""
    import numpy as np
    import tvm

    dev = tvm.cpu()
    dtype = "float32" if probe.kind == "stream" else probe.label
    width = lanes * 4 // np.dtype(dtype).itemsize * ACCUMULATORS
    if probe.kind == "stream":
        rows = max(1, probe.bytes_per_core // (width * 4))
        # Written before it is read: untouched pages would all map to one zero page (a cache hit).
        args = [tvm.runtime.tensor(np.ones((threads, rows, width), dtype), dev)]
        args.append(tvm.runtime.tensor(np.zeros((threads, width), dtype), dev))
        work = threads * rows * width * 4  # bytes read per repetition
    else:
        args = [tvm.runtime.tensor(np.ones((threads, width), dtype), dev)]
        work = threads * width * 2  # flops per repetition (an FMA counts two)
    func = _kernel(probe.kind, dtype, lanes, _target_key(target))
    seconds, reps, runs = _best_seconds(lambda reps: func(*args, reps), slot_s)
    return work * reps / seconds / 1e9, runs


def _target_key(target: dict) -> tuple:
    return tuple(sorted(target.items()))


def _best_seconds(call: Callable[[int], None], slot_s: float) -> tuple[float, int, int]:
    """(best seconds of one call, repetitions per call, timed calls): the repetitions are sized in
    two steps so a call lasts about slot/RUNS_PER_SLOT; the sizing calls double as warm-up."""
    start = time.perf_counter()
    call(1)  # the first call also starts TVM's thread pool
    wanted = slot_s / RUNS_PER_SLOT
    reps = 1
    for _ in range(2):
        seconds = _time_call(call, reps)
        reps = max(1, math.ceil(reps * wanted / max(seconds, 1e-7)))
    best, runs = math.inf, 0
    while runs < MIN_RUNS or time.perf_counter() - start < slot_s:
        best = min(best, _time_call(call, reps))
        runs += 1
    return best, reps, runs


def _time_call(call: Callable[[int], None], reps: int) -> float:
    begin = time.perf_counter()
    call(reps)
    return time.perf_counter() - begin


@cache
def _kernel(kind: str, dtype: str, lanes: int, target_key: tuple):
    import numpy as np
    import tvm

    dtype_lanes = lanes * 4 // np.dtype(dtype).itemsize
    func = _stream_func(dtype_lanes) if kind == "stream" else _fma_func(dtype_lanes, dtype)
    executable = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target(dict(target_key)))
    return executable.jit()["main"]


def _stream_func(lanes: int):
    from tvm.script import tirx as T

    width = lanes * ACCUMULATORS

    @T.prim_func
    def stream(a: T.handle, b: T.handle, reps: T.int32):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        parts = T.int32()
        rows = T.int32()
        A = T.match_buffer(a, (parts, rows, width), "float32")
        B = T.match_buffer(b, (parts, width), "float32")
        for p in T.parallel(parts):
            acc = T.decl_buffer((width,), "float32", scope="local")
            for u in T.unroll(ACCUMULATORS):
                for v in T.vectorized(lanes):
                    acc[u * lanes + v] = T.float32(0)
            for _r in range(reps):
                for i in range(rows):
                    for u in T.unroll(ACCUMULATORS):
                        for v in T.vectorized(lanes):
                            acc[u * lanes + v] = acc[u * lanes + v] + A[p, i, u * lanes + v]
            for u in T.unroll(ACCUMULATORS):
                for v in T.vectorized(lanes):
                    B[p, u * lanes + v] = acc[u * lanes + v]

    return stream


def _fma_func(lanes: int, dtype: str):
    from tvm.script import tirx as T

    width = lanes * ACCUMULATORS

    @T.prim_func
    def fma(b: T.handle, reps: T.int32):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        parts = T.int32()
        B = T.match_buffer(b, (parts, width), dtype)
        for p in T.parallel(parts):
            acc = T.decl_buffer((width,), dtype, scope="local")
            for u in T.unroll(ACCUMULATORS):
                for v in T.vectorized(lanes):
                    acc[u * lanes + v] = B[p, u * lanes + v]
            for _r in range(reps):
                for u in T.unroll(ACCUMULATORS):
                    for v in T.vectorized(lanes):
                        # Converges to 1.0 from any start: no overflow, no slow denormals.
                        acc[u * lanes + v] = acc[u * lanes + v] * T.Cast(dtype, 0.999) + T.Cast(dtype, 0.001)
            for u in T.unroll(ACCUMULATORS):
                for v in T.vectorized(lanes):
                    B[p, u * lanes + v] = acc[u * lanes + v]

    return fma
