"""Run a whole model on this CPU with the workbench's kernels, operator by operator.

Each operator's chosen candidate is built with its device's schedule template (`build_kernel`)
and the operators run in dataflow order, every one reading the outputs of the ones before it,
the model's inputs and its weights. Where the template refuses a PrimFunc (softmax and layer
norm: several reductions in one function) or the operator is unsupported, that operator runs
TVM's own lowering of the unscheduled PrimFunc instead, and the kernel says so
(`scheduled=False`, with the template's reason): the model's outputs stay checkable against an
ONNX runtime while the report shows which kernels were constructed.

The candidate is rank 1 (the model's best prediction) or, with `measured_pick`, the fastest
verified one of the top K measured here: Roller ends its construction by evaluating its top-K
rPrograms on the device and keeping the fastest (Roller, section 4), since its micro-model
ranks close candidates only roughly (evidence: docs/evidence.md#execute-measured-pick). The
pick is a profile session per distinct workload (built in warm workers, stored as
`workbench profile` stores its runs), with one difference: the numpy reference knows catalog
operators and expressions, not a model's fused PrimFuncs, so a candidate is checked against the
operator's TVM default lowering run on the operator's own arguments in one run of the model on
the seeded inputs (`_OperatorRunner`), at the tolerance the whole model is held to against ONNX
Runtime.

The kernels run in this process on TVM's thread pool, which reads TVM_NUM_THREADS once, when it
starts; without it TVM assumes hyper-threading and starts half the logical CPUs. `profile.local.pool_threads`
sizes it to the device's cores before it starts (evidence:
docs/evidence.md#execute-thread-pool).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import numpy as np

from workbench.codegen import vector_math
from workbench.codegen.build import Kernel, Prepacked, build_kernel, laid_out_args, target_dict
from workbench.codegen.verify import Verification
from workbench.errors import UserError, first_line
from workbench.models import memory_plan
from workbench.models.construction import ModelConstruction
from workbench.models.onnx_import import ImportedModel
from workbench.profile.runner import (BuiltCandidate, Measurement, Report, Runner, Timing, evaluator_repeats,
                                      runtime_versions, timed_repeats)
from workbench.profile.session import Progress, ProfileResult, cannot_run_locally, profile_candidates
from workbench.workers import WorkerPool, thread_env

# fp32 outputs against a reference computed in another order (the model's against ONNX Runtime,
# a candidate's against its operator's TVM default lowering): the two sum the reductions (up to a
# few thousand terms of inputs in [-1, 1]) in different orders, which moves a result by about
# sqrt(terms) * 6e-8 relative, ~1e-5 at worst on the sample models; 1e-4 relative plus 1e-4
# absolute (for results near zero, where a relative bound means nothing) leaves that margin while
# a wrong index or a missing term moves outputs of order 0.1-1.
RTOL = 1e-4
ATOL = 1e-4


@dataclass(frozen=True)
class OperatorKernel:
    name: str
    scheduled: bool  # True: the candidate's schedule; False: TVM's default lowering
    rank: int  # the candidate built (0 when not scheduled)
    error: str = ""  # why the candidate's schedule was not used
    module: object = field(default=None, compare=False, repr=False)  # runtime module with `main`
    prepacked: tuple[Prepacked, ...] = ()  # weights `main` takes laid out by the module (`codegen.build.Prepacked`)


@dataclass(frozen=True)
class OperatorPick:
    """The measured pick of one distinct workload (operators whose PrimFuncs have the same
    expression and candidates share it): the profile of its top K and the rank kept."""

    func_names: tuple[str, ...]  # the PrimFuncs of the operators sharing this workload
    profile: ProfileResult

    @property
    def rank(self) -> int | None:
        """The fastest verified candidate's rank (`best_measured`); None when none verified."""
        best = self.profile.best
        return best.rank if best is not None else None

    @property
    def reason(self) -> str:
        """Why no candidate is kept ("" when one is): the first failure, by rank."""
        if self.rank is not None:
            return ""
        first = min(self.profile.measurements, key=lambda m: m.rank)
        return (f"none of the top {len(self.profile.measurements)} candidates built and verified "
                f"(#{first.rank}: {first.error or 'not checked'})")

    @property
    def tried(self) -> tuple[Measurement, ...]:
        return self.profile.measurements


def measured_pick(mc: ModelConstruction, inputs: Mapping[str, np.ndarray], *, runner: str | Runner = "local",
                  store=None, timing: Timing = Timing(), progress: Progress | None = None,
                  run_label: str = "") -> tuple[OperatorPick, ...]:
    """Profile the top K of every distinct workload of `mc` as `workbench profile` does (built in
    parallel workers, timed on this CPU, recorded in `store`, a `profile.store.RunStore`, when
    given, under `run_label`), all in one warm `WorkerPool`, so that TVM is imported once per worker, not per
    candidate or workload. The local runner checks each candidate against its operator's TVM
    default lowering on the arguments it gets in a run of the model on `inputs` (module
    docstring); another `runner` (the fake one in tests) is used as given. A candidate that fails
    to build or verify is a measurement with an error and never kept. `progress` also gets a str
    before each workload. Operators with the same expression and candidates are profiled once."""
    groups: dict[tuple, list] = {}  # (expression, programs) -> the operators' results
    for r in mc.results:
        if r.supported:
            groups.setdefault((r.construction.expr, tuple(c.program for c in r.candidates)), []).append(r)
    notify = progress or (lambda event: None)
    calls = operator_references(mc.model, mc.device, inputs) if runner == "local" and groups else {}
    picks = []
    with WorkerPool() as pool:
        for i, results in enumerate(groups.values()):
            first = results[0]
            label = f"{mc.model.name}:{first.operator.name}"
            notify(f"pick {i + 1}/{len(groups)}: {label}")
            chosen = _OperatorRunner(mc.device, pool, *calls[first.operator.func_name]) if runner == "local" else runner
            profile = profile_candidates(first.construction.expr, mc.device, first.candidates, runner=chosen,
                                         store=store, workload_label=label, policy=mc.policy, timing=timing,
                                         progress=progress, pool=pool, run_label=run_label,
                                         options=first.construction.options)
            names = tuple(dict.fromkeys(r.operator.func_name for r in results))
            picks.append(OperatorPick(names, profile))
    return tuple(picks)


def model_inputs(model: ImportedModel, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs of `model`: floats uniform in [-1, 1] (no underflow, both signs, so that
    ReLUs and clips cut), integers 0 or 1 (valid indices and masks)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape, dtype in model.inputs:
        if np.issubdtype(np.dtype(dtype), np.floating):
            out[name] = rng.uniform(-1, 1, shape).astype(dtype)
        else:
            out[name] = rng.integers(0, 2, shape).astype(dtype)
    return out


def operator_references(model: ImportedModel, device, inputs: Mapping[str, np.ndarray]) -> dict[str, tuple]:
    """Per PrimFunc, the arguments its first operator gets and the outputs it writes when the
    model runs on `inputs` with TVM's default lowering of every operator for `device` (the
    reference a candidate is checked against: the operator's own values, so that a batch norm's
    variance or a softmax's row stays what the model feeds it, not random numbers). Where those
    outputs are constant and so verify nothing (a classifier behind constant weights, as in the
    ONNX light models), the arguments that come from the model's inputs and operators are drawn
    again, uniform in [-1, 1], the weights kept (and drawn too where the outputs stay constant,
    `_redrawn`), and the default lowering run on them. Runs the
    kernels in this process: `device` must be one this machine runs."""
    lowered: dict[str, OperatorKernel] = {}
    for op in model.operators:
        if op.func_name not in lowered:
            lowered[op.func_name] = _unscheduled(op, device, "the reference")
    kernels = [lowered[op.func_name] for op in model.operators]
    out: dict[str, tuple] = {}
    for op, (args, outs) in zip(model.operators, _run(model, kernels, inputs)):
        if op.func_name not in out:
            call = (tuple(a.numpy() for a in args), tuple(o.numpy() for o in outs))
            out[op.func_name] = _redrawn(op, lowered[op.func_name], *call) if constant_outputs(call[1]) else call
    return out


def _redrawn(op, kernel: OperatorKernel, args: tuple, outs: tuple) -> tuple:
    """`op`'s call with its activations drawn again (seeded by its index) and the outputs
    `kernel` computes from them; where those are still constant (a classifier whose weights are
    one value: every output the same sum), its floating weights drawn as well, unless that makes
    an output non-finite (a variance drawn negative), which no check could pass."""
    import tvm

    dev = tvm.cpu()

    def drawn(sources: tuple[str, ...]) -> tuple:
        rng = np.random.default_rng(op.index)
        new = tuple(rng.uniform(-1, 1, a.shape).astype(a.dtype)
                    if arg.source in sources and np.issubdtype(a.dtype, np.floating) else a
                    for arg, a in zip(op.args, args))
        tensors = [tvm.runtime.tensor(np.array(a, order="C"), dev) for a in new]
        results = [tvm.runtime.tensor(np.zeros_like(o), dev) for o in outs]
        kernel.module["main"](*tensors, *results)
        return new, tuple(r.numpy() for r in results)

    call = drawn(("input", "operator"))
    if constant_outputs(call[1]):
        everything = drawn(("input", "operator", "constant"))
        if all(np.isfinite(o).all() for o in everything[1] if np.issubdtype(o.dtype, np.floating)):
            return everything
    return call


def operator_runner(model: ImportedModel, index: int, device, pool: WorkerPool, seed: int = 0) -> "_OperatorRunner":
    """The local runner for operator `index` of `model` alone (the dashboard's Candidates page
    profiling an operator opened from the Models page): its candidates are checked against the
    operator's TVM default lowering on what it gets in one run of the model on seeded inputs, as
    `measured_pick` checks them. UserError when this machine cannot run `device`'s kernels."""
    if not 0 <= index < len(model.operators):
        raise UserError(f"model {model.name}: no operator {index} (it has {len(model.operators)})")
    problem = cannot_run_locally(device, pool)
    if problem:
        raise UserError(f"cannot profile {device.name} kernels on this machine: {problem}")
    calls = operator_references(model, device, model_inputs(model, seed))
    return _OperatorRunner(device, pool, *calls[model.operators[index].func_name])


class _OperatorRunner:
    """The local runner for one operator of a model: each built candidate is run in a warm worker
    of `pool` (the session's, with the local runner's environment) on the operator's `args`,
    its outputs compared with `expected` (RTOL, ATOL), and only a correct one timed, as
    `profile.runner.check_and_time` does for catalog workloads."""

    name = "local"
    needs_library = True

    def __init__(self, device, pool: WorkerPool, args: tuple, expected: tuple):
        self.env, self.pool, self.args, self.expected = thread_env(device), pool, args, expected

    def measure(self, expr, built, timing: Timing, report: Report) -> None:
        worker = self.pool.workers(1, self.env)[0]
        for candidate in built:
            outcome = worker.call(measure_operator, (candidate, self.args, self.expected, timing), timing.timeout_s)
            report(outcome.value if not outcome.error else
                   Measurement(candidate.rank, self.name, error=f"run: {outcome.error}"))


def measure_operator(built: BuiltCandidate, args: tuple, expected: tuple, timing: Timing) -> Measurement:
    """Load `built.library`, run it on `args`, check its outputs against `expected` and time a
    correct one, its repeats as `workbench profile` takes them (`runner.timed_repeats`; runs in
    the worker)."""
    import tvm

    dev = tvm.cpu()
    module = tvm.runtime.load_module(built.library)
    tensors, outs = _called(module, built.entry, built.prepacked, args, expected)
    problem = output_mismatch(tuple(o.numpy() for o in outs), expected)
    if problem:
        return Measurement(built.rank, "local", correct=False, error=f"wrong result: {problem}",
                           versions=runtime_versions())
    seconds = timed_repeats(evaluator_repeats(module, built.entry, dev, (*tensors, *outs), timing), timing)
    return Measurement(built.rank, "local", seconds, correct=True, versions=runtime_versions())


def verify_operator(kernel: Kernel, model: ImportedModel, index: int, device, seed: int = 0) -> Verification:
    """`kernel` (built for `device`, a CPU this machine runs) of operator `index` of `model`,
    checked as a measured pick's candidates are: run on the arguments the operator gets in a run
    of the model on `model_inputs(model, seed)` with TVM's default lowering of every operator, its
    outputs against that lowering's within RTOL and ATOL (`output_mismatch`; an export's check, in
    its worker). A crash or a wrong result is recorded in the Verification, never raised."""
    if not kernel.ok:
        return Verification(False, error=f"not built: {kernel.error}")
    try:
        args, expected = operator_references(model, device, model_inputs(model, seed))[model.operators[index].func_name]
        _, outs = _called(kernel.runtime(), kernel.entry, kernel.prepacked, args, expected)
        got = tuple(o.numpy() for o in outs)
    except Exception as err:  # a TVM runtime error of any kind is this kernel's failure
        return Verification(False, error=f"run: {first_line(err)}")
    problem = output_mismatch(got, expected)  # the outputs were made in the reference's shapes
    if problem:
        return Verification(False, error=problem, atol=ATOL, rtol=RTOL)
    diff = [np.abs(o.astype(np.float64) - e) for o, e in zip(got, expected)]
    return Verification(True, max(float(d.max(initial=0.0)) for d in diff),
                        max(float((d / (ATOL + RTOL * np.abs(e))).max(initial=0.0)) for d, e in zip(diff, expected)),
                        atol=ATOL, rtol=RTOL)


def _called(module, entry: str, prepacked: tuple[Prepacked, ...], args: tuple, expected: tuple) -> tuple[list, list]:
    """(arguments, outputs) as TVM tensors on this CPU after one call of `module`'s `entry` on
    `args` (its weights laid out first: `laid_out_args`), into outputs shaped as `expected`."""
    import tvm

    dev = tvm.cpu()
    tensors = laid_out_args(module, prepacked, [tvm.runtime.tensor(np.array(a, order="C"), dev) for a in args], dev)
    outs = [tvm.runtime.tensor(np.zeros_like(e), dev) for e in expected]
    module[entry](*tensors, *outs)
    return tensors, outs


def output_mismatch(outs: tuple[np.ndarray, ...], expected: tuple[np.ndarray, ...]) -> str:
    """Why `outs` are not `expected` within RTOL and ATOL ("" when they are). A reference whose
    every output is one value within ATOL (all zeros after a ReLU, say) would pass a kernel
    writing that value, so it is refused: it verifies nothing."""
    if constant_outputs(expected):
        return "the reference output is constant, so it cannot tell a right kernel from a wrong one"
    for i, (o, e) in enumerate(zip(outs, expected)):
        if o.shape != e.shape or not np.allclose(o, e, rtol=RTOL, atol=ATOL):
            error = float(np.max(np.abs(o - e))) if o.shape == e.shape else float("nan")
            return f"output {i} off by up to {error:.2e} (rtol {RTOL:g}, atol {ATOL:g})"
    return ""


def constant_outputs(outs: tuple[np.ndarray, ...]) -> bool:
    """Whether every output is one value within ATOL: no check against it can fail."""
    return all(o.size == 0 or np.ptp(o) <= ATOL for o in outs)


def build_model_kernels(mc: ModelConstruction, rank: int = 1,
                        picks: tuple[OperatorPick, ...] = ()) -> tuple[OperatorKernel, ...]:
    """One runnable kernel per operator (a PrimFunc called twice is built once): the candidate
    of rank `rank`, or where `picks` covers the operator, its measured pick (TVM's default
    lowering when none of its candidates verified)."""
    if not mc.device.runs_on_cpu:
        raise UserError(f"running a model needs a CPU device, got {mc.device.name} ({mc.device.kind})")
    if rank < 1:
        raise UserError(f"rank must be >= 1, got {rank}")
    picked = {name: p for p in picks for name in p.func_names}
    built: dict[str, OperatorKernel] = {}
    out = []
    for r in mc.results:
        op = r.operator
        if op.func_name not in built:
            pick = picked.get(op.func_name)
            if pick is not None and pick.rank is None:
                built[op.func_name] = _unscheduled(op, mc.device, pick.reason)
            else:
                built[op.func_name] = _build(r, mc, pick.rank if pick is not None else rank)
        kernel = built[op.func_name]
        out.append(replace(kernel, name=op.name))
    return tuple(out)


def _build(r, mc: ModelConstruction, rank: int) -> OperatorKernel:
    name = r.operator.name
    if len(r.candidates) < rank:
        return _unscheduled(r.operator, mc.device, r.reason or f"no candidate of rank {rank}")
    kernel = build_kernel(r.construction.expr, r.candidates[rank - 1].program, mc.device)
    if not kernel.ok:
        return _unscheduled(r.operator, mc.device, kernel.error)
    return OperatorKernel(name, True, rank, "", kernel.runtime(), kernel.prepacked)


def _unscheduled(op, device, reason: str) -> OperatorKernel:
    import tvm

    vector_math.register()  # exp, tanh and erf as the scheduled kernels lower them
    mod = tvm.IRModule({"main": op.func})
    executable = tvm.compile(mod, target=tvm.target.Target(target_dict(device)))
    return OperatorKernel(op.name, False, 0, reason, executable.jit())


def run_model(mc: ModelConstruction, kernels, inputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """The model's outputs for `inputs` (by input name), as `planned_run` gives them."""
    return planned_run(mc, kernels, inputs).outputs


@dataclass(frozen=True)
class PlannedRun:
    outputs: tuple[np.ndarray, ...]
    call: Callable[[], None]  # the whole model again, on the same buffers
    in_place: frozenset  # the operators that do not run: concatenations their parts were written into


def planned_run(mc: ModelConstruction, kernels, inputs: Mapping[str, np.ndarray]) -> PlannedRun:
    """The model's outputs for `inputs`, running `kernels` in dataflow order with the intermediate
    values sharing buffers as a runtime's memory planner shares them (`memory_plan`, with the
    concatenations `concat_axes` finds placed in place where they can be), and a call that runs
    the whole model again on those buffers, already in place (as a runtime holds its weights), so
    that timing it counts no copy of the inputs and weights: the outputs checked are those of the
    buffers timed, so the check covers the plan too."""
    planned = memory_plan.plan(mc.model, concat_axes(mc.model, kernels))
    shared = _run(mc.model, kernels, inputs, planned)
    outputs = tuple(shared[op][1][item].numpy() for op, item in mc.model.outputs)
    calls = [(k.module["main"], args, outs) for i, (k, (args, outs)) in enumerate(zip(kernels, shared))
             if i not in planned.in_place]

    def call():
        for main, args, outs in calls:
            main(*args, *outs)

    return PlannedRun(outputs, call, planned.in_place)


def concat_axes(model: ImportedModel, kernels) -> dict[int, int]:
    """The operators that concatenate other operators' outputs, each with its axis: of those whose
    output's shape is their parts' joined along one axis, the ones whose own kernel, run on random
    parts, gives exactly numpy's concatenation of them (what the kernel does, not what its name
    says: a concatenation fused with an activation is not one). For `memory_plan.plan`."""
    import tvm

    found = {}
    for i, (op, kernel) in enumerate(zip(model.operators, kernels)):
        if len(op.outputs) != 1 or len(op.args) < 2 or any(a.source != "operator" for a in op.args):
            continue
        (shape, dtype), = op.outputs
        shapes = [a.shape for a in op.args]
        axes = [d for d in range(len(shape)) if all(len(s) == len(shape) for s in shapes)
                and all(s[k] == shape[k] for s in shapes for k in range(len(shape)) if k != d)
                and sum(s[d] for s in shapes) == shape[d]]
        if len(axes) != 1 or any(a.dtype != dtype for a in op.args):
            continue
        rng = np.random.default_rng(i)
        parts = [rng.uniform(-1, 1, s).astype(dtype) for s in shapes]
        out = tvm.runtime.tensor(np.zeros(shape, dtype=dtype), tvm.cpu())
        try:
            kernel.module["main"](*[tvm.runtime.tensor(p, tvm.cpu()) for p in parts], out)
        except Exception:  # TVM raises many error types; an operator that fails here is not one, and the run says why
            continue
        if np.array_equal(out.numpy(), np.concatenate(parts, axis=axes[0])):
            found[i] = axes[0]
    return found


def operators_alone(mc: ModelConstruction, kernels, inputs: Mapping[str, np.ndarray],
                    repeat: int = 5) -> tuple[tuple[np.ndarray, ...], tuple[float, ...]]:
    """Each operator's first output in dataflow order, and its own time on the real arguments of
    the run on `inputs`, every value in a buffer of its own (ONNX Runtime's per-node profile is set
    beside these): the best of `repeat` runs of at least 5 ms each, so that a microsecond kernel
    is timed over many calls."""
    import tvm

    calls = _run(mc.model, kernels, inputs)
    outputs = tuple(outs[0].numpy() for _, outs in calls)  # before the timing runs them again
    each = []
    for kernel, (args, outs) in zip(kernels, calls):
        timer = kernel.module.time_evaluator("main", tvm.cpu(), number=1, repeat=repeat, min_repeat_ms=5)
        each.append(min(timer(*args, *outs).results))
    return outputs, tuple(each)


def _run(model: ImportedModel, kernels, inputs: Mapping[str, np.ndarray],
         planned: memory_plan.MemoryPlan | None = None) -> list[tuple[list, list]]:
    """Run the model; per operator, the tensors it read and the ones it wrote: each output in a
    buffer of its own, or where `planned` puts it (a value read after the run may then hold a
    later one's data; a concatenation placed in place does not run, its parts written into it)."""
    import tvm

    dev = tvm.cpu()
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
    if planned is not None:
        slots = [tvm.runtime.empty((max(size, 1),), "uint8", dev) for size in planned.slots]
    for i, (op, kernel) in enumerate(zip(model.operators, kernels)):
        args = [_value(a, feeds, weights, results) for a in op.args]
        if kernel.prepacked:  # laid out once per run, before its timed calls, as a runtime lays out its weights
            args = laid_out_args(kernel.module, kernel.prepacked, args, dev)
        if planned is not None:  # a view of its slot's bytes (TVM's own VM places its planned values the same way)
            outs = [_view(slots[planned.where[(i, item)]], shape, dtype, planned.offset((i, item)))
                    for item, (shape, dtype) in enumerate(op.outputs)]
        else:
            outs = [tvm.runtime.tensor(np.zeros(shape, dtype=dtype), dev) for shape, dtype in op.outputs]
        try:
            if planned is None or i not in planned.in_place:
                kernel.module["main"](*args, *outs)
        except Exception as err:  # a TVM runtime error names this operator, not the model
            raise RuntimeError(f"operator {op.name}: {first_line(err)}") from err
        results.append(outs)
        calls.append((args, outs))
    return calls


def _view(slot, shape: tuple[int, ...], dtype: str, offset: int):
    """A `shape` x `dtype` tensor over `slot`'s bytes from `offset` on. A kernel refuses a tensor
    with a byte offset (its buffers are declared without one), so past the start the view is
    numpy's over the same bytes, handed back through DLPack: its data pointer moved instead."""
    if not offset:
        return slot._create_view(shape, dtype)
    import tvm

    size = memory_plan.value_bytes(shape, dtype)
    return tvm.runtime.from_dlpack(np.from_dlpack(slot)[offset:offset + size].view(dtype).reshape(shape))


def _value(arg, feeds: dict, weights: list, results: list):
    if arg.source == "operator":
        return results[arg.ref][arg.item]
    return feeds[arg.ref] if arg.source == "input" else weights[arg.ref]
