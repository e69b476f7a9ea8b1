"""Split-K programs on a GPU (`RProgram.split` > 1): `codegen.cuda_splitk`'s two kernels, a
partial-sum pass and a final sum. Tried before the tensor-core and CUDA-core rules, which would
realise such a program unsplit; it declines (schedule None) every unsplit program."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.codegen.cuda_splitk import schedule_split_k
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.rprogram import RProgram


@dataclass(frozen=True)
class SplitKRule:
    name: str = "cuda-splitk"

    def schedule(self, expr: TensorExpr, program: RProgram, device: DeviceSpec):
        if not device.launches_thread_blocks or program.split <= 1:
            return None
        return schedule_split_k(expr, program, device)
