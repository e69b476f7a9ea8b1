"""CandidateTable (the top-K rPrograms and the roofline) and PredictedVsMeasured (profile them on
this machine with a progress bar, then measured against predicted).

Both take a finished `Construction` (`pipeline.construct`, or `ConstructionStepper.construction`).
Link the measured times of a profile into the table with
`traitlets.dlink((profiler, "measured"), (table, "measured"))`.
"""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING

import ipywidgets as widgets
import traitlets

from workbench import pipeline
from workbench.errors import UserError
from workbench.fmt import duration, estimate_parts, progress_text
from workbench.pipeline import Candidate, Construction, ProfileResult, RunStore, Timing
from workbench.viz.figures import (
    compared_points,
    live_figure,
    predicted_vs_measured_figure,
    roofline_figure,
    roofline_points,
)
from workbench.widgets.plot import PlotView
from workbench.widgets.tables import html_table, message

if TYPE_CHECKING:  # annotations only
    from workbench.pipeline import ProgressEvent

QUICK = Timing(repeat=3, min_repeat_ms=20)  # a lesson's timing: a few repeats, short ones


def candidates_of(construction: Construction) -> tuple[Candidate, ...]:
    """The construction's candidates; UserError when there are none."""
    if not construction.candidates:
        raise UserError("the construction found no candidates: raise eps or top-K")
    return tuple(construction.candidates)


def rank_options(candidates) -> list[tuple[str, int]]:
    """Dropdown options: `#rank: predicted time` -> rank."""
    return [(f"#{c.rank}: predicted {duration(c.predicted_seconds)}", c.rank) for c in candidates]


class CandidateTable(widgets.VBox):
    """The candidates as a table (tiles per layer, predicted and measured time, bottleneck,
    grid, waves), a picker for one of them (`rank`), the model's estimate of the picked one
    (its stage times, and which parts were measured on the device and which modelled), and the
    device's roofline with them on it."""

    rank = traitlets.Int(1)
    measured = traitlets.Dict()  # rank -> best measured seconds

    def __init__(self, construction: Construction, measured: dict[int, float] | None = None):
        self.construction = construction
        self.by_rank = {c.rank: c for c in candidates_of(construction)}
        self.picker = widgets.Dropdown(options=rank_options(self.by_rank.values()), description="candidate")
        self.table, self.estimate = widgets.HTML(), widgets.HTML()
        self.roofline_view = PlotView()
        super().__init__(children=[self.picker, self.table, self.estimate, self.roofline_view])
        traitlets.link((self, "rank"), (self.picker, "value"))
        self.measured = dict(measured or {})
        self.observe(lambda _: self._render(), names=["rank", "measured"])
        self._render()

    @property
    def candidate(self) -> Candidate:
        """The picked candidate."""
        return self.by_rank[self.rank]

    @property
    def rows(self) -> list[dict]:
        """The table's rows: `pipeline.candidate_rows`, the dashboard's candidate table."""
        return pipeline.candidate_rows(list(self.by_rank.values()), measured=self.measured)

    def _render(self) -> None:
        c = self.construction
        note = f"<p>tiles per layer as {' x '.join(a.name for a in c.expr.axes)}; picked row highlighted</p>"
        self.table.value = note + html_table(self.rows, marked=[r == self.rank for r in self.by_rank])
        self.estimate.value = estimate_html(self.candidate)
        device = c.device
        points = roofline_points(list(self.by_rank.values()), device.layers[-1].name, self.measured)
        self.roofline_view.show(roofline_figure(device.ceilings(), c.peak_gflops, points))


def estimate_html(candidate: Candidate) -> str:
    """The model's summary of one candidate: predicted time, bottleneck, stage times, and its
    measured and modelled parts (`Estimate.measured` / `.modelled`, Vortex's hybrid analyzer)."""
    est = candidate.estimate
    loads = ", ".join(f"{layer} {duration(t)}" for layer, t in est.load_seconds)
    measured, modelled = estimate_parts(est)
    return (f"<p><b>#{candidate.rank}</b>: predicted {duration(est.predicted_seconds)}, bound by "
            f"{escape(est.bottleneck)}; compute {duration(est.compute_seconds)}"
            + (f", loads from {escape(loads)}" if loads else "") + "<br>"
            f"<b>measured on the device:</b> {escape(measured)}<br><b>modelled:</b> {escape(modelled)}</p>")


class PredictedVsMeasured(widgets.VBox):
    """Profile: build, check against numpy and time every candidate with `pipeline.profile`
    (runner "local" by default: this machine), an IntProgress fed by its progress events, then
    measured against predicted with the rank correlations.

    `measured` (rank -> best seconds of the correct kernels) and `result` (the `ProfileResult`)
    are set when a profile finishes; `store_path` records the run in a runs store (SQLite)."""

    measured = traitlets.Dict()
    result = traitlets.Instance(ProfileResult, allow_none=True)

    def __init__(self, construction: Construction, runner: str = "local", timing: Timing = QUICK,
                 store_path: str | None = None, workload_label: str = ""):
        self.construction = construction
        self.candidates = candidates_of(construction)
        self.runner, self.timing, self.store_path, self.workload_label = runner, timing, store_path, workload_label
        self.button = widgets.Button(description="Profile", icon="play", button_style="primary")
        self.progress = widgets.IntProgress(min=0, max=1, value=0, description="profile")
        self.progress_text = widgets.HTML()
        self.status = widgets.HTML(message(f"Press Profile to build, check and time {len(self.candidates)} candidates "
                                           f"({runner} runner)."))
        self.scatter_view = PlotView()
        super().__init__(children=[widgets.HBox([self.button, self.progress, self.progress_text]), self.status,
                                   self.scatter_view])
        self.button.on_click(lambda _: self.profile())

    def profile(self) -> ProfileResult | None:
        """Run the profile session (what the button does); None, with the reason shown, when
        the session could not start (bad runner or store)."""
        self.button.disabled = True
        try:
            result = self._session()
        except UserError as err:
            self.status.value = message(str(err), "error")
            return None
        finally:
            self.button.disabled = False
        self.result = result
        self.measured = {m.rank: m.best_seconds for m in result.measurements if m.ok}
        self._show(result)
        return result

    def _session(self) -> ProfileResult:
        n = len(self.candidates)
        # Every candidate is measured (a failed build too, as a failure); a runner that opens the
        # libraries builds them all first, and its first "build" event doubles the bar.
        self.progress.max, self.progress.value = n, 0
        built, arrived = False, []

        def report(event: ProgressEvent) -> None:
            nonlocal built
            if event.phase == "build" and not built:
                built, self.progress.max = True, 2 * n
            self.progress.value = event.done + (n if built and event.phase == "measure" else 0)
            self.progress_text.value = escape(progress_text(event)[:120])
            if event.measurement is not None:  # the scatter fills in as the measurements arrive
                arrived.append(event.measurement)
                self.scatter_view.show(live_figure(self.candidates, arrived))

        kwargs = {"label": self.workload_label, "timing": self.timing, "progress": report}
        if self.store_path is None:
            return pipeline.profile(self.construction, self.runner, **kwargs)
        with RunStore(self.store_path) as store:
            return pipeline.profile(self.construction, self.runner, store=store, **kwargs)

    def _show(self, result: ProfileResult) -> None:
        points = compared_points(result.candidates, result.measurements)
        self.scatter_view.show(predicted_vs_measured_figure(points))
        cmp = result.comparison
        ratio = "" if math.isnan(cmp.error_ratio) else f"; measured / predicted geomean {cmp.error_ratio:.3g}"
        lines = [message(f"{len(points)} candidates, {cmp.n} correct and timed in {result.seconds:.1f} s "
                         f"({result.runner} runner): {result.best_note()}{ratio}", "ok" if cmp.n else "error")]
        for note in (result.load_note(), result.noise_note()):
            if note:
                lines.append(message(note, "error"))
        failed = [{"rank": m.rank, "error": m.error} for m in result.measurements if not m.ok]
        diagnoses = pipeline.diagnosis_rows(result)
        self.status.value = ("".join(lines) + (html_table(diagnoses) if diagnoses else "")
                             + (html_table(failed) if failed else ""))
