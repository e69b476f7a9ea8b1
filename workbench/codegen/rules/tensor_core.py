"""Tensor-core programs on the WMMA path (`codegen.cuda_mma`): one warp per fragment tile.

It declines (schedule None) what WMMA cannot take, and `declines` names why (bfloat16 and other
dtypes without TVM WMMA intrinsics, contractions that are not a (batched) matmul, warp tiles off
the fragment grid, ...): those programs fall through to the CUDA-core rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.codegen.cuda import block_threads, check_gpu_program, within_block_limits
from workbench.codegen.cuda_mma import schedule_wmma, unsupported
from workbench.codegen.template import ScheduleError
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.rprogram import RProgram


@dataclass(frozen=True)
class TensorCoreRule:
    name: str = "cuda-wmma"

    def declines(self, expr: TensorExpr, program: RProgram, device: DeviceSpec) -> str | None:
        """Why this rule does not take (expr, program, device) (one line), None when it does."""
        return unsupported(expr, program, device)

    def schedule(self, expr: TensorExpr, program: RProgram, device: DeviceSpec):
        if not device.launches_thread_blocks:
            return None
        check_gpu_program(expr, program)
        if unsupported(expr, program, device) is not None:
            return None
        if program.vthreads:
            raise ScheduleError("vthreads stride CUDA-core register tiles; a tensor-core program has none")
        threads = block_threads(expr, program, device) * device.warp_size  # a warp per fragment tile
        return within_block_limits(threads, lambda: schedule_wmma(expr, program, device), device)
