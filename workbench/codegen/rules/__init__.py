"""The schedule rules, declared once, in the order they are tried: the first rule whose
`schedule` returns a schedule builds the kernel (TVM dlight's `ApplyDefaultSchedule` works the
same way). The tensor-core rule comes before the CUDA-core rule, which takes every GPU program
the tensor-core rule declines; `TensorCoreRule.declines` says why it declined. A conv built in
its implicit-GEMM view (WMMA declines its fused axes) goes to `ConvGemmRule` first. The split-K
rule comes first of all: it takes only programs with `split` > 1, which the others would realise
unsplit.
"""

from __future__ import annotations

from typing import Sequence

from workbench.codegen.rules.conv import ConvGemmRule
from workbench.codegen.rules.cpu import CpuRule
from workbench.codegen.rules.gpu import GpuRule
from workbench.codegen.rules.split_k import SplitKRule
from workbench.codegen.rules.tensor_core import TensorCoreRule
from workbench.codegen.template import Rule, ScheduleError
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.rprogram import RProgram

RULES: tuple[Rule, ...] = (SplitKRule(), TensorCoreRule(), ConvGemmRule(), GpuRule(), CpuRule())


def apply_rules(expr: TensorExpr, program: RProgram, device: DeviceSpec, rules: Sequence[Rule] = RULES):
    """(rule, schedule) of the first rule that applies; ScheduleError when none does."""
    for rule in rules:
        sch = rule.schedule(expr, program, device)
        if sch is not None:
            return rule, sch
    raise ScheduleError(f"no schedule rule for a {device.kind} device ({device.name})")
