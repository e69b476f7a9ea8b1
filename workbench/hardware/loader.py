"""Device specs by name: the presets in `specs/devices/`, `local-cpu` (this machine, calibrated or
detected), or a spec file's path, read within a size cap and parsed by `hardware.parse`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from workbench.errors import UserError
from workbench.files import read_user_text
from workbench.hardware.calibrated import calibrated_spec_path
from workbench.hardware.detect import LOCAL_CPU_NAME, detect_local_cpu
from workbench.hardware.parse import DEVICE_LLC, spec_from_toml_text
from workbench.hardware.spec import DeviceSpec

# The package lives at <root>/workbench/hardware, the presets at <root>/specs/devices.
SPECS_DIR = Path(__file__).resolve().parents[2] / "specs" / "devices"
LOCAL_CPU = LOCAL_CPU_NAME
# A spec is a few kilobytes (the presets are under 6 KB); a bigger file is not a spec.
MAX_SPEC_BYTES = 2**20


def list_presets() -> tuple[str, ...]:
    """Names of the spec files in `specs/devices/` (without `local-cpu`, which is detected)."""
    return tuple(sorted(p.stem for p in SPECS_DIR.glob("*.toml")))


def load_spec(path_or_name: str | Path, *, check_target: bool = True) -> DeviceSpec:
    """A preset name from `specs/devices/`, `local-cpu` (this machine: calibrated if
    `calibrated_spec_path()` holds a spec of it, else detected), or a spec path.

    `check_target=False` skips asking TVM and LLVM about the target (`target_problem`): only
    for callers that never build a kernel, such as the pure-core tests that run without TVM.
    """
    text = str(path_or_name)
    if isinstance(path_or_name, Path) or text.endswith(".toml") or "/" in text:
        return _load_file(Path(text), check_target)
    if text == LOCAL_CPU:
        return _local_cpu(check_target)
    if text in list_presets():
        return _load_file(SPECS_DIR / f"{text}.toml", check_target)
    choices = ", ".join(list_presets() + (LOCAL_CPU,))
    raise UserError(f"unknown device {text!r}: choose one of {choices}, or give a .toml spec path")


def _local_cpu(check_target: bool) -> DeviceSpec:
    detected = detect_local_cpu()
    path = calibrated_spec_path()
    if not path.is_file():
        return detected
    calibrated = _load_file(path, check_target)
    # A home directory may be shared by several machines: use the file only if it describes this one.
    same = (calibrated.name, calibrated.compute_units, calibrated.target) == (
        detected.name, detected.compute_units, detected.target)
    if not same:
        return detected
    if detected.llc_bytes and not calibrated.llc_bytes:  # calibrated before the LLC fields: the detected one
        llc = {key: value for key, value in detected.sources if key in DEVICE_LLC}
        calibrated = replace(calibrated, llc_bytes=detected.llc_bytes, llc_gbps=detected.llc_gbps,
                             sources=tuple(sorted((dict(calibrated.sources) | llc).items())))
    if detected.prefetch_rows and not calibrated.prefetch_rows:  # calibrated before the field: the detected one
        source = {key: value for key, value in detected.sources if key == "prefetch_rows"}
        calibrated = replace(calibrated, prefetch_rows=detected.prefetch_rows,
                             sources=tuple(sorted((dict(calibrated.sources) | source).items())))
    if len(calibrated.layers) == len(detected.layers):  # calibrated before `ways`: the detected ones
        layers = tuple(replace(c, ways=c.ways or d.ways) for c, d in zip(calibrated.layers, detected.layers))
        calibrated = replace(calibrated, layers=layers)
    return calibrated


def _load_file(path: Path, check_target: bool = True) -> DeviceSpec:
    text = read_user_text(path, "spec", MAX_SPEC_BYTES)
    return spec_from_toml_text(text, label=f"spec {path.name}", check_target=check_target)
