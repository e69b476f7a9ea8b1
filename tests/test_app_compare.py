"""The Runs page's Compare view and the report downloads (Streamlit AppTest): two sets of runs
picked by label, the forest plot and table of verdicts, the filter to changes, each side's
candidates of a workload, and the reports of a run and of the comparison."""

from __future__ import annotations

import pytest

from tests.helpers import fake_runs_store
from tests.test_app import app, button, charts, errors, goto, small, title, values
from workbench import pipeline
from workbench.profile.fake import FakeRunner
from workbench.profile.store import RunStore
from workbench.report import run_html


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A workspace whose runs store holds "base", "same" (the same kernels) and "slow" (10 %
    slower) runs of two matmuls."""
    monkeypatch.setenv("WORKBENCH_WORKSPACE", str(tmp_path))
    fake_runs_store(tmp_path / "runs.sqlite3", [("base", FakeRunner(seed=2)), ("same", FakeRunner(seed=2, noise=0.003)),
                                                ("slow", FakeRunner(seed=2, scale=2.2))])
    return tmp_path


def downloads(at) -> list[str]:
    return [d.proto.label for d in at.get("download_button")]


def forest(at) -> dict:
    (chart,) = [c for c in charts(at) if title(c).startswith("B / A per workload")]
    return chart


def test_the_compare_view_shows_verdicts_filters_changes_and_each_sides_candidates(workspace):
    at = goto(app(small()), "Runs")
    assert not errors(at)
    assert sorted(at.dataframe[0].value["label"]) == ["base", "base", "same", "same", "slow", "slow"]
    assert any(i.value.startswith("Pick runs for both sides") for i in at.info)
    assert [d for d in downloads(at) if d.startswith("Download the report of run")]
    at.multiselect(key="compare_a_label").set_value(["base"]).run()
    at.multiselect(key="compare_b_label").set_value(["same"]).run()
    # one run a side: the default drift (a loaded host's) hides a 10% change; these fake runs
    # drift by their 0.3% repeat noise, so 1% is what this machine would be told
    assert "default" in next(c.value for c in at.caption if c.value.startswith("A: "))
    at.number_input(key="compare_drift").set_value(1.0).run()
    assert "drift 1% set on this page" in next(c.value for c in at.caption if c.value.startswith("A: "))
    assert not at.exception and not errors(at), errors(at)
    traces = forest(at)["data"]
    assert [t["name"] for t in traces] == ["no detectable change"] and len(values(traces[0]["x"])) == 2
    assert "Download the comparison report (HTML)" in downloads(at)
    table = at.dataframe[1].value  # after the runs table
    assert list(table["verdict"]) == ["no detectable change"] * 2
    at.checkbox(key="compare_changes_only").check().run()
    assert forest(at)["data"] == [] or all(len(values(t["x"])) == 0 for t in forest(at)["data"])
    at.multiselect(key="compare_b_label").set_value(["slow"]).run()
    traces = forest(at)["data"]
    assert [t["name"] for t in traces] == ["slower"]
    assert values(traces[0]["x"]) == pytest.approx([1.1, 1.1], rel=0.03)
    # click through: each side's candidates of the chosen workload, read back from the store
    at.selectbox(key="compare_workload").set_value("mm-48").run()
    a, b = at.dataframe[2].value, at.dataframe[3].value  # after the runs table and the comparison's
    assert len(a) == len(b) == 3 and "% peak compute" in a.columns
    with RunStore(workspace / "runs.sqlite3") as store:
        slow = [r.id for r in store.runs() if r.label == "slow" and r.workload == "mm-48"]
    assert any(m.value.startswith(f"**B**: run {slow[0]} ") for m in at.markdown), [m.value for m in at.markdown]


def test_pickers_of_several_keys_must_all_match(workspace):
    at = goto(app(small()), "Runs")
    at.multiselect(key="compare_a_label").set_value(["base"]).run()
    at.multiselect(key="compare_b_policy").set_value(["roller"]).run()
    at.multiselect(key="compare_b_device").set_value(["tiny-cpu"]).run()
    assert not errors(at)
    assert any("A: label=base (2 runs); B: device=tiny-cpu,policy=roller (6 runs)" in c.value for c in at.caption)
    at.multiselect(key="compare_b_label").set_value(["same", "slow"]).run()
    assert any("B: label=same,label=slow,device=tiny-cpu,policy=roller (4 runs)" in c.value for c in at.caption), \
        [c.value for c in at.caption]


def test_a_profiled_run_offers_its_report_on_the_candidates_page(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_WORKSPACE", str(tmp_path))
    real = pipeline.profile
    monkeypatch.setattr(pipeline, "profile", lambda construction, runner, **kwargs: real(construction, "fake", **kwargs))
    at = goto(app(small()), "Candidates")
    button(at, "Profile").click().run()
    run_id = at.session_state["profile"].run_id
    assert f"Download the report of run {run_id} (HTML)" in downloads(at)
    page = run_html(tmp_path / "runs.sqlite3", run_id)  # what the button sends when clicked
    assert page.startswith("<!DOCTYPE html>") and "<h2>Roofline</h2>" in page


def test_the_compare_view_remeasures_the_kernels_here_and_keeps_the_result_for_its_pickers(workspace):
    """The Remeasure button rebuilds each side's stored kernels and times them here (2 rounds: what
    was timed and how the page tells it are asserted, never how fast). "base" and "same" stored
    the same programs, so each is one kernel for both sides: no change, whatever the timings."""
    at = goto(app(small()), "Runs")
    at.multiselect(key="compare_a_label").set_value(["base"]).run()
    at.multiselect(key="compare_b_label").set_value(["same"]).run()
    at.number_input(key="compare_rounds").set_value(2).run()
    button(at, "Remeasure here in turn").click().run()
    assert not at.exception and not errors(at), errors(at)
    caption = next(c.value for c in at.caption if c.value.startswith("A: "))
    assert "Noise: remeasured here in turn" in caption and "2 rounds" in caption
    table = at.dataframe[1].value
    assert list(table["verdict"]) == ["no detectable change (both sides' fastest here is the same program)"] * 2
    assert all(k.split(" / ")[0].split("#")[1] == k.split(" / ")[1].split("#")[1] for k in table["kernels here (run#rank)"])
    here = [c for c in table.columns if c.startswith(("A here (", "B here ("))]  # in the unit the data chose
    assert len(here) == 2 and (table[here[0]] == table[here[1]]).all() and (table[here[0]] > 0).all()
    # other picks: the stored comparison again, until remeasured
    at.multiselect(key="compare_b_label").set_value(["slow"]).run()
    assert "runs are the unit" in next(c.value for c in at.caption if c.value.startswith("A: "))
    assert "kernels here (run#rank)" not in at.dataframe[1].value.columns
