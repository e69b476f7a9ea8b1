"""Calibration: Roller's micro-performance profiler, measuring this machine's CPU.

Roller (OSDI'22, section 4) fills its device description with measured numbers: the bandwidth of
each memory layer and the peak compute. `calibrate` does the same for a CPU spec with small
TVM-built kernels (`hardware.microbench`), run on all `compute_units` cores at once: a streaming
read per cache layer, the last-level cache and DRAM, a register-resident FMA per dtype, the
register micro-kernels (Vortex's level 0) and an empty kernel's launch. This module chooses what
to measure (`probes`, `micro_kernel_shapes`) and within what time; `hardware.calibrated` writes
the results into the spec. Results no healthy CPU produces are measured once more and then
refused (`impossible`).
"""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import date

from workbench.errors import UserError
from workbench.hardware import microbench
from workbench.hardware.bounds import MICRO_KERNEL_SLACK
from workbench.hardware.calibrated import apply_measurements, calibrated_spec_path, size_text
from workbench.hardware.detect import LOCAL_CPU_NAME
from workbench.hardware.microbench import LLC, ONE_CORE_DRAM, STARTUP_S, WARM_UP_S, Probe, ProbeResult, Progress
from workbench.hardware.registers import register_budget
from workbench.hardware.spec import DeviceSpec

# About 10 s for the bandwidths and peaks, 20 s for the micro-kernels
# (`microbench.MICRO_KERNEL_SHARE`).
DEFAULT_BUDGET_S = 30.0
# Quick: 0.1 s for each bandwidth and peak probe, 0.33 s for each of the three micro-kernels.
QUICK_BUDGET_S = 2.5
# Widest micro-kernel measured, in vector registers: BLAS kernels are 2-4 vectors wide (AVX2's
# 6 x 16 fp32 is 2, AVX-512's 6 x 64 is 4); wider tiles leave too few rows for the FMA latency.
MICRO_VECTORS = 4
# Most reduction steps of one pass over the panels, and the step the depth is a multiple of; the
# panels of A (rows x depth) and B (depth x columns) together fill CACHE_FILL of L1 at most.
MICRO_DEPTH = 256
MICRO_DEPTH_STEP = 8
# A working set fills this fraction of a cache layer's per-core capacity (room for the stack,
# page tables and the other data the core touches).
CACHE_FILL = 0.5
# DRAM is read at this working set in all, quick or not: 64 MiB read a 32 MiB L3 into it (55-67
# instead of 36-43 GB/s, a 2-core Zen 3) and ran as fast as the LLC on a guest whose cores hold
# 120-240 MiB (56 GB/s; 256 MiB: 31, the full calibration's 32), for 1.3 s more of a quick run.
DRAM_WORKING_SET = 256 * 1024**2
# The last-level cache is read at working sets halving from CACHE_FILL of its per-core share down
# to LLC_FLOOR x the per-core cache above it; it holds the largest that reads at least
# LLC_PLATEAU of the smallest's bandwidth. A guest's sysfs names its host's whole L3, which other
# tenants share: a 2-core Xeon guest shown a 480 MiB L3 read 3-48 MiB a core at 53-66 GB/s, 96
# MiB at 38 and 120 (CACHE_FILL of its share) at 33, DRAM's speed; its LLC probe had measured
# DRAM, and its quick DRAM read (32 MiB a core) ran faster than that and was refused. A held
# cache reads flat within streaming noise (a few per cent; the Emerald Rapids guest flat from 3 to
# 75 MiB a core); 0.9 parts a plateau from a fall (that guest's 60 MiB a core read 0.78-0.88 of
# 7.5 MiB's in four calibrations, 30 MiB 0.97-1.0).
LLC_FLOOR = 2
LLC_PLATEAU = 0.9
# A lower memory layer may measure at most this much faster than the layer above it before the
# results count as impossible: repeated best-of-N streaming reads of one layer agree within a few
# per cent on an idle machine, and cache layers of one core differ by 1.5-2x (L1 vs L2).
BANDWIDTH_SLACK = 1.15
FLOAT_DTYPES = ("float32", "float64")
# Building one probe's kernel with TVM takes about 70 ms (a micro-kernel's compile time, as
# `calibrate` says); `quick_seconds` adds it to the budget.
BUILD_SECONDS_PER_PROBE = 0.07
# "0" turns the first-use calibration off (the tests, scripted benchmarks that want the detected
# spec); anything else, or unset, leaves it on.
AUTO_CALIBRATE_ENV = "WORKBENCH_AUTO_CALIBRATE"


def calibrate(
    spec: DeviceSpec,
    *,
    budget_seconds: float = DEFAULT_BUDGET_S,
    quick: bool = False,
    progress: Progress | None = None,
) -> DeviceSpec:
    """`spec` with the bandwidths, peak compute, register micro-kernels and kernel launch
    measured on this machine (`calibrated=True`).

    Measures this machine's CPU with `spec`'s cores, SIMD width and TVM target, so `spec` should
    be `local-cpu`. Takes about `budget_seconds`, plus compiling the micro-kernels (about 70 ms
    each; `quick=True`: a few seconds, shorter time slots and three float32 micro-kernels).
    `progress` gets one line per measurement. GPU specs raise UserError.
    """
    if not spec.runs_on_cpu:
        _refuse_gpu(spec)
    budget = QUICK_BUDGET_S if quick else budget_seconds
    if budget <= 0:
        raise UserError(f"calibration budget must be positive, got {budget} s")
    threads = max(1, min(spec.compute_units, os.cpu_count() or 1))  # a core each, never oversubscribed
    todo = probes(spec, threads, quick)
    results = microbench.measure(spec, todo, threads, budget, progress)
    first = impossible(held_llc(spec, results, threads, "")[0])
    if first:  # a busy machine: measure once more before giving up
        if progress is not None:
            progress(f"impossible results ({first[0]}): measuring again")
        results = microbench.measure(spec, todo, threads, budget, progress)
    results, spec = held_llc(spec, results, threads, date.today().isoformat())
    problems = impossible(results)
    if problems:
        raise UserError(f"calibration refused, nothing stored: {'; '.join(problems)} "
                        f"(is another program using the CPU? run it again on a quiet machine)")
    one = one_core_probe(spec, todo, threads)
    if one is not None:  # in a process of its own: one thread
        results += microbench.measure(spec, (one,), 1, STARTUP_S + _slot(todo, budget), progress)
    return apply_measurements(spec, results, date.today().isoformat())


def one_core_probe(spec: DeviceSpec, todo: tuple[Probe, ...], threads: int) -> Probe | None:
    """One core's streaming read of the whole DRAM working set (`DeviceSpec.core_dram_gbps`),
    where the spec has more cores than one and `todo` reads DRAM; else None."""
    bottom = spec.layers[-1].name
    dram = next((p for p in todo if p.kind == "stream" and p.label == bottom), None)
    if threads < 2 or dram is None or spec.layers[-1].scope != "device":
        return None
    return Probe("stream", ONE_CORE_DRAM, dram.bytes_per_core * threads)


def _slot(todo: tuple[Probe, ...], budget: float) -> float:
    """The time slot of `todo`'s last streaming read (DRAM's) within `budget`: the one-core
    probe's as well."""
    return microbench.slot_seconds(todo, budget)[max(i for i, p in enumerate(todo) if p.kind == "stream")]


def quick_seconds(spec: DeviceSpec) -> float:
    """About how long `calibrate(spec, quick=True)` takes on an idle machine: its budget plus
    building each probe's kernel, and each process's warm-up (`microbench.WARM_UP_S`)."""
    threads = max(1, min(spec.compute_units, os.cpu_count() or 1))
    todo = probes(spec, threads, quick=True)
    seconds = QUICK_BUDGET_S + BUILD_SECONDS_PER_PROBE * len(todo) + WARM_UP_S
    if one_core_probe(spec, todo, threads) is not None:
        seconds += STARTUP_S + _slot(todo, QUICK_BUDGET_S) + BUILD_SECONDS_PER_PROBE + WARM_UP_S
    return seconds


def refusal_path():
    """Where a refused first-use calibration says why, beside the calibrated spec: while it is
    there the first-use calibration is not tried again (`device detect --calibrate` still is)."""
    return calibrated_spec_path().with_name("local-cpu.refused")


def first_use_due(spec: DeviceSpec) -> bool:
    """Whether the quick calibration should run by itself before `spec` profiles here: `spec` is
    `local-cpu` not calibrated (no calibrated spec of this machine in the data directory), no
    refusal is recorded, and AUTO_CALIBRATE_ENV is not "0"."""
    return (spec.name == LOCAL_CPU_NAME and spec.runs_on_cpu and not spec.calibrated
            and os.environ.get(AUTO_CALIBRATE_ENV, "") != "0" and not refusal_path().is_file())


def calibrate_first_use(detected: DeviceSpec, progress: Progress | None = None) -> tuple[DeviceSpec | None, str]:
    """The quick calibration of `detected` (this machine's fresh detection), stored where
    `local-cpu` loads it from (`store_calibrated`), and one line saying what happened. A refused
    calibration (a busy machine) stores why (`refusal_path`) and returns None: the caller goes on
    with the detected spec."""
    try:
        spec = calibrate(detected, quick=True, progress=progress)
    except Exception as err:  # noqa: BLE001 - a calibration by itself never stops the profile it precedes
        reason = str(err) if isinstance(err, UserError) else f"calibration failed: {type(err).__name__}: {err}"
        reason = reason.splitlines()[0] if reason else type(err).__name__
        path = refusal_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(reason + "\n")
        return None, (f"{reason}; profiling with the detected spec (`workbench device detect --calibrate` "
                      f"measures again; not tried by itself while {path} exists)")
    path = store_calibrated(spec)
    return spec, f"calibrated this CPU (quick): wrote {path}, which local-cpu loads from now on"


def store_calibrated(spec: DeviceSpec, path=None):
    """Write calibrated `spec` where `local-cpu` loads it (`calibrated_spec_path`, or `path`),
    and forget a refused first-use calibration; returns the path."""
    from workbench.files import write_user_file
    from workbench.hardware.write import spec_to_toml

    out = path or calibrated_spec_path()
    write_user_file(out, spec_to_toml(spec), "--out")
    refusal_path().unlink(missing_ok=True)
    return out


def impossible(results: tuple[ProbeResult, ...]) -> list[str]:
    """What no healthy CPU measures, one line each; empty when the results are plausible.

    - float32 FMA slower than float64: a vector register holds twice as many float32 lanes and
      every x86 and Arm core issues FMAs of either width at the same rate, so float32 is about 2x
      float64, never below it; a float32 run below float64 was slowed by something else.
    - a memory layer read faster than the layer above it (DRAM faster than L2, L2 than L1): each
      layer's streaming read is bounded by the layer above it, within BANDWIDTH_SLACK for noise.
    - a micro-kernel faster than the FMA peak of its dtype x MICRO_KERNEL_SLACK: it issues the
      same FMAs plus loads on the same cores. Compared as stored (to 0.1 GFLOP/s), so that the
      loader, which refuses the same, reads back every spec calibration writes.
    """
    problems = []
    fma = {r.probe.label: r.value for r in results if r.probe.kind == "fma"}
    if "float32" in fma and "float64" in fma and fma["float32"] < fma["float64"]:
        problems.append(f"float32 peak {fma['float32']:.1f} GFLOP/s below float64 {fma['float64']:.1f} GFLOP/s")
    for r in results:
        peak = fma.get(r.probe.dtype)
        if r.probe.kind == "micro" and peak is not None and round(r.value, 1) > round(peak, 1) * MICRO_KERNEL_SLACK:
            problems.append(f"{r.probe.label} micro-kernel at {r.value:.1f} GFLOP/s, faster than the "
                            f"{r.probe.dtype} FMA peak {peak:.1f} GFLOP/s x {MICRO_KERNEL_SLACK:g}")
    stream = [r for r in results if r.probe.kind == "stream"]  # ordered top (L1) to bottom (DRAM)
    for upper, lower in zip(stream, stream[1:]):
        if lower.value > upper.value * BANDWIDTH_SLACK:
            problems.append(f"{lower.probe.label} read at {lower.value:.1f} GB/s, faster than "
                            f"{upper.probe.label} above it at {upper.value:.1f} GB/s")
    return problems


def probes(spec: DeviceSpec, threads: int, quick: bool = False) -> tuple[Probe, ...]:
    """The measurements for `spec` on `threads` cores: a streaming read per cache layer, the
    last-level cache (where the spec has one) and DRAM, the FMA kernel per dtype, the register
    micro-kernels (`micro_kernel_probes`), then a kernel launch."""
    stream = []
    for layer in spec.layers:
        if layer.scope == "unit":
            stream.append(Probe("stream", layer.name, int(layer.capacity_bytes * CACHE_FILL)))
        elif layer.scope == "device":
            # between the per-core caches and DRAM, the order `impossible` compares in
            stream.extend(llc_probes(spec, threads))
            total = min(DRAM_WORKING_SET, layer.capacity_bytes // 4)
            stream.append(Probe("stream", layer.name, total // threads))
    fma = tuple(Probe("fma", dtype) for dtype in FLOAT_DTYPES)
    return tuple(stream) + fma + micro_kernel_probes(spec, quick) + (Probe("launch", "launch"),)


def llc_probes(spec: DeviceSpec, threads: int) -> tuple[Probe, ...]:
    """Streaming reads of the last-level cache (none where the spec names none): CACHE_FILL of its
    per-core share, then halving down to LLC_FLOOR x the last per-core cache (at least the
    first), each labelled "LLC <working set a core>"; `held_llc` keeps one."""
    if not spec.llc_bytes:
        return ()
    floor = LLC_FLOOR * max(layer.capacity_bytes for layer in spec.layers if layer.scope == "unit")
    size = int(spec.llc_bytes * CACHE_FILL) // threads
    out = [size]
    while out[-1] // 2 >= floor:
        out.append(out[-1] // 2)
    return tuple(Probe("stream", f"{LLC} {size_text(n)}", n) for n in out)


def held_llc(spec: DeviceSpec, results: tuple[ProbeResult, ...], threads: int, day: str
             ) -> tuple[tuple[ProbeResult, ...], DeviceSpec]:
    """`results` with the LLC reads (`llc_probes`) replaced by the one the cores hold, labelled
    LLC: the largest working set that reads at least LLC_PLATEAU of the smallest's bandwidth;
    and `spec` with `llc_bytes` cut to that working set over CACHE_FILL on all `threads` where it
    is less than sysfs's, the source saying so."""
    reads = [r for r in results if r.probe.kind == "stream" and r.probe.label.startswith(f"{LLC} ")]
    if not reads:
        return results, spec
    smallest = reads[-1]
    kept = next(r for r in reads if r.value >= LLC_PLATEAU * smallest.value)
    held = replace(kept, probe=replace(kept.probe, label=LLC))
    out = tuple(held if r is kept else r for r in results if r is kept or r not in reads)
    if kept is reads[0]:
        return out, spec
    larger = reads[reads.index(kept) - 1]
    llc_bytes = int(kept.probe.bytes_per_core * threads / CACHE_FILL)
    why = (f"{dict(spec.sources).get('llc_bytes', 'as detected')}; cut by workbench calibrate on {day} to "
           f"{size_text(llc_bytes)}, what {threads} cores hold: each read {size_text(kept.probe.bytes_per_core)} at "
           f"{kept.value:.1f} GB/s but {size_text(larger.probe.bytes_per_core)} at {larger.value:.1f}, below "
           f"{LLC_PLATEAU:g} of {size_text(smallest.probe.bytes_per_core)}'s {smallest.value:.1f} (others share it)")
    sources = tuple(sorted((dict(spec.sources) | {"llc_bytes": why}).items()))
    return out, replace(spec, llc_bytes=llc_bytes, sources=sources)


def micro_kernel_shapes(spec: DeviceSpec, quick: bool = False) -> tuple[tuple[int, int], ...]:
    """(rows, vectors) of the register micro-kernels measured on `spec`: every tile of 1 to
    MICRO_VECTORS vectors whose registers fit the CPU alignment's budget
    (`alignment.register_budget`): rows x vectors accumulators, one row of `vectors` of B and one
    broadcast of A (`alignment.micro_kernel_registers` of a matmul tile). 26 on AVX2's 16 ymm
    (up to 14 x 1, 6 x 2, 4 x 3, 2 x 4 vectors), 59 on AVX-512's 32 zmm. Quick: three of them,
    1 x 1, 2 x 2 and the most rows 2 vectors allow (BLAS's 6 x 16 on AVX2)."""
    budget = register_budget(spec)
    most = {v: (budget - v - 1) // v for v in range(1, MICRO_VECTORS + 1)}
    if quick:
        return tuple(dict.fromkeys(s for s in ((1, 1), (2, 2), (most[2], 2)) if 1 <= s[0] <= most[s[1]]))
    return tuple((rows, v) for v in range(1, MICRO_VECTORS + 1) for rows in range(1, most[v] + 1))


def micro_kernel_probes(spec: DeviceSpec, quick: bool = False) -> tuple[Probe, ...]:
    """A probe per `micro_kernel_shapes` and dtype (float32 only when quick), each with the most
    reduction steps (a multiple of MICRO_DEPTH_STEP, at most MICRO_DEPTH) whose panels of A and
    B fit CACHE_FILL of the first cache layer, so the loads hit L1."""
    l1 = next(layer for layer in spec.layers if layer.scope == "unit").capacity_bytes
    out = []
    for dtype in FLOAT_DTYPES[:1] if quick else FLOAT_DTYPES:
        itemsize = 8 if dtype == "float64" else 4
        lanes = spec.register_bytes // itemsize
        for rows, vectors in micro_kernel_shapes(spec, quick):
            cols = vectors * lanes
            fit = int(l1 * CACHE_FILL) // ((rows + cols) * itemsize)
            depth = max(MICRO_DEPTH_STEP, min(MICRO_DEPTH, fit) // MICRO_DEPTH_STEP * MICRO_DEPTH_STEP)
            out.append(Probe("micro", f"{dtype} {rows}x{cols}", dtype=dtype, rows=rows, cols=cols, depth=depth))
    return tuple(out)


def _refuse_gpu(spec: DeviceSpec) -> None:
    import tvm

    kind = spec.target_dict().get("kind", "cuda")
    if not tvm.device(kind, 0).exist:
        raise UserError(f"no GPU present to calibrate {spec.name}: calibrate measures this machine's devices")
    raise UserError(f"cannot calibrate {spec.name}: GPU calibration is not implemented, only CPUs")
