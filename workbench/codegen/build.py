"""Build one rProgram into a kernel: rule -> schedule -> `tvm.compile` -> `Kernel`.

A kernel that cannot be scheduled or compiled is still a `Kernel`, with `ok=False` and a
one-line `error`: a candidate's failure is data for the comparison, never a crash.
"""

from __future__ import annotations

import json
import platform
import re
import time
from dataclasses import dataclass, field, replace
from math import prod
from typing import Sequence

from workbench.codegen import targets, vector_math
from workbench.codegen.cuda import ASYNC_COPY_CONFIG, bound_occupancy
from workbench.codegen.rules import RULES, apply_rules
from workbench.codegen.template import Rule, ScheduleError
from workbench.errors import first_line
from workbench.hardware.spec import DeviceSpec
from workbench.ops.pixel_gemm import reshaped_params, with_call_shapes
from workbench.ops.shapes import MAX_ELEMENTS
from workbench.ops.tensor_expr import KernelArg, TensorExpr
from workbench.rtile.rprogram import RProgram

ENTRY = "main"  # the PrimFunc's global symbol: the function name inside the built library
# TVM names each buffer's TBAA type node in the LLVM IR after the address of a buffer object in
# the compiling process (`!{!"0x55d1c0a2b3c0", !53, i64 0}`), so two builds of one program differ
# there and nowhere else. `_stable_ir` renames them in order of appearance, one name per address
# (the alias sets stay as they were), so a rebuild gives the same IR text, byte for byte. A
# buffer accessed in vectors gets a node per access width too, named after the same address
# (`0x55e879cd30d0.w64.b0`, seen on AVX-512 convolutions); the suffix is kept.
_TBAA_ADDRESS = re.compile(r'!"(0x[0-9a-f]+)((?:\.w[0-9]+\.b[0-9]+)?)"')


@dataclass(frozen=True)
class Prepacked:
    """A kernel argument the kernel takes laid out in panels (`CpuPlan.prepacked`, a model's
    weight): its caller lays the value out once, with the library's function `function`
    (argument, then the laid-out tensor of `shape`), and passes the laid-out tensor in place
    `index` of every call (`laid_out_args`)."""

    index: int
    shape: tuple[int, ...]
    function: str

    def to_dict(self) -> dict:
        return {"index": self.index, "shape": list(self.shape), "function": self.function}


def laid_out_args(module, prepacked: Sequence[Prepacked], tensors: Sequence, dev) -> list:
    """`tensors` (a call's arguments) with each `prepacked` one replaced by its value laid out by
    `module`'s function for it; as they were where there is none."""
    import tvm

    out = list(tensors)
    for p in prepacked:
        panels = tvm.runtime.empty(p.shape, out[p.index].dtype, dev)
        module[p.function](out[p.index], panels)
        out[p.index] = panels
    return out


@dataclass(frozen=True)
class Kernel:
    """A built (or failed) kernel.

    `sources` holds `(file suffix, text)` pairs, the main one first: LLVM IR (`ll`) then assembly
    (`s`) on CPUs, CUDA C (`cu`) on GPUs. `executable` is the `tvm.runtime.Executable`
    (None when the build failed); `runtime()` gives its runtime module.
    """

    ok: bool
    error: str = ""
    template: str = ""
    target: str = ""  # the TVM target dict as JSON
    pass_config: str = ""  # the TVM PassContext config it was compiled under, as JSON (`pass_config`)
    entry: str = ENTRY
    args: tuple[KernelArg, ...] = ()
    tvmscript: str = ""
    trace_python: str = ""
    sources: tuple[tuple[str, str], ...] = ()
    build_seconds: float = 0.0
    prepacked: tuple[Prepacked, ...] = ()
    # the parameters the schedule declares in shapes other than the caller's, of as many elements
    # (`ops.pixel_gemm.reshaped_params`: a pixel-GEMM view's, buffers laid out along fused axes),
    # which the compiled function takes as the caller's (`with_call_shapes`): name -> (declared, the caller's)
    views: tuple[tuple[str, tuple[tuple[int, ...], tuple[int, ...]]], ...] = ()
    executable: object = field(default=None, compare=False, repr=False)

    @property
    def source(self) -> str:
        return self.sources[0][1] if self.sources else ""

    @property
    def source_suffix(self) -> str:
        return self.sources[0][0] if self.sources else ""

    @property
    def target_kind(self) -> str:
        return json.loads(self.target)["kind"] if self.target else ""

    def runtime(self):
        """The runtime module holding `entry` (compiled in process; cached by TVM)."""
        if self.executable is None:
            raise RuntimeError(f"kernel was not built: {self.error}")
        return self.executable.jit()


def build_kernel(
    expr: TensorExpr, program: RProgram, device: DeviceSpec, rules: Sequence[Rule] = RULES, sources: bool = True
) -> Kernel:
    """Schedule `program` with the first of `rules` that applies (`codegen.rules.RULES`),
    compile it for `device.target_dict()`, and return the `Kernel`; failures come back as `ok=False`.

    `sources=False` leaves `Kernel.sources` empty: rendering LLVM IR and assembly costs about as
    much as compiling a small kernel, wasted where the kernel is only run (profile builds)."""
    start = time.perf_counter()
    target = kernel_target(program, device)
    config = pass_config(program, device)
    stage = "schedule"
    try:
        chosen, sch = apply_rules(expr, program, device, rules)
        stage = "compile"
        packs = _prepacks(expr, program, device, sch.mod["main"])
        shapes = {expr.args[p.index].name: p.shape for p, _ in packs}
        call_args = tuple(replace(a, shape=shapes.get(a.name, a.shape)) for a in expr.args)
        views = tuple(reshaped_params(sch.mod["main"], call_args).items())
        mod = narrow_indices(with_call_shapes(sch.mod, call_args), expr, device)  # the `views` as the caller's buffers
        for p, func in packs:
            mod[p.function] = func.with_attr("global_symbol", p.function)
        executable = _compile(mod, target, config)
        texts = _sources(executable, target) if sources else ()
        if texts and texts[0][0] == "cu":  # what nvcc compiles asks for the model's occupancy
            texts = ((texts[0][0], bound_occupancy(texts[0][1], program, device)),) + texts[1:]
    except Exception as err:  # TVM raises many error types; every one is this candidate's failure
        return Kernel(ok=False, error=f"{stage}: {first_line(err)}", target=json.dumps(target, sort_keys=True),
                      pass_config=json.dumps(config, sort_keys=True), build_seconds=time.perf_counter() - start)
    return Kernel(
        ok=True,
        template=chosen.name,
        target=json.dumps(target, sort_keys=True),
        pass_config=json.dumps(config, sort_keys=True),
        args=expr.args,
        tvmscript=mod.script(),
        trace_python="\n".join(sch.trace.as_python()),
        sources=texts,
        build_seconds=time.perf_counter() - start,
        prepacked=tuple(p for p, _ in packs),
        views=views,
        executable=executable,
    )


def _prepacks(expr: TensorExpr, program: RProgram, device: DeviceSpec, func) -> tuple[tuple[Prepacked, object], ...]:
    """Per input the CPU plan lays out ahead (`CpuPlan.prepacked`): how the scheduled `func`
    takes it, and the PrimFunc that lays it out (`codegen.cpu.prepack_function`)."""
    if not device.runs_on_cpu:
        return ()
    from workbench.codegen.cpu import prepack_function
    from workbench.rtile.plan import cpu_plan

    plan = cpu_plan(program, device)
    names = [str(p.name) for p in func.params]
    out = []
    for name in plan.prepacked:
        index = names.index(name)
        shape = tuple(int(d) for d in func.params[index].ty.shape)
        out.append((Prepacked(index, shape, f"pack{index}"), prepack_function(expr, program, plan, name)))
    return tuple(out)


# LLVM features every x86 CPU kernel is compiled with: no gathers or scatters from LLVM's own
# vectorisers. The templates vectorise only contiguous rows; what LLVM vectorises on its own
# (the loop over a scalar micro-kernel's register tiles, its unrolled rows) it otherwise turns
# into gathers where an input is strided, which run slower than the shuffles it uses instead
# (evidence: docs/evidence.md#build-no-gathers). (LLVM sets the same tuning for Intel cores
# since Skylake; its Zen tunings leave gathers on.)
X86_FEATURES = ("+prefer-no-gather", "+prefer-no-scatter")


def target_dict(device: DeviceSpec) -> dict:
    """The TVM target of `device`; a CPU spec without one gets plain LLVM on its cores, and an
    x86 one `X86_FEATURES` added to its own."""
    if not device.runs_on_cpu:
        return device.target_dict()
    target = {"kind": "llvm", "num-cores": device.compute_units} | device.target_dict()
    if _is_x86(target.get("mtriple", "")):
        target["mattr"] = [*target.get("mattr", ()), *(f for f in X86_FEATURES if f not in target.get("mattr", ()))]
    return target


# LLVM's cost limit for unswitching a loop-invariant branch out of a loop (its default is 50),
# for a convolution's direct kernel (`CpuPlan` path `filters`) whose edge tiles keep a guard on
# the grid index (`CpuPlan.split_edges`) inside a register tile that unrolls reduction steps
# (window taps) as well as its filter vectors: a body far above 50, so every tile tested the
# guard. 479 ch -> 11 3x3 filters at stride 2 over 12 x 12: rank 1 37-39 us built plainly, 17
# with it (at 200 as at 2000); the other convs of four seeds within the host's noise. Given to
# every direct conv it built AVX2 code 38-78 % longer and gained nothing more, and matmuls built
# 22 % longer for nothing (docs/evidence.md#build-unswitch).
UNSWITCH_THRESHOLD = 2000


def kernel_target(program: RProgram, device: DeviceSpec) -> dict:
    """The target `program`'s kernel is compiled for: `target_dict(device)`, with LLVM's
    `UNSWITCH_THRESHOLD` on a CPU convolution's direct kernel whose guarded edge tiles unroll
    reduction steps."""
    target = target_dict(device)
    if device.runs_on_cpu:
        from workbench.rtile.plan import FILTERS, cpu_plan

        plan = cpu_plan(program, device)
        unrolled = prod(program.register_tile[a] for a in program.expr.reduce)
        if plan.path == FILTERS and plan.split_edges and unrolled > 1:
            target["cl-opt"] = [*target.get("cl-opt", ()), f"-unswitch-threshold:int={UNSWITCH_THRESHOLD}"]
    return target


# TVM's UnrollLoop (after vectorisation) unrolls, under this pass config, each loop whose
# variable indexes a buffer in registers (scope `local`). For a CPU program whose accumulators
# are one register tile's (`CpuPlan.direct_stores`): where the output's end cuts a register tile
# along its vectors, the vectoriser stores that tile lane by lane, in a loop over its lanes that
# indexes the accumulators, and LLVM then kept that tile's accumulators in memory through its
# whole K-loop unless it happened to unroll the loop itself: 356 x 71 x 139 in 48-column
# register tiles of 5, 6 and 8 rows ran 45-60 us, 34-36 with it (evidence:
# docs/evidence.md#lane-stores). On the lanes path its partial sums are one register tile's too,
# and their sum across the lanes unrolled took 5 x 177 x 3459's nest from 52-63 to 40 us
# (docs/evidence.md#lane-sums-per-tile). Not for other programs: a unit tile's accumulator
# buffer is `local` too, and unrolling the loops over it copies their bodies by the thousand
# (a 9 x 4800 unit tile's kernel did not compile in minutes). Accumulators on the stack
# (`CpuPlan.stack_accumulators`) are not `local`: their write-back carries its own unroll pragma
# (`codegen.cpu._store_registers`).
UNROLL_REGISTER_LOOPS = {"tirx.UnrollLoop": {"unroll_local_access": True}}


def pass_config(program: RProgram, device: DeviceSpec) -> dict:
    """The TVM pass config `program`'s kernel is compiled under: `ASYNC_COPY_CONFIG` (the CUDA
    templates' pipelined copies; nothing on a CPU), and `UNROLL_REGISTER_LOOPS` for a CPU program
    whose accumulators go straight from its register tiles to the output."""
    config = dict(ASYNC_COPY_CONFIG)
    if device.runs_on_cpu:
        from workbench.rtile.plan import cpu_plan

        if cpu_plan(program, device).direct_stores:
            config |= UNROLL_REGISTER_LOOPS
    return config


def _is_x86(triple: str) -> bool:
    """Whether an LLVM triple (empty: the host's, which TVM's wheel was built for) is x86."""
    arch = (triple or platform.machine()).split("-")[0].lower()
    return arch in ("x86_64", "amd64", "i386", "i686", "x86")


# Elements below which a kernel's buffers are indexed in int32 (`narrow_indices`): half of int32's
# range (`shapes.MAX_ELEMENTS`), so that a padded buffer (up to one unit tile longer per axis) and
# an offset one element past a row still fit.
INT32_ELEMENTS = (MAX_ELEMENTS + 1) // 2


def narrow_indices(mod, expr: TensorExpr, device: DeviceSpec):
    """`mod` with its int64 indices narrowed to int32 (TVM's `ForceNarrowIndexToInt32`), for a
    CPU kernel of static shapes whose every argument has fewer than `INT32_ELEMENTS` elements
    and none holds int64 data (the pass would narrow that buffer too, and the caller's tensor
    would no longer match it).
    A Relax model's PrimFuncs index in int64; lowering's NarrowDataType then gives their loops
    new int32 variables while the `pragma_loop_partition_hint` attributes the CPU template sets
    still name the old ones, so LoopPartition misses the loops they mark, and every
    guarded vector loop (a ragged tile's stores, its padding copies) stays scalar (SqueezeNet's
    1x1 conv of 64 filters over 55 x 55 pixels ran 150-280 us against 71 predicted; evidence:
    docs/evidence.md#build-narrow-indices)."""
    if not device.runs_on_cpu:
        return mod
    if not all(isinstance(d, int) for a in expr.args for d in a.shape):
        return mod  # a symbolic (Vortex) kernel's shape variables stay as the caller binds them
    if any(prod(a.shape) >= INT32_ELEMENTS or a.dtype == "int64" for a in expr.args):
        return mod
    from tvm.tirx.transform import ForceNarrowIndexToInt32

    return ForceNarrowIndexToInt32()(mod)


def _compile(mod, target: dict, config: dict):
    import tvm

    vector_math.register()  # exp, tanh and erf in vectors on CPUs
    with tvm.transform.PassContext(config=config):
        return tvm.compile(mod, target=tvm.target.Target(target))


def _sources(executable, target: dict) -> tuple[tuple[str, str], ...]:
    """The texts `targets.TARGETS` names for the kind: LLVM IR and assembly of a CPU module, the
    device code (CUDA C) of a GPU module."""
    mod = executable.mod
    entry = targets.target(target["kind"])
    if not entry.on_host:
        device_mods = [m for m in mod.imports if m.kind == target["kind"]]
        if not device_mods:
            raise ScheduleError(f"the compiled module has no {target['kind']} device code")
        mod = device_mods[0]
    return tuple((suffix, _stable_ir(mod.inspect_source(fmt)) if fmt == "ll" else mod.inspect_source(fmt))
                 for suffix, fmt in entry.sources)


def _stable_ir(text: str) -> str:
    """LLVM IR with TVM's per-process TBAA node names replaced by stable ones (`_TBAA_ADDRESS`)."""
    names: dict[str, str] = {}
    return _TBAA_ADDRESS.sub(
        lambda m: '!"' + names.setdefault(m.group(1), f"tvm-tbaa-buffer-{len(names)}") + m.group(2) + '"', text)
