"""The runs store: round trips, the queries of the Runs page, consistency after a killed run,
concurrent writers from two processes, and clear refusals of files that are not a runs store."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest

from tests.helpers import TINY_CPU, matmul
from workbench.construct.space import Options
from workbench.construct.stepper import construct
from workbench.errors import UserError
from workbench.profile.runner import Measurement
from workbench.rtile.model import Estimate
from workbench.profile.store import APPLICATION_ID, SCHEMA_VERSION, RunStore, default_path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = {"label": "t:mm-64", "op": "matmul", "dtype": "float32", "M": 64, "N": 64, "K": 64}


@lru_cache(maxsize=None)
def candidates():
    return construct(matmul(64, 64, 64), TINY_CPU, options=Options(topk=3)).candidates


def start(store: RunStore, policy: str = "roller", label: str = "t:mm-64") -> int:
    return store.start_run(workload=WORKLOAD | {"label": label}, device=TINY_CPU, policy=policy,
                           runner="local", candidates=candidates(), versions={"tvm": "x"})


def measured(rank: int, best: float, correct: bool | None = True, error: str = "") -> Measurement:
    seconds = (best * 1.1, best, best * 1.2)
    return Measurement(rank, "local", seconds, correct, error, 0.25, versions=(("threads", "2"),))


def test_a_run_round_trips(tmp_path):
    second = measured(2, 3e-6)
    with RunStore(tmp_path / "runs.sqlite3") as store:
        run_id = start(store)
        store.add_measurement(run_id, second)
        store.add_measurement(run_id, measured(1, 5e-6))
        store.finish_run(run_id)
        (run,) = store.runs()
        rows = store.measurements_of(run_id)
    assert run.id == run_id and run.workload == "t:mm-64" and run.device == "tiny-cpu" and run.topk == 3
    assert dict(run.params) == {"M": 64, "N": 64, "K": 64} and run.finished_at >= run.started_at
    assert [r.rank for r in rows] == [1, 2]
    assert rows[1].measurement == second
    assert rows[1].measurement.best_seconds == 3e-6 and rows[1].measurement.correct is True
    assert rows[1].predicted_seconds == candidates()[1].predicted_seconds
    assert dict(rows[0].measurement.versions) == {"threads": "2"}


def test_a_measurement_reported_again_replaces_the_first(tmp_path):
    """The local runner's second look reports a candidate again: the store keeps one row for it,
    the second, and leaves the other candidates' rows and a run without that row alone."""
    with RunStore(tmp_path / "runs.sqlite3") as store:
        run_id, other = start(store), start(store)
        store.add_measurement(run_id, measured(1, 5e-6))
        store.add_measurement(run_id, measured(2, 3e-6))
        store.add_measurement(other, measured(1, 7e-6))
        again = replace(measured(1, 5e-6), seconds=measured(1, 5e-6).seconds + (4e-6,))
        store.replace_measurement(run_id, again)
        store.replace_measurement(other, measured(2, 6e-6))  # none before: recorded
        with pytest.raises(UserError, match="no candidate of rank 9"):
            store.replace_measurement(run_id, measured(9, 1e-6))
        rows = store.measurements_of(run_id)
        assert [(r.rank, r.measurement.best_seconds) for r in rows] == [(1, 4e-6), (2, 3e-6)]
        assert rows[0].measurement == again
        assert [(r.rank, r.measurement.best_seconds) for r in store.measurements_of(other)] == [(1, 7e-6), (2, 6e-6)]


def test_runs_filter_and_best_so_far_ignores_incorrect(tmp_path):
    with RunStore(tmp_path / "runs.sqlite3") as store:
        first = start(store)
        store.add_measurement(first, measured(1, 5e-6))
        second = start(store)
        store.add_measurement(second, measured(1, 1e-6, correct=False, error="wrong result: x"))
        store.add_measurement(second, measured(2, 4e-6))
        third = start(store)
        store.add_measurement(third, measured(1, 6e-6))
        other = start(store, policy="markov", label="t:other")
        assert [r.id for r in store.runs(policy="markov")] == [other]
        assert [r.id for r in store.runs(workload="t:mm-64", device="tiny-cpu")] == [first, second, third]
        assert store.runs(device="v100") == ()
        curve = store.best_so_far("t:mm-64", "tiny-cpu")
    assert [p.run_id for p in curve] == [first, second, third]
    assert [p.run_best_seconds for p in curve] == [5e-6, 4e-6, 6e-6]  # the incorrect 1e-6 never counts
    assert [p.best_so_far for p in curve] == [5e-6, 4e-6, 4e-6]


def test_a_killed_run_leaves_a_consistent_store(tmp_path):
    path = tmp_path / "runs.sqlite3"
    store = RunStore(path)
    run_id = start(store)
    store.add_measurement(run_id, measured(1, 5e-6))
    with pytest.raises(UserError, match="no candidate of rank 9"):
        store.add_measurement(run_id, measured(9, 1e-6))  # rolled back: nothing half-written
    del store  # no finish_run, no close: as if the process was killed
    with RunStore(path) as again:
        (run,) = again.runs()
        assert run.finished_at is None and not run.cancelled and run.status.startswith("unfinished")
        assert [m.rank for m in again.measurements_of(run_id)] == [1]


def test_a_store_of_the_first_schema_is_migrated_in_place(tmp_path):
    """Runs written before runs could be cancelled read as not cancelled, and new ones can be."""
    from workbench.profile.store import MIGRATIONS

    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("INSERT INTO devices VALUES (1, 'v100', 'gpu', '{}')")
    conn.execute("INSERT INTO workloads VALUES (1, 'old:mm', 'matmul', '{}', 'float32')")
    conn.execute("INSERT INTO runs VALUES (1, 1.0, 2.0, 1, 1, 'roller', 3, 'local', '{}')")
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with RunStore(path) as store:
        stopped = start(store)
        store.finish_run(stopped, cancelled=True)
        assert [(r.id, r.status) for r in store.runs()] == [(1, "finished"), (stopped, "cancelled")]
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_new_files_carry_our_identity_and_schema(tmp_path):
    path = tmp_path / "deep" / "er" / "runs.sqlite3"
    RunStore(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"devices", "workloads", "runs", "candidates", "measurements"} <= tables


def test_default_path_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_path() == tmp_path / "tile-workbench" / "runs.sqlite3"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_path() == Path.home() / ".local" / "share" / "tile-workbench" / "runs.sqlite3"


def test_an_empty_file_becomes_a_store(tmp_path):
    path = tmp_path / "empty.sqlite3"
    path.write_bytes(b"")
    with RunStore(path) as store:
        assert store.runs() == ()


def test_a_text_file_is_refused(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("these are my notes, not a database\n" * 100)
    refusal = r"^--db .*notes.txt: not a tile-workbench runs store \(file is not a database\)$"
    with pytest.raises(UserError, match=refusal):
        RunStore(path)
    assert path.read_text().startswith("these are my notes")


def test_another_applications_database_is_refused(tmp_path):
    path = tmp_path / "other.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(UserError, match=r"not a tile-workbench runs store \(tables: users\)"):
        RunStore(path)


def test_a_corrupt_store_is_refused(tmp_path):
    path = tmp_path / "runs.sqlite3"
    with RunStore(path) as store:
        start(store)
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xa5" * (4096 - 100)  # page 1 after the header: the schema table
    path.write_bytes(bytes(data))
    Path(str(path) + "-wal").unlink(missing_ok=True)
    with pytest.raises(UserError, match="not a tile-workbench runs store"):
        with RunStore(path) as store:
            store.runs()


def test_a_store_of_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "runs.sqlite3"
    RunStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(UserError, match="newer tile-workbench"):
        RunStore(path)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"^--db "):
        RunStore(tmp_path)


_WRITER = """
import sys, time
from pathlib import Path
from tests.test_profile_store import measured, start
from workbench.profile.store import RunStore

path, name, rows = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with RunStore(path) as store:
    run_id = start(store)
    # Both writers get ready (imports, construction, the run row), then write at the same time.
    (path.parent / name).touch()
    deadline = time.time() + 60
    while len(list(path.parent.glob("ready-*"))) < 2 and time.time() < deadline:
        time.sleep(0.001)
    for i in range(rows):
        store.add_measurement(run_id, measured(1 + i % 3, 1e-6 * (i + 1)))
        time.sleep(0.001)  # as a runner reports: spread out, so that the two writers interleave
    store.finish_run(run_id)
"""


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    path = tmp_path / "runs.sqlite3"
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), f"ready-{i}", "200"], cwd=ROOT)
        for i in range(2)
    ]
    for w in writers:
        assert w.wait(timeout=120) == 0
    with RunStore(path) as store:
        runs = store.runs()
        counts = [len(store.measurements_of(r.id)) for r in runs]
    assert len(runs) == 2 and counts == [200, 200]
    assert all(r.finished_at is not None for r in runs)
    # The writers did write at the same time: their rows interleave.
    conn = sqlite3.connect(path)
    sql = "SELECT MIN(m.id), MAX(m.id) FROM measurements m JOIN candidates c ON c.id = m.candidate WHERE c.run = ?"
    first, second = (conn.execute(sql, (r.id,)).fetchone() for r in runs)
    conn.close()
    assert first[0] < second[1] and second[0] < first[1]


def test_programs_of_gives_each_candidates_stored_rprogram_and_plan(tmp_path):
    """Each program as `RProgram.to_dict` wrote it, with the plan its kernel is built from under
    "plan" (what `bench model` checks a stored time against)."""
    with RunStore(tmp_path / "runs.sqlite3") as store:
        run_id = start(store)
        stored = {c.rank: json.loads(json.dumps(c.program.to_dict() | {"plan": c.plan.to_dict(c.expr)}))
                  for c in candidates()}
        assert store.programs_of(run_id) == stored
        assert all(p["plan"]["template"] == "cpu" for p in stored.values())
        assert store.programs_of(run_id + 1) == {}  # no such run


def test_estimates_of_gives_each_candidates_stored_estimate(tmp_path):
    with RunStore(tmp_path / "runs.sqlite3") as store:
        run_id = start(store)
        assert store.estimates_of(run_id) == {c.rank: json.loads(json.dumps(c.estimate.to_dict())) for c in candidates()}
        assert store.estimates_of(run_id + 1) == {}  # no such run
        layers = [layer.name for layer in TINY_CPU.layers]
        read_back = {rank: Estimate.from_dict(e, layers) for rank, e in store.estimates_of(run_id).items()}
    assert read_back == {c.rank: c.estimate for c in candidates()}


def test_a_runs_device_spec_and_record_read_back_equal(tmp_path):
    with RunStore(tmp_path / "runs.sqlite3") as store:
        run_id = start(store, label="t:other")
        assert store.device_of(run_id) == TINY_CPU
        assert store.run(run_id).workload == "t:other"
        for missing in (store.device_of, store.run):
            with pytest.raises(UserError, match=f"--run {run_id + 1}: no such run"):
                missing(run_id + 1)


def test_a_store_of_schema_2_is_migrated_and_keeps_a_correction(tmp_path):
    """The corrections table arrives with schema 3; the runs written before stay as they were."""
    from workbench.profile.correction import Correction, StageFit
    from workbench.profile.store import MIGRATIONS

    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    for statements in MIGRATIONS[:2]:
        for statement in statements:
            conn.execute(statement)
    conn.execute("INSERT INTO devices VALUES (1, 'tiny-cpu', 'cpu', '{}')")
    conn.execute("INSERT INTO workloads VALUES (1, 'old:mm', 'matmul', '{}', 'float32')")
    conn.execute("INSERT INTO runs VALUES (1, 1.0, 2.0, 1, 1, 'roller', 3, 'local', '{}', 1)")
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    correction = Correction("tiny-cpu", StageFit(2.0, (("L1", 0.5), ("DRAM", 3.0)), 1e-6, 40, 4))
    with RunStore(path) as store:
        assert [(r.id, r.status) for r in store.runs()] == [(1, "cancelled")]
        assert store.correction("tiny-cpu") is None
        store.save_correction(correction, {"claim": False})
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    with RunStore(path) as store:
        stored = store.correction("tiny-cpu")
    assert stored.correction == correction and stored.measurements == 40 and stored.evaluation == {"claim": False}


FIXTURE_V3 = ROOT / "tests" / "fixtures" / "runs-v3.sqlite"  # written by the store of schema 3 (commit e93e79c)


def test_the_stored_schema_3_fixture_opens_migrated_with_its_runs_intact(tmp_path):
    """A store the code of schema 3 wrote: after the migration its two runs, candidates and
    measurements read as they were written, they carry no label or provenance, and new runs with
    both can be added beside them."""
    import shutil

    path = tmp_path / "old.sqlite3"
    shutil.copy(FIXTURE_V3, path)  # the migration writes: never the committed file
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 3
    with RunStore(path) as store:
        old = store.runs()
        assert [(r.workload, r.device, r.policy, r.status) for r in old] == [
            ("t:mm-64", "tiny-cpu", "roller", "finished"), ("t:mm-64", "tiny-cpu", "markov", "finished")]
        assert all(r.label == "" and r.provenance == () and r.commit == "" for r in old)
        assert dict(old[0].versions) == {"workbench": "0.1.0", "tvm": "0.22.0", "numpy": "2.3.0"}
        rows = store.measurements_of(old[1].id)
        assert [r.rank for r in rows] == [1, 2, 3]
        assert rows[1].measurement.best_seconds == pytest.approx(2e-6 * 1.1)
        assert len(rows[1].measurement.seconds) == 5 and rows[1].measurement.correct
        assert sorted(store.programs_of(old[0].id)) == [1, 2, 3]
        new = store.start_run(workload=WORKLOAD, device=TINY_CPU, policy="roller", runner="local",
                              candidates=candidates(), label="after", provenance={"git_commit": "abc", "threads": 2})
        assert store.runs()[-1].id == new
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    with RunStore(path) as store:
        last = store.runs()[-1]
    assert last.label == "after" and dict(last.provenance) == {"git_commit": "abc", "threads": 2}
    assert last.commit == "abc" and last.to_dict()["provenance"]["threads"] == 2
