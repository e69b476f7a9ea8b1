"""The model's correction learnt from the runs store (`profile/correction.py`), as the faces show it:
its verdict, before against after per held-out workload, and its coefficients.

Everything here reads the stored forms (`Evaluation.to_dict()`, `Correction.to_dict()`), which are
what the runs store keeps: a correction fitted a minute ago and one fitted last week are shown by
the same code. An error is the median |log(predicted / measured)| of a workload's measurements;
it is shown as the factor it stands for (0.405 -> x1.5: predictions typically 1.5 times off).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.fmt import MISSING, significant
from workbench.profile import correction
from workbench.viz.axes import legend_below

BEFORE, AFTER = "#adb5bd", "#1f77b4"  # the model alone in grey, corrected in the figures' blue
BAR_PX = 22  # per workload and bar pair row
# Error factors an axis may tick at: a held-out error is between "right" (x1) and a few hundred.
FACTORS = (1, 1.1, 1.2, 1.5, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)
FACTOR_TICKS = 6


def factor(error: float | None) -> str:
    """A log error as the factor it stands for: 0.405 -> `x1.5`; "-" when unknown."""
    return MISSING if error is None or not math.isfinite(error) else f"x{significant(math.exp(error))}"


def signed(value: float | None) -> str:
    """A rank correlation with its sign (`+0.42`), "-" where it is undefined."""
    return MISSING if value is None or not math.isfinite(value) else f"{value:+.2f}"


def verdict(evaluation: Mapping) -> str:
    """What a stored evaluation (`Evaluation.to_dict`) allows one to say, in the core's words."""
    return correction.verdict(bool(evaluation["claim"]), significant(float(evaluation["p_value"])))


def evaluation_text(evaluation: Mapping) -> str:
    """The evaluation in a line: measurements and workloads, held-out error and mean Spearman
    before -> after, workloads whose error fell, and the verdict first."""
    before, after = evaluation["before"], evaluation["after"]
    n = len(evaluation["workloads"])
    return (f"{verdict(evaluation)[0].upper()}{verdict(evaluation)[1:]}: {evaluation['measurements']} measurements of "
            f"{n} workloads, each predicted by a fit that never saw it; typical error "
            f"{factor(before['error'])} -> {factor(after['error'])}, mean Spearman {signed(before['spearman'])} -> "
            f"{signed(after['spearman'])}; error lower in {evaluation['improved']} of {n} workloads.")


def worse(evaluation: Mapping) -> bool:
    """Whether the held-out predictions were further off after the correction than before."""
    return evaluation["after"]["error"] > evaluation["before"]["error"]


def stored_text(fitted_at: float, measurements: int, evaluation: Mapping) -> str:
    """A stored correction in a phrase: `fitted 2026-11-24 00:10 on 40 measurements: no
    improvement shown (signed-rank p = 0.706)`."""
    when = datetime.fromtimestamp(fitted_at).strftime("%Y-%m-%d %H:%M")
    return f"fitted {when} on {measurements} measurements: {verdict(evaluation)}"


def _factor_axis(top: float) -> dict:
    """A linear axis of log error from 0 to `top`, ticked at round factors (x1, x1.5, x2, ...)."""
    ticks = [f for f in FACTORS if math.log(f) <= top] or [1]
    ticks = ticks[:: math.ceil(len(ticks) / FACTOR_TICKS)]
    return {"range": [0, top], "tickvals": [math.log(f) for f in ticks], "ticktext": [f"x{f:g}" for f in ticks],
            "title": "typical error (median factor off)"}


def before_after_figure(workloads: Sequence[Mapping]) -> go.Figure:
    """Paired bars per held-out workload (`WorkloadScore.to_dict()`s): on the left the typical
    error, on the right Spearman(predicted, measured), the model alone (grey) against corrected
    (blue). Shorter error bars and longer Spearman bars are better; a workload whose Spearman is
    undefined (one measurement, or tied predictions) has no Spearman bar, and says so on hover."""
    names = [w["workload"] for w in workloads]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("error, held out (shorter is better)", "Spearman, held out (longer is better)"))
    for when, colour in (("before", BEFORE), ("after", AFTER)):
        label = "model" if when == "before" else "corrected"
        errors = [w[f"{when}_error"] for w in workloads]
        rhos = [w[f"{when}_spearman"] for w in workloads]
        fig.add_trace(go.Bar(
            x=errors, y=names, orientation="h", name=label, legendgroup=label, marker={"color": colour},
            text=[factor(e) for e in errors], textposition="outside", cliponaxis=False,
            hovertext=[f"{n}: {label} typically {factor(e)} off over {w['measurements']} measurements"
                       for n, e, w in zip(names, errors, workloads)], hoverinfo="text",
        ), row=1, col=1)
        fig.add_trace(go.Bar(
            # an undefined correlation: a bar of no length whose text says so, never a 0
            x=[0.0 if r is None else r for r in rhos], y=names, orientation="h", name=label, legendgroup=label,
            showlegend=False, marker={"color": colour}, textposition="outside", cliponaxis=False,
            text=["undefined" if r is None else signed(r) for r in rhos],
            hovertext=[f"{n}: {label} Spearman {signed(r)}" if r is not None else
                       f"{n}: Spearman undefined (fewer than two measurements, or tied predictions)"
                       for n, r in zip(names, rhos)], hoverinfo="text",
        ), row=1, col=2)
    top = max([e for w in workloads for e in (w["before_error"], w["after_error"])], default=0.0)
    fig.update_xaxes(_factor_axis(max(top * 1.25, math.log(1.1))), row=1, col=1)
    fig.update_xaxes(range=[-1.2, 1.2], tickvals=[-1, -0.5, 0, 0.5, 1], title="rank correlation", row=1, col=2)
    fig.update_yaxes(autorange="reversed", automargin=True)  # the first workload on top
    legend, bottom = legend_below(2)
    fig.update_layout(
        barmode="group", height=100 + bottom + 2 * BAR_PX * max(1, len(names)),
        margin={"l": 10, "r": 10, "t": 70, "b": bottom}, legend=legend,
        title={"text": "before and after, each workload predicted by a fit on the others", "font": {"size": 13}},
    )
    fig.update_annotations(font_size=12)
    return fig


def coefficient_rows(correction: Mapping) -> list[dict]:
    """A correction's fits (`Correction.to_dict()`) as table rows: the device's over every
    operator, then one per operator class, each with its workloads, measurements, weight
    (how far it moves a prediction from the model: W / (W + p)), the multiplier of each stage
    time and the constant (`constant us`, microseconds, for `fmt.time_columns`)."""
    fits = [("all operators", correction["overall"])] + sorted(correction.get("classes", {}).items())
    return [
        {"fit": name, "workloads": f["workloads"], "measurements": f["measurements"], "weight": f["weight"],
         "x compute": f["compute"], **{f"x {layer} loads": a for layer, a in f["loads"].items()},
         "constant us": f["constant"] * 1e6}
        for name, f in fits
    ]
