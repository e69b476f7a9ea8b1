"""The schedule rules: declared once, tensor cores first, each declining what it cannot take."""

from __future__ import annotations

from functools import cache

import pytest

from tests.helpers import TINY_CPU, device, expr
from workbench.codegen.build import build_kernel
from workbench.codegen.rules import RULES, CpuRule, GpuRule, TensorCoreRule, apply_rules
from workbench.codegen.template import ScheduleError
from workbench.construct.stepper import construct
from workbench.ops.expr_lang import build_expr


@cache
def rank1(name: str, dtype: str):
    built = construct(expr("matmul", dtype, M=64, N=64, K=64), device(name))
    return built.expr, built.candidates[0].program


def test_the_tensor_core_rule_is_tried_before_the_cuda_core_rule():
    # the implicit-GEMM conv rule takes only conv GEMM views, which WMMA declines (fused axes)
    assert [rule.name for rule in RULES] == ["cuda-splitk", "cuda-wmma", "cuda-conv-gemm", "cuda", "cpu"]


@pytest.mark.parametrize(
    "name, dtype, rule",
    [("h100", "float16", "cuda-wmma"), ("v100", "float16", "cuda-wmma"), ("h100", "float32", "cuda"),
     (TINY_CPU.name, "float32", "cpu")],
)
def test_the_first_rule_that_applies_schedules(name, dtype, rule):
    fused, program = rank1(name, dtype)
    chosen, sch = apply_rules(fused, program, device(name))
    assert chosen.name == rule and sch is not None


def test_rules_decline_devices_they_do_not_schedule():
    gpu, cpu = rank1("h100", "float16"), rank1(TINY_CPU.name, "float32")
    assert CpuRule().schedule(*gpu, device("h100")) is None
    assert GpuRule().schedule(*cpu, device(TINY_CPU.name)) is None
    assert TensorCoreRule().schedule(*cpu, device(TINY_CPU.name)) is None


def test_no_rule_is_a_schedule_error():
    with pytest.raises(ScheduleError, match="no schedule rule for a cpu device"):
        apply_rules(*rank1(TINY_CPU.name, "float32"), device(TINY_CPU.name), rules=(GpuRule(),))


def test_a_declined_tensor_core_program_runs_on_the_cuda_cores_and_says_why():
    spec = device("h100")
    built = construct(build_expr("C[i,j] max= A[i,k] * B[k,j]", dict(i=64, j=64, k=64), "float16"), spec)
    fused, program = built.expr, built.candidates[0].program
    assert "not a sum of products" in TensorCoreRule().declines(fused, program, spec)
    assert TensorCoreRule().schedule(fused, program, spec) is None
    kernel = build_kernel(fused, program, spec)
    assert kernel.ok, kernel.error
    assert kernel.template == "cuda" and "wmma" not in kernel.source
    assert TensorCoreRule().declines(*rank1("h100", "float16"), spec) is None
