"""Hardware as data: `DeviceSpec` values loaded from `specs/devices/*.toml` or detected for this
machine's CPU (`local-cpu`)."""

from workbench.hardware.detect import detect_local_cpu
from workbench.hardware.loader import LOCAL_CPU, list_presets, load_spec
from workbench.hardware.parse import spec_from_toml_text
from workbench.hardware.spec import DeviceSpec, MemoryLayer
from workbench.hardware.write import spec_summary, spec_to_toml

__all__ = [
    "LOCAL_CPU",
    "DeviceSpec",
    "MemoryLayer",
    "detect_local_cpu",
    "list_presets",
    "load_spec",
    "spec_from_toml_text",
    "spec_summary",
    "spec_to_toml",
]
