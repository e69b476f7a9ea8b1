"""What-if hardware drawn (`workbench.whatif`): a suite's predicted time per workload on the
base and the edited spec, a sweep's predicted time per workload over one field's values with
the values where the top-1 program changes marked, and the table rows beside them. The
dashboard's What-if page and the widgets (`widgets.whatif`) both show these.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from workbench.fmt import duration, gbps, gflops, human_bytes, significant
from workbench.hardware.edit import FieldInfo
from workbench.viz.axes import legend_below, legend_height, log_axis
from workbench.whatif import TopOne

PLOT_PX = 380  # the plotting area and the title; the axis and the legend below add theirs
PEAKS = ("peak_gflops", "tensor_core_gflops", "micro_kernels")  # the tables of compute rates
CHANGED = "top-1 changes"  # the legend entry of the change markers
MARKER = "star"


def field_groups(fields: Sequence[FieldInfo]) -> dict[str, list[FieldInfo]]:
    """A spec's editable fields (`hardware.edit.editable_fields`) as an editor groups them, in the
    spec file's order: "device" ([device]
    numbers), "peak compute" (the peak, tensor-core and micro-kernel tables), "target", and
    "layer NAME" for each memory layer."""
    groups: dict[str, list[FieldInfo]] = {}
    for f in fields:
        head = f.name.split(".", 1)[0] if "." in f.name else "device"
        group = "peak compute" if head in PEAKS else head if head in ("device", "target") else f"layer {head}"
        groups.setdefault(group, []).append(f)
    return groups


def field_text(value: object, unit: str) -> str:
    """A spec field's value in its unit (`hardware.edit.FieldInfo.unit`): `1 MiB`, `20 GB/s`,
    `157 GFLOP/s`, `5.73 ns`, `2 us`; a count or a name as it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if unit == "bytes":
        return human_bytes(value)
    if unit == "GB/s":
        return gbps(value)
    if unit == "GFLOP/s":
        return gflops(value)
    if unit == "ns":
        return duration(value * 1e-9)
    if unit == "us":
        return duration(value * 1e-6)
    return str(value) if isinstance(value, int) else significant(value)


def tiles_text(top: TopOne) -> str:
    """A `whatif.TopOne`'s tiles, one layer after another: `L2 i=64, j=256 | L1 i=8, j=64`."""
    return " | ".join(f"{layer} " + ", ".join(f"{a}={n}" for a, n in tile) for layer, tile in top.tiles)


def top_rows(construction) -> list[dict]:
    """The top-K of a construction as rows: rank, each layer's tile (a column per layer), grid,
    predicted time (`predicted us`, for `fmt.time_columns`) and bound."""
    rows = []
    for c in construction.candidates:
        top = TopOne.of(c)
        row = {"rank": c.rank}
        row.update({layer: ", ".join(f"{a}={n}" for a, n in tile) for layer, tile in top.tiles})
        row.update({"grid": top.grid, "predicted us": top.predicted_seconds * 1e6, "bound": top.bound})
        rows.append(row)
    return rows


def suite_rows(diffs: Sequence) -> list[dict]:
    """One row per `whatif.WorkloadDiff`: predicted time on both specs (`base us`, `edited us`),
    the speed-up, whether the top-1 changed, both top-1s' tiles and the step where the two
    walks part (`walks_part_at`: also where they part on the way to the same top-1)."""
    return [{"workload": d.label, "base us": d.base_top.predicted_seconds * 1e6,
             "edited us": d.edited_top.predicted_seconds * 1e6, "speed-up": d.predicted_speedup,
             "top-1": "changed" if d.changed else "same", "base tiles": tiles_text(d.base_top),
             "edited tiles": tiles_text(d.edited_top) if d.changed else "",
             "walks part at step": d.walks_part_at} for d in diffs]


def suite_figure(diffs: Sequence, base_name: str, edited_name: str) -> go.Figure:
    """Predicted time per workload (log axis) as two bars, base and edited, the edited bar of a
    workload whose top-1 program changed marked with a star above it."""
    labels = [d.label for d in diffs]
    base = [d.base_top.predicted_seconds for d in diffs]
    edited = [d.edited_top.predicted_seconds for d in diffs]
    changed = [d for d in diffs if d.changed]
    legend, bottom = legend_below(3)
    traces = [
        go.Bar(x=labels, y=base, name=f"base: {base_name}", hovertext=[duration(s) for s in base], hoverinfo="text+x"),
        go.Bar(x=labels, y=edited, name=f"edited: {edited_name}", hovertext=[duration(s) for s in edited],
               hoverinfo="text+x"),
        go.Scatter(x=[d.label for d in changed], y=[max(d.base_top.predicted_seconds, d.edited_top.predicted_seconds) * 1.4
                                                    for d in changed],
                   mode="markers", marker={"symbol": MARKER, "size": 12, "color": "#e8590c"}, name="top-1 changed",
                   hovertext=[d.text for d in changed], hoverinfo="text+x"),
    ]
    times = base + edited
    fig = go.Figure(traces)
    fig.update_layout(title="Predicted time per workload, base vs edited", barmode="group",
                      yaxis=log_axis(min(times), max(times) * 1.4, duration, "predicted time"),
                      legend=legend, margin={"b": bottom + 60}, height=legend_height(PLOT_PX, 3) + 60)
    return fig


def sweep_figure(result, unit: str) -> go.Figure:
    """A `whatif.SweepResult`: predicted time (log axis) per workload over the swept values (a
    log axis where they are spaced geometrically), a star where a workload's top-1 program
    changes from the value before, and a dotted line at the base spec's value."""
    field = result.sweep.field
    values = list(result.values)
    traces = []
    for curve in result.curves:
        seconds = list(curve.predicted_seconds)
        traces.append(go.Scatter(x=values, y=seconds, mode="lines+markers", name=curve.label,
                                 hovertext=[f"{field_text(v, unit)}: {duration(s)}, bound by {t.bound}"
                                            for v, s, t in zip(values, seconds, curve.tops)], hoverinfo="text"))
    changes = [(curve, i) for curve in result.curves for i in curve.changes]
    traces.append(go.Scatter(x=[values[i] for _, i in changes], y=[c.tops[i].predicted_seconds for c, i in changes],
                             mode="markers", marker={"symbol": MARKER, "size": 14, "color": "#e8590c"}, name=CHANGED,
                             hovertext=[f"{c.label}: top-1 changes at {field_text(values[i], unit)} "
                                        f"({tiles_text(c.tops[i - 1])} -> {tiles_text(c.tops[i])})" for c, i in changes],
                             hoverinfo="text"))
    times = [s for c in result.curves for s in c.predicted_seconds]
    if result.geometric:
        xaxis = log_axis(values[0], values[-1], lambda v: field_text(v, unit), field, pad=1.1)
    else:
        xaxis = {"title": field}
    base = result.specs[0].changes[0].before
    if isinstance(base, (int, float)) and values[0] <= base <= values[-1]:
        traces.append(go.Scatter(x=[base, base], y=[min(times), max(times)], mode="lines", name="base value",
                                 line={"dash": "dot", "color": "#868e96"}, hovertext=field_text(base, unit),
                                 hoverinfo="text"))
    legend, bottom = legend_below(len(traces))
    fig = go.Figure(traces)
    fig.update_layout(title=f"Predicted time over {field}", xaxis=xaxis,
                      yaxis=log_axis(min(times), max(times), duration, "predicted time"),
                      legend=legend, margin={"b": bottom}, height=legend_height(PLOT_PX, len(traces)))
    return fig


def sweep_rows(result, unit: str) -> list[dict]:
    """A `whatif.SweepResult` as rows, one per value: the value (in its unit), each workload's
    predicted time (`<workload> us`) and the workloads whose top-1 changes at that value."""
    rows = []
    for i, value in enumerate(result.values):
        row = {result.sweep.field: field_text(value, unit)}
        row.update({f"{c.label} us": c.tops[i].predicted_seconds * 1e6 for c in result.curves})
        row["top-1 changes"] = ", ".join(c.label for c in result.curves if i in c.changes)
        rows.append(row)
    return rows
