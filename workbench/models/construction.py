"""Whole-model construction: every fused operator of an ONNX model constructed on one device,
its predicted time one kernel at a time, and the Rammer co-schedule of the whole model.

An operator that could not be mapped to a TensorExpr (or got no candidate) is listed with its
reason, named again under `not_constructed` (and in the text's last line), and left out of the
predicted times: the co-schedule passes its dependencies through (a consumer waits for the
operators the unsupported one waited for), so the rest still forms a valid plan. Both whole-model
times include the device's kernel launches (`DeviceSpec.launch_overhead_us`): one per kernel
one at a time, one for the co-schedule's rProgram (`rammer`). A model with symbolic dims is
constructed at their bound values; the report lists, per dim, the operators that depend on it
and the `workbench vortex compile` line of each matmul among them (`symbolic.py`). `report_dict`
is the JSON document of `workbench model` (shared/design/CLI.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from workbench.construct.space import Options
from workbench.construct.step import Candidate
from workbench.construct.stepper import POLICIES, Construction, construct
from workbench.errors import UserError
from workbench.fmt import duration
from workbench.hardware.spec import DeviceSpec
from workbench.models.onnx_import import ImportedModel, Operator
from workbench.models.rammer import Plan, ROperator, rkernel, schedule
from workbench.models.symbolic import SymbolicDim, vortex_command


@dataclass(frozen=True)
class OperatorResult:
    operator: Operator
    construction: Construction | None  # None when the operator is unsupported
    error: str = ""  # why the construction refused a mapped operator

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        return self.construction.candidates if self.construction is not None else ()

    @property
    def supported(self) -> bool:
        return bool(self.candidates)

    @property
    def reason(self) -> str:
        if self.supported:
            return ""
        return self.operator.reason or self.error or "the construction emitted no candidate"

    @property
    def predicted_seconds(self) -> float | None:
        """The fastest candidate's predicted time (rank 1), None when unsupported."""
        return self.candidates[0].predicted_seconds if self.candidates else None


@dataclass(frozen=True)
class ModelConstruction:
    model: ImportedModel
    device: DeviceSpec
    policy: str
    results: tuple[OperatorResult, ...]  # one per operator, in dataflow order
    plan: Plan
    seconds: float  # construction time of all operators (repeated PrimFuncs constructed once)

    @property
    def sum_seconds(self) -> float:
        """Predicted time running the supported operators' fastest kernels one by one, each
        launched on its own (the plan's sequential baseline, launches included)."""
        return sum(r.predicted_seconds + self.device.launch_seconds for r in self.results if r.supported)

    @property
    def rammer_gain(self) -> float:
        """One kernel at a time over the co-schedule (1.0 for an empty model)."""
        return self.sum_seconds / self.plan.seconds if self.plan.seconds > 0 else 1.0


def construct_model(
    model: ImportedModel, device: DeviceSpec, policy: str = "roller", options: Options = Options()
) -> ModelConstruction:
    """Construct every supported operator of `model` and co-schedule the results."""
    if policy not in POLICIES:  # checked once here: per operator it would list every one as refused
        raise UserError(f"unknown policy '{policy}' (known: {', '.join(sorted(POLICIES))})")
    start = time.perf_counter()
    cache: dict[str, OperatorResult] = {}  # an operator called twice is the same PrimFunc
    results = []
    for op in model.operators:
        if op.expr is None:
            results.append(OperatorResult(op, None))
            continue
        if op.func_name not in cache:
            cache[op.func_name] = _construct(op, device, policy, options)
        first = cache[op.func_name]
        results.append(OperatorResult(op, first.construction, first.error))
    seconds = time.perf_counter() - start
    plan = schedule(roperators(results, device.compute_units), device.compute_units, device.launch_seconds)
    return ModelConstruction(model, device, policy, tuple(results), plan, seconds)


def _construct(op: Operator, device: DeviceSpec, policy: str, options: Options) -> OperatorResult:
    """One operator's construction; an operator the construction refuses is listed, not fatal."""
    try:
        return OperatorResult(op, construct(op.expr, device, policy, options))
    except UserError as err:
        return OperatorResult(op, None, str(err))


def roperators(results, units: int) -> tuple[ROperator, ...]:
    """The supported operators as rOperators; edges through unsupported operators are kept."""
    index: dict[int, int] = {}  # model operator -> rOperator
    reach: dict[int, frozenset[int]] = {}  # model operator -> rOperators it (transitively) waits for
    out = []
    for r in results:
        op = r.operator
        preds = frozenset().union(*(({index[p]} if p in index else reach[p]) for p in op.preds))
        if not r.supported:
            reach[op.index] = preds
            continue
        kernels = tuple(rkernel(c.rank, c.program.grid, c.predicted_seconds, units) for c in r.candidates)
        index[op.index] = len(out)
        out.append(ROperator(op.name, tuple(sorted(preds)), kernels))
    return tuple(out)


def report_dict(mc: ModelConstruction) -> dict:
    """The JSON document of `workbench model PATH.onnx` (shared/design/CLI.md)."""
    ops = {r.operator.index: r.operator for r in mc.results}
    return {
        "model": mc.model.name,
        "device": mc.device.name,
        "policy": mc.policy,
        "construct_seconds": mc.seconds,
        "inputs": [{"name": n, "shape": list(s), "dtype": d} for n, s, d in mc.model.inputs],
        "operators": [_operator_dict(r, ops) for r in mc.results],
        "predicted_seconds": {"sum": mc.sum_seconds, "coscheduled": mc.plan.seconds},
        # what both predicted totals include besides the kernels: a launch per kernel one at a
        # time, one for the co-schedule's rProgram; its source is the spec's
        "launch_overhead": {"seconds_per_launch": mc.device.launch_seconds, "sum_launches": mc.plan.sequential_launches,
                            "coscheduled_launches": mc.plan.launches,
                            "source": dict(mc.device.sources).get("launch_overhead_us", "")},
        # what the predicted times leave out: every operator without candidates, by name
        "not_constructed": [{"name": r.operator.name, "kind": r.operator.kind, "reason": r.reason}
                            for r in mc.results if not r.supported],
        "schedule": plan_dict(mc.plan, [r.operator.name for r in mc.results if r.supported]),
        # the inputs' symbolic dims as bound (`--dim`), the operators whose shapes depend on each
        # (None: could not be told, `note` says why) and the Vortex workloads among them
        "symbolic_dims": {d.name: _dim_dict(d, mc.device.name) for d in mc.model.dims},
    }


def _dim_dict(dim: SymbolicDim, device: str) -> dict:
    return {
        "value": dim.value,
        "default": dim.default,
        "operators": None if dim.operators is None else list(dim.operators),
        "note": dim.note,
        "vortex": [{"operator": w.operator, "dynamic": w.dynamic or None, "value": w.value if w.params else None,
                    "command": vortex_command(w, device) or None, "reason": w.reason} for w in dim.matmuls],
    }


def _operator_dict(r: OperatorResult, ops: dict[int, Operator]) -> dict:
    op = r.operator
    return {
        "name": op.name,
        "kind": op.kind,
        "main_block": op.expr.main_block if op.expr is not None else "",
        "inputs": [_arg_label(a, ops) for a in op.args],
        "shapes": {"inputs": [list(a.shape) for a in op.args], "outputs": [list(shape) for shape, _ in op.outputs]},
        "candidates": [c.to_dict() for c in r.candidates],
        "predicted_seconds": r.predicted_seconds,
        "supported": r.supported,
        "reason": r.reason,
    }


def _arg_label(arg, ops: dict[int, Operator]) -> str:
    """An argument as the dashboard draws it: the producing operator (`NAME[i]` for output i of
    a multi-output one), `input:NAME` or `constant`."""
    if arg.source == "operator":
        producer = ops[arg.ref]
        return producer.name if len(producer.outputs) == 1 else f"{producer.name}[{arg.item}]"
    return f"input:{arg.ref}" if arg.source == "input" else "constant"


def plan_dict(plan: Plan, names: list[str]) -> dict:
    """JSON form of a co-schedule; `names[i]` names rOperator i."""
    return {
        "veus": plan.veus,
        "predicted_seconds": plan.seconds,
        "sequential_seconds": plan.sequential_seconds,
        "launch_seconds": plan.launch_seconds,
        "waves": [
            {
                "index": w.index,
                "selection": w.selection,
                "start": w.start,
                "end": w.end,
                "operators": [{"name": names[o], "rank": k} for o, k in zip(w.ops, w.ranks)],
                "tasks": [
                    {"operator": names[p.op], "task": p.task, "veu": p.veu, "start": p.start, "end": p.end}
                    for p in w.placements
                ],
            }
            for w in plan.waves
        ],
    }


def report_text(doc: dict) -> str:
    """The human-readable form of a `report_dict` document (the CLI without --json)."""
    ops = doc["operators"]
    built = sum(op["supported"] for op in ops)
    lines = [f"{doc['model']} on {doc['device']} ({doc['policy']}): {len(ops)} operators, {built} constructed "
             f"in {doc['construct_seconds']:.2f} s"]
    lines += _dims_text(doc.get("symbolic_dims", {}))
    for i, op in enumerate(ops):
        if op["supported"]:
            best = op["candidates"][0]
            lines.append(f"{i:3d} {op['name'][:40]:40s} {op['kind']:15s} {len(op['candidates']):3d} candidates "
                         f"{duration(best['predicted_seconds']):>10s}  grid {best['grid']}")
        else:
            lines.append(f"{i:3d} {op['name'][:40]:40s} {op['kind']:15s} unsupported: {op['reason']}")
    total, plan = doc["predicted_seconds"], doc["schedule"]
    launch = doc["launch_overhead"]
    gain = total["sum"] / total["coscheduled"] if total["coscheduled"] > 0 else 1.0
    lines.append(f"predicted {duration(total['sum'])} one kernel at a time ({launch['sum_launches']} launches), "
                 f"{duration(total['coscheduled'])} co-scheduled ({len(plan['waves'])} waves on {plan['veus']} vEUs, "
                 f"{launch['coscheduled_launches']} launch): {gain:.2f}x; "
                 f"a launch {duration(launch['seconds_per_launch'])} included in both")
    missing = doc["not_constructed"]
    if missing:
        lines.append(f"WARNING: {len(missing)} of {len(ops)} operators not constructed and left out of the predicted "
                     "times; they run TVM's default lowering:")
        lines += [f"WARNING:   {m['name']}: {m['reason']}" for m in missing]
    return "\n".join(lines)


def _dims_text(dims: dict) -> list[str]:
    """The symbolic dims' lines: each one's value (saying which were defaults), the operators
    that depend on it, the Vortex command of each matmul among them or why there is none."""
    if not dims:
        return []
    values = [f"{n}={d['value']}" + (f" (default; --dim {n}=N to choose)" if d["default"] else "")
              for n, d in dims.items()]
    lines = ["symbolic dims: " + ", ".join(values)]
    for name, d in dims.items():
        if d["operators"] is None:
            lines.append(f"  {name}: {d['note']}")
            continue
        lines.append(f"  {name}: {len(d['operators'])} operators depend on it"
                     + (": " + ", ".join(d["operators"]) if d["operators"] else ""))
        for w in d["vortex"]:
            lines.append(f"    {w['operator']}: {w['dynamic']}={w['value']} at this binding; {w['command']}" if w["command"]
                         else f"    {w['operator']}: no Vortex command ({w['reason']})")
    return lines
