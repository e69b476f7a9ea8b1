"""The codegen protocol: schedule rules (the shape of TVM dlight's rules).

A rule turns (TensorExpr, rProgram, DeviceSpec) into a `tvm.s_tir.Schedule` over the
expression's PrimFunc, or returns None when it does not apply; `codegen.rules.RULES` lists them
in the order they are tried.
"""

from __future__ import annotations

from typing import Protocol

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.rprogram import RProgram


class Rule(Protocol):
    name: str  # recorded as `Kernel.template`

    def schedule(self, expr: TensorExpr, program: RProgram, device: DeviceSpec):
        """A `tvm.s_tir.Schedule` realising `program`, None when the rule does not apply to
        (expr, program, device); raises ScheduleError when it applies but cannot realise it."""


class ScheduleError(RuntimeError):
    """A rule could not realise a program (recorded per candidate, never shown as a crash)."""
