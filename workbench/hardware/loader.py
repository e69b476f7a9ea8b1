"""Device specs by name: the presets in `specs/devices/`, `local-cpu` (this machine, calibrated or
detected), or a spec file's path, read within a size cap and parsed by `hardware.parse`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from workbench.errors import UserError
from workbench.files import read_user_text
from workbench.hardware.calibrated import calibrated_spec_path
from workbench.hardware.detect import LOCAL_CPU_NAME, detect_local_cpu
from workbench.hardware.parse import DEVICE_LLC, PREFETCH_KEY, spec_from_toml_text
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
    # calibrated before the fields: the detected ones, with their sources
    if detected.llc_bytes and not calibrated.llc_bytes:
        calibrated = _detected_fields(calibrated, detected, DEVICE_LLC)
    if detected.prefetch_rows and not calibrated.prefetch_rows:
        calibrated = _detected_fields(calibrated, detected, (PREFETCH_KEY,))
    if len(calibrated.layers) == len(detected.layers):  # calibrated before `ways`: the detected ones
        layers = tuple(replace(c, ways=c.ways or d.ways) for c, d in zip(calibrated.layers, detected.layers))
        calibrated = replace(calibrated, layers=layers)
    return calibrated


def _detected_fields(calibrated: DeviceSpec, detected: DeviceSpec, keys: tuple[str, ...]) -> DeviceSpec:
    """`calibrated` with `detected`'s fields `keys` and their sources."""
    sources = dict(calibrated.sources) | {key: value for key, value in detected.sources if key in keys}
    return replace(calibrated, **{key: getattr(detected, key) for key in keys}, sources=tuple(sorted(sources.items())))


def _load_file(path: Path, check_target: bool = True) -> DeviceSpec:
    text = read_user_text(path, "spec", MAX_SPEC_BYTES)
    return spec_from_toml_text(text, label=f"spec {path.name}", check_target=check_target)
