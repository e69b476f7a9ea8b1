"""Every program on a GPU, on the CUDA cores: Roller's thread-block template (`codegen.cuda`).
Tried after the tensor-core rule, so the tensor-core programs it gets are those that rule
declined; they run with their warp tiles split over the lanes."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.codegen.cuda import schedule_cuda_cores
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.rprogram import RProgram


@dataclass(frozen=True)
class GpuRule:
    name: str = "cuda"

    def schedule(self, expr: TensorExpr, program: RProgram, device: DeviceSpec):
        return schedule_cuda_cores(expr, program, device) if device.launches_thread_blocks else None
