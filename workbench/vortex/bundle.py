"""A Vortex bundle on disk (the edge: TVM, files, timing): compile once, run for any value.

`compile_bundle` builds the template's candidates (`hierarchy`), chooses the small set
(`select`), builds each chosen program with a symbolic outer extent (`symbolic_func`: the
catalog's or the expression language's, the dynamic extent T * outer for an int32 argument T,
scheduled by the existing CPU or CUDA code generator over a static expression of
`TEMPLATE_STEPS` outer tiles, whose integers every Python-side decision of the codegen reads),
exports one shared library per kernel, verifies each against numpy at `verify_values` (1 and
two primes beyond its outer tile), and writes the dispatch table, the device spec and
`manifest.json` into a staging directory that is renamed into place only when everything is
written: a failure leaves nothing. A kernel that fails to build or verify is recorded in the
manifest's `failed` and left out of the table. Builds and checks run in this process, one after
the other (CPU kernels for this machine only: a kernel built for another ISA must not run here).

A GPU bundle's kernels are built for the device's CUDA target; each kernel's CUDA source is
written beside its library (`kN.cu`) and, where nvcc is on PATH, compiled to PTX (`kN.ptx`) with
ptxas's registers and spills in the manifest (a kernel nvcc refuses is failed). Its kernels are
verified and timed only where a CUDA device is present (`gpu_here`); elsewhere the manifest says
`"verified": false` and why, and `run` refuses the bundle.

`run` pads only the dynamic axis of the inputs to the chosen kernel's outer tile (zeros: rows
of the output nobody reads), runs it, slices the output, verifies it and times it
(`profile.baselines.best_seconds`, repeats of at least 50 ms as every baseline).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from workbench.codegen import nvcc
from workbench.codegen.build import build_kernel, target_dict
from workbench.codegen.targets import runtime_device
from workbench.codegen.verify import check_output
from workbench.errors import UserError, first_line
from workbench.export import check_out
from workbench.files import read_user_text
from workbench.hardware.loader import load_spec
from workbench.hardware.parse import spec_from_toml_text
from workbench.hardware.spec import DeviceSpec
from workbench.hardware.write import spec_to_toml
from workbench.ops import catalog, expr_lang
from workbench.ops.reference import random_inputs
from workbench.ops.shapes import check_elements
from workbench.profile.local import pool_threads
from workbench.rtile.rprogram import RProgram, make_program
from workbench.rtile.traffic import calculus
from workbench.vortex.analyzer import Dynamic, at_extent, outer_tile, padded_extent
from workbench.vortex.hierarchy import candidates
from workbench.vortex.select import MAX_KERNELS, DispatchTable, dispatch, select
from workbench.workload import Workload

FORMAT, VERSION = "workbench-vortex-bundle", 1
MANIFEST, TABLE, DEVICE = "manifest.json", "dispatch.json", "device.toml"
TEMPLATE_STEPS = 4  # outer tiles along the dynamic axis in the static expression the codegen reads
DEFAULT_MAX_EXTENT = 4096
MAX_MANIFEST_BYTES = 2**22  # a manifest or table of a few kernels is kilobytes


@dataclass(frozen=True)
class Bundle:
    """A loaded bundle: where it is, its manifest and its dispatch table; `params` are the
    workload's parameters (an expression's: its axes' extents) with the dynamic one as `catalog.DYN`."""

    path: Path
    manifest: dict
    table: DispatchTable

    @property
    def params(self) -> dict:
        """The extents (an expression's text, its parameter `expr`, is not one)."""
        return {k: v for k, v in self.manifest["workload"].items() if k not in ("op", "dtype", EXPR)}

    def library(self, kernel_id: str) -> Path:
        return self.path / next(k["library"] for k in self.manifest["kernels"] if k["id"] == kernel_id)


EXPR = "expr"  # the op of an expression workload; its text is the parameter of that name


def dynamic_workload(workload: Workload) -> tuple[str, str, str, dict]:
    """(op, dtype, the dynamic parameter, every parameter with it set to 1) of a catalog
    workload, or of an expression (op `EXPR`, its text the parameter `expr`, the dynamic
    parameter its axis: `expr_lang.split_dynamic`)."""
    if workload.expr is not None:
        axis, extents = expr_lang.split_dynamic(workload.expr, dict(workload.params))
        return EXPR, workload.dtype, axis, {EXPR: workload.expr, **extents}
    if workload.op is None:
        raise UserError("vortex takes a catalog operator or an expression with one dyn extent "
                        "(--op matmul --shape M=dyn,K=..,N=.., or --expr TEXT --shape i=dyn,..)")
    param, static = catalog.split_dynamic(workload.op, dict(workload.params))
    return workload.op, workload.dtype, param, static


def build_static(op: str, params: dict, dtype: str):
    """The TensorExpr of a catalog operator, or of an expression (op `EXPR`), at static extents."""
    if op == EXPR:
        extents = {k: v for k, v in params.items() if k != EXPR}
        return expr_lang.build_expr(params[EXPR], extents, dtype)
    return catalog.build(op, params, dtype)


def symbolic_func(op: str, static: dict, param: str, tile: int, dtype: str):
    """The PrimFunc with the dynamic parameter `T * tile` (T its last argument): the catalog's
    `symbolic_func`, or the expression language's for op `EXPR`."""
    if op == EXPR:
        extents = {k: v for k, v in static.items() if k != EXPR}
        return expr_lang.symbolic_func(static[EXPR], extents, param, tile, dtype)
    return catalog.symbolic_func(op, static, param, tile, dtype)


def dynamic_axis(op: str, static: dict, param: str, dtype: str) -> str:
    """The expression axis the dynamic parameter sizes: the one whose extent follows it."""
    a, b = (build_static(op, {**static, param: v}, dtype) for v in (2, 3))
    moved = [x.name for x, y in zip(a.axes, b.axes) if x.extent != y.extent]
    if len(moved) != 1:
        raise UserError(f"{op}: {param} sizes {len(moved)} axes; a dynamic extent must size exactly one")
    return moved[0]


def choose_kernels(op: str, dtype: str, param: str, static: dict, device: DeviceSpec, max_extent: int,
                   limit: int = MAX_KERNELS) -> tuple[Dynamic, int, tuple[RProgram, ...]]:
    """Vortex's offline choice, nothing built: the dynamic extent, how many candidates the
    hierarchy offers on a template at `max_extent`, and the programs kept (`select`), in the order
    a bundle names them k0, k1, ...; UserError when no candidate fits the device."""
    dyn = Dynamic(param, dynamic_axis(op, static, param, dtype), max_extent)
    offered = candidates(build_static(op, {**static, param: max_extent}, dtype), device, dyn.axis)
    chosen = select(offered, device, dyn, limit)
    if not chosen:
        raise UserError(f"{op}: no candidate kernel fits {device.name}'s hierarchy")
    return dyn, len(offered), chosen


def verify_values(outer: int) -> tuple[int, ...]:
    """1 (padded to a whole outer tile), the first prime above the outer tile (two tiles, the
    second almost empty) and the first prime above three outer tiles (several steps of T)."""
    return (1, _prime_above(outer), _prime_above(3 * outer))


def _prime_above(n: int) -> int:
    n += 1
    while any(n % d == 0 for d in range(2, int(n**0.5) + 1)):
        n += 1
    return n


def gpu_here() -> bool:
    """Whether this machine has a CUDA device to run a GPU bundle's kernels on."""
    import tvm

    return bool(tvm.cuda().exist)


def compile_bundle(workload: Workload, device: DeviceSpec, out_dir, max_extent: int = DEFAULT_MAX_EXTENT,
                   limit: int = MAX_KERNELS, progress=None) -> Bundle:
    """Build, verify and write a bundle for `workload` (one `dyn` parameter) at `out_dir`
    (module docstring); UserError when the workload, device or path is refused, or when no
    kernel builds and verifies (then nothing is written). A GPU bundle compiled where no CUDA
    device is present is written unverified (`"verified": false` and why)."""
    if device.runs_on_cpu:
        _check_runs_here(device, "vortex compile verifies its kernels on this machine: use --device local-cpu")
    elif target_dict(device).get("kind") != "cuda":
        raise UserError(f"vortex compile builds CPU and CUDA kernels; {device.name}'s target is "
                        f"{target_dict(device).get('kind')}")
    verify = device.runs_on_cpu or gpu_here()
    if not isinstance(max_extent, int) or max_extent < 1:
        raise UserError(f"--max-extent must be a positive integer, got {max_extent!r}")
    op, dtype, param, static = dynamic_workload(workload)
    path = check_out(out_dir)
    start = time.perf_counter()
    dyn, _, chosen = choose_kernels(op, dtype, param, static, device, max_extent, limit)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name[:40]}.", dir=path.parent))
    try:
        kept, records, failed = [], [], []
        for n, program in enumerate(chosen):
            kernel_id = f"k{n}"
            if progress:
                progress(f"building {kernel_id} ({n + 1}/{len(chosen)})")
            record = build_symbolic(op, static, dtype, dyn, program, device, staging, kernel_id, verify=verify)
            if record.get("error"):
                failed.append(record)
            else:
                kept.append((kernel_id, program))
                records.append(record)
        if not device.runs_on_cpu:
            if progress:
                progress(f"nvcc on {len(records)} kernels")
            passed = nvcc_records(records, device, staging)
            failed += [r for r in passed if r.get("error")]
            kept = [(k, p) for k, p in kept if any(r["id"] == k and not r.get("error") for r in passed)]
            records = [r for r in passed if not r.get("error")]
        if not kept:
            raise UserError(f"no kernel built and verified; first failure: {failed[0]['error']}")
        table = DispatchTable(dyn, device, tuple(kept))
        manifest = {
            "format": FORMAT, "version": VERSION,
            "workload": {"op": op, "dtype": dtype, **{k: list(v) if isinstance(v, tuple) else v
                                                       for k, v in static.items()}, param: catalog.DYN},
            "dynamic": dyn.to_dict(), "device": device.name, "build": "in-process, one kernel at a time",
            "verified": verify, **({} if verify else {"why": "no GPU here"}),
            "compile_seconds": time.perf_counter() - start,
            "kernels": records, "failed": failed, "table": TABLE, "device_spec": DEVICE,
        }
        (staging / TABLE).write_text(json.dumps(table.to_dict()))
        (staging / DEVICE).write_text(spec_to_toml(device))
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
        try:
            os.rename(staging, path)  # replaces an empty directory only
        except OSError as err:
            raise UserError(f"cannot write the bundle {path}: {err.strerror or err}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return load_bundle(path)


def _check_runs_here(device: DeviceSpec, what: str) -> None:
    """Refuse kernels for a CPU target other than this machine's: they run in this process,
    where an instruction this CPU lacks would kill it."""
    if device.target_dict() != load_spec("local-cpu").target_dict():
        raise UserError(f"{what} ({device.name} targets another CPU)")


def build_symbolic(op, static, dtype, dyn: Dynamic, program: RProgram, device: DeviceSpec, folder: Path,
                   kernel_id: str, verify: bool = True) -> dict:
    """Build one kernel for `program` (any rProgram over the workload: a bundle's, or another
    selector's) with a symbolic outer extent, export its library into `folder` (a GPU kernel's
    CUDA source beside it) and, when `verify`, verify it: its manifest record, with `error`
    where any step failed (that kernel's failure, never the bundle's)."""
    outer = outer_tile(program, dyn)
    record = {"id": kernel_id, "outer": outer, "tiles": [dict(zip(program.axes, t)) for t in program.tiles],
              "library": f"{kernel_id}.so"}
    try:
        static_expr = build_static(op, {**static, dyn.param: outer * TEMPLATE_STEPS}, dtype)
        built_program = make_program(calculus(static_expr), device, program.tiles, program.cached, program.eps)
        symbolic = symbolic_func(op, static, dyn.param, outer, dtype)
        gpu = not device.runs_on_cpu
        kernel = build_kernel(replace(static_expr, func=symbolic), built_program, device, sources=gpu)
        record["build_seconds"] = kernel.build_seconds
        if not kernel.ok:
            return record | {"error": kernel.error}
        if gpu:
            record["template"] = kernel.template
            record["source"] = f"{kernel_id}.{kernel.source_suffix}"
            (folder / record["source"]).write_text(kernel.source)
        library = folder / record["library"]
        kernel.executable.export_library(str(library))
        if not verify:
            return record
        entry = load_kernel(library, device)
        checks = []
        for value in verify_values(outer):
            check, _ = execute(entry, program.expr, dyn, outer, value, seed=0, timed=False, device=device)
            checks.append({"value": value, "correct": check.correct, "max_rel_err": check.max_rel_err,
                           "error": check.error})
        record["verified"] = checks
        wrong = [c for c in checks if not c["correct"]]
        if wrong:
            return record | {"error": f"wrong at {dyn.param}={wrong[0]['value']}: {wrong[0]['error']}"}
        return record
    except Exception as err:  # TVM raises many error types; each is this kernel's failure
        return record | {"error": f"{type(err).__name__}: {first_line(err)}"}


def nvcc_records(records: list[dict], device: DeviceSpec, folder: Path) -> list[dict]:
    """GPU kernels' records with nvcc's verdict on their CUDA sources (one nvcc call for all,
    `codegen.nvcc`): the PTX written beside the source (`ptx`) and ptxas's registers and spills
    (`ptxas`), or `nvcc`: why there is none where nvcc is not on PATH; a source nvcc refuses
    makes its kernel failed (`error`)."""
    if nvcc.nvcc_path() is None:
        return [r | {"nvcc": "not found"} for r in records]
    sources = [(folder / r["source"]).read_text() for r in records]
    out = []
    for record, result in zip(records, nvcc.compile_ptx_many(sources, target_dict(device)["arch"])):
        if not result.ok:
            out.append(record | {"error": f"nvcc: {result.error}"})
            continue
        record = record | {"ptx": f"{record['id']}.ptx", "arch": result.arch}
        (folder / record["ptx"]).write_text(result.ptx)
        report = result.ptxas_report
        out.append(record | ({"ptxas": asdict(report)} if report else {"ptxas": None, "nvcc": result.error}))
    return out


def load_kernel(library: Path, device: DeviceSpec):
    """The entry function of an exported kernel library (for `execute`), with TVM's thread pool
    sized to `device`'s cores before the first kernel starts it (`pool_threads`: TVM's default
    ran the BERT GEMM on one of the two cores, half the speed the profiler's workers measure)."""
    import tvm

    if device.runs_on_cpu:
        pool_threads(device)
    return tvm.runtime.load_module(str(library))["main"]


def execute(entry, template, dyn: Dynamic, outer: int, value: int, seed: int, timed: bool,
            device: DeviceSpec | None = None):
    """Run the kernel `entry` (outer tile `outer`) at `value` on `device`'s runtime device (a
    CPU spec or None: this CPU): pad, run, slice, verify, and time when `timed`.
    (Verification, seconds or None)."""
    import tvm

    from workbench.profile.baselines import best_seconds

    padded = padded_extent(value, outer)
    exact = at_extent(template, dyn.axis, value, dyn.param)
    wide = at_extent(template, dyn.axis, padded, dyn.param)
    for arg in wide.args:
        check_elements(arg.name, arg.shape)
    inputs = random_inputs(exact, seed)
    gpu = device is not None and not device.runs_on_cpu
    dev = runtime_device(target_dict(device)["kind"]) if gpu else tvm.cpu()
    arrays = []
    for x, arg in zip(inputs, (a for a in wide.args if a.role == "input")):
        grown = np.zeros(arg.shape, dtype=x.dtype)
        grown[tuple(slice(0, s) for s in x.shape)] = x
        arrays.append(tvm.runtime.tensor(grown, dev))
    out_arg = wide.args[-1]
    out = tvm.runtime.tensor(np.zeros(out_arg.shape, dtype=out_arg.dtype), dev)
    steps = padded // outer

    def call():
        entry(*arrays, out, steps)
        if gpu:
            dev.sync()  # a GPU launch returns before the kernel ends (timed: the launch with it)

    call()
    result = out.numpy()[tuple(slice(0, s) for s in exact.args[-1].shape)]
    check = check_output(exact, inputs, result)
    seconds = best_seconds(call) if timed and check.correct else None
    return check, seconds


def load_bundle(path) -> Bundle:
    """The bundle at `path`; UserError naming what is missing or malformed."""
    folder = Path(path)
    if not (folder / MANIFEST).is_file():
        raise UserError(f"{path}: not a vortex bundle (no {MANIFEST})")
    try:
        manifest = json.loads(read_user_text(folder / MANIFEST, "manifest", MAX_MANIFEST_BYTES))
        if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
            raise UserError(f"{path}: not a {FORMAT} version {VERSION}")
        device = spec_from_toml_text(read_user_text(folder / DEVICE, "device spec", MAX_MANIFEST_BYTES),
                                     str(folder / DEVICE), check_target=False)
        table = DispatchTable.from_dict(json.loads(read_user_text(folder / TABLE, "dispatch table",
                                                                  MAX_MANIFEST_BYTES)), device)
        ids = {k["id"] for k in manifest["kernels"]}
        dynamic_workload(Workload.from_dict(manifest["workload"]))  # parsed, never evaluated
    except UserError as err:
        raise UserError(f"{path}: malformed bundle: {err}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise UserError(f"{path}: malformed bundle: {type(err).__name__} {first_line(err)}") from None
    if {k for k, _ in table.kernels} != ids:
        raise UserError(f"{path}: malformed bundle: the dispatch table and the manifest list different kernels")
    bundle = Bundle(folder, manifest, table)
    for kernel_id in sorted(ids):
        if not bundle.library(kernel_id).is_file():
            raise UserError(f"{path}: malformed bundle: library {bundle.library(kernel_id).name} is missing")
    return bundle


def value_of(bundle: Bundle, shape: dict) -> int:
    """The dynamic extent's value in `shape` (`--shape M=77`, the static parameters optional
    but equal to the bundle's); UserError for any other parameter, a static one that differs,
    or a value that is not a positive integer."""
    params, param = bundle.params, bundle.table.dyn.param
    if param not in shape:
        raise UserError(f"--shape: give the dynamic extent {param} (e.g. {param}=77)")
    for key, value in shape.items():
        if key == param:
            continue
        if key not in params:
            raise UserError(f"--shape: {key} is not a parameter of this bundle ({', '.join(sorted(params))})")
        expected = tuple(params[key]) if isinstance(params[key], list) else params[key]
        if value != expected:
            raise UserError(f"--shape: {key}={value} does not match the bundle's {key}={expected}")
    value = shape[param]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"--shape: {param} must be a positive integer, got {value!r}")
    return value


def run(bundle: Bundle, value: int, seed: int = 0) -> dict:
    """Select the kernel for `value`, run it on random inputs (`seed`), verify and time it:
    {"shape", "kernel", "predicted_seconds", "measured_seconds", "correct"} (measured None
    when the result is wrong or the kernel failed to load or run), plus "error" saying why it
    is not correct. A GPU bundle runs only where a CUDA device is present (else UserError)."""
    value = value_of(bundle, {bundle.table.dyn.param: value})
    device = bundle.table.device
    if device.runs_on_cpu:
        _check_runs_here(device, f"{bundle.path}: its kernels were built for another machine's CPU")
    elif not gpu_here():
        raise UserError(f"{bundle.path}: its kernels are for the GPU {device.name}, and there is no CUDA device here")
    kernel_id, predicted = dispatch(bundle.table, value)
    program = bundle.table.program(kernel_id)
    dyn = bundle.table.dyn
    doc = {"shape": bundle.params | {dyn.param: value}, "kernel": kernel_id, "predicted_seconds": predicted}
    try:
        check, seconds = execute(load_kernel(bundle.library(kernel_id), device), program.expr, dyn,
                                 outer_tile(program, dyn), value, seed, timed=True, device=device)
    except UserError:
        raise
    except Exception as err:  # TVM's errors (a GPU of another architecture, say): the kernel's failure
        return doc | {"measured_seconds": None, "correct": False, "error": f"{type(err).__name__}: {first_line(err)}"}
    return doc | {"measured_seconds": seconds, "correct": check.correct, "error": check.error}
