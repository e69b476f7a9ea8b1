"""Export a built kernel as a bundle: manifest, source, library, schedule replay, scheduled IR.

The bundle is assembled in a temporary directory beside the target and renamed into place, so
a reader never sees half a bundle, and an existing non-empty target is refused, never merged.
The manifest follows `shared/design/CLI.md` (`workbench export`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

from workbench.codegen.build import Kernel
from workbench.codegen.common import first_line
from workbench.errors import UserError
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.rprogram import RProgram

MANIFEST = "manifest.json"
LIBRARY = "kernel.so"
SCHEDULE = "schedule.py"
TVMSCRIPT = "kernel_tvmscript.py"

_SCHEDULE_SCRIPT = '''"""Replay of the workbench schedule of {workload}.

Rebuilds the unscheduled PrimFunc from its TVMScript and applies the recorded schedule trace.
Run it to print the scheduled TVMScript; import it and call `schedule()` for the Schedule.
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


def export_bundle(
    kernel: Kernel,
    expr: TensorExpr,
    program: RProgram,
    device: DeviceSpec,
    out_dir,
    *,
    policy: str,
    rank: int,
    predicted_seconds: float,
    measured_seconds: float | None = None,
    zip: bool = False,
) -> Path:
    """Write the bundle of `kernel` to `out_dir` (or the zip `out_dir`.zip) and return its path.

    Raises UserError for a kernel that failed (`ok == False`) and for a target that exists and is
    not an empty directory.
    """
    if not kernel.ok:
        raise UserError(f"cannot export a kernel that failed: {kernel.error}")
    target = _target_path(Path(out_dir), zip)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        files = _write_files(kernel, expr, staging)
        manifest = _manifest(kernel, expr, program, device, files, policy, rank, predicted_seconds, measured_seconds)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if zip:
            _zip_into_place(staging, target)
        else:
            _move_into_place(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _target_path(out: Path, zip: bool) -> Path:
    """The bundle's path; refuses anything that exists, except an empty directory (no zip)."""
    if zip and out.suffix != ".zip":
        out = out.with_name(out.name + ".zip")
    if out.exists() and (zip or not out.is_dir() or any(out.iterdir())):
        what = "is not empty" if out.is_dir() and not zip else "exists"
        raise UserError(f"{out} {what}; choose a new output path")
    return out


def _move_into_place(staging: Path, target: Path) -> None:
    if target.is_dir():
        target.rmdir()  # empty (checked above): an empty directory may be reused
    os.rename(staging, target)


def _zip_into_place(staging: Path, target: Path) -> None:
    partial = staging / ".bundle.zip"
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(staging.iterdir()):
            if path != partial:
                archive.write(path, arcname=path.name)
    os.rename(partial, target)


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
    if kernel.target_kind == "llvm" and len(names) > 1:
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
    return _SCHEDULE_SCRIPT.format(workload=workload.replace('"""', "'''"), unscheduled=_py_string(unscheduled), trace=trace)


def _py_string(text: str) -> str:
    """A Python literal of `text`: a readable triple-quoted block where that is exact, else repr."""
    if '"""' in text or "\\" in text or text.endswith('"'):
        return repr(text)
    return '"""' + text + '"""'


def versions() -> dict:
    """Versions of the packages that made the bundle."""
    import numpy
    import tvm
    import tvm_ffi

    import workbench

    return {"workbench": workbench.__version__, "tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__, "numpy": numpy.__version__}


def _manifest(kernel, expr, program, device, files, policy, rank, predicted, measured) -> dict:
    return {
        "workload": expr.workload_dict(),
        "device": device.name,
        "policy": policy,
        "rank": int(rank),
        "rprogram": program.to_dict(),
        "predicted_seconds": float(predicted),
        "measured_seconds": None if measured is None else float(measured),
        "entry": kernel.entry,
        "args": [arg.to_dict() for arg in kernel.args],
        "files": files,
        "target": json.loads(kernel.target),
        "template": kernel.template,
        "versions": versions(),
    }
