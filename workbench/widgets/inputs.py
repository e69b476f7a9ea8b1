"""What the widgets accept as a device, turned into a core value (a workload goes through
`pipeline.request`)."""

from __future__ import annotations

from pathlib import Path

from workbench.errors import UserError
from workbench.hardware.loader import load_spec
from workbench.pipeline import DeviceSpec


def as_device(value: DeviceSpec | str | Path) -> DeviceSpec:
    """A DeviceSpec as is, or a preset name / spec file loaded (`local-cpu` is this machine)."""
    if isinstance(value, DeviceSpec):
        return value
    if isinstance(value, (str, Path)):
        return load_spec(value)
    raise UserError(f"expected a DeviceSpec or a preset name, got {type(value).__name__}")
