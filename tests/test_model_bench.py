"""The offline model benchmark (`workbench bench model`, `profile/model_bench.py`): its scores
against closed forms on hand-made runs, the runs JSON against the store it is exported from, and
the committed runs files' structure (never a threshold on any machine's speed)."""

import json
import math
from pathlib import Path

import pytest

from helpers import device
from workbench import pipeline
from workbench.errors import UserError
from workbench.cli import main
from workbench.hardware.write import spec_to_toml
from workbench.profile.model_bench import (
    FORMAT,
    VERSION,
    export_runs,
    load_runs,
    predicted_seconds,
    runs_from_json,
    score,
    score_workload,
    store_runs,
)
from workbench.profile.compare import spearman
from workbench.profile.runner import Measurement
from workbench.profile.store import RunStore

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("runs-*.json"))


def _spearman_closed_form(d: list[int]) -> float:
    """1 - 6 sum d^2 / (n (n^2 - 1)): Spearman's rho of two rankings without ties, d the rank differences."""
    n = len(d)
    return 1 - 6 * sum(x * x for x in d) / (n * (n * n - 1))


def test_a_workload_scores_as_the_closed_form_says():
    # predicted ranks 1..5; measured ranks 2, 1, 4, 3, 5: rank differences 1, 1, 1, 1, 0
    w = score_workload("m", "w", [1, 2, 3, 4, 5], [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 1.0, 4.0, 3.0, 5.0])
    assert w.spearman == pytest.approx(_spearman_closed_form([1, 1, 1, 1, 0])) == pytest.approx(0.8)
    assert (w.best_predicted_rank, w.best_in_top, w.candidates) == (2, True, 5)
    # the measured best predicted slowest of five: rank 5, outside the top 3; reversed order: rho -1
    w = score_workload("m", "w", [1, 2, 3, 4, 5], [1.0, 2.0, 3.0, 4.0, 5.0], [5.0, 4.0, 3.0, 2.0, 1.0])
    assert (w.spearman, w.best_predicted_rank, w.best_in_top) == (pytest.approx(-1.0), 5, False)


def test_tied_predictions_are_ordered_by_the_stored_rank():
    # all four predicted alike: the order is the stored ranks 4, 3, 2, 1 as listed reversed
    w = score_workload("m", "w", [4, 3, 2, 1], [1.0] * 4, [1.0, 2.0, 3.0, 4.0])
    assert w.best_predicted_rank == 4  # the measured best has stored rank 4
    assert math.isnan(w.spearman)  # a constant prediction ranks nothing


def _constructed(workload="cpu-core:bmm-attn", dev="xeon-avx512", topk=3):
    c = pipeline.construct(pipeline.request(workload, device(dev), "roller", pipeline.Options(topk=topk)))
    return c, {"label": workload, **c.expr.workload_dict()}


def _runs_doc(spec, workload, programs, measured, machine="hand-made"):
    return {"format": FORMAT, "version": VERSION,
            "devices": {"x": {"machine": machine, "spec": spec_to_toml(spec)}},
            "runs": [{"device": "x", "workload": workload,
                      "candidates": [{"rank": r + 1, "program": p, "measured_seconds": s}
                                     for r, (p, s) in enumerate(zip(programs, measured))]}]}


def test_a_hand_made_runs_file_scores_its_known_ranks(tmp_path):
    """Measured times set to a known permutation of the current model's order: the benchmark
    reports the closed-form Spearman and the measured best's predicted place."""
    spec = device("xeon-avx512")
    c, workload = _constructed("cpu-core:gemv-4096", topk=10)
    by_time = {predicted_seconds(spec, workload, cand.program.to_dict()): cand.program.to_dict()
               for cand in c.candidates}
    assert len(by_time) >= 6  # one program per predicted time, so the ranks are known exactly
    programs = [by_time[t] for t in sorted(by_time)[:6]][::-1]  # listed slowest first: order is not rank
    predicted = [predicted_seconds(spec, workload, p) for p in programs]
    order = sorted(range(len(programs)), key=lambda i: predicted[i])  # order[r]: the r-th predicted
    measured_rank = [3, 1, 2, 6, 5, 4][:len(programs)]  # the r-th predicted is the measured_rank[r]-th fastest
    measured = [0.0] * len(programs)
    for r, i in enumerate(order):
        measured[i] = 1e-3 * measured_rank[r]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(_runs_doc(spec, workload, programs, measured)))
    [machine] = score(load_runs(path))
    [w] = machine.workloads
    d = [m - (r + 1) for r, m in enumerate(measured_rank)]
    assert w.spearman == pytest.approx(_spearman_closed_form(d))
    assert w.best_predicted_rank == measured_rank.index(1) + 1 == 2
    assert machine.mean_spearman == pytest.approx(w.spearman) and machine.best_in_top_share == 1.0


def test_a_program_measured_in_two_runs_counts_once_at_its_fastest(tmp_path):
    spec = device("xeon-avx512")
    c, workload = _constructed(topk=3)
    programs = [cand.program.to_dict() for cand in c.candidates]
    doc = _runs_doc(spec, workload, programs, [3e-3, 2e-3, 1e-3])
    doc["runs"].append({"device": "x", "workload": workload,
                        "candidates": [{"rank": 1, "program": programs[0], "measured_seconds": 0.5e-3}]})
    [machine] = score(runs_from_json(json.dumps(doc)))
    [w] = machine.workloads
    assert w.candidates == 3
    predicted = [predicted_seconds(spec, workload, p) for p in programs]
    assert w.spearman == pytest.approx(spearman(predicted, [0.5e-3, 2e-3, 1e-3]))


def test_the_exported_json_scores_as_the_store_it_came_from(tmp_path):
    c, workload = _constructed("cpu-core:gemv-4096", topk=4)
    db = tmp_path / "runs.sqlite3"
    with RunStore(db) as store:
        run = store.start_run(workload=workload, device=c.device, policy="roller", runner="local",
                              candidates=c.candidates)
        for cand, seconds in zip(c.candidates, (4e-3, 1e-3, 3e-3, 2e-3)):
            store.add_measurement(run, Measurement(cand.rank, "local", (seconds, seconds * 1.1), True))
        store.add_measurement(run, Measurement(1, "local", (), None, "build failed"))  # no time: left out
        store.finish_run(run)
    out = tmp_path / "runs.json"
    assert main(["runs", "export", "--db", str(db), "--machine", "a machine", "--out", str(out)]) == 0
    from_json, from_store = load_runs(out), load_runs(db)
    assert [r.candidates for r in from_json] == [r.candidates for r in from_store]
    assert from_json[0].spec == c.device and from_json[0].machine == "a machine"
    assert from_store[0].machine == f"xeon-avx512 ({c.device.target_dict()['mcpu']}, {c.device.compute_units} cores)"
    [a], [b] = score(from_json), score(from_store)
    assert a.workloads[0].spearman == pytest.approx(b.workloads[0].spearman)
    assert a.workloads[0].best_predicted_rank == b.workloads[0].best_predicted_rank


def test_export_refuses_a_store_that_does_not_exist(tmp_path, capsys):
    assert main(["runs", "export", "--db", str(tmp_path / "none.sqlite3"), "--out", str(tmp_path / "o.json")]) == 2
    assert "no runs store there" in capsys.readouterr().err
    assert not (tmp_path / "none.sqlite3").exists()


@pytest.mark.parametrize("text, message", [
    ("{", "neither a runs store nor runs JSON"),
    ('{"format": "other"}', "not a tile-workbench runs file"),
    (json.dumps({"format": FORMAT, "version": 99}), "runs file version 99"),
    (json.dumps({"format": FORMAT, "version": VERSION, "devices": {}, "runs": [{"device": "x"}]}), "malformed runs file"),
])
def test_a_malformed_runs_file_is_one_user_error(text, message):
    with pytest.raises(UserError, match=message):
        runs_from_json(text)


def test_the_committed_runs_files_exist_and_are_small():
    assert FIXTURES, "tests/fixtures/runs-*.json: the stored runs of at least one machine"
    assert sum(p.stat().st_size for p in FIXTURES) < 300 * 1024


def test_bench_model_reports_every_machine_of_the_committed_runs(capsys):
    """The structure of `bench model --json` on the committed runs (docs/cli.md), not their scores."""
    assert main(["bench", "model", "--runs", *map(str, FIXTURES), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["files"] == list(map(str, FIXTURES)) and doc["top"] == 3
    machines = {m["machine"]: m for m in doc["machines"]}
    stored = {run.machine: run for path in FIXTURES for run in load_runs(path)}
    assert set(machines) == set(stored)
    for m in doc["machines"]:
        assert m["workloads"] == len(m["results"]) > 0 and m["skipped"] == []
        assert -1 <= m["mean_spearman"] <= 1 and 0 <= m["best_in_top3"] <= 1
        spearmen = [r["spearman"] for r in m["results"] if r["spearman"] is not None]
        assert m["mean_spearman"] == pytest.approx(sum(spearmen) / len(spearmen))
        assert m["best_in_top3"] == pytest.approx(sum(r["best_in_top3"] for r in m["results"]) / len(m["results"]))
        for r in m["results"]:
            assert 1 <= r["best_predicted_rank"] <= r["candidates"]
            assert r["best_in_top3"] == (r["best_predicted_rank"] <= 3)
    assert main(["bench", "model", "--runs", *map(str, FIXTURES)]) == 0
    text = capsys.readouterr().out
    assert all(f"{name}: mean Spearman" in text for name in machines)


def test_a_workload_this_version_cannot_rebuild_is_skipped_and_named():
    spec = device("xeon-avx512")
    c, workload = _constructed(topk=3)
    programs = [cand.program.to_dict() for cand in c.candidates]
    doc = _runs_doc(spec, dict(workload, op="no_such_op", label="gone"), programs, [1e-3, 2e-3, 3e-3])
    [machine] = score(runs_from_json(json.dumps(doc)))
    assert machine.workloads == () and [w for w, _ in machine.skipped] == ["gone"]
    assert "no_such_op" in machine.skipped[0][1] and machine.to_dict()["skipped"][0]["workload"] == "gone"
