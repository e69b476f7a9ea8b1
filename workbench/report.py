"""A report that travels: one self-contained HTML file (plotly's JavaScript inlined once, no
network, no server) of a stored profile run or of a comparison of two sets of runs, as
`workbench report` writes it and the dashboard's Runs and Candidates pages offer it for download.

A run's report: the workload, the device spec, the provenance, the candidates table (each time
with its share of the peaks), predicted vs measured, the roofline and the diagnosis. A
comparison's: both sides' selectors and provenance, the forest plot of the ratios and the table of
verdicts. Everything is read from the runs store, so a report can be made of any stored run,
long after the session that measured it.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Mapping, Sequence

import plotly.io as pio

from workbench.fmt import duration, gbps, gflops, significant
from workbench.hardware.spec import DeviceSpec
from workbench.profile.diagnose import Diagnosis, diagnose
from workbench.profile.noise import median_interval
from workbench.profile.store import RunRecord, RunStore, StoredMeasurement
from workbench.errors import UserError
from workbench.profile.versus import RunsComparison, Selector, noise_text, remeasured_text
from workbench.rtile.model import Estimate
from workbench.viz.compare import ComparedPoint, predicted_vs_measured_figure
from workbench.viz.roofline import roofline_figure, roofline_points
from workbench.viz.versus import forest_figure

# Provenance keys a comparison shows per side (the distinct values over its runs).
SIDE_KEYS = ("label", "device", "policy", "git_commit", "workbench", "tvm", "spec_sha256", "cpu_model", "gpu", "blas",
             "threads")
STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.5em}.note{color:#555;font-size:13px}
.slower{color:#d62728}.faster{color:#2ca02c}"""


@dataclass(frozen=True)
class StoredCandidate:
    """A stored candidate as the figures take one: rank, prediction and its estimate."""

    rank: int
    predicted_seconds: float
    estimate: Estimate


def _table(rows: Sequence[Mapping[str, object]]) -> str:
    if not rows:
        return "<p class='note'>none</p>"
    heads = list(dict.fromkeys(k for r in rows for k in r))
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in heads) + "</tr>"]
    for r in rows:
        cells = []
        for h in heads:
            v = r.get(h)
            number = isinstance(v, (int, float)) and not isinstance(v, bool)
            text = "-" if v is None or (isinstance(v, float) and math.isnan(v)) else (
                significant(v) if isinstance(v, float) else str(v))
            cells.append(f"<td class='n'>{html.escape(text)}</td>" if number else f"<td>{html.escape(text)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out + ["</table>"])


def _pairs(values: Mapping[str, object]) -> str:
    return _table([{"field": k, "value": "" if v is None else str(v)} for k, v in values.items()])


class _Page:
    """An HTML page being written: the first figure carries plotly's JavaScript, the rest reuse it."""

    def __init__(self, title: str):
        self.title = title
        self.parts: list[str] = []
        self.figures = 0

    def add(self, text: str) -> None:
        self.parts.append(text)

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def note(self, text: str) -> None:
        self.parts.append(f"<p class='note'>{html.escape(text)}</p>")

    def figure(self, fig) -> None:
        self.parts.append(pio.to_html(fig, include_plotlyjs=self.figures == 0, full_html=False,
                                      div_id=f"figure-{self.figures}", config={"displaylogo": False}))
        self.figures += 1

    def html(self) -> str:
        return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(self.title)}</title>"
                f"<style>{STYLE}</style></head><body><h1>{html.escape(self.title)}</h1>\n" + "\n".join(self.parts)
                + "\n</body></html>\n")


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def device_rows(device: DeviceSpec) -> list[dict]:
    """The spec's memory layers as table rows."""
    return [{"layer": l.name, "scope": l.scope, "capacity (B)": l.capacity_bytes, "bandwidth": gbps(l.bandwidth_gbps),
             "latency (ns)": l.latency_ns} for l in device.layers]


def run_diagnoses(device: DeviceSpec, peak: float, candidates: Sequence[StoredCandidate],
                  best: Mapping[int, float], in_llc: bool = False) -> dict[int, Diagnosis]:
    """rank -> the diagnosis of each candidate with a correct time in `best`."""
    by_rank = {c.rank: c for c in candidates}
    return {rank: diagnose(by_rank[rank].estimate, device, peak, seconds, in_llc)
            for rank, seconds in sorted(best.items()) if rank in by_rank and seconds > 0}


def candidate_table(candidates: Sequence[StoredCandidate], measurements: Sequence[StoredMeasurement],
                    diagnoses: Mapping[int, Diagnosis]) -> list[dict]:
    """One row per candidate: predicted, measured (best repeat), the median with its interval,
    the shares of the peaks and the limit that binds, the error."""
    by_rank: dict[int, StoredMeasurement] = {}
    for m in measurements:
        by_rank.setdefault(m.rank, m)
    rows = []
    for c in candidates:
        m = by_rank.get(c.rank)
        ok = m is not None and m.measurement.ok
        iv = median_interval(m.measurement.seconds) if ok else None
        d = diagnoses.get(c.rank)
        top = d.bandwidth_share if d else None
        rows.append({
            "rank": c.rank, "predicted": duration(c.predicted_seconds),
            "measured": duration(m.measurement.best_seconds) if ok else "-",
            "median [interval]": f"{duration(m.measurement.median_seconds)} [{duration(iv.low)}, {duration(iv.high)}]"
            if iv else "-",
            "repeats": len(m.measurement.seconds) if m else 0,
            "achieved": gflops(d.gflops) if d else "-",
            "% peak compute": d.compute_share * 100 if d else None,
            "% peak bandwidth": f"{top[1]:.0%} of {top[0]}" if top else "-",
            "binds": d.binding if d else "-",
            "predicted bottleneck": c.estimate.bottleneck,
            "error": m.measurement.error if m else "not measured",
        })
    return rows


@dataclass(frozen=True)
class StoredRun:
    """A stored run read back with what its views need: the spec, the compute roof it was
    measured against, its candidates, measurements, fastest correct time per rank, diagnoses."""

    run: RunRecord
    device: DeviceSpec
    peak_gflops: float
    candidates: tuple[StoredCandidate, ...]
    measurements: tuple[StoredMeasurement, ...]
    best: Mapping[int, float]
    diagnoses: Mapping[int, Diagnosis]

    def candidate_rows(self) -> list[dict]:
        return candidate_table(self.candidates, self.measurements, self.diagnoses)


def stored_run(store: RunStore, run_id: int) -> StoredRun:
    """Run `run_id` of `store` read back; UserError when there is no such run."""
    run = store.run(run_id)
    device = store.device_of(run_id)
    layers = [layer.name for layer in device.layers]
    candidates = tuple(StoredCandidate(rank, e["predicted_seconds"], Estimate.from_dict(e, layers))
                       for rank, e in store.estimates_of(run_id).items())
    measurements = store.measurements_of(run_id)
    best: dict[int, float] = {}
    for m in measurements:
        if m.measurement.ok:
            best[m.rank] = min(best.get(m.rank, math.inf), m.measurement.best_seconds)
    # the compute roof the session divided by; a run stored before it was recorded: the ALUs' peak
    peak = float(dict(run.provenance).get("peak_gflops") or device.peak(run.dtype))
    in_llc = bool(dict(run.provenance).get("in_llc"))  # runs stored before 50fd7a9: DRAM's roof
    return StoredRun(run, device, peak, candidates, measurements, best,
                     run_diagnoses(device, peak, candidates, best, in_llc))


def run_report(store: RunStore, run_id: int) -> str:
    """The HTML report of stored run `run_id`; UserError when the store has no such run."""
    stored = stored_run(store, run_id)
    run = stored.run
    page = _Page(f"{run.workload} on {run.device}: run {run.id}")
    _run_sections(page, stored)
    return page.html()


def runs_report(store: RunStore, selector: Selector) -> str:
    """The HTML report of every stored run `selector` picks (a whole model's operators, run under
    one label): a summary row per run, then each run's sections; UserError when none matches."""
    runs = selector.select(store.runs())
    if not runs:
        raise UserError(f"--runs {selector.text!r}: no run in {store.path} matches")
    stored = [stored_run(store, r.id) for r in runs]
    page = _Page(f"{len(runs)} runs: {selector.text}")
    rows = []
    for s in stored:
        fastest = min(s.best, key=s.best.get) if s.best else None
        d = s.diagnoses.get(fastest) if fastest is not None else None
        rows.append({"run": s.run.id, "workload": s.run.workload, "device": s.run.device, "policy": s.run.policy,
                     "status": s.run.status, "best": duration(s.best[fastest]) if fastest is not None else "-",
                     "best rank": fastest, "% of peaks": d.peak_text if d else "-"})
    page.heading("Runs")
    page.add(_table(rows))
    for s in stored:
        page.add(f"<h2 style='border-top:2px solid #888;padding-top:1em'>Run {s.run.id}: "
                 f"{html.escape(s.run.workload)} on {html.escape(s.run.device)}</h2>")
        _run_sections(page, s)
    return page.html()


def _run_sections(page: _Page, stored: StoredRun) -> None:
    """A run's sections: workload, device, provenance, candidates, the two figures, diagnosis."""
    run, device, peak, candidates, best = stored.run, stored.device, stored.peak_gflops, stored.candidates, stored.best
    provenance, diagnoses = dict(run.provenance), stored.diagnoses
    page.note(f"{run.policy} policy, top {run.topk}, {run.runner} runner; started {_when(run.started_at)}, "
              f"{run.status}" + (f"; label {run.label}" if run.label else ""))
    page.heading("Workload")
    page.add(_pairs({"label": run.workload, "operator": run.op, "dtype": run.dtype, **dict(run.params)}))
    page.heading("Device")
    page.add(_pairs({"name": device.name, "kind": device.kind, "vendor": device.vendor,
                     "compute units": device.compute_units, "peak compute (this workload)": gflops(peak),
                     "peaks from": "calibration on the machine" if device.calibrated else "the spec",
                     "spec sha256": provenance.get("spec_sha256", "")}))
    page.add(_table(device_rows(device)))
    page.heading("Provenance")
    page.add(_pairs(provenance if provenance else
                    {"recorded": "versions only (a run stored before provenance was)", **dict(run.versions)}))
    page.heading("Candidates")
    page.note("measured: the fastest repeat; the interval covers the median of the repeats (order statistics); "
              "% of peak: achieved FLOP/s and bytes/s of the fastest repeat over the device's peaks")
    page.add(_table(stored.candidate_rows()))
    points = [ComparedPoint(c.rank, c.predicted_seconds, best.get(c.rank)) for c in candidates]
    page.heading("Predicted vs measured")
    page.figure(predicted_vs_measured_figure(points))
    page.heading("Roofline")
    page.figure(roofline_figure(device.ceilings(), peak, roofline_points(candidates, device.layers[-1].name, best)))
    page.heading("Diagnosis")
    page.add(_table([{"rank": rank, "% of peaks": d.peak_text, "why": d.sentence} for rank, d in diagnoses.items()]))


def run_html(path, run_id: int) -> str:
    """The report of run `run_id` of the runs store at `path` (the dashboards' downloads, made
    when clicked, in a thread of their own: the store is opened here)."""
    with RunStore(path) as store:
        return run_report(store, run_id)


def _side_rows(runs: Sequence[RunRecord]) -> list[dict]:
    """Per provenance key of SIDE_KEYS, the distinct values over a side's runs."""
    rows = []
    for key in SIDE_KEYS:
        values = []
        for r in runs:
            value = getattr(r, key) if key in ("label", "device", "policy") else dict(r.provenance).get(key, "")
            values.append(str(value) if value not in (None, "") else "-")
        rows.append({"field": key, "values": ", ".join(dict.fromkeys(values))})
    return rows


def _here(w, side: str) -> tuple[tuple[int, int] | None, tuple]:
    """(the kernel a side ran fastest here, its contenders with their times) of a remeasured
    workload; (None, ()) where it was not remeasured."""
    r = w.remeasured
    if r is None:
        return None, ()
    return (r.kernel_a, r.contenders_a) if side == "a" else (r.kernel_b, r.contenders_b)


def comparison_report(store: RunStore, comparison: RunsComparison) -> str:
    """The HTML report of `comparison` (`versus.compare_runs` on `store`)."""
    c = comparison
    by_id = {r.id: r for r in store.runs()}
    page = _Page(f"Runs compared: B ({c.b.text}) against A ({c.a.text})")
    counts = c.counts()
    page.note(f"confidence {c.confidence:.0%}; a change under {c.margin:.0%} counts as none. "
              + ", ".join(f"{n} {v}" for v, n in counts.items()) + f" of {len(c.workloads)} workloads.")
    page.note(f"Noise: {remeasured_text(c.rounds) if c.rounds else noise_text(c.noise)}.")
    if c.busy_runs:
        page.note(f"Warning: {c.busy_note()}.")
    for name, selector, ids in (("A", c.a, c.a_runs), ("B", c.b, c.b_runs)):
        page.heading(f"{name}: {selector.text} ({len(ids)} runs: {', '.join(map(str, ids))})")
        page.add(_table(_side_rows([by_id[i] for i in ids if i in by_id])))
    page.heading("B / A per workload")
    page.figure(forest_figure(c.workloads))
    rows = []
    for w in c.workloads:
        row = {"workload": w.workload, "device": w.device}
        for name, side in (("A", w.a), ("B", w.b)):
            iv = median_interval(side.seconds, c.confidence) if side else None
            row[f"{name} median [interval]"] = (f"{duration(side.median_seconds)} [{duration(iv.low)}, "
                                                f"{duration(iv.high)}]" if side else "-")
            row[f"{name} kernels (run#rank)"] = ", ".join(f"{r}#{k}" for r, k in side.kernels) if side else "-"
        if c.rounds:  # the kernels timed here in turn: each side's contenders, its fastest here first
            for name, kernel, tried in (("A", *_here(w, "a")), ("B", *_here(w, "b"))):
                row[f"{name} here (run#rank: geometric mean)"] = ", ".join(
                    f"{r}#{k}: {duration(t)}" for r, k, t in sorted(tried, key=lambda t: (t[:2] != kernel, t[2]))) or "-"
        row["B/A [interval]"] = (f"{w.interval.ratio:.3f} [{w.interval.low:.3f}, {w.interval.high:.3f}]"
                                 if w.interval else "-")
        row["runs A / B"] = f"{w.interval.runs_a} / {w.interval.runs_b}" if w.interval else "-"
        row["noise model"] = w.interval.model if w.interval else "-"
        row["run sd"] = f"{w.interval.spread:.1%}" if w.interval else "-"
        row["verdict"] = w.verdict + (f" ({w.why})" if w.why else "")
        rows.append(row)
    page.add(_table(rows))
    return page.html()
