"""Convolutions on a GPU as implicit GEMM (`codegen.cuda_conv`): the programs the construction
built over a conv's GEMM view (`ops.gemm_view`). Tried before the CUDA-core rule, which would
read the view's fused axes as a plain axis fusion; it declines (None) every other expression."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.codegen.cuda_conv import schedule_implicit_gemm
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.rprogram import RProgram


@dataclass(frozen=True)
class ConvGemmRule:
    name: str = "cuda-conv-gemm"

    def schedule(self, expr: TensorExpr, program: RProgram, device: DeviceSpec):
        return schedule_implicit_gemm(expr, program, device) if device.launches_thread_blocks else None
