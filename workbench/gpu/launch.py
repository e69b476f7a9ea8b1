"""How the host launches a scheduled CUDA module's kernels, read off TVM's lowering.

TVM 0.27 lowers a GPU PrimFunc (the `s_tir` pipeline `tvm.compile` runs, then the split into a
host module and device modules, as `tvm.tirx.build` does) to device PrimFuncs, one per kernel,
and a host function that calls each with `T.call_ffi_kernel("main_kernel", A.data, ..., 256, 128,
launch_params=["blockIdx.x", "threadIdx.x"])`: the kernel's global symbol, its pointer (and
scalar) operands in parameter order, then one value per thread tag of `launch_params`, the
dynamic shared-memory bytes last when the tag `tirx.use_dyn_shared_memory` is present (the
docstring of `tvm.tirx.call_ffi_kernel`). A buffer the host allocates between two kernels
(split-K's partial sums) is a `T.alloc_buffer` of the host function: scratch for the caller.

This reads those calls, in program order; it does not run the device code generator.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
DYNAMIC_SHARED = "tirx.use_dyn_shared_memory"  # TVM's kUseDynamicSharedMemoryTag (runtime/metadata.h)


class LaunchError(Exception):
    """The lowered module launches kernels in a way a plain CUDA launcher cannot repeat."""


@dataclass(frozen=True)
class Launch:
    """One kernel launch: the kernel's symbol, grid and block (x, y, z), dynamic shared memory
    and its arguments in parameter order (a buffer's name, or an int for a scalar)."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int
    args: tuple[str | int, ...]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def to_dict(self) -> dict:
        """The launch as docs/gpu.md writes it (a scalar argument as {"int": value})."""
        return {"kernel": self.kernel, "grid": list(self.grid), "block": list(self.block),
                "dynamic_shared_bytes": self.dynamic_shared_bytes,
                "args": [a if isinstance(a, str) else {"int": a} for a in self.args]}


@dataclass(frozen=True)
class Scratch:
    """A buffer the host allocates for the kernels (flat, as TVM allocates it)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


def lower_launches(mod, target: dict, config: dict,
                   params: tuple[str, ...]) -> tuple[tuple[Launch, ...], tuple[Scratch, ...]]:
    """The launches (in order) and scratch buffers of the scheduled module `mod` compiled for the
    TVM target `target` under PassContext `config` (as `codegen.build` compiles it); `params`
    are the PrimFunc's buffer names, every other buffer a launch names is scratch. LaunchError
    for a launch tag or argument a plain launcher cannot give."""
    import tvm
    import tvm_ffi

    build = importlib.import_module("tvm.tirx.build")  # `tvm.tirx.build` the name is the function
    tvm_target = tvm.target.Target(target)
    host = tvm.target.Target("llvm" if tvm.runtime.enabled("llvm") else "c")
    with tvm.transform.PassContext(config=config):
        bound = tvm.tirx.transform.BindTarget(tvm_target.with_host(host))(mod)
        pipeline, _, _ = tvm.tirx.get_tir_pipeline("default")
        host_mod, _ = build.split_host_device_mods(pipeline(bound))
    calls = []
    for func in host_mod.functions.values():
        tvm_ffi.structural_walk(func.body, (tvm.ir.Call, lambda c: calls.append(c) if _is_launch(c) else None),
                                order="pre")
    launches, scratch = [], {}
    for call in calls:
        launch, buffers = _launch(call)
        launches.append(launch)
        for buf in buffers:
            if buf.name not in params:
                scratch[buf.name] = Scratch(buf.name, tuple(int(d) for d in buf.shape), str(buf.dtype))
    if not launches:
        raise LaunchError("the lowered module launches no kernel")
    return tuple(launches), tuple(scratch.values())


def _is_launch(call) -> bool:
    op = getattr(call, "op", None)
    return getattr(op, "name", None) == "tirx.call_ffi_kernel"


def _launch(call):
    """(Launch, the buffers it passes) of one `call_ffi_kernel`."""
    from tvm.tirx import IntImm

    tags = [str(t) for t in call.attrs.launch_params]
    unknown = [t for t in tags if t not in THREAD_TAGS and t != DYNAMIC_SHARED]
    if unknown:
        raise LaunchError(f"launch flag {unknown[0]} is not supported by a plain launch")
    name, *rest = call.args
    values = len([t for t in tags if t in THREAD_TAGS]) + (DYNAMIC_SHARED in tags)
    operands, extents = rest[: len(rest) - values], rest[len(rest) - values:]
    if not all(isinstance(v, IntImm) for v in extents):
        raise LaunchError(f"kernel {name.value}: a launch extent is not a constant")
    by_tag = dict(zip([t for t in tags if t in THREAD_TAGS], (int(v.value) for v in extents)))
    dynamic = int(extents[-1].value) if DYNAMIC_SHARED in tags else 0
    args, buffers = [], []
    for operand in operands:
        if isinstance(operand, IntImm):
            args.append(int(operand.value))
        elif getattr(getattr(operand, "op", None), "name", None) == "tirx.buffer_data":
            buffers.append(operand.args[0])
            args.append(operand.args[0].name)
        else:
            raise LaunchError(f"kernel {name.value}: argument {operand} is neither a buffer nor a constant")
    grid = tuple(by_tag.get(f"blockIdx.{a}", 1) for a in "xyz")
    block = tuple(by_tag.get(f"threadIdx.{a}", 1) for a in "xyz")
    return Launch(str(name.value), grid, block, dynamic, tuple(args)), buffers
