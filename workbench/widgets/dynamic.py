"""DispatchSlider: Vortex's run-time dispatcher as a slider over the dynamic extent: the kernel
it picks at the value, why (each kept kernel's padded extent and predicted time there), the
predicted curves with the pick on them, and, for a compiled bundle, the pick run and measured."""

from __future__ import annotations

import ipywidgets as widgets
import traitlets

from workbench import pipeline
from workbench.fmt import duration
from workbench.viz.figures import MeasuredPoint, dynamic_figure
from workbench.widgets.plot import PlotView
from workbench.widgets.tables import html_table, message


class DispatchSlider(widgets.VBox):
    """A slider over the plan's dynamic extent (`pipeline.VortexPlan`, 1 to its largest value)
    that shows the kernel `pipeline.vortex_pick` chooses at `value` and its predicted time, the
    plan's kernels at that value (the pick highlighted), and the curves with the pick as a star.

    With `bundle` (`pipeline.vortex_compile` / `vortex_load`; its plan: `pipeline.vortex_bundle_plan`), **Run**
    (or `run()`) runs the bundle at the value (`pipeline.vortex_run`: dispatched, verified,
    timed); every run stays on the figure as a measured point, and `measured` maps each value
    run to its measured seconds (None when the result was wrong).
    """

    value = traitlets.Int(1)
    kernel = traitlets.Unicode("", read_only=True)
    predicted = traitlets.Float(0.0, read_only=True)
    measured = traitlets.Dict()

    def __init__(self, plan: pipeline.VortexPlan, bundle=None, value: int = 1, samples=pipeline.DIETCODE_SAMPLES):
        self.plan, self.bundle, self.samples = plan, bundle, tuple(samples)
        self.runs: list[MeasuredPoint] = []
        self.curves = {k: row for (k, _), row in zip(plan.table.kernels, plan.curves)}
        param = plan.dyn.param
        self.slider = widgets.IntSlider(min=1, max=plan.values[-1], description=param, continuous_update=False,
                                        layout=widgets.Layout(width="520px"))
        self.run_button = widgets.Button(description="Run", icon="play", disabled=bundle is None,
                                         tooltip="run the bundle at this value, verified and timed" if bundle else
                                         "no compiled bundle given: predictions only")
        self.pick_html, self.kernels_html, self.status = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.figure_view = PlotView()
        super().__init__(children=[widgets.HBox([self.slider, self.run_button]), self.pick_html, self.status,
                                   self.figure_view, self.kernels_html])
        self.value = value  # clamped by `_clamp`; drawn once, below
        traitlets.link((self, "value"), (self.slider, "value"))
        self.run_button.on_click(lambda _: self.run())
        self.observe(lambda _: self._render(), names="value")
        self._render()

    @traitlets.validate("value")
    def _clamp(self, proposal) -> int:
        return max(1, min(int(proposal["value"]), self.plan.values[-1]))

    def run(self) -> dict | None:
        """Run the bundle at the current value (`pipeline.vortex_run`), add the measured point
        and return its result; None without a bundle."""
        if self.bundle is None:
            self.status.value = message("No compiled bundle: give DispatchSlider(plan, bundle) to measure.", "error")
            return None
        result = pipeline.vortex_run(self.bundle, self.value)
        point = MeasuredPoint(self.value, result["kernel"], result["measured_seconds"], result["correct"])
        self.runs = [p for p in self.runs if p.value != point.value] + [point]
        self.measured = {**self.measured, self.value: result["measured_seconds"]}
        if result["correct"]:
            self.status.value = message(f"Ran {result['kernel']} at {self.plan.dyn.param}={self.value}: measured "
                                        f"{duration(result['measured_seconds'])}, predicted "
                                        f"{duration(result['predicted_seconds'])}, verified against numpy.", "ok")
        else:
            self.status.value = message(f"{result['kernel']} at {self.value} gave a wrong result: {result['error']}", "error")
        self._render()
        return result

    def _render(self) -> None:
        plan, v = self.plan, self.value
        kernel, seconds = pipeline.vortex_pick(plan, v)
        self.set_trait("kernel", kernel)
        self.set_trait("predicted", seconds)
        param = plan.dyn.param
        ran = self.measured.get(v, False)
        measured = "" if ran is False else (f", measured {duration(ran)}" if ran is not None else ", measured: wrong result")
        self.pick_html.value = (f"<p>At <b>{param}={v}</b> the dispatcher picks <b>{kernel}</b>: outer tile "
                                f"{plan.outer(kernel)}, runs {param}={plan.padded(kernel, v)}, predicted "
                                f"<b>{duration(seconds)}</b>{measured}.</p>")
        ids = [k for k, _ in plan.table.kernels]
        rows = [{"kernel": k, "tiles": str(p.tiles), "outer tile": plan.outer(k), f"runs {param}": plan.padded(k, v),
                 "predicted": duration(plan.seconds(k, v))} for k, p in plan.table.kernels]
        self.kernels_html.value = html_table(rows, marked=[k == kernel for k in ids])
        self.figure_view.show(dynamic_figure(plan.values, self.curves, param, self.samples, self.runs,
                                             picked=(v, kernel, seconds)))
