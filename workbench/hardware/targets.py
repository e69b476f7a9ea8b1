"""The target of a device spec, checked at load time: TVM parses it and LLVM is asked about its
triple, CPU or GPU architecture, because a target LLVM cannot compile for crashes TVM's passes
later (`target_problem`)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading

from workbench.errors import first_line

# GPU architectures are CPU names of the LLVM backends TVM compiles device code with: CUDA's `arch`
# (sm_80) is an NVPTX one, ROCm's `mcpu` (gfx906) an AMDGPU one. kind: (field, triple, example).
_GPU_ARCHS = {"cuda": ("arch", "nvptx64-nvidia-cuda", "sm_80"), "rocm": ("mcpu", "amdgcn-amd-amdhsa", "gfx906")}
_STDERR_LOCK = threading.Lock()


@functools.lru_cache(maxsize=64)
def target_problem(target: tuple) -> str:
    """Why TVM or LLVM refuses the target of a spec ("" when nothing does), asked once per target.

    Parsing is not enough: `tvm.target.Target` takes any `mtriple` string, and a triple LLVM has
    no backend for then crashes the whole process (a segfault inside TVM's lowering passes) when
    a kernel is built. So LLVM is asked too: does it know the triple, and the CPU for it. TVM is
    imported here and in `_llvm_problem`, not at the top: parsing a spec needs none.
    """
    import tvm

    as_dict = {key: dict(value) if isinstance(value, tuple) else value for key, value in target}
    with _quiet_stderr():
        try:
            tvm.target.Target(as_dict)
        except Exception as err:  # TVM raises ValueError, TypeError or its own errors, with the reason
            # TVM appends the whole target dict after the reason; the spec file already shows it.
            reason = first_line(err).split(" Target creation from config dict failed")[0]
            return f"target: TVM refuses it: {reason}"
        host = as_dict.get("host")
        parts = [("target", as_dict)] + ([("target.host", host)] if isinstance(host, dict) else [])
        for where, part in parts:
            problem = _llvm_problem(where, part)
            if problem:
                return problem
    return ""


def _llvm_problem(where: str, target: dict) -> str:
    """What LLVM refuses in one target dict (TVM has parsed it): triple, CPU, GPU architecture."""
    import tvm
    from tvm.target import codegen

    cores = target.get("num-cores")
    if cores is not None and (isinstance(cores, bool) or cores < 1):  # TVM takes any int here
        return f"{where}.num-cores must be a positive integer, got {cores!r}"
    kind = target.get("kind")
    if kind in _GPU_ARCHS:
        key, triple, example = _GPU_ARCHS[kind]
        name = target.get(key)
        if name is not None and not codegen.llvm_is_valid_cpu(name, triple):
            return f"{where}.{key} {name!r} is not a {kind} architecture this LLVM knows (such as {example!r})"
        return ""
    if kind != "llvm":
        return ""
    given = target.get("mtriple")
    triple = given or codegen.llvm_get_system_triple()
    try:
        # Builds LLVM's target for the triple, which fails cleanly for a triple it cannot compile for.
        codegen.llvm_get_vector_width(tvm.target.Target({"kind": "llvm", "mtriple": triple}))
    except Exception:
        known = ", ".join(codegen.llvm_get_targets())
        return f"{where}.mtriple {triple!r} names no architecture this LLVM compiles for (known: {known})"
    cpu = target.get("mcpu")
    if cpu is not None and not codegen.llvm_is_valid_cpu(cpu, triple):
        default = "" if given else f" (the default; give {where}.mtriple for another architecture)"
        return f"{where}.mcpu {cpu!r} is not a CPU this LLVM knows for {triple}{default}"
    return ""


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 sent to /dev/null: LLVM and TVM's C++ logging write there directly (an
    unknown triple logs an 'Error:' line before Python sees the exception), and a refused spec
    must print its one line only."""
    with _STDERR_LOCK:
        sys.stderr.flush()
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(null)
