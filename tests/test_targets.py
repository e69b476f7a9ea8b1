"""The target table: every preset's target kind is in it, and builds keep the texts it names."""

from __future__ import annotations

import pytest

from tests.helpers import TINY_CPU, device, expr
from workbench.codegen import targets
from workbench.codegen.build import build_kernel, target_dict
from workbench.construct.stepper import construct
from workbench.hardware.loader import list_presets


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_target_kind_is_in_the_table(name):
    spec = device(name)
    entry = targets.target(target_dict(spec)["kind"])
    assert entry in targets.TARGETS.values()
    assert entry.on_host == spec.runs_on_cpu


def test_kernels_run_on_the_cpu_device_for_llvm_and_on_their_own_device_otherwise():
    import tvm

    assert targets.runtime_device("llvm") == tvm.cpu(0)
    assert targets.runtime_device("cuda", 1) == tvm.cuda(1)


def test_a_kind_outside_the_table_keeps_its_device_code_under_its_own_name():
    entry = targets.target("vulkan")
    assert (entry.runtime_device, entry.sources, entry.on_host) == ("vulkan", (("vulkan", ""),), False)


def test_source_names_and_languages_by_suffix():
    assert [targets.source_name(s) for s in ("cu", "ll", "s", "spv")] == ["CUDA C", "LLVM IR", "assembly", "spv"]
    assert [targets.language(s) for s in ("cu", "ll", "s", "spv")] == ["cpp", "llvm", "nasm", "text"]


@pytest.mark.parametrize("name", [TINY_CPU.name, "v100"])
def test_a_build_keeps_the_texts_its_target_names(name):
    spec = device(name)
    built = construct(expr("relu", shape=[64, 64]), spec)
    kernel = build_kernel(built.expr, built.candidates[0].program, spec)
    assert kernel.ok, kernel.error
    assert [suffix for suffix, _ in kernel.sources] == [s for s, _ in targets.target(kernel.target_kind).sources]
    assert all(text.strip() for _, text in kernel.sources)
