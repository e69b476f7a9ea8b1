"""Every program on a CPU: loop tiling for the LLVM target (`codegen.cpu`)."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.codegen.cpu import schedule_cpu
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.rprogram import RProgram


@dataclass(frozen=True)
class CpuRule:
    name: str = "cpu"

    def schedule(self, expr: TensorExpr, program: RProgram, device: DeviceSpec):
        return schedule_cpu(expr, program, device) if device.runs_on_cpu else None
