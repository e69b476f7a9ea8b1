"""The runs store: every profile run, its candidates and their measurements, and each device's
correction of the model fitted on them (`profile/correction.py`), in one SQLite file.

Write-ahead logging lets readers (the dashboard) read while a run writes, and `busy_timeout`
makes concurrent writers wait their turn instead of failing. A run and its candidates go in one
transaction and each measurement in its own, so a killed run leaves a consistent store: the run
shows as unfinished (`finished_at` NULL) with the measurements it got. The file carries our
`application_id` and its schema version in `user_version`; migrations bring an older file up to
date, and anything else (a corrupt file, another application's database) is refused with a
UserError rather than written to.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import sqlite3
import threading
import time
import zlib
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from workbench.errors import UserError
from workbench.files import check_size, read_user_file, write_user_file
from workbench.hardware.spec import DeviceSpec
from workbench.profile.correction import Correction, Evaluation, Row, evaluate, fit, stages_of
from workbench.profile.runner import Measurement

APPLICATION_ID = 0x54574B42  # "TWKB": marks a file as a tile-workbench runs store
EXCHANGE_FORMAT = "tile-workbench runs"  # `dump_runs` documents: `workbench runs export/import` files
# A runs file holds every repeat of every candidate: 10 000 runs of 10 candidates fit in this
# (uncompressed; a compressed file is read up to it too).
MAX_RUNS_FILE_BYTES = 256 * 2**20
GZIP_MAGIC = b"\x1f\x8b"
BUSY_TIMEOUT_MS = 30_000  # a writer waits this long for another process's transaction

# MIGRATIONS[i] brings schema version i to i + 1 (statements run in one transaction).
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE devices (id INTEGER PRIMARY KEY, name TEXT NOT NULL, kind TEXT NOT NULL,
           spec TEXT NOT NULL, UNIQUE (name, spec))""",
        """CREATE TABLE workloads (id INTEGER PRIMARY KEY, label TEXT NOT NULL, op TEXT NOT NULL,
           params TEXT NOT NULL, dtype TEXT NOT NULL, UNIQUE (label, op, params, dtype))""",
        """CREATE TABLE runs (id INTEGER PRIMARY KEY, started_at REAL NOT NULL, finished_at REAL,
           workload INTEGER NOT NULL REFERENCES workloads(id), device INTEGER NOT NULL REFERENCES devices(id),
           policy TEXT NOT NULL, topk INTEGER NOT NULL, runner TEXT NOT NULL, versions TEXT NOT NULL)""",
        """CREATE TABLE candidates (id INTEGER PRIMARY KEY, run INTEGER NOT NULL REFERENCES runs(id),
           rank INTEGER NOT NULL, rprogram TEXT NOT NULL, predicted_seconds REAL NOT NULL,
           estimate TEXT NOT NULL, UNIQUE (run, rank))""",
        """CREATE TABLE measurements (id INTEGER PRIMARY KEY, candidate INTEGER NOT NULL REFERENCES candidates(id),
           runner TEXT NOT NULL, seconds TEXT NOT NULL, best_seconds REAL, median_seconds REAL,
           correct INTEGER, error TEXT NOT NULL, build_seconds REAL NOT NULL, created_at REAL NOT NULL,
           versions TEXT NOT NULL)""",
        "CREATE INDEX runs_by_workload ON runs (workload, device, started_at)",
        "CREATE INDEX measurements_by_candidate ON measurements (candidate)",
    ),
    # A run stopped part-way (Ctrl-C, SIGTERM, the dashboard's user leaving the page) is closed
    # as cancelled; one with no finished_at was killed outright or is still running.
    ("ALTER TABLE runs ADD COLUMN cancelled INTEGER NOT NULL DEFAULT 0",),
    # The model's correction per device name (`profile/correction.py`), fitted on the device's
    # stored measurements; a refit replaces it. `evaluation` is its cross-validated before/after.
    (
        """CREATE TABLE corrections (device TEXT PRIMARY KEY, fitted_at REAL NOT NULL,
           measurements INTEGER NOT NULL, correction TEXT NOT NULL, evaluation TEXT NOT NULL)""",
    ),
    # A run's label (`--label NAME`, what `runs compare` selects by) and its provenance
    # (`profile/provenance.py`: commit, machine, options). Runs of older stores have neither.
    (
        "ALTER TABLE runs ADD COLUMN label TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE runs ADD COLUMN provenance TEXT NOT NULL DEFAULT '{}'",
        "CREATE INDEX runs_by_label ON runs (label)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


def default_path() -> Path:
    """`$XDG_DATA_HOME/tile-workbench/runs.sqlite3` (XDG default `~/.local/share`)."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "tile-workbench" / "runs.sqlite3"


@dataclass(frozen=True)
class RunRecord:
    id: int
    started_at: float
    finished_at: float | None
    workload: str  # the workload's label
    op: str
    params: tuple[tuple[str, object], ...]
    dtype: str
    device: str
    policy: str
    topk: int
    runner: str
    versions: tuple[tuple[str, str], ...]
    cancelled: bool = False  # stopped part-way; its measurements are those taken before
    label: str = ""  # the run's own label (`--label NAME`), "" when none was given
    provenance: tuple[tuple[str, object], ...] = ()  # `profile.provenance.collect`; () for older runs

    @property
    def status(self) -> str:
        if self.cancelled:
            return "cancelled"
        return "finished" if self.finished_at is not None else "unfinished (killed, or still running)"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"params": dict(self.params), "versions": dict(self.versions),
                                           "provenance": dict(self.provenance), "status": self.status}

    @property
    def workload_dict(self) -> dict:
        """The run's workload as `TensorExpr.workload_dict` writes it, with its label."""
        return {"label": self.workload, "op": self.op, "dtype": self.dtype, **dict(self.params)}

    @property
    def commit(self) -> str:
        """The checkout's commit the run was made from ("" when unknown)."""
        return str(dict(self.provenance).get("git_commit", ""))


@dataclass(frozen=True)
class StoredMeasurement:
    """A measurement with the candidate it belongs to."""

    run_id: int
    rank: int
    predicted_seconds: float
    measurement: Measurement

    def to_dict(self) -> dict:
        return {"run_id": self.run_id, "predicted_seconds": self.predicted_seconds, **self.measurement.to_dict()}


@dataclass(frozen=True)
class BestPoint:
    """One run on the best-so-far curve of a (workload, device)."""

    run_id: int
    started_at: float
    run_best_seconds: float | None  # the run's fastest correct kernel (None: none was correct)
    best_so_far: float | None  # the fastest up to and including this run

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class StoredCorrection:
    """A device's stored correction, when it was fitted and its before/after (`Evaluation.to_dict`)."""

    device: str
    fitted_at: float
    measurements: int
    correction: Correction
    evaluation: dict

    def to_dict(self) -> dict:
        return {"device": self.device, "fitted_at": self.fitted_at, "measurements": self.measurements,
                "correction": self.correction.to_dict(), "evaluation": self.evaluation}


class RunStore:
    """A runs store at `path` (default: `default_path()`), created or migrated on open."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_path()
        self._lock = threading.Lock()
        self._conn = self._connect()
        try:
            self._migrate()
        except BaseException:
            self._conn.close()
            raise

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    # -- writing ---------------------------------------------------------------------------------

    def start_run(
        self,
        *,
        workload: Mapping,
        device: DeviceSpec,
        policy: str,
        runner: str,
        candidates: Sequence,
        topk: int | None = None,
        versions: Mapping[str, str] | None = None,
        label: str = "",
        provenance: Mapping[str, object] | None = None,
    ) -> int:
        """Record a run and its candidates (`Candidate`s: rank, program, estimate); returns its id.

        `workload` holds `label`, `op`, `dtype` and the operator's parameters (the rest); `label`
        is the run's own, `provenance` what made it (`profile.provenance.collect`)."""
        with self._write() as db:
            workload_id = self._workload_id(db, workload)
            device_id = self._device_id(db, device)
            run_id = db.execute(
                """INSERT INTO runs (started_at, workload, device, policy, topk, runner, versions, label, provenance)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (time.time(), workload_id, device_id, policy, topk if topk is not None else len(candidates),
                 runner, _dumps(dict(versions or {})), label, _dumps(dict(provenance or {}))),
            ).lastrowid
            db.executemany(
                "INSERT INTO candidates (run, rank, rprogram, predicted_seconds, estimate) VALUES (?, ?, ?, ?, ?)",
                [(run_id, c.rank, _dumps(_stored_program(c)), c.estimate.predicted_seconds,
                  _dumps(c.estimate.to_dict())) for c in candidates],
            )
        return run_id

    def add_measurement(self, run_id: int, m: Measurement) -> None:
        """Record the measurement of candidate `m.rank` of run `run_id`."""
        with self._write() as db:
            _insert_measurement(db, run_id, m)

    def replace_measurement(self, run_id: int, m: Measurement) -> None:
        """Replace the last measurement recorded of candidate `m.rank` of run `run_id` by `m` (a
        runner's second report of it: `Timing.revisit`), in one transaction; record it where
        there is none."""
        with self._write() as db:
            db.execute("""DELETE FROM measurements WHERE id = (SELECT m.id FROM measurements m JOIN candidates c
                          ON c.id = m.candidate WHERE c.run = ? AND c.rank = ? ORDER BY m.id DESC LIMIT 1)""",
                       (run_id, m.rank))
            _insert_measurement(db, run_id, m)

    def finish_run(self, run_id: int, cancelled: bool = False) -> None:
        """Close a run: done, or `cancelled` part-way (its measurements so far are kept)."""
        with self._write() as db:
            db.execute("UPDATE runs SET finished_at = ?, cancelled = ? WHERE id = ?", (time.time(), int(cancelled), run_id))

    def save_correction(self, correction: Correction, evaluation: Mapping) -> None:
        """Store `correction` as its device's, replacing an earlier one."""
        with self._write() as db:
            db.execute(
                """INSERT OR REPLACE INTO corrections (device, fitted_at, measurements, correction, evaluation)
                   VALUES (?, ?, ?, ?, ?)""",
                # Plain JSON, not `_dumps`: the layers keep their order (registers to DRAM).
                (correction.device, time.time(), correction.measurements, json.dumps(correction.to_dict()),
                 json.dumps(dict(evaluation))),
            )

    # -- reading ---------------------------------------------------------------------------------

    def runs(
        self, workload: str | None = None, device: str | None = None, policy: str | None = None
    ) -> tuple[RunRecord, ...]:
        """Runs, oldest first, filtered by workload label, device name and policy where given."""
        where, args = [], []
        for column, value in (("w.label", workload), ("d.name", device), ("r.policy", policy)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = f"""SELECT r.id, r.started_at, r.finished_at, w.label, w.op, w.params, w.dtype, d.name, r.policy,
                  r.topk, r.runner, r.versions, r.cancelled, r.label, r.provenance FROM runs r JOIN workloads w ON w.id = r.workload
                  JOIN devices d ON d.id = r.device {'WHERE ' + ' AND '.join(where) if where else ''}
                  ORDER BY r.started_at, r.id"""
        rows = self._read(sql, args)
        return tuple(
            RunRecord(row[0], row[1], row[2], row[3], row[4], tuple(sorted(json.loads(row[5]).items())), row[6],
                      row[7], row[8], row[9], row[10], tuple(sorted(json.loads(row[11]).items())), bool(row[12]),
                      row[13], tuple(sorted(json.loads(row[14]).items())))
            for row in rows
        )

    def measurements_of(self, run_id: int) -> tuple[StoredMeasurement, ...]:
        """The measurements of run `run_id`, by candidate rank."""
        rows = self._read(
            """SELECT c.rank, c.predicted_seconds, m.runner, m.seconds, m.correct, m.error, m.build_seconds,
               m.created_at, m.versions FROM measurements m JOIN candidates c ON c.id = m.candidate
               WHERE c.run = ? ORDER BY c.rank, m.id""",
            (run_id,),
        )
        return tuple(
            StoredMeasurement(run_id, rank, predicted, Measurement(
                rank, runner, tuple(json.loads(seconds)), None if correct is None else bool(correct), error,
                build_seconds, created_at, tuple(sorted(json.loads(versions).items())),
            ))
            for rank, predicted, runner, seconds, correct, error, build_seconds, created_at, versions in rows
        )

    def programs_of(self, run_id: int) -> dict[int, dict]:
        """rank -> the stored rProgram (`RProgram.to_dict`) of each candidate of run `run_id`."""
        rows = self._read("SELECT rank, rprogram FROM candidates WHERE run = ? ORDER BY rank", (run_id,))
        return {rank: json.loads(text) for rank, text in rows}

    def estimates_of(self, run_id: int) -> dict[int, dict]:
        """rank -> the stored estimate (`Estimate.to_dict`) of each candidate of run `run_id`."""
        rows = self._read("SELECT rank, estimate FROM candidates WHERE run = ? ORDER BY rank", (run_id,))
        return {rank: json.loads(text) for rank, text in rows}

    def device_of(self, run_id: int) -> DeviceSpec:
        """The device spec run `run_id` was constructed and measured for, as stored with it."""
        rows = self._read("SELECT d.spec FROM runs r JOIN devices d ON d.id = r.device WHERE r.id = ?", (run_id,))
        if not rows:
            raise UserError(f"--run {run_id}: no such run in {self.path}")
        try:
            return DeviceSpec.from_dict(json.loads(rows[0][0]))
        except TypeError as err:  # a field this version does not know
            raise UserError(f"--run {run_id}: its device spec is of another tile-workbench version ({err})") from None

    def run(self, run_id: int) -> RunRecord:
        """Run `run_id`'s record; UserError naming it when the store has none."""
        found = [r for r in self.runs() if r.id == run_id]
        if not found:
            raise UserError(f"--run {run_id}: no such run in {self.path}")
        return found[0]

    def correction(self, device: str) -> StoredCorrection | None:
        """The stored correction of device `device` (its name), or None."""
        rows = self._read("""SELECT fitted_at, measurements, correction, evaluation FROM corrections
                             WHERE device = ?""", (device,))
        if not rows:
            return None
        fitted_at, measurements, correction, evaluation = rows[0]
        return StoredCorrection(device, fitted_at, measurements, Correction.from_dict(json.loads(correction)),
                                json.loads(evaluation))

    def best_so_far(self, workload: str, device: str) -> tuple[BestPoint, ...]:
        """Per run of (workload label, device name), oldest first: its best correct time and the
        best over all runs up to it."""
        rows = self._read(
            """SELECT r.id, r.started_at, MIN(CASE WHEN m.correct = 1 AND m.error = '' THEN m.best_seconds END)
               FROM runs r JOIN workloads w ON w.id = r.workload JOIN devices d ON d.id = r.device
               LEFT JOIN candidates c ON c.run = r.id LEFT JOIN measurements m ON m.candidate = c.id
               WHERE w.label = ? AND d.name = ? GROUP BY r.id ORDER BY r.started_at, r.id""",
            (workload, device),
        )
        points, best = [], None
        for run_id, started_at, run_best in rows:
            if run_best is not None:
                best = run_best if best is None else min(best, run_best)
            points.append(BestPoint(run_id, started_at, run_best, best))
        return tuple(points)

    # -- moving runs between stores --------------------------------------------------------------

    def dump_runs(self, run_ids: Sequence[int]) -> dict:
        """Runs `run_ids` as one JSON-able document (EXCHANGE_FORMAT): each with its workload, its
        device spec, its candidates and their measurements, without this store's ids."""
        runs = []
        for run_id in run_ids:
            row = self._read(
                """SELECT r.started_at, r.finished_at, r.policy, r.topk, r.runner, r.versions, r.cancelled, r.label,
                   r.provenance, w.label, w.op, w.params, w.dtype, d.name, d.kind, d.spec FROM runs r
                   JOIN workloads w ON w.id = r.workload JOIN devices d ON d.id = r.device WHERE r.id = ?""",
                (run_id,))
            if not row:
                raise UserError(f"run {run_id}: no such run in {self.path}")
            (started, finished, policy, topk, runner, versions, cancelled, label, provenance,
             w_label, op, params, dtype, d_name, d_kind, spec) = row[0]
            candidates = self._read("SELECT rank, rprogram, predicted_seconds, estimate FROM candidates "
                                    "WHERE run = ? ORDER BY rank", (run_id,))
            measurements = self._read(
                """SELECT c.rank, m.runner, m.seconds, m.best_seconds, m.median_seconds, m.correct, m.error,
                   m.build_seconds, m.created_at, m.versions FROM measurements m JOIN candidates c
                   ON c.id = m.candidate WHERE c.run = ? ORDER BY m.id""", (run_id,))
            runs.append({
                "started_at": started, "finished_at": finished, "policy": policy, "topk": topk, "runner": runner,
                "versions": json.loads(versions), "cancelled": bool(cancelled), "label": label,
                "provenance": json.loads(provenance),
                "workload": {"label": w_label, "op": op, "params": json.loads(params), "dtype": dtype},
                "device": {"name": d_name, "kind": d_kind, "spec": json.loads(spec)},
                "candidates": [{"rank": rank, "rprogram": json.loads(program), "predicted_seconds": predicted,
                                "estimate": json.loads(estimate)} for rank, program, predicted, estimate in candidates],
                "measurements": [{"rank": rank, "runner": m_runner, "seconds": json.loads(seconds), "best_seconds": best,
                                  "median_seconds": median, "correct": correct, "error": error,
                                  "build_seconds": build, "created_at": created, "versions": json.loads(m_versions)}
                                 for rank, m_runner, seconds, best, median, correct, error, build, created, m_versions
                                 in measurements],
            })
        return {"format": EXCHANGE_FORMAT, "schema": SCHEMA_VERSION, "runs": runs}

    def load_runs(self, doc: Mapping, what: str = "runs file") -> tuple[int, int]:
        """Merge the runs of a `dump_runs` document into this store, in one transaction, with new
        ids; a run the store already holds (same start time, workload, device spec, policy,
        runner and label) is skipped, so importing a file twice adds nothing the second time.
        Returns (added, skipped); UserError naming `what` for a document of another form."""
        if not isinstance(doc, Mapping) or doc.get("format") != EXCHANGE_FORMAT or not isinstance(doc.get("runs"), list):
            raise UserError(f"{what}: not a tile-workbench runs file (format {EXCHANGE_FORMAT!r})")
        added = skipped = 0
        try:
            with self._write() as db:
                for run in doc["runs"]:
                    if self._load_run(db, run):
                        added += 1
                    else:
                        skipped += 1
        except (KeyError, TypeError, AttributeError, ValueError) as err:  # rolled back: nothing of the file is kept
            raise UserError(f"{what}: a run lacks a field or has one of the wrong type ({err!r})") from None
        return added, skipped

    def _load_run(self, db: sqlite3.Connection, run: Mapping) -> bool:
        """Insert one run of a `dump_runs` document (False: the store holds it already)."""
        workload = {"label": run["workload"]["label"], "op": run["workload"]["op"],
                    "dtype": run["workload"]["dtype"], **run["workload"]["params"]}
        workload_id = self._workload_id(db, workload)
        device = run["device"]
        key = (device["name"], device["kind"], _dumps(device["spec"]))
        db.execute("INSERT OR IGNORE INTO devices (name, kind, spec) VALUES (?, ?, ?)", key)
        device_id = db.execute("SELECT id FROM devices WHERE name = ? AND kind = ? AND spec = ?", key).fetchone()[0]
        if db.execute("""SELECT 1 FROM runs WHERE started_at = ? AND workload = ? AND device = ? AND policy = ?
                         AND runner = ? AND label = ?""",
                      (run["started_at"], workload_id, device_id, run["policy"], run["runner"], run["label"])).fetchone():
            return False
        run_id = db.execute(
            """INSERT INTO runs (started_at, finished_at, workload, device, policy, topk, runner, versions, cancelled,
               label, provenance) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (run["started_at"], run["finished_at"], workload_id, device_id, run["policy"], run["topk"], run["runner"],
             _dumps(run["versions"]), int(run["cancelled"]), run["label"], _dumps(run["provenance"])),
        ).lastrowid
        ids = {c["rank"]: db.execute(
            "INSERT INTO candidates (run, rank, rprogram, predicted_seconds, estimate) VALUES (?, ?, ?, ?, ?)",
            (run_id, c["rank"], _dumps(c["rprogram"]), c["predicted_seconds"], _dumps(c["estimate"])),
        ).lastrowid for c in run["candidates"]}
        db.executemany(
            """INSERT INTO measurements (candidate, runner, seconds, best_seconds, median_seconds, correct, error,
               build_seconds, created_at, versions) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            [(ids[m["rank"]], m["runner"], _dumps(m["seconds"]), m["best_seconds"], m["median_seconds"], m["correct"],
              m["error"], m["build_seconds"], m["created_at"], _dumps(m["versions"])) for m in run["measurements"]])
        return True

    # -- plumbing --------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"--db {self.path}: cannot create its folder ({err.strerror})") from None
        with self._guard():
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                   check_same_thread=False)
        try:
            with self._guard():
                conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                self._check_identity(conn)
                conn.execute("PRAGMA journal_mode = WAL")
                # In WAL mode NORMAL loses no committed transaction when a process is killed (only
                # on power loss), and spares an fsync per commit.
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute("PRAGMA foreign_keys = ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_identity(self, conn: sqlite3.Connection) -> None:
        # One read transaction: another process may be creating the store right now, and a view
        # of its id from before that commit with its tables from after would look foreign.
        conn.execute("BEGIN")
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        finally:
            conn.execute("COMMIT")
        if app_id == 0 and not tables:
            return  # a new, empty file: ours to initialise
        if app_id != APPLICATION_ID:
            what = f"tables: {', '.join(tables[:5])}" if tables else f"application id {app_id:#x}"
            raise UserError(f"--db {self.path}: not a tile-workbench runs store ({what})")
        if version > SCHEMA_VERSION:
            raise UserError(f"--db {self.path}: written by a newer tile-workbench "
                            f"(schema {version}, this one reads up to {SCHEMA_VERSION})")

    def _migrate(self) -> None:
        with self._write() as db:
            # Read inside the write transaction: another process may have migrated meanwhile.
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for statements in MIGRATIONS[version:]:
                for statement in statements:
                    db.execute(statement)
            if version < SCHEMA_VERSION:
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def _write(self):
        """One IMMEDIATE transaction (the write lock is taken up front, so two writers never
        deadlock upgrading read locks); rolled back on any error."""
        with self._lock, self._guard():
            db = self._conn
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:  # SQLite itself rolls back on some errors (disk full)
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _read(self, sql: str, args: Sequence) -> list[tuple]:
        with self._lock, self._guard():
            return self._conn.execute(sql, tuple(args)).fetchall()

    @contextmanager
    def _guard(self):
        """SQLite errors as one-line UserErrors naming the file."""
        try:
            yield
        except sqlite3.OperationalError as err:  # locked past busy_timeout, unwritable, disk full
            raise UserError(f"--db {self.path}: {err}") from None
        except sqlite3.DatabaseError as err:  # not a database, or a corrupt one
            raise UserError(f"--db {self.path}: not a tile-workbench runs store ({err})") from None

    @staticmethod
    def _workload_id(db: sqlite3.Connection, workload: Mapping) -> int:
        fixed = {"label", "op", "dtype"}
        key = (str(workload["label"]), str(workload["op"]),
               _dumps({k: v for k, v in workload.items() if k not in fixed}), str(workload.get("dtype", "float32")))
        db.execute("INSERT OR IGNORE INTO workloads (label, op, params, dtype) VALUES (?, ?, ?, ?)", key)
        found = db.execute("SELECT id FROM workloads WHERE label = ? AND op = ? AND params = ? AND dtype = ?", key)
        return found.fetchone()[0]

    @staticmethod
    def _device_id(db: sqlite3.Connection, device: DeviceSpec) -> int:
        key = (device.name, device.kind, _dumps(dataclasses.asdict(device)))
        db.execute("INSERT OR IGNORE INTO devices (name, kind, spec) VALUES (?, ?, ?)", key)
        return db.execute("SELECT id FROM devices WHERE name = ? AND kind = ? AND spec = ?", key).fetchone()[0]


# -- runs files: `dump_runs` documents on disk ------------------------------------------------------


def read_only(path: str | os.PathLike) -> sqlite3.Connection:
    """A connection to the SQLite file at `path` that cannot write it."""
    return sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)


def older_schema(path: str | os.PathLike) -> bool:
    """Whether the file at `path` is a runs store of an older schema, which opening it as a
    `RunStore` migrates in place; read without writing it. False for anything else: a store of
    this schema, a file that is none (`RunStore` names what it is)."""
    try:
        with closing(read_only(path)) as db:
            app_id = db.execute("PRAGMA application_id").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error:
        return False
    return app_id == APPLICATION_ID and version < SCHEMA_VERSION


def write_runs_file(path: str | os.PathLike, doc: Mapping, what: str = "--out") -> None:
    """Write a `dump_runs` document to `path` as JSON, gzip-compressed where the name ends in
    `.gz` (with no timestamp, so the same runs give the same bytes)."""
    data = json.dumps(doc).encode("utf-8")
    if str(path).endswith(".gz"):
        data = gzip.compress(data, compresslevel=9, mtime=0)
    write_user_file(path, data, what)


def read_runs_file(path: str | os.PathLike, what: str = "runs file") -> object:
    """The JSON value of the runs file `path` (as `write_runs_file` writes it, gzip-compressed or
    not; `RunStore.load_runs` checks it is a runs document); UserError as "<what> <path>: ..."."""
    label = f"{what} {path}"
    data = read_user_file(path, what, MAX_RUNS_FILE_BYTES)
    if data[:2] == GZIP_MAGIC:
        inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # a gzip header and trailer around deflate
        try:
            data = inflate.decompress(data, MAX_RUNS_FILE_BYTES + 1)  # one byte more tells one too large
        except zlib.error as err:
            raise UserError(f"{label}: not gzip ({err})") from None
        check_size(len(data), f"{label} (uncompressed)", MAX_RUNS_FILE_BYTES)
        if not inflate.eof:
            raise UserError(f"{label}: gzip cut short")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{label}: not JSON ({err})") from None


# -- the model's correction, fitted on the stored runs (`profile/correction.py`) ---------------------


def stored_rows(store: RunStore, device: str) -> tuple[Row, ...]:
    """The rows of every run of `device` in `store`: each candidate's correct, timed measurement
    (its fastest repeat, the time the comparison and the Runs page use; the fastest of them where
    a candidate was measured more than once) with its stored estimate."""
    rows = []
    for run in store.runs(device=device):
        estimates = store.estimates_of(run.id)
        fastest: dict[int, float] = {}
        for m in store.measurements_of(run.id):
            if m.measurement.ok and m.rank in estimates:
                fastest[m.rank] = min(fastest.get(m.rank, math.inf), m.measurement.best_seconds)
        for rank, seconds in sorted(fastest.items()):
            stages = stages_of(estimates[rank])
            if seconds > 0 and stages.predicted_seconds > 0:  # a time of 0 has no relative error
                rows.append(Row(run.workload, run.op, run.id, rank, stages, seconds))
    return tuple(rows)


def refit(store: RunStore, device: str) -> tuple[Correction, Evaluation]:
    """Fit `device`'s correction on every stored measurement of it, score it (`evaluate`), and
    store it as the device's; UserError when the store holds too few measurements."""
    rows = stored_rows(store, device)
    if not rows:
        known = sorted({run.device for run in store.runs()})
        raise UserError(f"device {device}: no correct measurements in {store.path} "
                        f"(its runs are of: {', '.join(known) if known else 'no device yet'})")
    evaluation = evaluate(rows, device)
    correction = fit(rows, device)
    store.save_correction(correction, evaluation.to_dict())
    return correction, evaluation


def _dumps(value) -> str:
    """Canonical JSON (sorted keys), so equal values are equal strings for the UNIQUE columns."""
    return json.dumps(value, sort_keys=True)


def _stored_program(candidate) -> dict:
    """A candidate's program as stored: `RProgram.to_dict`, and the plan its kernel was built
    from (`Candidate.plan`; a `report.StoredCandidate` read back from a store has none) under "plan", so
    that `bench model` can leave out a program the template now builds otherwise
    (`model_bench.score`)."""
    program = candidate.program.to_dict()
    plan = getattr(candidate, "plan", None)
    return program if plan is None else program | {"plan": plan.to_dict(candidate.program.expr)}


def _insert_measurement(db, run_id: int, m: Measurement) -> None:
    """Insert `m` as a measurement of candidate `m.rank` of run `run_id` (inside a `_write`)."""
    row = db.execute("SELECT id FROM candidates WHERE run = ? AND rank = ?", (run_id, m.rank)).fetchone()
    if row is None:
        raise UserError(f"run {run_id} has no candidate of rank {m.rank}")
    db.execute(
        """INSERT INTO measurements (candidate, runner, seconds, best_seconds, median_seconds, correct,
           error, build_seconds, created_at, versions) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
        (row[0], m.runner, _dumps(list(m.seconds)), m.best_seconds, m.median_seconds,
         None if m.correct is None else int(m.correct), m.error, m.build_seconds, m.created_at,
         _dumps(dict(m.versions))),
    )
