"""Export one candidate as a bundle: the one path `workbench export`, the dashboard's Export page
and the notebook ExportButton take (`export_candidate`).

1. The output path is checked before anything is built (`check_out`): a missing parent that
   cannot be made, a parent that is a file, a name too long for the file system, a symbolic link,
   an unwritable directory or an existing bundle is a UserError naming it.
2. The bundle is assembled in a hidden staging directory (`.NAME.xxxxxxxx`) beside the target:
   building there is the final proof that the target's directory takes files, and renaming it
   into place means a reader never sees half a bundle. Any failure, Ctrl-C or SIGTERM included,
   removes the staging directory and the parents made for it; an existing bundle is never
   overwritten or merged.
3. The kernel is built, its files written, and it is run against the numpy reference in a worker
   process (`workbench.workers`): a compiler crash or an illegal instruction is this
   kernel's failure, never the caller's death. A kernel is run only on a machine that can run it
   (`workbench.codegen.host`); one for another CPU or a GPU not here is exported unverified, the
   manifest saying why (`"verified": false`). For another CPU the same schedule is built for this
   CPU and checked instead, so a wrong schedule is refused wherever it was meant to run.
4. A kernel that fails to build, crashes or gives wrong results is refused (`KernelRejected`) and
   nothing is exported.

The manifest follows `shared/design/CLI.md` (`workbench export`), plus `verified`,
`verification` and `device_spec` (README, "Export"). It is enough to build the same kernel again:
`rebuild(bundle)` reads the workload, the device spec (the whole spec as TOML, since a name like
`local-cpu` means another spec on every machine) and the rProgram back and calls `build_kernel`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from workbench.codegen import targets
from workbench.codegen.build import Kernel, build_kernel
from workbench.codegen.verify import Verification, verify
from workbench.construct.stepper import construction_view, tiled_expr
from workbench.errors import UserError, first_line
from workbench.files import read_user_text
from workbench.hardware.parse import spec_from_toml_text
from workbench.hardware.spec import DeviceSpec
from workbench.hardware.write import spec_to_toml
from workbench.models.execute import verify_operator
from workbench.ops.catalog import normalize_params
from workbench.ops.pixel_gemm import reshaped_params
from workbench.ops.tensor_expr import TensorExpr
from workbench.ops.window_gemm import is_window_view
from workbench.rtile.panels import gathered_inputs
from workbench.rtile.rprogram import RProgram
from workbench.versions import versions
from workbench.workers import BUILD_TIMEOUT_S, RUN_TIMEOUT_S, Outcome, Worker, thread_env
from workbench.workload import Workload, construction_expr_of, imported_model, model_operator_expr

MANIFEST = "manifest.json"
# A manifest is a few kilobytes (the device spec, the rProgram, the verification); a bigger file
# is not one.
MAX_MANIFEST_BYTES = 2**20
LIBRARY = "kernel.so"
SCHEDULE = "schedule.py"
TVMSCRIPT = "kernel_tvmscript.py"
# Bytes in one file name on Linux file systems (ext4, xfs, btrfs, tmpfs) where pathconf cannot tell.
NAME_MAX = 255
# Characters of the bundle's name kept in its staging directory's name (`.NAME.xxxxxxxx`): short
# enough that the staging name fits wherever the bundle's name does.
STAGING_STEM = 64
# Characters of a bundle name made by `bundle_name`.
BUNDLE_NAME_CHARS = 120
# How the kernel is checked (the manifest's `verification.method`): an operator of a model, and
# (METHOD) any other workload.
MODEL_METHOD = ("workbench.models.execute.verify_operator: one run on the arguments the operator gets in a run "
                "of the model on model_inputs(model, seed) with TVM's default lowering of every operator, "
                "|out - ref| <= atol + rtol * |ref| against that lowering's outputs; a constant reference "
                "verifies nothing and is refused (docs/models.md)")
METHOD = ("workbench.codegen.verify.verify: one run on random_inputs(expr, seed) (drawn per combiner) "
          "against the float64 numpy reference, |out - ref| <= atol_i + rtol * |ref| per output, atol_i "
          "from that output's error scale (the reported atol is the largest); a degenerate reference "
          "verifies nothing and is refused (docs/verification.md)")

_SCHEDULE_SCRIPT = '''"""Replay of the workbench schedule of {workload}.

Rebuilds the unscheduled PrimFunc from its TVMScript and applies the recorded schedule trace.
Run it to print the scheduled TVMScript; import it and call `schedule()` for the Schedule.{view}
"""

import tvm
from tvm import s_tir

UNSCHEDULED = {unscheduled}


def schedule() -> s_tir.Schedule:
    """The schedule of the exported kernel, replayed on the unscheduled module."""
    sch = s_tir.Schedule(tvm.script.from_source(UNSCHEDULED))
{trace}
    return sch


if __name__ == "__main__":
    print(schedule().mod.script())
'''


class KernelRejected(UserError):
    """The candidate failed to build, crashed or gave wrong results: nothing was exported. (Not
    bad input: the CLI exits with status 1 for it, as for any failed kernel.)"""


@dataclass(frozen=True)
class Check:
    """What running the kernel here found. `verification` is None when it was not run here
    (`reason` says why); for a kernel of another CPU, `host` is the same schedule built for this
    CPU (`host_target`) and checked instead."""

    verification: Verification | None
    reason: str = ""
    host: Verification | None = None
    host_target: str = ""


@dataclass(frozen=True)
class ExportResult:
    path: Path
    rank: int
    verified: bool  # the exported kernel itself ran here and matched the reference
    verification: dict  # the manifest's "verification"
    kernel: Kernel  # as built in the worker (no executable)

    def summary(self) -> str:
        """One line on how the kernel was checked."""
        v = self.verification
        checked = v if self.verified else v.get("host_check", {})
        against = ("its operator's TVM default lowering in a run of the model"
                   if checked.get("method") == MODEL_METHOD else "numpy")
        if self.verified:
            return f"checked against {against} on this machine (max abs error {v['max_abs_err']:.3g})"
        host = f" (its schedule, built for this CPU, matches {against})" if "host_check" in v else ""
        return f"not run here: {v['reason']}{host}"


def export_candidate(
    expr: TensorExpr,
    candidate,
    device: DeviceSpec,
    out,
    *,
    policy: str,
    measured_seconds: float | None = None,
    zip: bool = False,
    seed: int = 0,
    operator: Workload | None = None,
) -> ExportResult:
    """Build `candidate` (of the constructed `expr`) for `device`, check it, and write its bundle
    to `out` (a new or empty directory; with `zip`, the file `out`.zip). `operator`, where `expr`
    is an operator of an ONNX model (a `Workload` naming the model and the operator), has it
    checked against the operator's TVM default lowering in a run of the model, as a measured
    pick's candidates are (numpy knows no fused PrimFunc of a model), and named in the manifest.

    UserError for a bad `out` (before anything is built); KernelRejected, with nothing written,
    for a kernel that does not build, crashes or gives wrong results."""
    target = check_out(out, zip)
    if operator is None:
        _check_numpy_reference(expr)
    model = _model_doc(operator) if operator is not None else None
    with _Staging(target) as staging:
        worker = Worker(thread_env(device))
        try:
            kernel, files = _build(worker, expr, candidate, device, staging.folder)
            check = _check(worker, kernel, expr, candidate, device, staging.folder / LIBRARY, seed, operator)
        finally:
            worker.close()
        verification = _verification_dict(check, seed, MODEL_METHOD if operator is not None else METHOD)
        manifest = _manifest(kernel, expr, candidate.program, device, files, policy, candidate.rank,
                             candidate.predicted_seconds, measured_seconds)
        if model is not None:
            manifest["model"] = model
        manifest |= {"verified": check.verification is not None, "verification": verification}
        try:
            (staging.folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        except OSError as err:
            raise UserError(f"cannot write the bundle {target}: {err.strerror or err}") from None
        staging.commit(zip)
    return ExportResult(target, candidate.rank, check.verification is not None, verification, kernel)


def build_apart(expr: TensorExpr, candidate, device: DeviceSpec) -> Kernel:
    """`build_kernel` of a candidate in a worker process, for callers that must survive a
    compiler crash (the dashboard); the Kernel comes back without its executable, a crash as
    `ok=False`."""
    worker = Worker()
    try:
        outcome = worker.call(_built, (expr, candidate, device), BUILD_TIMEOUT_S)
    finally:
        worker.close()
    return outcome.value if not outcome.error else Kernel(ok=False, error=f"build: {outcome.error}")


def bundle_name(*parts) -> str:
    """A file-system-safe bundle name from `parts` (workload, device, policy, rank, ...)."""
    raw = "-".join(str(p) for p in parts)
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.")[:BUNDLE_NAME_CHARS] or "bundle"


# -- the output path -------------------------------------------------------------------------------


def check_out(out, zip: bool = False) -> Path:
    """The bundle's path for `out` (`.zip` appended with `zip`); UserError naming the problem
    when a bundle cannot be written there. Leaves nothing behind: whether the nearest existing
    directory takes files is tried with an empty directory made and removed at once (permission
    bits do not tell: root ignores them, and sysfs or a read-only mount refuses even root)."""
    text = os.fspath(out)
    if not str(text).strip():
        raise UserError("give an output path for the bundle")
    if "\0" in str(text):
        raise UserError("the output path contains a NUL character")
    path = Path(os.path.abspath(text))
    if zip and path.suffix != ".zip":
        # `--zip --out DIR` of an existing directory: DIR.zip beside it is not what a user who
        # named that directory expects, nor a file inside it what the option's help says
        if os.path.isdir(path):
            raise UserError(f"{text} is a directory; with --zip give the archive's path "
                            f"(such as {os.path.join(text, 'bundle.zip')})")
        path = path.with_name(path.name + ".zip")
    if path == path.parent:
        raise UserError(f"{text}: a bundle needs a name of its own, not the root directory")
    ancestor = _existing_ancestor(path.parent)
    name_max = _name_max(ancestor)
    for part in path.relative_to(ancestor).parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise UserError(f"the output path has a name of {size} bytes ('{part[:24]}...'); "
                            f"this file system allows {name_max}")
    if os.path.lexists(path):
        _check_existing(path, zip)
    _try_writing(ancestor)
    return path


def _try_writing(folder: Path) -> None:
    try:
        probe = tempfile.mkdtemp(prefix=".workbench-probe.", dir=folder)
    except OSError as err:
        raise UserError(f"cannot write in {folder}: {err.strerror or err}") from None
    os.rmdir(probe)


def _existing_ancestor(path: Path) -> Path:
    """The nearest directory at or above `path` that exists; UserError for a file or a broken
    symbolic link in the way."""
    while not os.path.lexists(path):
        path = path.parent
    if not path.exists():
        raise UserError(f"{path} is a broken symbolic link")
    if not path.is_dir():
        raise UserError(f"{path} is not a directory")
    return path


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return NAME_MAX


def _check_existing(path: Path, zip: bool) -> None:
    """An existing target may only be an empty directory (and not for a zip)."""
    if path.is_symlink():
        broken = "" if path.exists() else "broken "
        raise UserError(f"{path} is a {broken}symbolic link; choose a new output path")
    if zip or not path.is_dir():
        raise UserError(f"{path} exists; choose a new output path")
    try:
        empty = not any(path.iterdir())
    except OSError as err:
        raise UserError(f"{path}: {err.strerror}") from None
    if not empty:
        raise UserError(f"{path} is not empty; choose a new output path")


class _Staging:
    """The hidden staging directory beside `target` (and any missing parents, made first). On
    leaving, it is removed; after a failure (any exception, KeyboardInterrupt included) the
    parents made for it go too, so nothing is left behind."""

    def __init__(self, target: Path):
        self.target = target
        self.folder: Path | None = None
        self.made: list[Path] = []

    def __enter__(self) -> _Staging:
        try:
            missing = []
            parent = self.target.parent
            while not os.path.lexists(parent):
                missing.append(parent)
                parent = parent.parent
            for folder in reversed(missing):
                folder.mkdir()
                self.made.append(folder)
            self.folder = Path(tempfile.mkdtemp(prefix=f".{self.target.name[:STAGING_STEM]}.", dir=self.target.parent))
        except BaseException as err:
            self._remove(failed=True)
            if isinstance(err, OSError):
                raise UserError(f"cannot write the bundle {self.target}: {err.strerror or err}") from None
            raise
        return self

    def __exit__(self, kind, err, trace) -> None:
        self._remove(failed=kind is not None)

    def commit(self, zip: bool) -> None:
        """Move the bundle into place: rename the directory, or link the zip (which, unlike a
        rename, never replaces a file that appeared meanwhile)."""
        try:
            if zip:
                partial = self.folder / ".bundle.zip"
                with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
                    for path in sorted(self.folder.iterdir()):
                        if path != partial:
                            archive.write(path, arcname=path.name)
                os.link(partial, self.target)
            else:
                os.rename(self.folder, self.target)  # replaces an empty directory only
                self.folder = None
        except OSError as err:
            if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise UserError(f"{self.target} exists and is not empty; choose a new output path") from None
            raise UserError(f"cannot write the bundle {self.target}: {err.strerror or err}") from None

    def _remove(self, failed: bool) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        if failed:
            for folder in reversed(self.made):
                try:
                    folder.rmdir()
                except OSError:  # something else was put there meanwhile: not ours to remove
                    pass


# -- build and check, in the worker ----------------------------------------------------------------


def _build(worker: Worker, expr, candidate, device, folder: Path) -> tuple[Kernel, dict]:
    outcome = worker.call(_build_files, (expr, candidate, device, str(folder)), BUILD_TIMEOUT_S)
    if outcome.error:
        raise KernelRejected(f"candidate {candidate.rank} could not be built, nothing exported: {outcome.error}")
    kernel, files = outcome.value
    if not kernel.ok:
        raise KernelRejected(f"candidate {candidate.rank} did not build, nothing exported: {kernel.error}")
    return kernel, files


def _check(worker: Worker, kernel: Kernel, expr, candidate, device, library: Path, seed: int,
           operator: Workload | None) -> Check:
    # a model's operator is checked after a run of the whole model on TVM's default lowering,
    # whose every operator is built first (`operator_references`): a build's allowance more
    extra = BUILD_TIMEOUT_S if operator is not None else 0.0
    outcome = worker.call(check_here, (kernel, str(library), expr, candidate, device, seed, operator),
                          BUILD_TIMEOUT_S + RUN_TIMEOUT_S + extra)
    return accept(candidate.rank, outcome)


def accept(rank: int, outcome: Outcome) -> Check:
    """The Check of a worker's `check_here` outcome, or KernelRejected: a crash, a timeout, a wrong
    result, or (for another CPU) a schedule that is wrong on this CPU."""
    if outcome.error:
        raise KernelRejected(f"candidate {rank} failed when run on this machine, nothing exported: {outcome.error}")
    check = outcome.value
    if check.verification is not None and not check.verification.correct:
        raise KernelRejected(f"candidate {rank} gives wrong results, nothing exported: {check.verification.error}")
    if check.host is not None and not check.host.correct:
        raise KernelRejected(f"candidate {rank}'s schedule fails its check when built for this CPU "
                             f"({check.host_target}), nothing exported: {check.host.error}")
    return check


def _built(expr, candidate, device) -> Kernel:
    """Runs in a worker: the kernel without its executable (which cannot leave the process)."""
    return replace(build_kernel(expr, candidate.program, device), executable=None)


def _build_files(expr, candidate, device, folder: str) -> tuple[Kernel, dict]:
    """Runs in the worker: build `candidate` and write its files (not the manifest) to `folder`."""
    kernel = build_kernel(expr, candidate.program, device)
    files = _write_files(kernel, expr, Path(folder)) if kernel.ok else {}
    return replace(kernel, executable=None), files


def check_here(kernel: Kernel, library: str, expr, candidate, device: DeviceSpec, seed: int,
               operator: Workload | None = None) -> Check:
    """Runs in the worker: the exported `library` against the reference (numpy's, or for a
    model's `operator` its TVM default lowering's) if this machine can run it; else the reason,
    and for another CPU the same schedule built for this CPU, checked."""
    import tvm

    from workbench.codegen.host import cannot_run_here, host_target

    def checked(built: Kernel, spec: DeviceSpec) -> Verification:
        if operator is None:
            return verify(built, expr, seed)
        return verify_operator(built, imported_model(operator.model, operator.dims), operator.operator, spec, seed)

    reason = cannot_run_here(json.loads(kernel.target))
    if not reason:
        module = tvm.runtime.load_module(library)
        return Check(checked(replace(kernel, executable=tvm.runtime.Executable(module)), device))
    if not device.runs_on_cpu:
        return Check(None, reason)
    here = host_target(device.target_dict())
    hosted = replace(device, target=tuple(sorted(here.items())))
    return Check(None, reason, checked(build_kernel(expr, candidate.program, hosted), hosted), json.dumps(here, sort_keys=True))


def _verification_dict(check: Check, seed: int, method: str) -> dict:
    """The manifest's `verification`: how the kernel was checked, or why it was not run."""
    if check.verification is not None:
        return {"ran": True, "method": method, "seed": seed, **_numbers(check.verification)}
    doc = {"ran": False, "reason": check.reason}
    if check.host is not None:
        doc["host_check"] = {"target": json.loads(check.host_target), "method": method, "seed": seed,
                             **_numbers(check.host)}
    return doc


def _check_numpy_reference(expr: TensorExpr) -> None:
    """UserError, before anything is built, for an expression numpy has no reference of: an
    operator of a model (a fused PrimFunc, named by TVM, with no catalog parameters), which is
    checked in a run of its model, so the export needs to know which model and operator."""
    if expr.op == "expr":
        return
    try:
        normalize_params(expr.op, dict(expr.params))
    except UserError:
        raise UserError(f"{expr.op} has no numpy reference (an operator of a model is checked in a run of "
                        "the model): export it with its workload, the model and the operator's index") from None


def _model_doc(operator: Workload) -> dict:
    """The manifest's `model`: the ONNX file (its name and SHA-256: a path does not travel), the
    operator's index and PrimFunc, and the symbolic dims as bound."""
    model = imported_model(operator.model, operator.dims)
    return {"file": Path(operator.model).name, "sha256": _sha256(operator.model), "operator": operator.operator,
            "function": model.operators[operator.operator].func_name, "dims": dict(operator.dims)}


def _sha256(path) -> str:
    """The SHA-256 of the model file at `path` (hex); UserError when it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as err:
        raise UserError(f"model {path}: {err.strerror}") from None


def _numbers(v: Verification) -> dict:
    """A Verification's fields, JSON-safe (a NaN error, of a check with no outputs, is null)."""
    fields = asdict(v)
    return {k: None if isinstance(x, float) and not math.isfinite(x) else x for k, x in fields.items()}


# -- the bundle's files ----------------------------------------------------------------------------


def _write_files(kernel: Kernel, expr: TensorExpr, folder: Path) -> dict:
    """Write sources, library, schedule script and TVMScript; return the manifest's `files`."""
    names = []
    for suffix, text in kernel.sources:
        name = f"kernel.{_safe_suffix(suffix)}"
        (folder / name).write_text(text)
        names.append(name)
    try:
        kernel.executable.export_library(str(folder / LIBRARY))
    except Exception as err:  # linking needs a host compiler; TVM reports its absence variously
        raise UserError(f"cannot write the kernel library: {first_line(err)}") from err
    (folder / SCHEDULE).write_text(schedule_script(kernel, expr))
    (folder / TVMSCRIPT).write_text(kernel.tvmscript)
    files = {"kernel_source": names[0] if names else None, "library": LIBRARY, "schedule": SCHEDULE, "tvmscript": TVMSCRIPT}
    if targets.target(kernel.target_kind).on_host and len(names) > 1:
        files["assembly"] = names[1]
    return files


def _safe_suffix(suffix: str) -> str:
    """A file suffix made of letters and digits only (never a path)."""
    clean = re.sub(r"[^A-Za-z0-9]", "", suffix)
    return clean or "txt"


def schedule_script(kernel: Kernel, expr: TensorExpr) -> str:
    """The text of `schedule.py`: the unscheduled module's TVMScript plus the replayed trace."""
    import tvm

    unscheduled = tvm.IRModule({"main": expr.func}).script()
    trace = "\n".join("    " + line for line in kernel.trace_python.splitlines())
    workload = json.dumps(expr.workload_dict(), sort_keys=True)
    return _SCHEDULE_SCRIPT.format(workload=workload.replace('"""', "'''"), unscheduled=_py_string(unscheduled),
                                   trace=trace, view=_view_note(kernel, expr) + _math_note(kernel))


def _math_note(kernel: Kernel) -> str:
    """A paragraph for `schedule.py` where a CPU kernel computes exp, tanh or erf (or sigmoid, which
    TVM lowers through exp), which the shipped library lowers with the workbench's rules
    (`codegen.vector_math`); '' elsewhere."""
    if not targets.target(kernel.target_kind).on_host or not re.search(r"T\.(exp|tanh|erf|sigmoid)\(", kernel.tvmscript):
        return ""
    return ("\n\nThe shipped library computes float32 exp, tanh and erf from multiplies and adds, in vectors"
            " (workbench/codegen/vector_math.py); tvm.compile on its own lowers them to a libm call per lane:"
            " call vector_math.register() first to build the same code.")


def _view_note(kernel: Kernel, expr: TensorExpr) -> str:
    """A paragraph for `schedule.py` where the unscheduled PrimFunc declares other buffer shapes
    than the shipped kernel takes (a pixel-GEMM view, `ops.pixel_gemm`), or the schedule lays
    buffers out along fused axes (`Kernel.views`); '' elsewhere."""
    views = _shapes(reshaped_params(expr.func, kernel.args).items())
    if not views:
        laid_out = _shapes(kernel.views)
        if not laid_out:
            return ""
        return ("\n\nThe schedule lays buffers out along the operator's fused axes (codegen/common.py, axis_loops),"
                " over the caller's memory without a copy: " + "; ".join(laid_out) + ".\nThe shipped kernel takes"
                " the caller's shapes (manifest.json's args); the replayed module declares the laid-out ones.")
    gathered = ", ".join(f"{name}'s" for name in gathered_inputs(expr))
    if is_window_view(expr):
        what = "ops/window_gemm.py: a conv of few channels as\nthe GEMM over its pixels of its gathered windows"
        copy = f" ({gathered} windows gathered into a buffer of its own first, im2col)"
    else:
        what = "ops/pixel_gemm.py: a pointwise conv as\nthe GEMM over its pixels"
        copy = f" ({gathered} strided pixels gathered into a buffer of its own first)" if gathered else ""
    return (f"\n\nIts PrimFunc is the workbench's view of the operator ({what}), over the caller's buffers reshaped"
            " without a copy: " + "; ".join(views) + copy + ".\nThe shipped kernel takes the caller's shapes (manifest.json's args).")


def _shapes(pairs) -> list[str]:
    """"X [declared] for [the caller's]" per (name, (declared, the caller's)) of `pairs`."""
    return [f"{name} {list(declared)} for {list(wanted)}" for name, (declared, wanted) in pairs]


def _py_string(text: str) -> str:
    """A Python literal of `text`: a readable triple-quoted block where that is exact, else repr."""
    if '"""' in text or "\\" in text or text.endswith('"'):
        return repr(text)
    return '"""' + text + '"""'


def _manifest(kernel, expr, program, device, files, policy, rank, predicted, measured) -> dict:
    return {
        "workload": expr.workload_dict(),
        "device": device.name,
        "device_spec": spec_to_toml(device),
        "policy": policy,
        "rank": int(rank),
        "rprogram": program.to_dict(),
        "predicted_seconds": float(predicted),
        "measured_seconds": None if measured is None else float(measured),
        "entry": kernel.entry,
        "args": [arg.to_dict() for arg in kernel.args],
        # arguments the entry takes laid out by the library's own function (a model's weights,
        # `codegen.build.Prepacked`): call it once on the argument, pass its result every call
        "prepacked": [p.to_dict() for p in kernel.prepacked],
        "files": files,
        "target": json.loads(kernel.target),
        "pass_config": json.loads(kernel.pass_config),
        "template": kernel.template,
        "versions": versions(),
    }


# -- rebuilding from the manifest ------------------------------------------------------------------


def rebuild(bundle, model=None) -> Kernel:
    """The kernel of the bundle directory `bundle`, built again from its manifest alone
    (`bundle_program`; for an operator of a model, from the manifest and that `model`); its
    sources equal the bundle's."""
    program, device = bundle_program(bundle, model)
    return build_kernel(program.expr, program, device)


def bundle_program(bundle, model=None) -> tuple[RProgram, DeviceSpec]:
    """The rProgram (virtual threads included, carrying the workload's expression with its axes
    fused as construction fuses them) and the device spec that the manifest of the bundle
    directory `bundle` records. The kernel of an operator of a model (the manifest's `model`)
    takes its expression from that model, which the manifest names but does not hold: `model`,
    the ONNX file's path, whose SHA-256 must be the manifest's. UserError names a missing or
    malformed manifest or field, or a missing or other model."""
    path = Path(bundle) / MANIFEST
    label = f"manifest {path}"
    try:
        manifest = json.loads(read_user_text(path, "manifest", MAX_MANIFEST_BYTES))
    except json.JSONDecodeError as err:
        raise UserError(f"{label}: not JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(manifest, dict):
        raise UserError(f"{label}: not a JSON object")
    for key, kind in (("workload", dict), ("device_spec", str), ("rprogram", dict)):
        if not isinstance(manifest.get(key), kind):
            raise UserError(f"{label}: no {key} ({'a JSON object' if kind is dict else 'the spec as TOML text'})")
    device = spec_from_toml_text(manifest["device_spec"], label=f"{label}: device_spec")
    try:  # the expression the construction tiled (a conv's GEMM view on a GPU)
        if "model" in manifest:
            expr = _model_operator_expr(manifest["model"], model, device)
        else:
            expr = construction_expr_of(manifest["workload"], device)
    except UserError as err:
        raise UserError(f"{label}: {err}") from None
    try:
        program = RProgram.from_dict(manifest["rprogram"], expr)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise UserError(f"{label}: rprogram is malformed ({type(err).__name__}: {err})") from None
    return program, device


def _model_operator_expr(doc, path, device: DeviceSpec) -> TensorExpr:
    """The construction expression of the manifest's `model` entry (`_model_doc`), from the ONNX
    file at `path`."""
    if not isinstance(doc, dict) or not isinstance(doc.get("operator"), int) or not isinstance(doc.get("dims", {}), dict):
        raise UserError("model is malformed (an object with the operator's index and the dims)")
    if path is None:
        raise UserError(f"the kernel of operator {doc['operator']} of the model {doc.get('file')}: its expression is "
                        "that model's, so rebuilding it needs the model file")
    digest = _sha256(path)
    if digest != doc.get("sha256"):
        raise UserError(f"model {path} is not the one the kernel was built for (SHA-256 {digest[:12]}..., "
                        f"the manifest's {str(doc.get('sha256'))[:12]}...)")
    dims = tuple(sorted((str(k), int(v)) for k, v in doc.get("dims", {}).items()))
    return tiled_expr(construction_view(model_operator_expr(str(path), doc["operator"], dims), device).expr, device)
