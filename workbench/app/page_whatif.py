"""What-if page: every field of the current device editable beside its base value (bounds and
units from `hardware.edit.editable_fields`); the edited spec becomes the selection's device
(named after its edits, downloadable and saved as TOML, carried in the URL as `set=`), and the
page shows what the edit does: the workload's top-K on both specs side by side, the step where
the two constructions diverge (a link into the Construction page at that step for each), what
changed in words, a suite's predicted times base vs edited, and one field swept over a range.

The core (`pipeline.edit_device`, `pipeline.whatif`, `pipeline.whatif_sweep`) keeps every
construction for the process, so a rerun that changes nothing constructs nothing.
"""

from __future__ import annotations

import streamlit as st

from workbench import pipeline
from workbench.app import views
from workbench.app.messages import message
from workbench.app.state import edited, in_workspace, selection, set_selection, step_link
from workbench.errors import UserError
from workbench.pipeline import DeviceSpec, EditedSpec, FieldInfo, Request, Workload
from workbench.viz.figures import field_groups, field_text, suite_figure, suite_rows, sweep_figure, sweep_rows, top_rows

INPUTS_PER_ROW = 3
SWEPT = "L2.capacity_bytes"  # the field a sweep starts on where the device has it (the example)
SWEEP_RANGE = ("0.25x", "4x")  # a factor of the base value either way: two octaves
SWEEP_POINTS = 5


def groups(base: DeviceSpec) -> dict[str, list[FieldInfo]]:
    """The editable fields of `base` by group (`viz.whatif.field_groups`)."""
    return field_groups(pipeline.editable_fields(base))


def fields(base: DeviceSpec) -> list[FieldInfo]:
    """The editable fields of `base`, each name once."""
    return [f for members in groups(base).values() for f in members]


def _key(base: DeviceSpec, name: str) -> str:
    return f"whatif:{base.name}:{name}"


def _text(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _base() -> tuple[DeviceSpec, EditedSpec | None]:
    """The unedited device of the selection, and the edit that made the selection's device."""
    edit = edited()
    return (edit.base, edit) if edit is not None else (selection().device, None)


def _edits(base: DeviceSpec) -> list[str]:
    """The inputs' values that differ from `base`, as `FIELD=VALUE` edits."""
    out = []
    for f in fields(base):
        value = st.session_state.get(_key(base, f.name), f.value)
        if value != f.value:
            out.append(f"{f.name}={_text(value)}")
    return out


def _on_edit() -> None:
    """An input changed: the edited spec (or the base, where no field differs) becomes the
    selection's device; a spec the loader refuses leaves the selection as it was, and says why."""
    base, edit = _base()
    texts = _edits(base)
    sel = selection()
    st.session_state.pop("whatif_error", None)
    if tuple(texts) == tuple(map(str, edit.edits if edit else ())):
        return
    if not texts:
        set_selection(Request(sel.workload, base, sel.policy, sel.options))
        return
    try:
        new = pipeline.edit_device(base, texts)
    except UserError as err:
        st.session_state.whatif_error = message(err)
        return
    set_selection(Request(sel.workload, new.spec, sel.policy, sel.options), new)


def _on_reset() -> None:
    base, _ = _base()
    for f in fields(base):
        st.session_state[_key(base, f.name)] = f.value
    _on_edit()


def _input(base: DeviceSpec, f: FieldInfo, edit: EditedSpec | None) -> None:
    """One field's input, set to the value the edit gave it (the base value where it gave none),
    with the base value, unit and bounds beside it; a field that follows from the edit (`derived`:
    the peaks of fewer units) says its value on the edited device, its input staying free."""
    key = _key(base, f.name)
    now = {c.field: c.after for c in edit.changes} if edit else {}
    st.session_state[key] = now.get(f.name, f.value)  # the selection's value wins over a refused input
    label = f"{f.name} ({f.unit})" if f.unit else f.name
    if f.kind == "text":
        st.text_input(label, key=key, on_change=_on_edit)
        bounds = ""
    else:
        kind = int if f.kind == "int" else float
        low, high = (None if b is None else kind(b) for b in (f.low, f.high))
        st.number_input(label, min_value=low, max_value=high, step=1 if kind is int else None,
                        format="%d" if kind is int else "%g", key=key, on_change=_on_edit)
        bounds = f"; {field_text(low, f.unit)} .. {field_text(high, f.unit)}" if low is not None else ""
    follows = {c.field: c.after for c in edit.derived} if edit else {}
    marked = ("**edited**, " if f.name in now else
              f"**{field_text(follows[f.name], f.unit)}** on the edited device (follows the edit), " if f.name in follows
              else "")
    st.caption(f"{marked}base {field_text(f.value, f.unit)}{bounds}")


def _editor(base: DeviceSpec, edit: EditedSpec | None) -> None:
    touched = {c.field for c in edit.changes} if edit else set()
    for name, members in groups(base).items():
        mine = any(f.name in touched for f in members)
        with st.expander(name + (" (edited)" if mine else ""), expanded=mine or name == "device"):
            for start in range(0, len(members), INPUTS_PER_ROW):
                for col, f in zip(st.columns(INPUTS_PER_ROW), members[start:start + INPUTS_PER_ROW]):
                    with col:
                        _input(base, f, edit)
    st.button("Reset to the base spec", on_click=_on_reset, disabled=edit is None)
    if st.session_state.get("whatif_error"):
        st.error(st.session_state.whatif_error)


def _edited_spec(edit: EditedSpec) -> None:
    st.subheader(f"Edited device: {edit.spec.name}")
    infos = {f.name: f for f in fields(edit.base)}
    units = {name: f.unit for name, f in infos.items()}
    rows = [{"field": c.field, "base": field_text(c.before, units.get(c.field, "")),
             "edited": field_text(c.after, units.get(c.field, "")), "how": how}
            for how, changes in (("edited", edit.changes), ("follows", edit.derived)) for c in changes]
    st.dataframe(rows, hide_index=True, width="stretch")
    left, right = st.columns(2)
    left.download_button("Download the edited spec (TOML)", edit.toml, file_name=f"{edit.spec.name}.toml",
                         mime="application/toml", on_click="ignore")
    path = right.text_input("Save as (in the workspace)", value=f"devices/{edit.spec.name}.toml")
    if right.button("Save the spec"):
        try:
            target = in_workspace(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(edit.toml)
            st.success(f"Saved {target}: `workbench ... --device {target}` loads it")
        except (UserError, OSError) as err:
            st.error(message(err) if isinstance(err, UserError) else f"{path}: {err.strerror or err}")


def _links(sel: Request, edit: EditedSpec, step: int) -> str:
    base_link = step_link(Request(sel.workload, edit.base, sel.policy, sel.options), None, step)
    edited_link = step_link(sel, edit, step)
    if not base_link or not edited_link:
        return "(the URL cannot name this device, so there is no link: open the Construction page and seek step " \
               f"{step})"
    return f"[base at step {step}]({base_link}) · [edited at step {step}]({edited_link})"


def _workload_diff(sel: Request, edit: EditedSpec) -> None:
    st.subheader("This workload")
    try:
        with st.spinner("constructing on both specs..."):  # instant where the core kept both constructions
            d = pipeline.whatif([sel.workload], edit, sel.policy, sel.options).results[0]
    except UserError as err:
        st.error(message(err))
        return
    verdict = "the top-1 program changes" if d.changed else "the top-1 program stays"
    st.markdown(f"**{d.label}**: {verdict}")
    st.markdown("\n".join(f"- {line}" for line in d.explanation))
    step = d.walks_part_at
    if step is None:
        st.caption(f"The two constructions take the same {d.base.steps} steps.")
    else:
        same = "" if d.changed else " (and still reach the same top-1)"
        st.markdown(f"The constructions diverge at **step {step}**{same}: {_links(sel, edit, step)}")
    left, right = st.columns(2)
    for col, name, construction in ((left, f"base: {edit.base.name}", d.base), (right, f"edited: {edit.spec.name}", d.edited)):
        with col:
            st.markdown(f"**{name}**: top-{len(construction.candidates)} in {construction.steps} steps")
            views.time_table(top_rows(construction))


def _suite_names(sel: Request) -> tuple[list[str], int]:
    names = list(pipeline.suites())
    label = sel.workload.label if isinstance(sel.workload, Workload) else ""
    own = label.split(":", 1)[0] if label else ""
    return names, names.index(own) if own in names else 0


def _suite(sel: Request, edit: EditedSpec) -> None:
    st.subheader("A suite")
    names, index = _suite_names(sel)
    suite = st.selectbox("Suite", names, index=index, key="whatif_suite_name")
    held = st.session_state.get("whatif_suite")
    asked = (suite, edit, sel.policy, sel.options)
    if st.button(f"Compare the {suite} suite"):
        try:
            _, workloads = pipeline.suite(suite)
            bar = st.progress(0.0, text="constructing...")
            diffs = []
            for i, w in enumerate(workloads):
                bar.progress(i / len(workloads), text=f"constructing {w.describe()} on both specs")
                diffs.extend(pipeline.whatif([w], edit, sel.policy, sel.options).results)
            bar.empty()
            held = st.session_state.whatif_suite = (asked, tuple(diffs))
        except UserError as err:
            st.error(message(err))
    if held is None or held[0] != asked:
        st.caption("Constructs every workload of the suite on both specs (seconds per workload).")
        return
    diffs = held[1]
    changed = sum(d.changed for d in diffs)
    st.caption(f"top-1 changed on {changed} of {len(diffs)} workloads (starred)")
    st.plotly_chart(suite_figure(diffs, edit.base.name, edit.spec.name), key="whatif_suite_chart")
    views.time_table(suite_rows(diffs))


def _sweep(sel: Request, base: DeviceSpec) -> None:
    st.subheader("Sweep one field")
    numeric = [f for f in fields(base) if f.kind != "text"]
    names = [f.name for f in numeric]
    cols = st.columns([3, 1, 1, 1])
    field = cols[0].selectbox("Field", names, index=names.index(SWEPT) if SWEPT in names else 0, key="sweep_field")
    low = cols[1].text_input("from", value=SWEEP_RANGE[0], key="sweep_low", help="a value, a size (256KiB) or a factor of the base (0.5x)")
    high = cols[2].text_input("to", value=SWEEP_RANGE[1], key="sweep_high")
    points = int(cols[3].number_input("points", min_value=2, value=SWEEP_POINTS, step=1, key="sweep_points"))
    names_, index = _suite_names(sel)
    over = st.radio("Over", ("this workload", f"the {names_[index]} suite"), horizontal=True, key="sweep_over")
    unit = next(f.unit for f in numeric if f.name == field)
    asked = (f"{field}={low.strip()}:{high.strip()}:{points}", over, base, sel.workload, sel.policy, sel.options)
    held = st.session_state.get("whatif_sweep")
    if st.button("Sweep"):
        try:  # the core checks the range and the number of points (`pipeline.parse_sweep`)
            workloads = [sel.workload] if over == "this workload" else list(pipeline.suite(names_[index])[1])
            with st.spinner(f"constructing {len(workloads)} workload(s) at {points} values..."):
                result = pipeline.whatif_sweep(workloads, base, asked[0], sel.policy, sel.options)
            held = st.session_state.whatif_sweep = (asked, result)
        except UserError as err:
            st.error(message(err))
    if held is None or held[0] != asked:
        st.caption("Constructs each workload at every value of the field, from the base spec.")
        return
    result = held[1]
    where = [f"{c.label} at {', '.join(field_text(result.values[i], unit) for i in c.changes)}"
             for c in result.curves if c.changes]
    st.caption("top-1 changes: " + ("; ".join(where) if where else "none over this range"))
    st.plotly_chart(sweep_figure(result, unit), key="whatif_sweep_chart")
    views.time_table(sweep_rows(result, unit))


def page() -> None:
    st.title("What-if")
    sel = selection()
    base, edit = _base()
    st.caption(f"{sel.label} on **{base.name}**" + (f", edited as **{edit.spec.name}**" if edit else "")
               + ": change any field of the device; the edited spec becomes the device of every page")
    _editor(base, edit)
    if edit is None:
        st.info("Edit a field above to compare the constructions on the base and the edited device.")
    else:
        _edited_spec(edit)
        _workload_diff(sel, edit)
        _suite(sel, edit)
    _sweep(sel, base)


page()
