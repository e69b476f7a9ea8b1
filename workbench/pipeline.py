"""The front door: what the CLI, the dashboard pages and the widgets call, so that none of them
assembles the pipeline itself.

    request(workload, device, policy, options)     what to construct
      -> stepper(request)                            a cursor over the steps (lessons, the Construction page)
      -> construct(request) -> Construction          the finished top-K (or `Stepper.finish()`)
           -> profile(construction, ...)             build, verify, time, store: a ProfileResult
           -> export(construction, rank, out)        build, verify, write one bundle: the only export
           -> build(construction, rank)              one kernel's sources and schedule, to read
           -> markov_versus_roller(request, c)       a Markov pick against Roller's, and why
    Candidate.to_dict(measurement) / candidate_rows  a candidate as JSON / as a table row
    import_onnx(path, dims)                          an ONNX model, its symbolic dims bound (--dim)
    construct_model(model, device, policy, options)   every operator of an ONNX model, co-scheduled
      -> run_model_report(model_construction, path)  run on this CPU against ONNX Runtime, timed
    vortex_plan(workload with dyn, device, max)     Vortex's kernels for a dynamic extent, priced over it
      -> vortex_pick(plan, value)                    the dispatcher's kernel for one value
      -> vortex_compile / vortex_load / vortex_run   the bundle on disk, run and verified per value
    gpu_pack(suites, workloads, device, topk, out)   kernels built here for a GPU machine without TVM
      -> gpu_ingest(result, store)                   its runner's result stored as runs (docs/gpu.md)
    edit_device(device, ["L2.capacity_bytes=2MiB"])  what-if hardware: an edited spec (`hardware.edit`)
      -> whatif(workloads, edited, policy, options)  each workload's top-1 on both specs, diffed (`whatif`)
      -> whatif_measure(diff)                        base and edited top-1 built and timed here
    whatif_sweep(workloads, device, "FIELD=LO:HI:N")  one field swept: curves and top-1 change points
    and what a face offers to choose from or shows beside them: the workloads (`suites`,
    `operators`, `parse_workload`), the devices (`device_presets`, `device_from_toml`,
    `calibrate_device`, `device_summary`), the runs store (`RunStore`, `default_store_path`),
    a kernel's sources (`source_label`, `ptx_report`) and a model file (`model_bytes`).

Each stage takes the value the stage before made and nothing else: a `Candidate` carries its
program (with its expression and virtual threads), its device, its estimate and the actions that
built it (docs/architecture.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from statistics import median

from workbench.codegen.build import Kernel
from workbench.codegen.nvcc import PtxResult, compile_ptx, nvcc_path
from workbench.codegen.targets import SOURCE_TEXTS
from workbench.construct.graph import ConstructionGraph
from workbench.construct.policies import POLICIES, policy_class
from workbench.construct.space import Options
from workbench.construct.step import Candidate, Step
from workbench.construct.stepper import Construction, Stepper
from workbench.construct.versus import Versus, markov_versus_roller as versus
from workbench.errors import UserError
from workbench.export import ExportResult, KernelRejected, build_apart, bundle_name, check_out, export_candidate
from workbench.files import check_size, read_user_file
from workbench.fmt import shape_text, time_columns
from workbench.gpu import ingest as gpu_results
from workbench.gpu import pack as gpu_packs
from workbench.hardware.edit import Edit, EditedSpec, FieldInfo, Sweep, editable_fields, parse_edit, parse_sweep
from workbench.hardware.loader import LOCAL_CPU, MAX_SPEC_BYTES, list_presets, load_spec
from workbench.hardware.parse import spec_from_toml_text
from workbench.hardware.write import spec_summary, spec_to_toml
from workbench.hardware.spec import DeviceSpec
from workbench.hardware.targets import target_problem
from workbench.models import construction as whole_model
from workbench.models.construction import ModelConstruction, report_dict, report_text
from workbench.models.execute import operator_runner
from workbench.models.onnx_import import MAX_MODEL_BYTES, ImportedModel, import_model, symbolic_dim_names
from workbench.models.run import run_model_report
from workbench.models.symbolic import parse_dims
from workbench.ops import random_suite
from workbench.ops.catalog import DYNAMIC_PARAMS, OpInfo, list_ops
from workbench.ops.shapes import DTYPES
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.model.common import peak_gflops, stays_in_llc
from workbench.profile.correction import Correction, corrected_seconds, earned
from workbench.profile.diagnose import diagnose
from workbench.profile.runner import Measurement, Runner, Timing
from workbench.profile.importance import importance, slice_points, stored_trials
from workbench.profile.session import (
    TURNS, Progress, ProfileResult, ProgressEvent, cannot_run_locally, expr_label, profile_candidates, time_in_turns,
)
from workbench.profile.store import RunStore, default_path, read_runs_file, refit, write_runs_file
from workbench.profile import remeasure
from workbench.profile.remeasure import ROUNDS as REMEASURE_ROUNDS
from workbench.profile.versus import Selector, compare_runs, text as comparison_text
from workbench.vortex import bundle as vortex_bundle
from workbench.vortex.analyzer import Dynamic, outer_tile, padded_extent, cost as vortex_cost
from workbench.vortex.dietcode import DEFAULT_SAMPLES as DIETCODE_SAMPLES
from workbench.vortex.select import DispatchTable, cost_table, dispatch
from workbench.workers import WorkerPool
from workbench import whatif as what_if
from workbench.workload import Workload, imported_model, list_suites, load_suite, parse_shape, stored_program, suite_workload, workload_from_args

__all__ = [
    "MAX_MODEL_BYTES", "POLICIES", "build", "bundle_name_for", "Candidate", "candidate_rows",
    "cannot_profile_here", "check_export_path", "construct", "construct_model", "Construction", "DeviceSpec",
    "diagnosis_rows", "export", "importance", "slice_points", "stored_trials", "ExportResult", "Kernel", "KernelRejected", "load_device",
    "ModelConstruction", "Options", "profile", "ProfileResult", "report_dict", "report_text", "Request",
    "request", "stepper", "Stepper", "Timing", "markov_versus_roller", "Versus", "WorkerPool", "Correction", "refit", "rank_by_correction",
    "run_model_report", "DIETCODE_SAMPLES", "VortexPlan", "vortex_compile", "vortex_load", "vortex_pick",
    "vortex_plan", "vortex_bundle_plan", "vortex_run", "vortex_value_of", "import_onnx", "model_symbolic_dims", "gpu_pack", "gpu_ingest",
    # what the faces choose from and show beside a construction
    "ConstructionGraph", "ImportedModel", "Measurement", "ProgressEvent", "Step", "TensorExpr", "Workload",
    "DTYPES", "DYNAMIC_PARAMS", "LOCAL_CPU", "OpInfo", "PtxResult", "RunStore",
    "calibrate_device", "calibrate_first_use", "calibration_size", "check_model_upload", "default_store_path", "detect_local_device",
    "device_from_toml", "device_presets", "device_summary", "has_nvcc", "model_bytes", "operators",
    "parse_shape", "parse_workload", "ptx_report", "source_label", "suite", "suites",
    "random_suites", "is_random_suite", "fresh_seed", "MAX_RANDOM_COUNT",
    # the runs store between machines and runs: `runs export/import/compare`
    "read_runs_file", "write_runs_file", "Selector", "compare_runs", "comparison_text", "REMEASURE_ROUNDS", "spec_to_toml", "store_calibrated",
    # what-if hardware: `workbench whatif`, the dashboard's device editor
    "Edit", "EditedSpec", "FieldInfo", "Sweep", "editable_fields", "parse_edit", "parse_sweep", "edit_device",
    "whatif", "whatif_sweep", "whatif_unrealisable", "whatif_measure", "WhatIfMeasured",
]


@dataclass(frozen=True)
class Request:
    """One construction to make: a workload (a `Workload`, or an already built TensorExpr such
    as a model's operator), a device, a policy and its options."""

    workload: Workload | TensorExpr
    device: DeviceSpec
    policy: str = "roller"
    options: Options = Options()

    def expr(self) -> TensorExpr:
        """The workload's expression (built by TVM for a `Workload`); UserError for bad input."""
        return self.workload if isinstance(self.workload, TensorExpr) else self.workload.build()

    @property
    def label(self) -> str:
        """The workload as the user named it (`cpu-core:mm-512`, `matmul M=64,...`)."""
        if isinstance(self.workload, Workload):
            return self.workload.describe()
        return expr_label(self.workload)

    def describe(self) -> str:
        dtype = "" if self.workload.dtype == "float32" else f" {self.workload.dtype}"
        return f"{self.label}{dtype} on {self.device.name} ({self.policy}, top-{self.options.topk})"


def request(workload: Workload | TensorExpr | str, device: DeviceSpec | str | Path, policy: str = "roller",
            options: Options = Options()) -> Request:
    """A Request from what a user types: a workload `SUITE:ID` or a `Workload` or TensorExpr, a
    device preset name or spec file (`local-cpu`: this machine) or a DeviceSpec. UserError for an
    unknown suite entry, device or policy, or top-K below 1."""
    if isinstance(workload, str):
        workload = suite_workload(workload)
    elif not isinstance(workload, (Workload, TensorExpr)):
        raise UserError(f"expected a Workload, a TensorExpr or 'SUITE:ID', got {type(workload).__name__}")
    device = load_device(device)
    policy_class(policy)
    if options.topk < 1:
        raise UserError(f"top-K must be >= 1, got {options.topk}")
    return Request(workload, device, policy, options)


def load_device(device: DeviceSpec | str | Path) -> DeviceSpec:
    """A DeviceSpec as is, or a preset name / spec file loaded (`local-cpu`: this machine);
    UserError for an unknown or bad one."""
    if isinstance(device, (str, Path)):
        return load_spec(device)
    if not isinstance(device, DeviceSpec):
        raise UserError(f"expected a DeviceSpec or a preset name, got {type(device).__name__}")
    return device


def stepper(req: Request) -> Stepper:
    """A cursor over the construction of `req`, at its start."""
    return Stepper(req.expr(), req.device, req.policy, req.options)


def construct(req: Request) -> Construction:
    """The finished construction of `req`: its top-K, graph, step count and time."""
    return stepper(req).finish()


def markov_versus_roller(req: Request, construction: Construction) -> Versus | None:
    """For a Markov construction of `req`, its rank 1 against Roller's on the same workload,
    device and options (`construct.versus`: the predicted ratio, and why where Markov's is
    slower); None for any other policy."""
    if construction.policy != "markov":
        return None
    return versus(construction, construct(replace(req, policy="roller")))


def profile(
    construction: Construction,
    runner: str | Runner = "local",
    *,
    label: str = "",
    store=None,
    timing: Timing = Timing(),
    progress: Progress | None = None,
    tracker: str | None = None,
    key: str | None = None,
    ranks: Sequence[int] | None = None,
    pool: WorkerPool | None = None,
    workload: Workload | TensorExpr | None = None,
    run_label: str = "",
) -> ProfileResult:
    """Build, verify and time the construction's candidates (those of `ranks`, default all) with
    `runner` ("local", "rpc" with `tracker` and `key`, "fake", or a Runner), recording the run
    in `store` (a `profile.store.RunStore`) under the workload label `label` and the run's own
    `run_label` (what `runs compare` selects by); builds and local runs use the warm
    workers of `pool` (a `WorkerPool`, for many profiles in a row) when given.

    The numpy reference knows catalog operators and expressions, not a model's fused PrimFuncs:
    when `workload` (the request's) is an operator of an ONNX model, the local runner checks its
    candidates against the operator's TVM default lowering in a run of the model on seeded
    inputs (`models.execute.operator_runner`, as `workbench model --pick measured` does), and
    the RPC runner is refused in one line."""
    chosen = construction.candidates if ranks is None else tuple(construction.candidate(r) for r in ranks)
    if pool is None and _model_operator(workload) and runner == "local":
        with WorkerPool() as own:
            return profile(construction, runner, label=label, store=store, timing=timing, progress=progress,
                           tracker=tracker, key=key, ranks=ranks, pool=own, workload=workload, run_label=run_label)
    if _model_operator(workload):
        if runner == "rpc":
            raise UserError("an operator of a model is checked against its TVM default lowering in a run of the "
                            "model on this machine: profile it with the local runner")
        if runner == "local":
            model = imported_model(workload.model, workload.dims)
            runner = operator_runner(model, workload.operator, construction.device, pool, timing.seed)
    return profile_candidates(construction.expr, construction.device, chosen, runner=runner, tracker=tracker,
                              key=key, store=store, workload_label=label, policy=construction.policy,
                              timing=timing, progress=progress, pool=pool, run_label=run_label,
                              options=construction.options)


def _model_operator(workload) -> bool:
    return isinstance(workload, Workload) and workload.model is not None


def cannot_profile_here(device: DeviceSpec) -> str:
    """Why the local runner cannot run kernels for `device` ("" when it can): no such GPU here,
    or a CPU whose instructions this one lacks. Takes a worker process's start (about a second)."""
    return cannot_run_locally(device)


def export(construction: Construction, rank: int, out, *, zip: bool = False,
           measured_seconds: float | None = None, workload: Workload | TensorExpr | None = None) -> ExportResult:
    """Build candidate `rank`, verify it and write its bundle to `out` (`workbench.export`): an
    `ExportResult`. When `workload` (the request's) is an operator of an ONNX model, the kernel
    is checked against the operator's TVM default lowering in a run of the model, as `profile`
    checks it. UserError for a bad `out` or rank (before anything is built);
    `KernelRejected` (a UserError) with nothing written for a kernel that fails."""
    cand = construction.candidate(rank)
    return export_candidate(construction.expr, cand, construction.device, out, policy=construction.policy,
                            measured_seconds=measured_seconds, zip=zip,
                            operator=workload if _model_operator(workload) else None)


def build(construction: Construction, rank: int) -> Kernel:
    """Candidate `rank` built for reading (a `codegen.build.Kernel`: sources, TVMScript, schedule
    trace; ok or failed, never run), in a worker process so that a compiler crash fails this
    kernel, not the caller."""
    return build_apart(construction.expr, construction.candidate(rank), construction.device)


def bundle_name_for(construction: Construction, rank: int, label: str) -> str:
    """The default bundle name of candidate `rank`: workload `label`, device, policy, rank (file-
    system safe), the same in every face."""
    return bundle_name(label, construction.device.name, construction.policy, f"rank{rank}")


def construct_model(model: ImportedModel | str | Path, device: DeviceSpec | str | Path, policy: str = "roller",
                    options: Options = Options()) -> ModelConstruction:
    """Every operator of an ONNX model (a path, read within MAX_MODEL_BYTES, or an imported
    model) constructed on `device` (a spec, preset name or spec file), and their Rammer
    co-schedule (`models.construction`); `report_dict` / `report_text` give its JSON and text forms."""
    imported = model if isinstance(model, ImportedModel) else import_model(model)
    return whole_model.construct_model(imported, load_device(device), policy, options)


def import_onnx(path: str | Path, dims: str | Sequence[str] | Mapping[str, int] | None = None) -> ImportedModel:
    """An ONNX model imported with its inputs' symbolic dims bound (`workbench model --dim`):
    `dims` as the option's text ("batch=4,seq=16", or a list of such) or a mapping; a dim not
    given is bound to 1, and the report says so (`models.symbolic`). For `construct_model`."""
    return import_model(path, dims if isinstance(dims, Mapping) else parse_dims(dims))


def model_symbolic_dims(path: str | Path) -> tuple[str, ...]:
    """The names of an ONNX model's symbolic input dims, without importing it (a face asks for
    their values only when there are some)."""
    return symbolic_dim_names(path)


def check_export_path(out, zip: bool = False) -> Path:
    """The bundle path `out` checked as `export` checks it (`workbench.export.check_out`), for a
    face that must refuse a bad path before it constructs anything."""
    return check_out(out, zip)


def diagnosis_rows(result: ProfileResult) -> list[dict]:
    """One row per correct, timed kernel of a profile: achieved GFLOP/s, the share of the
    compute roof, the limit that binds (`profile.diagnose`) and the sentence saying why."""
    return [{"rank": rank, "achieved GFLOP/s": d.gflops, "% of peak": dict(d.shares)["compute"] * 100,
             "binds": d.binding, "why": d.sentence} for rank, d in sorted(result.diagnoses.items())]


def rank_by_correction(construction: Construction, store: RunStore | None) -> tuple[Construction, str]:
    """`construction` with its candidates ranked by the corrected prediction (`corrected_seconds`,
    ties by the model's rank) where `store` holds a correction of its device that has earned it
    (`correction.earned`), and a line saying so; else `construction` as it is and "". The
    estimates stay the model's: the store keeps them, and the next fit learns from them."""
    stored = store.correction(construction.device.name) if store is not None else None
    if stored is None or not earned(stored.evaluation):
        return construction, ""
    op = construction.expr.op
    order = sorted(construction.candidates,
                   key=lambda c: (corrected_seconds(c.estimate, stored.correction, op), c.rank))
    ranked = tuple(replace(c, rank=i + 1) for i, c in enumerate(order))
    ev = stored.evaluation
    note = (f"ranked by the runs store's correction of {construction.device.name} (held-out mean Spearman "
            f"{ev['before']['spearman']:+.2f} -> {ev['after']['spearman']:+.2f}; `workbench runs fit` refits it)")
    return replace(construction, candidates=ranked), note


def candidate_rows(candidates: Sequence[Candidate], measurements: Sequence[Measurement] | None = None,
                   measured: Mapping[int, float] | None = None, correction: Correction | None = None) -> list[dict]:
    """The candidate table every face shows, one row per candidate: rank, predicted time (with a
    `correction` learnt from the runs store, the corrected prediction beside it), whether the
    compute term was measured (a calibrated level-0 micro-kernel) or modelled, the
    measured time (the best repeat, from `measurements`, a profile's, or `measured`, rank ->
    seconds) with its share of the device's peak compute and of the bandwidth of the layer read
    closest to its roof and the limit that binds (`profile.diagnose`), with `measurements` also the median and the spread of the median's interval
    (`profile.noise`, as a share of the median) and the error, then bottleneck, grid, waves, the
    tile per memory layer, the virtual threads and the template's plan in words (`rtile.plan`). Times in one unit for the whole table, chosen
    from their median (`fmt.time_columns`): `predicted (ms)` 107, never `predicted us` 107427.73."""
    by_rank = {m.rank: m for m in measurements or ()}
    times = dict(measured or {}) | {m.rank: m.best_seconds for m in by_rank.values() if m.ok}
    shown = measurements is not None or measured is not None
    rows = []
    for c in candidates:
        row = {"rank": c.rank, "predicted us": c.predicted_seconds * 1e6}
        if correction is not None:
            row["corrected us"] = corrected_seconds(c.estimate, correction, c.program.expr.op) * 1e6
        if shown:
            row["measured us"] = times[c.rank] * 1e6 if c.rank in times else None
            d = diagnose(c.estimate, c.device, peak_gflops(c.program.expr, c.device), times[c.rank],
                         stays_in_llc(c.program.expr, c.device)) \
                if c.rank in times and times[c.rank] > 0 else None
            top = d.bandwidth_share if d is not None else None
            row["% peak compute"] = d.compute_share * 100 if d is not None else None
            row["% peak bandwidth"] = top[1] * 100 if top is not None else None
            row["binds"] = d.binding if d is not None else None
        if by_rank:
            m = by_rank.get(c.rank)
            interval = m.interval if m is not None and m.ok else None
            row["median us"] = m.median_seconds * 1e6 if interval is not None else None
            row["spread %"] = (interval.high - interval.low) / m.median_seconds * 100 if interval is not None else None
        if by_rank:
            row["error"] = by_rank[c.rank].error if c.rank in by_rank else ""
        row["bottleneck"] = c.estimate.bottleneck
        row["compute"] = "measured" if any(p.startswith("compute") for p in c.estimate.measured) else "modelled"
        row |= {"grid": c.program.grid, "waves": c.estimate.waves}
        row |= {name: shape_text(t) for name, t in zip(c.program.layers, c.program.tiles)}
        row["vthreads"] = ", ".join(f"{a}x{v}" for a, v in c.program.vthreads) or None
        row["plan"] = c.plan_text
        rows.append(row)
    rows = [{k: v for k, v in row.items() if k != "vthreads" or any(r["vthreads"] for r in rows)} for row in rows]
    return time_columns(rows)[0]


# Vortex (dynamic shapes, docs/vortex.md): the bundle on disk as `workbench vortex` writes and runs it.
vortex_compile = vortex_bundle.compile_bundle
vortex_load = vortex_bundle.load_bundle
vortex_run = vortex_bundle.run
vortex_value_of = vortex_bundle.value_of


@dataclass(frozen=True)
class VortexPlan:
    """What `vortex compile` chooses for a workload with one `dyn` extent, before anything is
    built: the dispatch table (kernels `k0`, `k1`, ... in the order compile names them), how many
    candidates the hierarchy offered (None for a compiled bundle's plan: a bundle does not keep
    that count), and each kernel's predicted seconds at `values` (every value where one kernel's
    padded extent changes, so the curves are exact steps)."""

    table: DispatchTable
    candidates: int | None
    values: tuple[int, ...]
    curves: tuple[tuple[float, ...], ...]  # one row per kernel of the table, one entry per value

    @property
    def dyn(self) -> Dynamic:
        return self.table.dyn

    def outer(self, kernel_id: str) -> int:
        """The kernel's outer tile along the dynamic axis: the values it pads to."""
        return outer_tile(self.table.program(kernel_id), self.dyn)

    def padded(self, kernel_id: str, value: int) -> int:
        """The extent the kernel runs for `value`: whole outer tiles."""
        return padded_extent(value, self.outer(kernel_id))

    def seconds(self, kernel_id: str, value: int) -> float:
        """The kernel's predicted seconds at `value` (padded to its outer tile)."""
        return vortex_cost(self.table.program(kernel_id), self.table.device, self.dyn, value).predicted_seconds


def vortex_plan(workload: Workload, device: DeviceSpec | str | Path,
                max_extent: int = vortex_bundle.DEFAULT_MAX_EXTENT) -> VortexPlan:
    """Vortex's offline choice for `workload` (one catalog parameter `dyn`) on `device` (CPU or
    GPU; nothing built or run): the hierarchy's candidates, the small set `vortex compile` keeps,
    and their predicted curves over 1..max_extent. UserError for a workload without exactly one
    allowed `dyn`, or a bad bound."""
    device = load_device(device)
    if not isinstance(max_extent, int) or isinstance(max_extent, bool) or max_extent < 1:
        raise UserError(f"the largest value must be a positive integer, got {max_extent!r}")
    op, dtype, param, static = vortex_bundle.dynamic_workload(workload)
    dyn, offered, chosen = vortex_bundle.choose_kernels(op, dtype, param, static, device, max_extent)
    return _priced(DispatchTable(dyn, device, tuple((f"k{n}", p) for n, p in enumerate(chosen))), offered)


def vortex_bundle_plan(bundle: vortex_bundle.Bundle) -> VortexPlan:
    """The plan of a compiled bundle (`vortex_compile`, `vortex_load`): its kernels priced over
    1..the largest value it was compiled for, as `vortex_plan` prices its choice, without choosing
    the kernels again."""
    return _priced(bundle.table, None)


def _priced(table: DispatchTable, offered: int | None) -> VortexPlan:
    """The table's kernels priced at every value of 1..its bound where a padded extent changes."""
    dyn, chosen = table.dyn, tuple(p for _, p in table.kernels)
    steps = {1, dyn.max_extent} | {v for p in chosen for n in range(0, dyn.max_extent, outer_tile(p, dyn)) for v in (n, n + 1)}
    values = tuple(sorted(v for v in steps if 1 <= v <= dyn.max_extent))
    curves = tuple(tuple(row) for row in cost_table(chosen, table.device, dyn, values))
    return VortexPlan(table, offered, values, curves)


def vortex_pick(plan: VortexPlan, value: int) -> tuple[str, float]:
    """(kernel id, predicted seconds) the run-time dispatcher picks at `value` of the dynamic
    extent; UserError for a value that is not a positive integer."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"{plan.dyn.param} must be a positive integer, got {value!r}")
    return dispatch(plan.table, value)


# GPU packs (docs/gpu.md; the format: docs/gpu.md).

def gpu_pack(suites: Sequence[str], workloads: Sequence[str], device: DeviceSpec | str | Path, topk: int, out,
             progress=None) -> gpu_packs.PackResult:
    """The top-`topk` kernels of every workload of `suites` (names, suite files or
    `sample-gemms`) and `workloads` (`SUITE:ID`) on the GPU `device`, built and compiled here
    (cubin and PTX), with their launches and predictions, written to the new directory `out`
    with the runner (`gpu.pack`); `progress` gets a line per workload. UserError for bad input."""
    chosen = gpu_packs.pack_workloads(suites, workloads)
    return gpu_packs.write_pack(chosen, load_device(device), topk, out, progress=progress)


def gpu_ingest(result: str | Path, store: RunStore) -> tuple[gpu_results.Ingested, ...]:
    """The GPU runner's result file `result` stored in `store` as one run per workload
    (`gpu.ingest`); UserError in one line for a missing, non-JSON or malformed file."""
    return gpu_results.ingest(gpu_results.load_result(result), store)


# What a face offers to choose from, and shows beside a construction: the same functions for the
# CLI, the dashboard pages and the widgets, so that none of them reaches into the core for them.

def suites() -> tuple[str, ...]:
    """The names of the workload suites in `specs/suites/` (`cpu-core`, ...)."""
    return list_suites()


def suite(name: str, seed: int | None = None) -> tuple[str, tuple[Workload, ...]]:
    """Suite `name` (or a suite TOML path): its name and its workloads in file order; a random
    suite (`random:N`, `random-conv:N`) drawn with `seed`, named `KIND@SEED`. UserError for an
    unknown or bad one, or a random one without a seed."""
    return load_suite(name, seed)


MAX_RANDOM_COUNT = random_suite.MAX_COUNT  # shapes a random suite may draw: ids r0 .. r(MAX - 1)


def random_suites() -> tuple[str, ...]:
    """The kinds of random suite (`random`, `random-conv`): `KIND:N` draws N shapes per seed."""
    return tuple(random_suite.KINDS)


def is_random_suite(name: str) -> bool:
    """True when suite `name` is drawn at random (it needs a seed); UserError for a malformed
    random name (`random:`, `random:0`, `random-foo:3`)."""
    if not random_suite.is_random(name):
        return False
    random_suite.parse_name(name)
    return True


def fresh_seed() -> int:
    """A seed for a random suite from the operating system's randomness, 0 to 2^64-1."""
    return random_suite.fresh_seed()


def operators() -> tuple[OpInfo, ...]:
    """The catalog's operators: name, parameters (kind, default, doc), description and an example
    shape from a real network."""
    return list_ops()


def parse_workload(op: str | None = None, shape: str | None = None, expr: str | None = None,
                   workload: str | None = None, dtype: str = "float32") -> Workload:
    """The workload the CLI's flags name (CLI.md): exactly one of `op` (with `shape`), `expr`
    (with `shape`, its extents) or `workload` (`SUITE:ID`), in `dtype`; nothing is built yet.
    UserError, in the flags' words, for anything else."""
    return workload_from_args(op, shape, expr, workload, dtype)


def device_presets() -> tuple[str, ...]:
    """The names of the device presets in `specs/devices/` (`local-cpu`, this machine, is not one)."""
    return list_presets()


def device_from_toml(data: bytes, name: str) -> DeviceSpec:
    """A device spec uploaded as the bytes of a TOML file called `name`, validated as the presets
    are (TVM and LLVM check its target); UserError for one over MAX_SPEC_BYTES, not UTF-8, or
    invalid."""
    check_size(len(data), f"spec {name}", MAX_SPEC_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{name}: not UTF-8 text") from None
    return spec_from_toml_text(text, label=name)


def device_summary(spec: DeviceSpec) -> dict:
    """The spec as `workbench devices --json` prints it: name, kind, units, peak GFLOP/s per
    dtype and each memory layer's capacity, bandwidth and latency."""
    return spec_summary(spec)


def detect_local_device() -> DeviceSpec:
    """This machine's CPU detected afresh (`local-cpu`, not calibrated): what `calibrate_device`
    measures, since calibrating a calibrated spec would nest its sources."""
    from workbench.hardware.detect import detect_local_cpu

    return detect_local_cpu()


def calibration_size(spec: DeviceSpec, quick: bool = False) -> int:
    """How many measurements `calibrate_device(spec, quick=quick)` makes (each reports one line to
    its `progress`; a measuring round repeated on implausible results reports more)."""
    from workbench.hardware import calibrate

    threads = max(1, min(spec.compute_units, os.cpu_count() or 1))  # as `calibrate` runs them
    return len(calibrate.probes(spec, threads, quick))


def calibrate_device(spec: DeviceSpec, *, quick: bool = False, progress=None) -> DeviceSpec:
    """`spec` (this machine's CPU, `detect_local_device`) with its bandwidths, peak compute,
    register micro-kernels and kernel launch measured here (`hardware.calibrate`): about 30 s,
    a few with `quick`; `progress` gets one line per measurement. UserError for a GPU spec or
    implausible results."""
    from workbench.hardware import calibrate

    return calibrate.calibrate(spec, quick=quick, progress=progress)


def store_calibrated(spec: DeviceSpec, path=None):
    """Write a calibrated spec where `local-cpu` loads it from (or to `path`); returns the path."""
    from workbench.hardware import calibrate

    return calibrate.store_calibrated(spec, path)


def calibrate_first_use(announce=None) -> str:
    """The quick calibration of this machine's CPU where it is due (`calibrate.first_use_due`:
    `local-cpu` not calibrated here yet), stored where `local-cpu` loads it from: `announce` gets
    "calibrating this CPU once (about N s)..." before it runs, and the line returned says how it
    went ("" when it was not due)."""
    from workbench.hardware import calibrate

    if not calibrate.first_use_due(load_spec(LOCAL_CPU, check_target=False)):
        return ""
    detected = detect_local_device()
    if announce is not None:
        announce(f"calibrating this CPU once (about {calibrate.quick_seconds(detected):.0f} s)...")
    return calibrate.calibrate_first_use(detected)[1]


def default_store_path() -> Path:
    """Where the CLI keeps its runs store (`$XDG_DATA_HOME/tile-workbench/runs.sqlite3`), the
    `RunStore` a face opens unless told otherwise."""
    return default_path()


def source_label(suffix: str) -> tuple[str, str]:
    """(what a kernel source with file suffix `suffix` is, the language to highlight it as):
    ("LLVM IR", "llvm") for "ll"; the suffix and plain text for one codegen does not name."""
    return SOURCE_TEXTS.get(suffix, (suffix, "text"))


def has_nvcc() -> bool:
    """Whether nvcc is on PATH here, so that `ptx_report` can compile a CUDA kernel."""
    return nvcc_path() is not None


def ptx_report(source: str, arch: str) -> PtxResult:
    """A CUDA kernel's source compiled to PTX for `arch` (`sm_80`) and assembled by `ptxas -v`:
    registers per thread, spills, stack and shared memory, or why it failed (`codegen.nvcc`)."""
    return compile_ptx(source, arch)


def model_bytes(path: str | Path) -> bytes:
    """The bytes of the ONNX file `path`, read as `import_onnx` reads it (a regular file within
    MAX_MODEL_BYTES); UserError naming the file otherwise."""
    return read_user_file(path, "model", MAX_MODEL_BYTES)


def check_model_upload(data: bytes, name: str) -> None:
    """Refuse an uploaded model `name` over MAX_MODEL_BYTES before a face writes it anywhere."""
    check_size(len(data), f"model {name}", MAX_MODEL_BYTES)


# What-if hardware (docs/cli.md `workbench whatif`): a spec edited field by field, the workloads
# constructed on both, one field swept, and where this CPU can make an edit real, both timed.

def edit_device(device: DeviceSpec | str | Path, edits: Sequence[str | Edit]) -> EditedSpec:
    """`device` (a spec, preset name or spec file) with `edits` (`FIELD=VALUE` texts or Edits,
    `hardware.edit`) applied: the edited spec, named after its edits, its changes and the fields
    derived from them; UserError in one line naming a bad field or value."""
    parsed = tuple(e if isinstance(e, Edit) else parse_edit(e) for e in edits)
    if not parsed:
        raise UserError("no edit: give FIELD=VALUE, such as L2.capacity_bytes=2MiB")
    edited = what_if.apply_edits(load_device(device), parsed)
    # an edited target is asked of TVM and LLVM as a spec file's is when it loads (the pure
    # `apply_edits` asks neither): a CPU LLVM does not know would otherwise be compared by name
    # alone, and the spec `--out` writes would not load
    if edited.spec.target != edited.base.target and (problem := target_problem(edited.spec.target)):
        named = [e for e in parsed if e.field.startswith("target")] or parsed  # or compute_units' num-cores
        raise UserError(f"{' '.join(map(str, named))}: {problem}")
    return edited


def whatif(workloads: Sequence[Workload | TensorExpr | str], edited: EditedSpec, policy: str = "roller",
           options: Options = Options()) -> what_if.SuiteDiff:
    """Each workload (a `Workload`, TensorExpr or `SUITE:ID`) constructed on `edited.base` and
    `edited.spec` and compared (`whatif.compare`): top-K, top-1 diff, the step where the walks
    diverge, the change in words. Constructions are kept for the process, so a base is built once."""
    policy_class(policy)
    return what_if.compare_suite(_labelled(workloads), edited, policy, options)


def whatif_sweep(workloads: Sequence[Workload | TensorExpr | str], device: DeviceSpec | str | Path,
                 sweep: str | Sweep, policy: str = "roller", options: Options = Options()) -> what_if.SweepResult:
    """Each workload constructed on `device` with one field over a range (`FIELD=LO:HI:N` or a
    Sweep): predicted seconds per value and the values where the top-1 program changes."""
    policy_class(policy)
    parsed = sweep if isinstance(sweep, Sweep) else parse_sweep(sweep)
    return what_if.sweep(_labelled(workloads), load_device(device), parsed, policy, options)


def whatif_unrealisable(edited: EditedSpec, base_edit: EditedSpec | None = None) -> str:
    """Why `whatif_measure` cannot make `edited` real on this machine ("" when it can);
    `base_edit` the edits that made its base from `local-cpu` (`--base-set`), if any."""
    return what_if.unrealisable(edited, LOCAL_CPU, base_edit)


@dataclass(frozen=True)
class WhatIfMeasured:
    """The base and the edited top-1 of one workload, timed here in turns (`time_in_turns`):
    each one's best repeats of the rounds, or why a kernel failed (`error`)."""

    base_rounds: tuple[float, ...]
    edited_rounds: tuple[float, ...]
    error: str = ""

    @property
    def base_seconds(self) -> float | None:
        return float(median(self.base_rounds)) if self.base_rounds else None

    @property
    def edited_seconds(self) -> float | None:
        return float(median(self.edited_rounds)) if self.edited_rounds else None

    @property
    def measured_speedup(self) -> float | None:
        """The median over rounds of base seconds / edited seconds: the ratio of two times a
        few seconds apart, which the host's drift moves alike."""
        if not self.base_rounds or len(self.base_rounds) != len(self.edited_rounds):
            return None
        return float(median(b / e for b, e in zip(self.base_rounds, self.edited_rounds)))


def stored_kernel(store: RunStore, run_id: int, rank: int) -> tuple:
    """(expression, device, candidate) of stored candidate `rank` of run `run_id`, for
    `session.time_in_turns`: the workload's construction expression and the run's device spec as
    stored, the program re-estimated by the current model. UserError when it cannot be rebuilt."""
    from workbench.rtile.model import estimate

    spec = store.device_of(run_id)
    programs = store.programs_of(run_id)
    if rank not in programs:
        raise UserError(f"run {run_id} stored no candidate of rank {rank}")
    try:
        program = stored_program(store.run(run_id).workload_dict, programs[rank], spec)
    except UserError:
        raise
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"run {run_id} rank {rank}: its stored program does not fit the workload's construction "
                        f"today ({type(err).__name__}: {err})") from None
    return program.expr, spec, Candidate(program, estimate(program, spec), spec, (), rank)


def remeasure_runs(store: RunStore, comparison, rounds: int = REMEASURE_ROUNDS, progress=None):
    """`comparison` (`compare_runs`) re-decided from each workload's fastest stored kernels of
    either side rebuilt from `store` and timed here in turn (`profile.remeasure`)."""
    return remeasure.remeasure(comparison, lambda run, rank: stored_kernel(store, run, rank), rounds,
                               progress=progress)


def whatif_measure(diff: what_if.WorkloadDiff, timing: Timing = Timing(), pool: WorkerPool | None = None,
                   rounds: int = TURNS) -> WhatIfMeasured:
    """The base and the edited top-1 of `diff` built, verified and timed on this machine in
    turns, `rounds` times each (the edited one with the edited spec's threads and target: fewer
    cores, a narrower ISA), nothing stored. The caller checks `whatif_unrealisable` first."""
    sides = [(c.expr, c.device, c.candidate(1)) for c in (diff.base, diff.edited)]
    measured = time_in_turns(sides, timing, rounds, pool)
    errors = [f"{c.device.name}: {next(m.error for m in ms if not m.ok)}"
              for c, ms in zip((diff.base, diff.edited), measured) if not all(m.ok for m in ms)]
    if errors:
        return WhatIfMeasured((), (), "; ".join(errors))
    base, edited = (tuple(m.best_seconds for m in ms) for ms in measured)
    return WhatIfMeasured(base, edited)


def _labelled(workloads: Sequence[Workload | TensorExpr | str]) -> tuple[tuple[str, TensorExpr], ...]:
    """(label, expression) of each workload: a `SUITE:ID` text resolved, a Workload built once
    for the process (a slider's every move asks again)."""
    out = []
    for w in workloads:
        w = suite_workload(w) if isinstance(w, str) else w
        out.append((expr_label(w), w) if isinstance(w, TensorExpr) else (w.describe(), _built(w)))
    return tuple(out)


@lru_cache(maxsize=64)
def _built(workload: Workload) -> TensorExpr:
    return workload.build()
