"""Runs page: the history in the SQLite runs store, filtered by workload, device and policy; the
best time so far of each (workload, device) over time, and predicted vs measured across runs; and,
for one (workload, device), the space its measured candidates cover (Optuna-dashboard style): the
importance of each tile dimension, the grid and virtual threads, a slice of the time against one of
them, and parallel coordinates of all; and the model's correction learnt from a device's stored
measurements (`pipeline.refit`): its verdict, before and after per held-out workload, its
coefficients. A Compare view sets two sets of runs (by label, device, commit, policy) against each
other workload by workload (`profile.versus`): a forest plot of the ratios with their intervals,
the table (with the runs each side pooled and the noise model) filtered to changes if asked, and
each side's candidates of a chosen workload; a button remeasures the comparison here in turn
(`profile.remeasure`, as `runs compare --remeasure`); the report of a run or of the comparison
downloads as one HTML file (`workbench.report`)."""

from __future__ import annotations

from datetime import datetime
from functools import partial
from pathlib import Path

import streamlit as st

from workbench import pipeline
from workbench.app import views
from workbench.app.messages import message
from workbench.app.profile_controls import store_path, store_path_input
from workbench.errors import UserError
from workbench.pipeline import RunStore, importance, slice_points, stored_trials
from workbench.profile.remeasure import MAX_ROUNDS, ROUNDS
from workbench.profile.versus import FASTER, SLOWER, Noise, RunsComparison, compare_runs, mapping_selector, noise_text, \
    remeasured_text
from workbench.report import comparison_report, run_html, stored_run
from workbench.viz.figures import (
    ComparedPoint,
    before_after_figure,
    best_so_far_figure,
    coefficient_rows,
    forest_figure,
    evaluation_text,
    importance_figure,
    parallel_figure,
    predicted_vs_measured_figure,
    slice_figure,
    stored_text,
    worse,
)

ALL = "(all)"
SERIES_SHOWN = 8  # (workload, device) lines on the best-so-far chart
RUNS_COMPARED = 20  # most recent runs on the predicted-vs-measured chart


def _filters(runs) -> tuple[str | None, str | None, str | None]:
    cols = st.columns(3)
    chosen = []
    for col, label, values in zip(cols, ("workload", "device", "policy"),
                                  ([r.workload for r in runs], [r.device for r in runs], [r.policy for r in runs])):
        choice = col.selectbox(label, (ALL,) + tuple(sorted(set(values))))
        chosen.append(None if choice == ALL else choice)
    return tuple(chosen)


def _best_us(measurements) -> float | None:
    """The run's fastest correct kernel, in microseconds (None when none was correct)."""
    times = [m.measurement.best_seconds for m in measurements if m.measurement.ok]
    return min(times) * 1e6 if times else None


def _table(runs, measured: dict) -> None:
    rows = [
        {"run": r.id, "label": r.label, "started": datetime.fromtimestamp(r.started_at).strftime("%Y-%m-%d %H:%M:%S"),
         "workload": r.workload, "device": r.device, "policy": r.policy, "runner": r.runner, "top-K": r.topk,
         "status": r.status,
         "best us": _best_us(measured[r.id])}
        for r in reversed(runs)
    ]
    views.time_table(rows)  # "best (ms)": one unit for the column, chosen from its times


# What a side of the Compare view picks runs by: (selector key, picker label, the run's value)
SIDE_PICKERS = (("label", "label", lambda r: r.label), ("device", "device", lambda r: r.device),
                ("commit", "commit", lambda r: r.commit[:12]), ("policy", "policy", lambda r: r.policy))


def _side(runs, name: str, column) -> dict[str, list[str]]:
    """The pickers of one side; {selector key: the values picked}."""
    picked = {}
    with column:
        st.markdown(f"**{name}**")
        for key, label, value in SIDE_PICKERS:
            options = sorted({value(r) for r in runs} - {""})
            chosen = st.multiselect(label, options, key=f"compare_{name.lower()}_{key}") if options else []
            if chosen:
                picked[key] = chosen
    return picked


def _compare(store: RunStore, runs) -> None:
    """Two sets of runs picked by label, device, commit and policy, compared workload by workload."""
    st.subheader("Compare two sets of runs")
    left, right = st.columns(2)
    a, b = _side(runs, "A", left), _side(runs, "B", right)
    if not a or not b:
        st.info("Pick runs for both sides (A: the baseline) to compare them workload by workload.")
        return
    drift = st.number_input("run-to-run drift, % (empty: pooled from the runs where each side has "
                            "several, else the default)", min_value=0.01, max_value=1000.0, value=None,
                            key="compare_drift", help="as `runs compare --drift PCT`: what this machine's time "
                            "of the same code moves by from one run to the next (one standard deviation)")
    noise = Noise(drift=drift / 100, source=f"drift {drift:g}% set on this page") if drift else None
    try:
        comparison = compare_runs(store, mapping_selector(a), mapping_selector(b), noise=noise)
    except UserError as err:
        st.error(message(err))
        return
    comparison = _remeasured(store, comparison, (a, b, drift))
    counts = comparison.counts()
    st.caption(f"A: {comparison.a.text} ({len(comparison.a_runs)} runs); B: {comparison.b.text} "
               f"({len(comparison.b_runs)} runs). " + ", ".join(f"{n} {v}" for v, n in counts.items())
               + f" at {comparison.confidence:.0%} confidence; a change under {comparison.margin:.0%} counts as none. "
               f"Noise: {remeasured_text(comparison.rounds) if comparison.rounds else noise_text(comparison.noise)}.")
    if comparison.busy_runs:
        st.warning(comparison.busy_note())
    changes_only = st.checkbox("only workloads that changed", key="compare_changes_only")
    shown = [w for w in comparison.workloads if not changes_only or w.verdict in (FASTER, SLOWER)]
    st.plotly_chart(forest_figure(shown), key="forest_chart")
    views.time_table([{"workload": w.workload, "device": w.device,
                      "A median us": w.a.median_seconds * 1e6 if w.a else None,
                      "B median us": w.b.median_seconds * 1e6 if w.b else None}
                     | ({"A here us": w.remeasured.here_seconds[0] * 1e6 if w.remeasured else None,
                         "B here us": w.remeasured.here_seconds[1] * 1e6 if w.remeasured else None,
                         "kernels here (run#rank)": f"{_kernel(w.remeasured.kernel_a)} / {_kernel(w.remeasured.kernel_b)}"
                         if w.remeasured else None} if comparison.rounds else {}) | {
                      "B/A": w.interval.ratio if w.interval else None,
                      "low": w.interval.low if w.interval else None,
                      "high": w.interval.high if w.interval else None,
                      "runs A / B": f"{w.interval.runs_a} / {w.interval.runs_b}" if w.interval else None,
                      "noise model": w.interval.model if w.interval else None,
                      "run sd %": w.interval.spread * 100 if w.interval else None,
                      "verdict": w.verdict + (f" ({w.why})" if w.why else "")} for w in shown])
    st.download_button("Download the comparison report (HTML)",
                       partial(_comparison_html, store.path, a, b, noise, comparison if comparison.rounds else None),
                       file_name="comparison-report.html", mime="text/html", key="compare_report", on_click="ignore")
    if not shown:
        return
    workload = st.selectbox("each side's candidates of", [w.workload for w in shown], key="compare_workload")
    chosen = next(w for w in shown if w.workload == workload)
    for column, name, side in zip(st.columns(2), "AB", (chosen.a, chosen.b)):
        with column:
            if side is None:
                st.info(f"{name} has no correct measurement of {workload}.")
                continue
            run_id, rank = side.kernels[0]
            st.markdown(f"**{name}**: run {run_id} (its best kernel: #{rank}; runs "
                        f"{', '.join(str(r) for r, _ in side.kernels)})")
            st.dataframe(stored_run(store, run_id).candidate_rows(), hide_index=True, width="stretch",
                         key=f"compare_candidates_{name.lower()}")


def _run_report(store: RunStore, runs) -> None:
    """The report of one shown run, as one HTML file to download."""
    run_id = st.selectbox("report of run", [r.id for r in reversed(runs)], key="report_run")
    st.download_button(f"Download the report of run {run_id} (HTML)", partial(run_html, store.path, run_id),
                       file_name=f"run-{run_id}-report.html", mime="text/html", key="run_report", on_click="ignore")


def _comparison_html(path: Path, a: dict, b: dict, noise: Noise | None, remeasured: RunsComparison | None) -> str:
    """The comparison report (the remeasured one where the page holds it), made when the download
    is clicked (in a thread of its own)."""
    with RunStore(path) as store:
        return comparison_report(store, remeasured or compare_runs(store, mapping_selector(a), mapping_selector(b),
                                                                    noise=noise))


def _remeasured(store: RunStore, comparison: RunsComparison, picked: tuple) -> RunsComparison:
    """The Remeasure control: each workload's stored kernels of both sides rebuilt and timed here
    in turn when the button is pressed (`pipeline.remeasure_runs`, as `runs compare --remeasure`);
    the page keeps showing that comparison while the pickers (`picked`) and rounds stay as they were."""
    left, right = st.columns([1, 3])
    rounds = left.number_input("rounds", min_value=2, max_value=MAX_ROUNDS, value=ROUNDS, step=1,
                               key="compare_rounds", help="how many times each kernel is timed here")
    key = (repr(picked), rounds)
    with right:
        st.write("")  # align the button with the number's box
        pressed = st.button("Remeasure here in turn", key="compare_remeasure",
                            help="rebuild each workload's fastest stored kernels of A and of B (each run's three "
                            "fastest) and time them one after another on this machine: verdicts that a host's drift "
                            "between runs cannot move")
    if pressed:
        try:
            with st.spinner(f"rebuilding and timing each workload's kernels here, {rounds} rounds"):
                st.session_state["compare_remeasured"] = (key, pipeline.remeasure_runs(store, comparison, int(rounds)))
        except UserError as err:
            st.error(message(err))
    held = st.session_state.get("compare_remeasured")
    return held[1] if held and held[0] == key else comparison


def _kernel(kernel: tuple[int, int]) -> str:
    return f"{kernel[0]}#{kernel[1]}"


def _charts(store: RunStore, runs, measured: dict) -> None:
    pairs = list(dict.fromkeys((r.workload, r.device) for r in reversed(runs)))[:SERIES_SHOWN]
    series = {f"{w} on {d}": store.best_so_far(w, d) for w, d in pairs}
    points = [
        ComparedPoint(m.rank, m.predicted_seconds, m.measurement.best_seconds if m.measurement.ok else None, f"run {r.id}")
        for r in runs[-RUNS_COMPARED:] for m in measured[r.id]
    ]
    left, right = st.columns(2)
    left.plotly_chart(best_so_far_figure(series), key="best_chart")
    right.plotly_chart(predicted_vs_measured_figure(points), key="runs_compare_chart")


def _space(store: RunStore, runs) -> None:
    """Importance, slice and parallel coordinates over the correct measurements of the shown runs
    of one (workload, device): one when the filters name one, else the one chosen here."""
    st.subheader("Which parameters matter")
    pairs = list(dict.fromkeys((r.workload, r.device) for r in reversed(runs)))  # most recent first
    pair = pairs[0] if len(pairs) == 1 else st.selectbox(
        "workload on device", pairs, format_func=lambda p: f"{p[0]} on {p[1]}", key="space_pair")
    trials = stored_trials(store, [r for r in runs if (r.workload, r.device) == pair])
    found = importance(trials)
    if not found:
        st.info(f"{len(trials)} correct measurements of {pair[0]} on {pair[1]}: parameter importance needs two or "
                "more with different times.")
        return
    st.caption(
        f"Over {len(trials)} correct measurements (each candidate of each shown run, its best repeat). Importance: "
        "the share of the variance of log time that a parameter's values account for, adjusted for how many values "
        "it takes (epsilon squared). It is marginal: each parameter alone, so parameters that matter only together "
        "look weaker, and tiles that always change together share the credit.")
    left, right = st.columns(2)
    left.plotly_chart(importance_figure(found), key="importance_chart")
    with right:
        parameter = st.selectbox("slice: time against", [f.parameter for f in found], key="slice_parameter")
        st.plotly_chart(slice_figure(slice_points(trials, parameter), parameter), key="slice_chart")
    st.plotly_chart(parallel_figure(trials, [f.parameter for f in found]), key="parallel_chart")


def _correction(store: RunStore, runs) -> None:
    """Fit the chosen device's correction on every stored measurement of it (`pipeline.refit`,
    which stores it), and show the device's stored correction: the verdict of its held-out
    evaluation, before and after per workload, and its coefficients."""
    st.subheader("The model's correction")
    devices = list(dict.fromkeys(r.device for r in reversed(runs)))  # most recent first
    device = devices[0] if len(devices) == 1 else st.selectbox("device", devices, key="correction_device")
    st.caption(
        "A correction of the model learnt from this device's stored measurements (all runs of it, not only the "
        "shown ones): measured time fitted on the model's stage times, per operator class, trusted in proportion "
        "to the workloads it has seen. It is scored honestly: each workload is predicted by a fit on the other "
        "workloads only, and an improvement is claimed only when a signed-rank test rules out chance. The "
        "Candidates page shows the corrected prediction beside the model's.")
    fitted = st.button(f"Fit correction for {device}", key="fit_correction")
    if fitted:
        try:
            pipeline.refit(store, device)
        except UserError as err:
            st.error(message(err))
    stored = store.correction(device)
    if stored is None:
        if not fitted:
            st.info(f"No correction stored for {device} yet: fit one (it needs correct measurements of at least "
                    "two workloads).")
        return
    evaluation = stored.evaluation
    shown = st.success if evaluation["claim"] else st.warning if worse(evaluation) else st.info
    shown(evaluation_text(evaluation))
    st.caption(f"Stored correction of {device}: {stored_text(stored.fitted_at, stored.measurements, evaluation)}.")
    st.plotly_chart(before_after_figure(evaluation["workloads"]), key="correction_chart")
    st.caption("Coefficients: the measured time is fitted as a multiple of each stage time of the model plus a "
               "constant; a fit's weight is how far it moves a prediction from the model's, in log time "
               "(workloads / (workloads + coefficients)); a class's fit is blended with the device's by its own.")
    views.time_table(coefficient_rows(stored.correction.to_dict()))


def page() -> None:
    st.title("Runs")
    store_path_input()
    try:
        path = Path(store_path())
    except UserError:  # the workspace cannot be made: store_path_input said so
        return
    if not path.is_file():
        st.info(f"No runs store at {path} yet: profile candidates on the Candidates page (or give another path).")
        return
    try:
        with RunStore(path) as store:
            every = store.runs()
            workload, device, policy = _filters(every)
            runs = store.runs(workload, device, policy)
            if not runs:
                st.info("No runs match.")
                return
            measured = {r.id: store.measurements_of(r.id) for r in runs}
            st.caption(f"{len(runs)} runs in {path}")
            _table(runs, measured)
            _run_report(store, runs)
            _compare(store, every)
            _charts(store, runs, measured)
            _space(store, runs)
            _correction(store, runs)
    except UserError as err:
        st.error(message(err))


page()
