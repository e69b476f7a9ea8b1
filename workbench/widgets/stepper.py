"""ConstructionStepper: step a construction policy forwards and back and watch the graph grow.

The widget mirrors the core `Stepper` (`pipeline.stepper`) in one trait, `position` (steps taken
from the start): the buttons, the slider and the Play control all set it, and every change seeks
the core stepper and redraws from it. The construction is finished first (`Stepper.finish()`,
milliseconds for the sizes of a lesson; the cursor stays at the start), so the slider spans every
step; replaying a recorded step is free and deterministic (the Markov walk is seeded), so stepping
back and forth shows exactly what the policy did.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

import ipywidgets as widgets
import traitlets

from workbench import pipeline
from workbench.fmt import tile_text
from workbench.pipeline import Candidate, Construction, DeviceSpec, Options
from workbench.viz.figures import first_steps, graph_figure, state_tiles
from workbench.widgets.plot import PlotView
from workbench.widgets.tables import html_table
from workbench.widgets.tiles import TileView

if TYPE_CHECKING:  # annotations only
    from workbench.pipeline import Step, TensorExpr, Workload

PLAY_INTERVAL_MS = 700  # one step per interval while playing: time to read the step's note
DEFAULT_OPTIONS = Options()


def _button(description: str, icon: str) -> widgets.Button:
    return widgets.Button(description=description, icon=icon, layout=widgets.Layout(width="auto"))


class ConstructionStepper(widgets.VBox):
    """Back / Next / Play / Reset over one construction (`policy` "roller" or "markov") of a
    workload on a device, given as `pipeline.request` takes them (a TensorExpr, a Workload or
    `SUITE:ID`; a DeviceSpec, a preset name or a spec file). `construction` is the finished one.

    Shows the construction graph up to the current step, the step's action and note, every
    alternative it chose among with its reuse score (Roller) or benefit and probability (Markov),
    the temperature of a Markov step, and the step's rTiles (`tile_view`).
    """

    position = traitlets.Int(0)
    total = traitlets.Int(0, read_only=True)
    temperature = traitlets.Float(None, allow_none=True, read_only=True)

    def __init__(self, expr_or_workload: TensorExpr | Workload | str, device: DeviceSpec | str, policy: str = "roller",
                 options: Options = DEFAULT_OPTIONS, position: int = 0):
        req = pipeline.request(expr_or_workload, device, policy, options)
        self.stepper = pipeline.stepper(req)
        self.construction: Construction = self.stepper.finish()  # the cursor stays at the start
        self.set_trait("total", self.construction.steps)
        self.reset_button, self.back_button = _button("Reset", "fast-backward"), _button("Back", "step-backward")
        self.next_button, self.end_button = _button("Next", "step-forward"), _button("End", "fast-forward")
        self.play = widgets.Play(min=0, max=self.total, interval=PLAY_INTERVAL_MS, description="Play")
        self.slider = widgets.IntSlider(min=0, max=self.total, description="step", continuous_update=False,
                                        layout=widgets.Layout(width="420px"))
        self.heading, self.step_html, self.alternatives = widgets.HTML(self._heading()), widgets.HTML(), widgets.HTML()
        self.graph_view = PlotView()
        self.tile_view = TileView(self.stepper.space.expr, req.device)
        controls = [self.reset_button, self.back_button, self.play, self.next_button, self.end_button, self.slider]
        super().__init__(children=[self.heading, widgets.HBox(controls), self.step_html, self.graph_view,
                                   self.alternatives, self.tile_view])
        self.reset_button.on_click(lambda _: self._go(0))
        self.back_button.on_click(lambda _: self._go(self.position - 1))
        self.next_button.on_click(lambda _: self._go(self.position + 1))
        self.end_button.on_click(lambda _: self._go(self.total))
        self.position = position  # clamped by `_clamp`
        traitlets.link((self, "position"), (self.slider, "value"))
        traitlets.link((self, "position"), (self.play, "value"))
        self.observe(lambda _: self._render(), names="position")
        self._render()

    @traitlets.validate("position")
    def _clamp(self, proposal) -> int:
        return max(0, min(int(proposal["value"]), self.total))

    @property
    def current(self) -> Step | None:
        """The step shown (None at the start)."""
        return self.stepper.current

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        """The top-K of the whole construction (`construction.candidates`), wherever the position is."""
        return self.construction.candidates

    def _go(self, position: int) -> None:
        self.position = position

    def _render(self) -> None:
        s = self.stepper
        s.seek(self.position)
        step = s.current
        self.set_trait("temperature", step.temperature if step is not None else None)
        self.step_html.value = self._step_text(step)
        self.alternatives.value = self._alternatives_table(step)
        current = step.node.key if step is not None and step.node is not None else None
        markov = s.policy_name == "markov"
        self.graph_view.show(graph_figure(s.graph(), first_steps(s.steps[: s.position]), current, visits_as_size=markov))
        self.tile_view.tiles = state_tiles(step.state if step is not None else None, s.space.n_tile_layers)
        for button, disabled in ((self.reset_button, s.position == 0), (self.back_button, s.position == 0),
                                 (self.next_button, s.position == self.total), (self.end_button, s.position == self.total)):
            button.disabled = disabled

    def _heading(self) -> str:
        s = self.stepper
        expr = s.space.expr
        params = ", ".join(f"{k}={v}" for k, v in expr.params)
        axes = ", ".join(f"{a.name}={a.extent}{'' if a.kind == 'spatial' else ' (reduce)'}" for a in expr.axes)
        return (f"<b>{escape(expr.op)}</b> {escape(params)} on <b>{escape(s.space.device.name)}</b> by "
                f"<b>{escape(s.policy_name)}</b>: axes {escape(axes)}; {self.total} steps, "
                f"{len(self.candidates)} candidates")

    def _step_text(self, step: Step | None) -> str:
        s = self.stepper
        where = f"<b>Step {s.position}</b> of {self.total}"
        if step is None:
            return f"<p>{where}: at the start. Press <b>Next</b> (or Play) to take the first step.</p>"
        what = escape(step.action.describe(s.space.axes, s.space.layer_names))
        temperature = f" (temperature {step.temperature:.3g})" if step.temperature is not None else ""
        return f"<p>{where}: <code>{what}</code>{temperature}: {escape(step.note)}</p>"

    def _alternatives_table(self, step: Step | None) -> str:
        if step is None or not step.alternatives:
            return "<p><i>This step chose among no alternatives.</i></p>"
        s = self.stepper
        score = "benefit" if s.policy_name == "markov" else "reuse score"
        rows = [
            {"action": a.action.describe(s.space.axes, s.space.layer_names), "tile": tile_text(s.space.axes, a.tile),
             score: a.score, "probability": a.probability, "note": a.note or None}
            for a in step.alternatives
        ]
        caption = "<p><b>Alternatives</b> (the chosen one highlighted)</p>"
        return caption + html_table(rows, marked=[a.note == "chosen" for a in step.alternatives])
