"""The offline model benchmark (`workbench bench model`, `workbench/model_bench.py`): its scores
against closed forms on hand-made runs stored in a runs store and read back from the file
`runs export` writes of it, that file against the store it came from, and the committed runs
files' structure (never a threshold on any machine's speed)."""

import dataclasses
import gzip
import json
import math
import sqlite3
from pathlib import Path

import pytest

from helpers import device
from workbench import pipeline
from workbench.errors import UserError
from workbench.cli import main
from workbench.profile import store as store_module
from workbench.model_bench import load_runs, machine_label, predicted_seconds, runs_agree, score, score_workload
from workbench.profile.compare import spearman
from workbench.profile.runner import Measurement
from workbench.profile.store import EXCHANGE_FORMAT, RunStore, read_runs_file

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("runs-*.json*"))


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


def _store(path, spec, workload, runs):
    """A runs store at `path` holding one finished run of `workload` on `spec` per (candidates,
    seconds) of `runs`: each candidate stored at its `rank` and measured correct, fastest repeat
    its `seconds`."""
    with RunStore(path) as store:
        for candidates, seconds in runs:
            run = store.start_run(workload=workload, device=spec, policy="roller", runner="local",
                                  candidates=candidates)
            for cand, s in zip(candidates, seconds):
                store.add_measurement(run, Measurement(cand.rank, "local", (1.5 * s, s), True))
            store.finish_run(run)
    return path


def _exported(db, out):
    """The `runs export` file of every run in store `db`, written to `out`."""
    assert main(["runs", "export", "--db", str(db), "--runs", "device=xeon-avx512", "--out", str(out)]) == 0
    return out


def test_a_hand_made_runs_file_scores_its_known_ranks(tmp_path):
    """Measured times set to a known permutation of the current model's order, stored and
    exported: the benchmark reports the closed-form Spearman and the measured best's predicted
    place, from the exported file as from the store."""
    spec = device("xeon-avx512")
    c, workload = _constructed("cpu-core:mm-skinny", topk=10)
    by_time = {predicted_seconds(spec, workload, cand.program.to_dict()): cand for cand in c.candidates}
    assert len(by_time) >= 6  # one program per predicted time, so the ranks are known exactly
    # the six predicted fastest, stored slowest first as ranks 1..6: stored order is not predicted order
    chosen = [dataclasses.replace(by_time[t], rank=r + 1) for r, t in enumerate(sorted(by_time)[:6][::-1])]
    predicted = [predicted_seconds(spec, workload, cand.program.to_dict()) for cand in chosen]
    order = sorted(range(len(chosen)), key=lambda i: predicted[i])  # order[r]: the r-th predicted
    measured_rank = [3, 1, 2, 6, 5, 4]  # the r-th predicted is the measured_rank[r]-th fastest
    measured = [0.0] * len(chosen)
    for r, i in enumerate(order):
        measured[i] = 1e-3 * measured_rank[r]
    db = _store(tmp_path / "runs.sqlite3", spec, workload, [(chosen, measured)])
    d = [m - (r + 1) for r, m in enumerate(measured_rank)]
    for path in (_exported(db, tmp_path / "runs.json"), db):
        [machine] = score(load_runs(path))
        [w] = machine.workloads
        assert w.candidates == 6
        assert w.spearman == pytest.approx(_spearman_closed_form(d)) == pytest.approx(1 - 6 * 14 / 210)
        assert w.best_predicted_rank == measured_rank.index(1) + 1 == 2
        assert machine.mean_spearman == pytest.approx(w.spearman) and machine.best_in_top_share == 1.0


def test_a_program_measured_in_two_runs_counts_once_at_its_fastest(tmp_path):
    spec = device("xeon-avx512")
    c, workload = _constructed(topk=3)
    db = _store(tmp_path / "runs.sqlite3", spec, workload,
                [(c.candidates, [3e-3, 2e-3, 1e-3]), (c.candidates[:1], [0.5e-3])])
    [machine] = score(load_runs(_exported(db, tmp_path / "runs.json")))
    [w] = machine.workloads
    assert w.candidates == 3
    predicted = [predicted_seconds(spec, workload, cand.program.to_dict()) for cand in c.candidates]
    assert w.spearman == pytest.approx(spearman(predicted, [0.5e-3, 2e-3, 1e-3]))


def _built_otherwise(db, ranks):
    """`db` with the stored plan of each candidate of `ranks` changed (one more lane), as a
    template changed since the run would leave it."""
    with sqlite3.connect(db) as conn:
        for rank in ranks:
            (text,) = conn.execute("SELECT rprogram FROM candidates WHERE rank = ?", (rank,)).fetchone()
            program = json.loads(text)
            program["plan"]["lanes"] += 1
            conn.execute("UPDATE candidates SET rprogram = ? WHERE rank = ?", (json.dumps(program), rank))
    return db


def test_a_program_whose_stored_plan_is_not_the_templates_now_is_left_out_and_counted(tmp_path, capsys):
    """Three programs stored with their plans; the second's plan as an older template made it:
    its time is of another kernel, so the workload scores the other two and says one was left
    out, in the store, in its export and in both outputs."""
    spec = device("xeon-avx512")
    c, workload = _constructed(topk=3)
    db = _built_otherwise(_store(tmp_path / "runs.sqlite3", spec, workload, [(c.candidates, [3e-3, 1e-3, 2e-3])]), [2])
    kept = [c.candidates[0], c.candidates[2]]
    predicted = [predicted_seconds(spec, workload, cand.program.to_dict()) for cand in kept]
    for path in (db, _exported(db, tmp_path / "runs.json")):
        [machine] = score(load_runs(path))
        [w] = machine.workloads
        assert (w.candidates, w.stale, machine.skipped) == (2, 1, ())
        assert w.spearman == pytest.approx(spearman(predicted, [3e-3, 2e-3]))
        assert w.best_predicted_rank == sorted(predicted).index(predicted[1]) + 1  # rank 3, at 2 ms
    capsys.readouterr()  # what `runs export` printed
    assert main(["bench", "model", "--runs", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["machines"][0]["results"][0]["stale"] == 1
    assert main(["bench", "model", "--runs", str(db)]) == 0
    assert "(1 built otherwise now, left out)" in capsys.readouterr().out


def test_a_workload_with_fewer_than_two_programs_built_as_stored_is_skipped_and_says_why(tmp_path):
    spec = device("xeon-avx512")
    c, workload = _constructed(topk=3)
    db = _built_otherwise(_store(tmp_path / "runs.sqlite3", spec, workload, [(c.candidates, [3e-3, 1e-3, 2e-3])]), [1, 2])
    [machine] = score(load_runs(db))
    assert machine.workloads == () and [w for w, _ in machine.skipped] == [workload["label"]]
    assert "2 of its 3 programs are built otherwise now" in machine.skipped[0][1]


def test_a_store_of_an_older_schema_is_scored_and_left_as_it_was(tmp_path):
    """Scoring reads a store of schema 3 (tests/fixtures/runs-v3.sqlite: two runs of one workload
    on tiny-cpu) through a migrated copy: its runs score, and the file keeps its bytes and its
    schema, as its older code wrote them."""
    path = tmp_path / "old.sqlite3"
    path.write_bytes((Path(__file__).parent / "fixtures" / "runs-v3.sqlite").read_bytes())
    before = path.read_bytes()
    [machine] = score(load_runs(path))
    assert machine.machine == "tiny-cpu" and [w.workload for w in machine.workloads] == ["t:mm-64"]
    assert path.read_bytes() == before
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 3


def test_runs_agree_is_the_mean_spearman_of_every_two_runs_over_their_shared_programs(tmp_path):
    """Three runs of the same three programs: the first and second in the same order (+1), the
    third reversed (-1 against each): the mean of the three pairs is -1/3; a run of one program
    shares too few with the others to compare, and one run alone has nothing to agree with."""
    assert runs_agree([{"a": 1, "b": 2, "c": 3}, {"a": 2, "b": 3, "c": 4}, {"a": 3, "b": 2, "c": 1}]) == pytest.approx(-1 / 3)
    assert math.isnan(runs_agree([{"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 2, "d": 3}]))
    assert math.isnan(runs_agree([{"a": 1, "b": 2, "c": 3}]))
    spec = device("xeon-avx512")
    c, workload = _constructed(topk=3)
    db = _store(tmp_path / "runs.sqlite3", spec, workload,
                [(c.candidates, [1e-3, 2e-3, 3e-3]), (c.candidates, [1e-3, 3e-3, 2e-3]), (c.candidates[:1], [1e-3])])
    [machine] = score(load_runs(db))
    [w] = machine.workloads
    assert w.runs_spearman == pytest.approx(0.5) == machine.mean_runs_spearman  # 1 - 6 x 2 / 24
    assert w.to_dict()["runs_spearman"] == pytest.approx(0.5)


def test_the_exported_file_scores_as_the_store_it_came_from(tmp_path):
    """The JSON `runs export` writes and its gzip-compressed form (`--out *.gz`) read as the store
    they came from; a measurement without a time is left out of all three."""
    spec = device("xeon-avx512")
    c, workload = _constructed("cpu-core:gemv-4096", topk=4)
    db = _store(tmp_path / "runs.sqlite3", spec, workload, [(c.candidates, (4e-3, 1e-3, 3e-3, 2e-3))])
    with RunStore(db) as store:
        [run] = store.runs()
        store.add_measurement(run.id, Measurement(1, "local", (), None, "build failed"))
    plain, packed = _exported(db, tmp_path / "runs.json"), _exported(db, tmp_path / "runs.json.gz")
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
    assert _exported(db, tmp_path / "again.json.gz").read_bytes() == packed.read_bytes()  # no timestamp in it
    from_store, from_plain, from_packed = load_runs(db), load_runs(plain), load_runs(packed)
    assert from_plain == from_packed == from_store
    fastest = [(m.rank, m.measured_seconds) for m in from_store[0].candidates]
    assert fastest == [(1, 4e-3), (2, 1e-3), (3, 3e-3), (4, 2e-3)]
    assert from_store[0].spec == c.device
    assert from_store[0].machine == f"xeon-avx512 ({c.device.target_dict()['mcpu']}, {c.device.compute_units} cores)"
    # a last-level cache the spec names is part of the machine: two Xeons with 300 and 120 MiB
    assert machine_label(dataclasses.replace(c.device, llc_bytes=120 * 1024**2, llc_gbps=56.0)) == from_store[0].machine[:-1] + ", 120 MiB LLC)"
    [a], [b] = score(from_plain), score(from_store)
    assert a.to_dict() == b.to_dict()


def test_runs_import_reads_a_compressed_export(tmp_path):
    spec = device("xeon-avx512")
    c, workload = _constructed(topk=3)
    db = _store(tmp_path / "runs.sqlite3", spec, workload, [(c.candidates, [3e-3, 2e-3, 1e-3])])
    packed = _exported(db, tmp_path / "runs.json.gz")
    assert main(["runs", "import", str(packed), "--db", str(tmp_path / "theirs.sqlite3")]) == 0
    assert load_runs(tmp_path / "theirs.sqlite3") == load_runs(db)


def test_export_refuses_a_store_that_does_not_exist(tmp_path, capsys):
    assert main(["runs", "export", "--db", str(tmp_path / "none.sqlite3"), "--runs", "device=x",
                 "--out", str(tmp_path / "o.json")]) == 2
    assert "no runs store there" in capsys.readouterr().err
    assert not (tmp_path / "none.sqlite3").exists()


# mtime=0: the same bytes in every pytest worker, whose test ids are made from them
@pytest.mark.parametrize("content, message", [
    (b"{", "not JSON"),
    (b'{"format": "other"}', "not a tile-workbench runs file"),
    (json.dumps({"format": EXCHANGE_FORMAT, "runs": [{"label": "x"}]}).encode(), "a run lacks a field"),
    (gzip.compress(json.dumps({"format": EXCHANGE_FORMAT, "runs": []}).encode(), mtime=0)[:-12], "gzip cut short"),
    (b"\x1f\x8b not deflate", "not gzip"),
    (gzip.compress(b"{", mtime=0), "not JSON"),
])
def test_a_malformed_runs_file_is_one_user_error(tmp_path, content, message):
    path = tmp_path / "runs.json"
    path.write_bytes(content)
    with pytest.raises(UserError, match=message) as err:
        load_runs(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_compressed_runs_file_is_read_only_up_to_the_cap(tmp_path, monkeypatch):
    """A small gzip file that inflates past the cap is refused, not inflated in full."""
    path = tmp_path / "runs.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"format": EXCHANGE_FORMAT, "runs": [], "pad": " " * 4096}).encode()))
    monkeypatch.setattr(store_module, "MAX_RUNS_FILE_BYTES", 1024)
    with pytest.raises(UserError, match="uncompressed.*over the 1,024-byte limit"):
        read_runs_file(path)


def test_the_committed_runs_files_are_small_runs_exports():
    assert FIXTURES, "tests/fixtures/runs-*.json[.gz]: the stored runs of at least one machine"
    # two runs of cpu-core's top 10 per CPU, each candidate with its plan, take 50-140 KB gzipped
    # (the Zen 4's of 2026-12-05: 129 KB; the 2-core Xeons' of 2026-12-07 and 2026-12-08: 136 and
    # 138 KB); the seven machines' files stay under 768 KiB
    assert sum(p.stat().st_size for p in FIXTURES) < 768 * 1024
    for path in FIXTURES:
        doc = read_runs_file(path)
        assert doc["format"] == EXCHANGE_FORMAT and doc["runs"]


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
        agree = [r["runs_spearman"] for r in m["results"] if r["runs_spearman"] is not None]
        assert m["mean_runs_spearman"] == (pytest.approx(sum(agree) / len(agree)) if agree else None)
        for r in m["results"]:
            assert 1 <= r["best_predicted_rank"] <= r["candidates"]
            assert r["best_in_top3"] == (r["best_predicted_rank"] <= 3)
    assert main(["bench", "model", "--runs", *map(str, FIXTURES)]) == 0
    text = capsys.readouterr().out
    assert all(f"{name}: mean Spearman" in text for name in machines)


def test_a_workload_this_version_cannot_rebuild_is_skipped_and_named(tmp_path):
    spec = device("xeon-avx512")
    c, workload = _constructed(topk=3)
    db = _store(tmp_path / "runs.sqlite3", spec, dict(workload, op="no_such_op", label="gone"),
                [(c.candidates, [1e-3, 2e-3, 3e-3])])
    [machine] = score(load_runs(_exported(db, tmp_path / "runs.json")))
    assert machine.workloads == () and [w for w, _ in machine.skipped] == ["gone"]
    assert "no_such_op" in machine.skipped[0][1] and machine.to_dict()["skipped"][0]["workload"] == "gone"


def test_a_program_stored_over_other_axes_than_the_construction_is_refused():
    """A pointwise conv stored before its pixel-GEMM view (`ops.pixel_gemm`) names seven axes;
    the construction now tiles four: its prediction would read the wrong tiles, so it is an
    error `score` skips and names, not a number."""
    workload = {"label": "conv-1x1", "op": "conv2d", "dtype": "float32",
                "N": 1, "C": 8, "H": 5, "W": 5, "F": 8, "KH": 1, "KW": 1, "stride": 1, "pad": 0}
    program = {"axes": ["n", "f", "h", "w", "c", "r", "s"]}
    with pytest.raises(ValueError, match=r"axes \['n', 'f', 'h', 'w', 'c', 'r', 's'\] are not the construction's \['n', 'f', 'p', 'c'\]"):
        predicted_seconds(device("xeon-avx512"), workload, program)
