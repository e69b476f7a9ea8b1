"""ModelView: every operator of an ONNX model constructed on one device, with its predicted time
and whether its compute term was measured or modelled, and the Rammer co-schedule of the whole
model as a Gantt chart of vEUs."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

import ipywidgets as widgets
import traitlets

from workbench import pipeline
from workbench.fmt import duration, time_columns
from workbench.pipeline import POLICIES, DeviceSpec, ModelConstruction, Options
from workbench.viz.figures import gantt_figure, operator_times_figure
from workbench.widgets.plot import PlotView
from workbench.widgets.tables import html_table

if TYPE_CHECKING:  # annotations only
    from workbench.pipeline import ImportedModel

MODEL_OPTIONS = Options(topk=3)  # the co-schedule picks among a few rKernels per operator


class ModelView(widgets.VBox):
    """A model (an .onnx path or an `ImportedModel`) on `device`: switching `policy` constructs
    again; `result` is the core `ModelConstruction` shown."""

    policy = traitlets.Unicode("roller")
    result = traitlets.Instance(ModelConstruction, allow_none=True)

    def __init__(self, model: ImportedModel | str | Path, device: DeviceSpec | str, policy: str = "roller",
                 options: Options = MODEL_OPTIONS):
        self.model = model  # an .onnx path until the first construction imports it
        self.device, self.options = pipeline.load_device(device), options
        self.policy_buttons = widgets.ToggleButtons(options=sorted(POLICIES), value=policy, description="policy")
        self.summary, self.operators = widgets.HTML(), widgets.HTML()
        self.times_view, self.gantt_view = PlotView(), PlotView()
        super().__init__(children=[self.policy_buttons, self.summary, self.operators, self.times_view, self.gantt_view])
        self.policy = policy
        traitlets.link((self, "policy"), (self.policy_buttons, "value"))
        self.observe(lambda _: self._construct(), names="policy")
        self._construct()

    def _construct(self) -> None:
        self.result = pipeline.construct_model(self.model, self.device, self.policy, self.options)
        self.model = self.result.model  # imported once: a policy switch constructs again, nothing more
        doc = pipeline.report_dict(self.result)
        ops = doc["operators"]
        best = [op["candidates"][0]["estimate"] if op["supported"] else None for op in ops]
        rows = [
            {"#": i, "operator": op["name"], "kind": op["kind"], "candidates": len(op["candidates"]),
             "predicted us": op["predicted_seconds"] * 1e6 if op["supported"] else None,
             "compute": _compute(est) if est is not None else None,
             "grid": op["candidates"][0]["grid"] if op["supported"] else None, "unsupported": op["reason"] or None}
            for i, (op, est) in enumerate(zip(ops, best))
        ]
        shown, _ = time_columns(rows)  # `predicted (us)` in one unit chosen from the times, as the dashboard's table
        self.operators.value = html_table(shown, marked=[not op["supported"] for op in ops])
        plan = self.result.plan
        built = sum(op["supported"] for op in ops)
        self.summary.value = (
            f"<p><b>{escape(doc['model'])}</b> on <b>{escape(doc['device'])}</b> ({escape(self.policy)}): {len(ops)} "
            f"operators, {built} constructed in {doc['construct_seconds']:.2f} s. Predicted "
            f"{duration(self.result.sum_seconds)} one kernel at a time, {duration(plan.seconds)} co-scheduled in "
            f"{len(plan.waves)} waves on {plan.veus} vEUs.</p>" + _provenance([e for e in best if e is not None])
        )
        self.times_view.show(operator_times_figure(
            [op["name"] for op in ops], [op["kind"] for op in ops], [op["predicted_seconds"] for op in ops],
            [op["reason"] for op in ops],
        ))
        self.gantt_view.show(gantt_figure(plan, [op["name"] for op in ops if op["supported"]]))


def _compute(estimate: dict) -> str:
    """Whether an estimate's compute term was measured (a calibrated level-0 micro-kernel) or
    modelled, as `pipeline.candidate_rows` says it."""
    return "measured" if any(p.startswith("compute") for p in estimate["measured"]) else "modelled"


def _provenance(estimates: list[dict]) -> str:
    """The model summary's line on what was measured and what modelled over the operators' best
    candidates (`Estimate.measured` / `.modelled`): for how many the compute term was measured,
    and the other parts measured, and modelled, for every one of them."""
    if not estimates:
        return ""
    measured = sum(_compute(e) == "measured" for e in estimates)
    compute = (f"measured (a calibrated register micro-kernel) for {measured} of {len(estimates)} operators, modelled "
               "for the others" if measured else "modelled for every operator")

    def everywhere(kind: str) -> str:
        shared = [p for p in estimates[0][kind] if not p.startswith("compute") and all(p in e[kind] for e in estimates)]
        return escape("; ".join(shared) or "nothing")

    return (f"<p>The compute term of each operator's best candidate: {compute}. For every operator, measured on "
            f"the device: {everywhere('measured')}; modelled: {everywhere('modelled')}.</p>")
