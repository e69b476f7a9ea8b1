"""`workbench model PATH --run`: the whole model run on this CPU with the workbench's kernels
(`execute`), its outputs checked against ONNX Runtime, and its end-to-end time beside ONNX
Runtime's and TVM's own default build of the same Relax module, all measured in one run (timings
on a shared machine are only comparable within one run, as ratios), with each operator's measured
time beside its predicted one (where the time goes). Each operator runs its rank-1 candidate
(`pick="rank1"`) or the fastest verified one of its top K measured here first (`pick="measured"`,
`execute.measured_pick`); the report says which rank each operator ran and how long picking took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.codegen import vector_math
from workbench.codegen.build import target_dict
from workbench.errors import UserError, first_line
from workbench.fmt import duration
from workbench.models.construction import ModelConstruction
from workbench.models import ort_profile
from workbench.models.execute import (ATOL, RTOL, OperatorPick, build_model_kernels, constant_outputs, measured_pick,
                                      model_inputs, operators_alone, planned_run)
from workbench.models.onnx_import import fused_module, read_onnx
from workbench.profile.baselines import SETTLE_S, best_seconds, best_seconds_in_turn
from workbench.profile.local import pool_threads
from workbench.profile.runner import Runner, Timing
from workbench.profile.session import Progress, cannot_run_locally

REPEAT = 5  # best of 5: the fastest run is the one least disturbed by other work on the machine
# Which candidate each operator runs: rank 1 of the model, or the fastest verified of its top K.
PICKS = ("rank1", "measured")


@dataclass(frozen=True)
class OperatorTime:
    name: str
    measured_seconds: float
    predicted_seconds: float | None  # None: the operator was not constructed
    scheduled: bool  # False: TVM's default lowering ran instead of the candidate
    rank: int | None = None  # the candidate run; None when TVM's default lowering ran
    pick: OperatorPick | None = None  # the measured pick that chose it (pick "measured" only)
    reason: str = ""  # why TVM's default lowering ran ("" when scheduled)
    onnxruntime_seconds: float | None = None  # ONNX Runtime's nodes mapped to it (`ort_profile`); None: none
    onnxruntime_nodes: tuple[str, ...] = ()
    in_place: bool = False  # a concatenation its parts were written into: the whole run does not run it

    @property
    def kernel_text(self) -> str:
        what = f"scheduled, rank {self.rank}" if self.scheduled else "TVM DEFAULT LOWERING"
        return what + (" (in place: not run in the whole model)" if self.in_place else "")

    def to_dict(self) -> dict:
        out = {"name": self.name, "measured_seconds": self.measured_seconds,
               "predicted_seconds": self.predicted_seconds, "scheduled": self.scheduled, "rank": self.rank,
               "reason": self.reason, "onnxruntime_seconds": self.onnxruntime_seconds,
               "onnxruntime_nodes": list(self.onnxruntime_nodes), "in_place": self.in_place}
        if self.pick is not None:  # each candidate tried, its best repeat (None: failed, `error` says why)
            out["profile_run_id"] = self.pick.profile.run_id
            out["candidates_tried"] = [{"rank": m.rank, "seconds": m.best_seconds if m.ok else None, "error": m.error}
                                       for m in self.pick.tried]
        return out


@dataclass(frozen=True)
class ModelRun:
    outputs_match: bool  # every output within RTOL/ATOL of ONNX Runtime's, which are not constant
    max_abs_error: float
    seconds: float  # the workbench's kernels, the whole model
    onnxruntime_seconds: float
    tvm_default_seconds: float | None  # None: TVM's default build failed (tvm_default_error says why)
    tvm_default_error: str
    operators: tuple[OperatorTime, ...]
    threads: int  # ONNX Runtime's intra-op threads: the device's compute units
    kernel_threads: int  # TVM's pool running the workbench's kernels and TVM's default build
    pick: str = "rank1"  # which candidate each operator ran (PICKS)
    pick_seconds: float = 0.0  # wall time of the measured pick (0 for rank 1)
    picks: tuple[OperatorPick, ...] = ()  # one per distinct workload profiled (pick "measured")
    # ONNX Runtime's profiled nodes that no operator computes: (node, op type, seconds, why)
    onnxruntime_unmatched: tuple[tuple[str, str, float, str], ...] = ()
    # ONNX Runtime's outputs each one value within ATOL (a model whose weights are constants, as
    # onnx's `light` test models are, computes the same value for every class): any kernel that
    # writes that value matches them, so they check nothing and `outputs_match` is False
    outputs_constant: bool = False

    @property
    def not_scheduled(self) -> tuple[OperatorTime, ...]:
        """The operators that ran TVM's default lowering instead of a constructed kernel."""
        return tuple(o for o in self.operators if not o.scheduled)

    def to_dict(self) -> dict:
        return {"outputs_match": self.outputs_match, "outputs_checked": not self.outputs_constant,
                "max_abs_error": self.max_abs_error, "rtol": RTOL,
                "atol": ATOL, "seconds": self.seconds, "onnxruntime_seconds": self.onnxruntime_seconds,
                "tvm_default_seconds": self.tvm_default_seconds, "tvm_default_error": self.tvm_default_error,
                "threads": {"workbench": self.kernel_threads, "onnxruntime": self.threads},
                "pick": self.pick, "pick_seconds": self.pick_seconds,
                "operators": [o.to_dict() for o in self.operators],
                "not_scheduled": [{"name": o.name, "reason": o.reason} for o in self.not_scheduled],
                "onnxruntime_unmatched": [{"node": n, "op_type": t, "seconds": sec, "reason": why}
                                          for n, t, sec, why in self.onnxruntime_unmatched]}

    def pick_text(self) -> str:
        """How the kernels were chosen, in one line."""
        if self.pick == "rank1":
            return "kernels: every operator's rank 1 (the best predicted)"
        failed = sum(1 for p in self.picks for m in p.tried if not m.ok)
        runs = [p.profile.run_id for p in self.picks if p.profile.run_id is not None]
        stored = f"; stored as runs {', '.join(map(str, runs))}" if runs else ""
        return (f"kernels: the fastest verified of each operator's top K, measured here: {len(self.picks)} "
                f"workloads, {sum(len(p.tried) for p in self.picks)} candidates tried ({failed} failed, skipped) "
                f"in {self.pick_seconds:.1f} s{stored}")

    def check_text(self) -> str:
        """The outputs' check against ONNX Runtime, in one line."""
        if self.outputs_constant:
            return (f"outputs NOT CHECKED: ONNX Runtime's are constant (each one value within atol {ATOL:g}, as a "
                    f"model whose weights are constants gives), which any kernel writing that value matches "
                    f"(max abs error {self.max_abs_error:.2e})")
        match = "match" if self.outputs_match else "DO NOT match"
        return (f"outputs {match} ONNX Runtime (max abs error {self.max_abs_error:.2e}; "
                f"tolerance rtol {RTOL:g}, atol {ATOL:g})")

    def text(self) -> str:
        lines = [f"{'operator':40s} {'measured':>10s} {'predicted':>10s} {'ORT':>10s} {'ORT/ours':>8s} kernel"]
        for o in self.operators:  # duration: "-" for an operator without a prediction
            ratio = f"{o.onnxruntime_seconds / o.measured_seconds:.2f}" if o.onnxruntime_seconds else "-"
            lines.append(f"{o.name[:40]:40s} {duration(o.measured_seconds):>10s} {duration(o.predicted_seconds):>10s} "
                         f"{duration(o.onnxruntime_seconds):>10s} {ratio:>8s} " + o.kernel_text)
        if self.onnxruntime_unmatched:
            lines.append(f"ONNX Runtime nodes no operator computes: {len(self.onnxruntime_unmatched)}, "
                         f"{duration(sum(s for _, _, s, _ in self.onnxruntime_unmatched))} in all: "
                         + ", ".join(f"{n} ({t}: {why})" for n, t, _, why in self.onnxruntime_unmatched[:8])
                         + (", ..." if len(self.onnxruntime_unmatched) > 8 else ""))
        for o in self.not_scheduled:
            lines.append(f"WARNING: {o.name} ran TVM's default lowering, not a constructed kernel: {o.reason}")
        lines.append(self.pick_text())
        lines.append(self.check_text())
        tvm = (f"TVM default build {duration(self.tvm_default_seconds)} "
               f"({self.tvm_default_seconds / self.seconds:.2f}x)" if self.tvm_default_seconds is not None
               else f"TVM default build failed: {self.tvm_default_error}")
        lines.append(f"end to end: workbench ({self.kernel_threads} threads) {duration(self.seconds)}, "
                     f"ONNX Runtime ({self.threads} threads) {duration(self.onnxruntime_seconds)} "
                     f"({self.onnxruntime_seconds / self.seconds:.2f}x), "
                     f"{tvm} (x: their time over the workbench's)")
        return "\n".join(lines)


def run_model_report(mc: ModelConstruction, path: str | Path, rank: int = 1, seed: int = 0, *,
                     pick: str = "rank1", store=None, runner: str | Runner = "local",
                     progress: Progress | None = None, run_label: str = "") -> ModelRun:
    """Build every operator's kernel of rank `rank` (`pick="rank1"`) or its measured pick
    (`pick="measured"`: the top K of each distinct workload profiled with `runner` and recorded
    in `store` under `run_label` first, `execute.measured_pick`), run the model `mc` (constructed from the ONNX
    file `path`) on seeded random inputs, check it against ONNX Runtime and time it beside ONNX
    Runtime and TVM's default build. A model with symbolic dims runs at its bound values: the
    inputs have the bound shapes, which ONNX Runtime takes as they are and TVM's build imports.
    UserError for an unknown pick, a GPU device, a CPU whose instructions this one lacks (the
    kernels run in this process, where an illegal instruction would kill it), or without
    onnxruntime."""
    if pick not in PICKS:
        raise UserError(f"unknown pick '{pick}' (known: {', '.join(PICKS)})")
    if not mc.device.runs_on_cpu:
        raise UserError(f"running a model needs a CPU device, got {mc.device.name} ({mc.device.kind})")
    problem = cannot_run_locally(mc.device)
    if problem:
        raise UserError(f"cannot run {mc.device.name}'s kernels on this machine: {problem}")
    try:
        import onnxruntime
    except ImportError:
        raise UserError("running a model checks it against ONNX Runtime: pip install onnxruntime") from None
    path = Path(path)
    inputs = model_inputs(mc.model, seed)
    kernel_threads = pool_threads(mc.device)  # before any kernel runs: TVM sizes its pool once
    start = time.perf_counter()
    picks = (measured_pick(mc, inputs, runner=runner, store=store, progress=progress, run_label=run_label)
             if pick == "measured" else ())
    pick_seconds = time.perf_counter() - start if pick == "measured" else 0.0
    kernels = build_model_kernels(mc, rank, picks)
    planned = planned_run(mc, kernels, inputs)
    ours = planned.outputs
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = mc.device.compute_units
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    expected = session.run(None, inputs)
    errors = [float(np.max(np.abs(a - b))) if a.size else 0.0 for a, b in zip(ours, expected)]
    constant = constant_outputs(tuple(expected))
    match = not constant and all(a.shape == b.shape and np.allclose(a, b, rtol=RTOL, atol=ATOL)
                                 for a, b in zip(ours, expected))
    # in turn, so that a spell of the shared host's slowness slows both alike, each repeat after a
    # call that brings its weights back from where the other's run left them (`best_seconds_in_turn`)
    seconds, ort_seconds = best_seconds_in_turn((planned.call, lambda: session.run(None, inputs)),
                                                Timing(repeat=REPEAT), settle_s=SETTLE_S, warm=True)
    outputs, each = operators_alone(mc, kernels, inputs, REPEAT)
    tvm_seconds, tvm_error = _tvm_default(mc, path, inputs)
    names = [r.operator.name for r in mc.results]
    ort = ort_profile.profile(path, inputs, mc.device.compute_units, REPEAT,
                              list(zip(names, outputs)))
    picked = {name: p for p in picks for name in p.func_names}
    operators = tuple(OperatorTime(r.operator.name, t, r.predicted_seconds, k.scheduled, k.rank if k.scheduled else None,
                                   picked.get(r.operator.func_name), "" if k.scheduled else k.error,
                                   ort.seconds(r.operator.name), ort.nodes_of(r.operator.name), i in planned.in_place)
                      for i, (r, k, t) in enumerate(zip(mc.results, kernels, each)))
    times = {n.name: n for n in ort.nodes}
    unmatched = tuple((n, times[n].op_type, times[n].seconds, why) for n, why in ort.unmatched)
    return ModelRun(match, max(errors, default=0.0), seconds, ort_seconds, tvm_seconds, tvm_error, operators,
                    mc.device.compute_units, kernel_threads, pick, pick_seconds, picks, unmatched, constant)


def _tvm_default(mc: ModelConstruction, path: Path, inputs: dict) -> tuple[float | None, str]:
    """TVM's own build of the model's fused Relax module (the one the operators come from) for
    the device's LLVM target with its default schedules, exp, tanh and erf lowered as our kernels'
    are (`codegen.vector_math`); (None, why) when it fails."""
    import tvm
    from tvm import relax

    vector_math.register()
    try:
        proto, _ = read_onnx(path, mc.model.dim_values)  # symbolic dims bound as the model's
        mod = fused_module(proto, path.name)
        executable = relax.build(mod, target=tvm.target.Target(target_dict(mc.device)))
        vm = relax.VirtualMachine(executable, tvm.cpu())
        args = [tvm.runtime.tensor(inputs[name], tvm.cpu()) for name, _, _ in mc.model.inputs]
        return _best(lambda: vm["main"](*args)), ""
    except Exception as err:  # TVM raises many error types; the rest of the run stands
        return None, first_line(err)


def _best(call) -> float:
    """Best seconds per call, timed as the baselines are (`profile.baselines.best_seconds`:
    repeats long enough that a 40 us model is timed over many calls), after a warm-up call
    (first-call allocations, the thread pool's start)."""
    call()
    return best_seconds(call, Timing(repeat=REPEAT))
