"""`workbench bench dynamic`: Vortex beside a per-shape oracle, numpy and a DietCode-style
selector over a list of values of the dynamic extent, every result verified against numpy and
every time taken the same way (`profile.baselines.best_seconds`: the best of 5 repeats of at
least 50 ms, in this process) in one run, the four interleaved value by value so that a change
of load on the machine falls on all of them alike.

- **vortex**: `bundle.compile_bundle` once (its wall time is `compile_seconds`), then at each
  value every kernel of the bundle is run, verified and timed once (`vortex_kernels_seconds`:
  pad the dynamic axis, run, verify, time, as `bundle.run` does), and Vortex's time is that of
  the kernel the dispatcher picks there (`select.dispatch`, by predicted cost): the gap between
  it and the bundle's fastest is the dispatcher's, the gap between that one and the oracle the
  kernel set's.
- **oracle**: at each value, a Roller construction of the static workload (the dynamic extent
  set to the value) with its top-K built, verified and timed; the best measured of them.
- **numpy**: the `numpy` baseline (`A @ B` through BLAS, threads limited to the device's cores)
  at the static shape.
- **dietcode**: a reconstruction of DietCode's sample-driven flow (MLSys'22; formulas in
  `dietcode.py`) from what this workbench has; DietCode itself tunes its micro-kernels with an
  auto-scheduler over the samples, which this module does not run. Here:
  1. its candidate micro-kernels are the Roller top-1 programs of the static workload at each
     sample value (a repeated program is kept once);
  2. each is built once with a symbolic outer extent, as Vortex's kernels are
     (`bundle.build_symbolic`), so that one library runs every value padded to its outer tile;
  3. each is timed once, at its own sample only; its throughput is the useful flops there over
     the time, divided by its two DietCode penalties there (so its adapted score at its own
     sample is what was measured);
  4. every kernel is scored at every sample with `dietcode.adapted_score` (units: the device's
     cores; the tile: the program's unit tile, the padding over every axis, the grid over the
     spatial ones), and `dietcode.train` keeps `len(samples)` kernels by the greedy cover and
     labels each sample with its best one;
  5. at each benchmark value the nearest sample's kernel runs (`Dispatch.select`), padded,
     verified and timed as `bundle.run` does.
  A value is `in_samples` when it lies within [min(samples), max(samples)]; outside, DietCode's
  choice is an extrapolation, which is what this comparison shows.

A result that is wrong, or a kernel that fails to build, gets None seconds and an error beside
it, never a time. CPU kernels for this machine only (`local-cpu`): they run in this process.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from workbench.construct.space import Options
from workbench.construct.stepper import Stepper
from workbench.errors import UserError, first_line
from workbench.hardware.spec import DeviceSpec
from workbench.ops.shapes import check_elements
from workbench.ops.tensor_expr import SPATIAL, TensorExpr
from workbench.profile.compare import geometric_mean
from workbench.rtile.rprogram import RProgram
from workbench.vortex import bundle as vortex
from workbench.vortex import dietcode
from workbench.vortex.analyzer import Dynamic, at_extent, outer_tile
from workbench.vortex.select import DispatchTable, dispatch
from workbench.workload import Workload

DEFAULT_TOPK = 5  # the oracle's top-K, as `bench kernels`
SEED = 0  # inputs of every verification and timing (`random_inputs`)


def parse_values(text: str, flag: str) -> tuple[int, ...]:
    """`"1,5,24"` -> (1, 5, 24); UserError naming `flag` for an empty list, an entry that is not
    a positive integer, or one given twice."""
    items = [part.strip() for part in (text or "").split(",")]
    if not any(items):
        raise UserError(f"{flag} is empty: give positive integers, e.g. 1,5,24")
    values = []
    for item in items:
        if not item.isdigit() or int(item) < 1:
            raise UserError(f"{flag}: {item!r} is not a positive integer")
        if int(item) in values:
            raise UserError(f"{flag}: {int(item)} is given twice")
        values.append(int(item))
    return tuple(values)


@dataclass(frozen=True)
class MicroKernel:
    """One DietCode candidate: the sample it was constructed at, its program, its outer tile
    along the dynamic axis, its time at its sample, its throughput (flop/s, step 3 of the module
    docstring) and the loaded library."""

    name: str
    sample: int
    program: RProgram
    outer: int
    seconds: float
    throughput: float
    entry: object = field(compare=False, repr=False)


def score(program: RProgram, throughput: float, dyn: Dynamic, value: int, units: int) -> float:
    """DietCode's adapted score of a micro-kernel at `value`: the throughput times its padding
    penalty over every axis and its occupancy penalty over the spatial grid on `units` cores."""
    expr = at_extent(program.expr, dyn.axis, value, dyn.param)
    extent = {a.name: a.extent for a in expr.axes}
    tile = dict(zip(program.axes, program.unit_tile))
    spatial = [a.name for a in expr.axes if a.kind == SPATIAL]
    padding = dietcode.padding_penalty([extent[a] for a in program.axes], program.unit_tile)
    occupancy = dietcode.occupancy_penalty([extent[a] for a in spatial], [tile[a] for a in spatial], units)
    return throughput * padding * occupancy


def train_dietcode(op: str, static: dict, dtype: str, dyn: Dynamic, device: DeviceSpec, samples: tuple[int, ...],
                   folder: Path, progress=None) -> tuple[dietcode.Dispatch | None, dict, list]:
    """(DietCode's dispatch or None when no kernel built, its kernels by name, the failures)
    (module docstring, steps 1-4)."""
    kernels: dict[str, MicroKernel] = {}
    failed, seen = [], set()
    for sample in samples:
        name = f"d{sample}"
        if progress:
            progress(f"dietcode: constructing and building the kernel of sample {sample}")
        expr = vortex.build_static(op, {**static, dyn.param: sample}, dtype)
        top = Stepper(expr, device, "roller", Options(topk=1, seed=SEED)).finish()
        program = top.candidates[0].program
        if dyn.axis not in program.axes:
            failed.append({"id": name, "sample": sample, "error": f"the program has no axis {dyn.axis} (fused)"})
            continue
        if (program.tiles, program.cached) in seen:
            continue
        seen.add((program.tiles, program.cached))
        record = vortex.build_symbolic(op, static, dtype, dyn, program, device, folder, name)
        if record.get("error"):
            failed.append(record | {"sample": sample})
            continue
        outer = outer_tile(program, dyn)
        try:
            entry = vortex.load_kernel(folder / record["library"], device)
            check, seconds = vortex.execute(entry, program.expr, dyn, outer, sample, SEED, timed=True)
        except Exception as err:  # TVM raises many error types; each is this kernel's failure
            failed.append({"id": name, "sample": sample, "error": f"{type(err).__name__}: {first_line(err)}"})
            continue
        if not check.correct:
            failed.append({"id": name, "sample": sample, "error": f"wrong at its sample: {check.error}"})
            continue
        throughput = expr.flops / seconds / score(program, 1.0, dyn, sample, device.compute_units)
        kernels[name] = MicroKernel(name, sample, program, outer, seconds, throughput, entry)
    if not kernels:
        return None, kernels, failed
    scores = {n: [score(k.program, k.throughput, dyn, s, device.compute_units) for s in samples]
              for n, k in kernels.items()}
    return dietcode.train(samples, scores, k=len(samples)), kernels, failed


def oracle(expr: TensorExpr, device: DeviceSpec, topk: int) -> dict:
    """The per-shape oracle at one static shape: Roller's top-K built, verified and timed here;
    {"oracle_seconds" (best measured, None when none verified), "oracle_rank", "oracle_failed"}."""
    construction = Stepper(expr, device, "roller", Options(topk=topk, seed=SEED)).finish()
    best, rank, failed = None, None, []
    for cand in construction.candidates:
        seconds, error = time_static(construction.expr, cand.program, device)
        if error:
            failed.append({"rank": cand.rank, "error": error})
        elif best is None or seconds < best:
            best, rank = seconds, cand.rank
    return {"oracle_seconds": best, "oracle_rank": rank, "oracle_candidates": len(construction.candidates),
            "oracle_failed": failed}


def time_static(expr: TensorExpr, program: RProgram, device: DeviceSpec) -> tuple[float | None, str]:
    """Build `program` for the static `expr`, run it on random inputs, verify, time: (seconds,
    "") or (None, why not)."""
    import numpy as np
    import tvm

    from workbench.codegen.build import build_kernel
    from workbench.codegen.verify import check_output
    from workbench.ops.reference import random_inputs
    from workbench.profile.baselines import best_seconds

    kernel = build_kernel(expr, program, device, sources=False)
    if not kernel.ok:
        return None, kernel.error
    try:
        entry = kernel.runtime()["main"]
        inputs = random_inputs(expr, SEED)
        dev = tvm.cpu()
        arrays = [tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in inputs]
        out_arg = expr.args[-1]
        out = tvm.runtime.tensor(np.zeros(out_arg.shape, dtype=out_arg.dtype), dev)
        entry(*arrays, out)
        check = check_output(expr, inputs, out.numpy())
        if not check.correct:
            return None, f"wrong result: {check.error}"
        return best_seconds(lambda: entry(*arrays, out)), ""
    except Exception as err:  # TVM raises many error types; each is this candidate's failure
        return None, f"{type(err).__name__}: {first_line(err)}"


def _ratio(pairs) -> float | None:
    """Geometric mean of a / b over the pairs where both are measured."""
    kept = [a / b for a, b in pairs if a and b]
    return geometric_mean(kept) if kept else None


def bench_dynamic(workload: Workload, device: DeviceSpec, values: tuple[int, ...],
                  samples: tuple[int, ...] = dietcode.DEFAULT_SAMPLES, topk: int = DEFAULT_TOPK,
                  max_extent: int = vortex.DEFAULT_MAX_EXTENT, progress=None) -> dict:
    """The benchmark (module docstring): {"compile_seconds", "results": [{"value", "vortex_seconds",
    "oracle_seconds", "numpy_seconds", "dietcode_seconds", ...}], "geomean": {...}, ...}.
    UserError for a bad workload, device, value, sample or top-K, before anything is built."""
    from workbench.profile.baselines import Baseline

    if not isinstance(topk, int) or topk < 1:
        raise UserError(f"--topk must be >= 1, got {topk}")
    op, dtype, param, static = vortex.dynamic_workload(workload)
    if not values or not samples:
        raise UserError("give at least one value and one sample of the dynamic extent")
    exprs = {}
    for v in dict.fromkeys(values + samples):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UserError(f"{param} must be a positive integer, got {v!r}")
        exprs[v] = vortex.build_static(op, {**static, param: v}, dtype)
        for arg in exprs[v].args:
            check_elements(arg.name, arg.shape)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    numpy = Baseline("numpy")
    with tempfile.TemporaryDirectory(prefix="workbench-bench-dynamic.") as tmp:
        start = time.perf_counter()
        b = vortex.compile_bundle(workload, device, Path(tmp) / "bundle", max_extent=max_extent, progress=progress)
        compile_seconds = time.perf_counter() - start
        dyn = b.table.dyn
        entries = {k: vortex.load_kernel(b.library(k), device) for k, _ in b.table.kernels}
        folder = Path(tmp) / "dietcode"
        folder.mkdir()
        start = time.perf_counter()
        choice, kernels, dc_failed = train_dietcode(op, static, dtype, dyn, device, tuple(sorted(samples)), folder,
                                                    progress)
        dc_seconds = time.perf_counter() - start
        results = []
        for n, value in enumerate(values):
            if progress:
                progress(f"[{n + 1}/{len(values)}] {param}={value}")
            row = {"value": value, "in_samples": min(samples) <= value <= max(samples)}
            runs = {k: _timed(entries[k], program, dyn, value) for k, program in b.table.kernels}
            row |= _vortex_at(b.table, runs, value)
            row["vortex_kernels_seconds"] = {k: seconds for k, (seconds, _) in runs.items()}
            row |= _dietcode_at(choice, kernels, dyn, value)
            row |= oracle(exprs[value], device, topk)
            measured = numpy.measure(exprs[value], device)
            row |= {"numpy_seconds": measured.seconds, "numpy_error": measured.error, "numpy_note": measured.note}
            results.append(row)
    inside = [r for r in results if r["in_samples"]]
    outside = [r for r in results if not r["in_samples"]]
    return {
        "workload": workload.describe(), "device": device.name, "date": started,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "cpu_count": os.cpu_count(), "topk": topk, "max_extent": max_extent,
        "compile_seconds": compile_seconds,
        "vortex_kernels": [k["id"] for k in b.manifest["kernels"]], "vortex_failed": b.manifest["failed"],
        "dietcode": {"samples": sorted(samples), "train_seconds": dc_seconds,
                     "kernels": {k.name: {"sample": k.sample, "outer": k.outer, "seconds_at_sample": k.seconds,
                                          "throughput_flops": k.throughput,
                                          "tiles": [dict(zip(k.program.axes, t)) for t in k.program.tiles]}
                                 for k in kernels.values()},
                     "dispatch": dict(zip(choice.samples, choice.choices)) if choice else {},
                     "failed": dc_failed},
        "results": results,
        "geomean": {
            "vortex_speed_vs_oracle": _ratio((r["oracle_seconds"], r["vortex_seconds"]) for r in results),
            "vortex_speed_vs_numpy": _ratio((r["numpy_seconds"], r["vortex_seconds"]) for r in results),
            "vortex_speed_vs_its_best_kernel": _ratio((_least(r["vortex_kernels_seconds"]), r["vortex_seconds"])
                                                      for r in results),
            "dietcode_speed_vs_oracle_in_samples": _ratio((r["oracle_seconds"], r["dietcode_seconds"]) for r in inside),
            "dietcode_speed_vs_oracle_outside": _ratio((r["oracle_seconds"], r["dietcode_seconds"]) for r in outside),
            "vortex_speed_vs_dietcode_in_samples": _ratio((r["dietcode_seconds"], r["vortex_seconds"]) for r in inside),
            "vortex_speed_vs_dietcode_outside": _ratio((r["dietcode_seconds"], r["vortex_seconds"]) for r in outside),
        },
    }


def _timed(entry, program: RProgram, dyn: Dynamic, value: int) -> tuple[float | None, str]:
    """One bundle kernel run, verified and timed at `value`: (seconds, "") or (None, why not)."""
    try:
        check, seconds = vortex.execute(entry, program.expr, dyn, outer_tile(program, dyn), value, SEED, timed=True)
    except Exception as err:  # TVM raises many error types; a kernel that raises has no time
        return None, f"{type(err).__name__}: {first_line(err)}"
    return (seconds, "") if check.correct else (None, check.error)


def _least(seconds: dict) -> float | None:
    measured = [s for s in seconds.values() if s]
    return min(measured) if measured else None


def _vortex_at(table: DispatchTable, runs: dict, value: int) -> dict:
    """Vortex at `value`: the kernel `dispatch` picks and its run among `runs` (kernel id ->
    `_timed`'s answer), so the dispatched kernel is timed once, with the others."""
    kernel, predicted = dispatch(table, value)
    seconds, error = runs[kernel]
    return {"vortex_seconds": seconds, "vortex_kernel": kernel, "vortex_predicted_seconds": predicted,
            "vortex_correct": seconds is not None, "vortex_error": error}


def _dietcode_at(choice: dietcode.Dispatch | None, kernels: dict, dyn: Dynamic, value: int) -> dict:
    """DietCode's kernel for `value`, run, verified and timed (step 5 of the module docstring)."""
    if choice is None:
        return {"dietcode_seconds": None, "dietcode_kernel": None, "dietcode_correct": False,
                "dietcode_error": "no DietCode kernel built"}
    kernel = kernels[choice.select(value)]
    try:
        check, seconds = vortex.execute(kernel.entry, kernel.program.expr, dyn, kernel.outer, value, SEED, timed=True)
    except Exception as err:  # TVM raises many error types; each is this run's failure
        return {"dietcode_seconds": None, "dietcode_kernel": kernel.name, "dietcode_correct": False,
                "dietcode_error": f"{type(err).__name__}: {first_line(err)}"}
    return {"dietcode_seconds": seconds, "dietcode_kernel": kernel.name, "dietcode_correct": check.correct,
            "dietcode_error": check.error}
