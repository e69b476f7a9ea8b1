"""Run a whole model on this CPU with the workbench's kernels, operator by operator.

Each operator's chosen candidate (rank 1 by default) is built with its device's schedule
template (`build_kernel`) and the operators run in dataflow order, every one reading the
outputs of the ones before it, the model's inputs and its weights. Where the template refuses a
PrimFunc (softmax and layer norm: several reductions in one function) or the operator is
unsupported, that operator runs TVM's own lowering of the unscheduled PrimFunc instead, and the
kernel says so (`scheduled=False`, with the template's reason): the model's outputs stay
checkable against an ONNX runtime while the report shows which kernels were constructed.

The kernels run in this process on TVM's thread pool, which reads TVM_NUM_THREADS once, when it
starts; without it TVM assumes hyper-threading and starts half the logical CPUs. `profile.local.pool_threads`
sizes it to the device's cores before it starts. On the 2-core development machine TVM's default
pool ran the kernels on one thread and still paid 7.3 us per call of an empty parallel kernel
(0.9 us with TVM_NUM_THREADS=2); sized to the cores, the MLP sample ran in 32-34 us instead of 85
and the BERT layer in 206 us instead of 485 (the quietest runs on a machine shared with other work).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from workbench.codegen.build import build_kernel, target_dict
from workbench.codegen.common import first_line
from workbench.errors import UserError
from workbench.models.model import ModelConstruction


@dataclass(frozen=True)
class OperatorKernel:
    name: str
    scheduled: bool  # True: the candidate's schedule; False: TVM's default lowering
    rank: int  # the candidate built (0 when not scheduled)
    error: str = ""  # why the candidate's schedule was not used
    module: object = field(default=None, compare=False, repr=False)  # runtime module with `main`


def build_model_kernels(mc: ModelConstruction, rank: int = 1) -> tuple[OperatorKernel, ...]:
    """One runnable kernel per operator (a PrimFunc called twice is built once)."""
    if not mc.device.runs_on_cpu:
        raise UserError(f"running a model needs a CPU device, got {mc.device.name} ({mc.device.kind})")
    if rank < 1:
        raise UserError(f"rank must be >= 1, got {rank}")
    built: dict[str, OperatorKernel] = {}
    out = []
    for r in mc.results:
        op = r.operator
        if op.func_name not in built:
            built[op.func_name] = _build(r, mc, rank)
        kernel = built[op.func_name]
        out.append(OperatorKernel(op.name, kernel.scheduled, kernel.rank, kernel.error, kernel.module))
    return tuple(out)


def _build(r, mc: ModelConstruction, rank: int) -> OperatorKernel:
    name = r.operator.name
    if len(r.candidates) < rank:
        return _unscheduled(r.operator, mc, r.reason or f"no candidate of rank {rank}")
    kernel = build_kernel(r.construction.expr, r.candidates[rank - 1].program, mc.device)
    if not kernel.ok:
        return _unscheduled(r.operator, mc, kernel.error)
    return OperatorKernel(name, True, rank, "", kernel.runtime())


def _unscheduled(op, mc: ModelConstruction, reason: str) -> OperatorKernel:
    import tvm

    mod = tvm.IRModule({"main": op.func})
    executable = tvm.compile(mod, target=tvm.target.Target(target_dict(mc.device)))
    return OperatorKernel(op.name, False, 0, reason, executable.jit())


def run_model(mc: ModelConstruction, kernels, inputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """The model's outputs for `inputs` (by input name), running `kernels` in dataflow order."""
    calls = _run(mc, kernels, inputs)
    return tuple(calls[op][1][item].numpy() for op, item in mc.model.outputs)


def time_model(mc: ModelConstruction, kernels, inputs: Mapping[str, np.ndarray],
               repeat: int = 5) -> tuple[float, tuple[float, ...]]:
    """The whole model's time and each operator's own time, on the real arguments of one run on
    `inputs`. The whole model: every kernel in dataflow order on buffers already in place (as a
    runtime holds its weights), so that copying the inputs and weights in is not counted, timed
    as the baselines are (`profile.baselines.best_seconds`, `repeat` repeats). An operator: the
    best of `repeat` runs of at least 5 ms each, so that a microsecond kernel is timed over many
    calls."""
    import tvm

    from workbench.profile.baselines import best_seconds
    from workbench.profile.runner import Timing

    calls = _run(mc, kernels, inputs)  # also the warm-up
    mains = [k.module["main"] for k in kernels]

    def whole_model():
        for main, (args, outs) in zip(mains, calls):
            main(*args, *outs)

    whole = best_seconds(whole_model, Timing(repeat=repeat))
    each = []
    for kernel, (args, outs) in zip(kernels, calls):
        timer = kernel.module.time_evaluator("main", tvm.cpu(), number=1, repeat=repeat, min_repeat_ms=5)
        each.append(min(timer(*args, *outs).results))
    return whole, tuple(each)


def _run(mc: ModelConstruction, kernels, inputs: Mapping[str, np.ndarray]) -> list[tuple[list, list]]:
    """Run the model; per operator, the tensors it read and the ones it wrote."""
    import tvm

    dev = tvm.cpu()
    model = mc.model
    feeds = {}
    for name, shape, dtype in model.inputs:
        if name not in inputs:
            raise UserError(f"model {model.name}: missing input {name!r}")
        array = np.asarray(inputs[name], dtype=dtype)
        if array.shape != shape:
            raise UserError(f"model {model.name}: input {name!r} has shape {array.shape}, the model needs {shape}")
        feeds[name] = tvm.runtime.tensor(np.array(array, order="C"), dev)
    # np.array, not np.ascontiguousarray: the latter turns 0-d weights (ReLU6 bounds) into 1-d.
    weights = [tvm.runtime.tensor(np.array(c, order="C"), dev) for c in model.constants]
    results: list[list] = []  # per operator, its output tensors
    calls = []
    for op, kernel in zip(model.operators, kernels):
        args = [_value(a, feeds, weights, results) for a in op.args]
        outs = [tvm.runtime.tensor(np.zeros(shape, dtype=dtype), dev) for shape, dtype in op.outputs]
        try:
            kernel.module["main"](*args, *outs)
        except Exception as err:  # a TVM runtime error names this operator, not the model
            raise RuntimeError(f"operator {op.name}: {first_line(err)}") from err
        results.append(outs)
        calls.append((args, outs))
    return calls


def _value(arg, feeds: dict, weights: list, results: list):
    if arg.source == "operator":
        return results[arg.ref][arg.item]
    return feeds[arg.ref] if arg.source == "input" else weights[arg.ref]
