"""What-if hardware in a notebook: DeviceEditor (every field of a device as an input beside its
base value, the edited spec in `edited`), WhatIf (the editor and the diff of one workload's
construction, or a suite's predicted times, on the base and the edited spec) and SweepView (one
field over a range: predicted time per workload as curves, the top-1 changes marked).

Thin over the core: edits go through `pipeline.edit_device`, diffs through `pipeline.whatif`,
sweeps through `pipeline.whatif_sweep`; figures and rows come from `viz.whatif`.

    from workbench.widgets import WhatIf
    w = WhatIf("cpu-core:mm-512", "a100")
    w.editor.set("shared.capacity_bytes", 98304)
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

import ipywidgets as widgets
import traitlets

from workbench import pipeline
from workbench.errors import UserError
from workbench.fmt import time_columns
from workbench.pipeline import DeviceSpec, EditedSpec, FieldInfo, Options
from workbench.viz.figures import field_groups, field_text, suite_figure, suite_rows, sweep_figure, sweep_rows, top_rows
from workbench.widgets.plot import PlotView
from workbench.widgets.stepper import ConstructionStepper
from workbench.widgets.tables import html_table, message

if TYPE_CHECKING:  # annotations only
    from workbench.pipeline import TensorExpr, Workload
    from workbench.whatif import SweepResult, WorkloadDiff

_WIDE = widgets.Layout(width="340px")
_DESCRIPTION = {"description_width": "190px"}


def _text(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _input(f: FieldInfo) -> widgets.Widget:
    """The input of one field: bounded where the loader bounds it, an integer or a float."""
    common = {"value": f.value, "description": f.name, "style": _DESCRIPTION, "layout": _WIDE}
    if f.kind == "text":
        return widgets.Text(continuous_update=False, **common)
    if f.low is None:
        return (widgets.IntText if f.kind == "int" else widgets.FloatText)(continuous_update=False, **common)
    kind = int if f.kind == "int" else float
    box = widgets.BoundedIntText if f.kind == "int" else widgets.BoundedFloatText
    return box(min=kind(f.low), max=kind(f.high), continuous_update=False, **common)


def _note(f: FieldInfo, follows: object = None) -> str:
    """A field's base value and its bounds where the loader bounds it; first its value on the
    edited device where it follows from the edit (`follows`, an `EditedSpec.derived` value)."""
    bounds = f" ({field_text(f.low, f.unit)} .. {field_text(f.high, f.unit)})" if f.low is not None else ""
    now = f"<b>{escape(field_text(follows, f.unit))}</b> on the edited device (follows the edit), " if follows is not None else ""
    return f"<small>{now}base {escape(field_text(f.value, f.unit))}{escape(bounds)}</small>"


def _workloads(workloads) -> tuple:
    """One workload (a Workload, TensorExpr or `SUITE:ID`), a suite by name, or a sequence of them."""
    if isinstance(workloads, str) and ":" not in workloads:
        return tuple(pipeline.suite(workloads)[1])
    return tuple(workloads) if isinstance(workloads, (list, tuple)) else (workloads,)


class DeviceEditor(widgets.VBox):
    """Every editable field of `device` (a spec, preset name or spec file) as an input, grouped
    ([device] numbers, peak compute, target, one group per memory layer), each beside its base
    value, unit and bounds. `edited` is the edited spec (`pipeline.edit_device`; None while no
    field differs from the base); `error` says why the last edit was refused (the inputs then
    keep what was typed, `edited` the last accepted spec)."""

    edited = traitlets.Any(None, allow_none=True, read_only=True)
    error = traitlets.Unicode("", read_only=True)

    def __init__(self, device: DeviceSpec | str, edits: Sequence[str] = ()):
        self.base = pipeline.load_device(device)
        groups = field_groups(pipeline.editable_fields(self.base))
        self.fields = {f.name: f for members in groups.values() for f in members}
        self.inputs = {name: _input(f) for name, f in self.fields.items()}
        self.notes = {name: widgets.HTML(_note(f)) for name, f in self.fields.items()}
        boxes = [widgets.VBox([widgets.HBox([self.inputs[f.name], self.notes[f.name]]) for f in members])
                 for members in groups.values()]
        self.accordion = widgets.Accordion(boxes, titles=tuple(groups))
        self.name_html, self.message_html = widgets.HTML(), widgets.HTML()
        self.reset_button = widgets.Button(description="Reset to the base spec", layout=widgets.Layout(width="auto"))
        super().__init__(children=[self.name_html, self.accordion, self.reset_button, self.message_html])
        self.reset_button.on_click(lambda _: self.reset())
        for edit in edits:
            name, value = self._resolved(edit)
            self.inputs[name].value = value
        for box in self.inputs.values():
            box.observe(lambda _: self._update(), names="value")
        self._update()

    def _resolved(self, edit: str) -> tuple[str, object]:
        """(the field's name, the value its input holds) of a `FIELD=VALUE` edit: the name as
        `editable_fields` gives it, a size or a factor resolved; UserError for a bad one."""
        change = pipeline.edit_device(self.base, [edit]).changes[0]
        return change.field, change.after

    @property
    def edits(self) -> tuple[str, ...]:
        """The inputs that differ from the base, as `FIELD=VALUE` edits."""
        return tuple(f"{name}={_text(box.value)}" for name, box in self.inputs.items()
                     if box.value != self.fields[name].value)

    def set(self, field: str, value) -> None:
        """Set one field's input to `value` (a number, or an edit's text such as `2MiB` or
        `0.5x`, resolved against the base); UserError for a bad field or value."""
        name, resolved = self._resolved(f"{field}={value}")
        self.inputs[name].value = resolved

    def reset(self) -> None:
        """Every input back to the base value."""
        for name, box in self.inputs.items():
            box.value = self.fields[name].value

    def _update(self) -> None:
        edits = self.edits
        try:
            edited = pipeline.edit_device(self.base, edits) if edits else None
        except UserError as err:
            self.set_trait("error", str(err))
            self.message_html.value = message(str(err), "error")
            return
        self.set_trait("error", "")
        self.message_html.value = ""
        self.set_trait("edited", edited)
        follows = {c.field: c.after for c in edited.derived} if edited else {}
        for name, note in self.notes.items():
            note.value = _note(self.fields[name], follows.get(name))
        self.name_html.value = (f"<b>{escape(edited.spec.name)}</b>: {escape(', '.join(edits))}" if edited
                                else f"<b>{escape(self.base.name)}</b> (no field edited)")

    def save(self, path) -> None:
        """Write the edited spec as a TOML spec file (`load_spec(path)` reads it back)."""
        if self.edited is None:
            raise UserError("no field is edited: nothing to save")
        Path(path).write_text(self.edited.toml)


class WhatIf(widgets.VBox):
    """A DeviceEditor and what its edit does to `workloads` (one workload, a suite by name, or a
    sequence; `pipeline.whatif`): for one, the top-K on both specs side by side, the first
    construction step where they diverge, and what changed in words; for several, predicted
    time per workload base vs edited, the changed top-1s starred, and a table. `diffs` holds
    the core's `WorkloadDiff`s of the current edit (empty while none)."""

    diffs = traitlets.Tuple(read_only=True)

    def __init__(self, workloads: Workload | TensorExpr | str | Sequence, device: DeviceSpec | str, policy: str = "roller",
                 options: Options = Options(), edits: Sequence[str] = ()):
        self.workloads, self.policy, self.options = _workloads(workloads), policy, options
        self.editor = DeviceEditor(device, edits)
        self.summary, self.base_table, self.edited_table = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.figure_view = PlotView()
        sides = widgets.HBox([self.base_table, self.edited_table], layout=widgets.Layout(grid_gap="24px"))
        super().__init__(children=[self.editor, self.summary, sides, self.figure_view])
        self.editor.observe(lambda _: self._render(), names="edited")
        self._render()

    @property
    def diff(self) -> WorkloadDiff | None:
        """The one workload's diff (None while no field is edited, or for several workloads)."""
        return self.diffs[0] if len(self.diffs) == 1 and len(self.workloads) == 1 else None

    def stepper(self, edited: bool = True) -> ConstructionStepper:
        """A ConstructionStepper of the one workload on the edited (or the base) spec, at the
        step where the two walks part (`walks_part_at`; at the end where they do not)."""
        d = self.diff
        if d is None:
            raise UserError("edit a field of one workload's device first")
        spec = self.editor.edited.spec if edited else self.editor.base
        step = d.walks_part_at if d.walks_part_at is not None else (d.edited if edited else d.base).steps
        return ConstructionStepper(self.workloads[0], spec, self.policy, self.options, position=step)

    def _render(self) -> None:
        edited: EditedSpec | None = self.editor.edited
        self.base_table.value = self.edited_table.value = ""
        self.figure_view.clear()
        if edited is None:
            self.set_trait("diffs", ())
            self.summary.value = message("Edit a field to compare the constructions on the base and the edited device.")
            return
        try:
            diffs = pipeline.whatif(self.workloads, edited, self.policy, self.options).results
        except UserError as err:
            self.set_trait("diffs", ())
            self.summary.value = message(str(err), "error")
            return
        self.set_trait("diffs", tuple(diffs))
        if len(diffs) == 1:
            self._one(diffs[0], edited)
        else:
            changed = sum(d.changed for d in diffs)
            self.summary.value = message(f"top-1 changed on {changed} of {len(diffs)} workloads (starred)")
            self.figure_view.show(suite_figure(diffs, edited.base.name, edited.spec.name))
            rows, _ = time_columns(suite_rows(diffs))
            self.base_table.value = html_table(rows, marked=[d.changed for d in diffs])

    def _one(self, d: WorkloadDiff, edited: EditedSpec) -> None:
        verdict = "the top-1 program changes" if d.changed else "the top-1 program stays"
        step = (f"the constructions diverge at step {d.walks_part_at} (<code>stepper()</code> opens there)"
                if d.walks_part_at is not None else f"the constructions take the same {d.base.steps} steps")
        items = "".join(f"<li>{escape(line)}</li>" for line in d.explanation)
        self.summary.value = f"<p><b>{escape(d.label)}</b>: {verdict}; {step}</p><ul>{items}</ul>"
        for box, name, construction in ((self.base_table, f"base: {edited.base.name}", d.base),
                                        (self.edited_table, f"edited: {edited.spec.name}", d.edited)):
            rows, _ = time_columns(top_rows(construction))
            box.value = f"<p><b>{escape(name)}</b></p>" + html_table(rows, marked=[d.changed] + [False] * (len(rows) - 1))


class SweepView(widgets.VBox):
    """One field of `device` swept over a range (`pipeline.whatif_sweep`, from the base spec) for
    `workloads` (as WhatIf takes them): the field, from, to and points as inputs, predicted time
    per workload as curves with a star where the top-1 program changes, and a table. `result`
    is the core's `SweepResult` of the last sweep (None before one, or after a refused one)."""

    result = traitlets.Any(None, allow_none=True, read_only=True)

    def __init__(self, workloads, device: DeviceSpec | str, field: str = "L2.capacity_bytes", low: str = "0.25x",
                 high: str = "4x", points: int = 5, policy: str = "roller", options: Options = Options(),
                 run: bool = True):
        self.workloads, self.policy, self.options = _workloads(workloads), policy, options
        self.base = pipeline.load_device(device)
        self.units = {f.name: f.unit for members in field_groups(pipeline.editable_fields(self.base)).values()
                      for f in members if f.kind != "text"}
        names = list(self.units)
        self.field = widgets.Dropdown(options=names, value=field if field in names else names[0], description="field")
        self.low, self.high = widgets.Text(low, description="from"), widgets.Text(high, description="to")
        self.points = widgets.IntText(points, description="points")
        self.sweep_button = widgets.Button(description="Sweep", icon="line-chart")
        self.message_html, self.table = widgets.HTML(), widgets.HTML()
        self.figure_view = PlotView()
        controls = widgets.HBox([self.field, self.low, self.high, self.points, self.sweep_button])
        super().__init__(children=[controls, self.message_html, self.figure_view, self.table])
        self.sweep_button.on_click(lambda _: self.run())
        if run:
            self.run()

    def run(self) -> SweepResult | None:
        """Sweep with the inputs' values; the result (None, with the reason shown, when refused)."""
        text = f"{self.field.value}={self.low.value.strip()}:{self.high.value.strip()}:{self.points.value}"
        try:  # the core checks the range and the number of points (`pipeline.parse_sweep`)
            sweep = pipeline.parse_sweep(text)
            result = pipeline.whatif_sweep(self.workloads, self.base, sweep, self.policy, self.options)
        except UserError as err:
            self.set_trait("result", None)
            self.message_html.value = message(str(err), "error")
            self.figure_view.clear()
            self.table.value = ""
            return None
        self.set_trait("result", result)
        unit = self.units[sweep.field]
        where = [f"{c.label} at {', '.join(field_text(result.values[i], unit) for i in c.changes)}"
                 for c in result.curves if c.changes]
        self.message_html.value = message("top-1 changes: " + ("; ".join(where) if where else "none over this range"))
        self.figure_view.show(sweep_figure(result, unit))
        rows, _ = time_columns(sweep_rows(result, unit))
        self.table.value = html_table(rows, marked=[bool(r["top-1 changes"]) for r in rows])
        return result
