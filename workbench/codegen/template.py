"""The codegen protocol: one schedule template per target family (TVM dlight's shape).

A template turns (TensorExpr, rProgram, DeviceSpec) into a `tvm.s_tir.Schedule` over the
expression's PrimFunc, or returns None when it does not apply to the device.
"""

from __future__ import annotations

from typing import Protocol

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.rprogram import RProgram


class Template(Protocol):
    name: str

    def applies(self, device: DeviceSpec) -> bool: ...

    def schedule(self, expr: TensorExpr, program: RProgram, device: DeviceSpec):
        """A `tvm.s_tir.Schedule` realising `program`; raises ScheduleError when it cannot."""


class ScheduleError(RuntimeError):
    """A template could not realise a program (recorded per candidate, never shown as a crash)."""
