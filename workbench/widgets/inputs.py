"""What the widgets accept as a workload and a device, turned into core values."""

from __future__ import annotations

from pathlib import Path

from workbench.errors import UserError
from workbench.hardware.loader import load_spec
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.workload import Workload, suite_workload


def as_expr(value: TensorExpr | Workload | str) -> TensorExpr:
    """A TensorExpr as is, a `Workload` built, or a suite reference `SUITE:ID` built."""
    if isinstance(value, TensorExpr):
        return value
    if isinstance(value, Workload):
        return value.build()
    if isinstance(value, str):
        return suite_workload(value).build()
    raise UserError(f"expected a TensorExpr, a Workload or 'SUITE:ID', got {type(value).__name__}")


def as_device(value: DeviceSpec | str | Path) -> DeviceSpec:
    """A DeviceSpec as is, or a preset name / spec file loaded (`local-cpu` is this machine)."""
    if isinstance(value, DeviceSpec):
        return value
    if isinstance(value, (str, Path)):
        return load_spec(value)
    raise UserError(f"expected a DeviceSpec or a preset name, got {type(value).__name__}")
