"""Profile sessions: the fake runner drives the whole session in milliseconds; a real local
session times matmul 64x64x64 and the store holds its measurements; per-build timeouts and bad
input are reported, not raised."""

from __future__ import annotations

import json
from functools import lru_cache

import pytest

from tests.helpers import TINY_CPU, matmul
from workbench.construct.space import Options
from workbench.construct.stepper import construct
from workbench.errors import UserError
from workbench.profile.fake import FakeRunner
from workbench.profile.runner import Timing
from workbench.profile.session import profile_candidates
from workbench.profile.store import RunStore

FAST = Timing(repeat=3, min_repeat_ms=1)


@lru_cache(maxsize=None)
def mm64():
    return construct(matmul(64, 64, 64), TINY_CPU, options=Options(topk=4))


def test_the_fake_runner_drives_a_whole_session(tmp_path):
    c = mm64()
    events = []
    with RunStore(tmp_path / "runs.sqlite3") as store:
        result = profile_candidates(c.expr, TINY_CPU, c.candidates, runner=FakeRunner(incorrect=frozenset({1})),
                                    store=store, workload_label="t:mm-64", progress=events.append)
        stored = store.measurements_of(result.run_id)
        (run,) = store.runs(workload="t:mm-64")
    assert [m.rank for m in result.measurements] == [1, 2, 3, 4]
    assert result.measurements[0].correct is False and result.best.rank != 1
    assert result.comparison.n == 3 and result.comparison.best_predicted_rank == result.best.rank
    assert [e.phase for e in events] == ["measure"] * 4 and events[-1].done == events[-1].total == 4
    assert [s.measurement for s in stored] == list(result.measurements)
    assert run.id == result.run_id and run.runner == "fake" and run.finished_at is not None
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert [cand["rank"] for cand in data["candidates"]] == [1, 2, 3, 4]
    assert data["candidates"][0]["correct"] is False and data["best_seconds"] == result.best.best_seconds
    assert {"spearman", "kendall", "best_in_top1", "error_ratio", "run_id"} <= set(data)


def test_a_local_session_times_a_real_kernel_and_stores_it(tmp_path):
    c = mm64()
    events = []
    with RunStore(tmp_path / "runs.sqlite3") as store:
        result = profile_candidates(c.expr, TINY_CPU, c.candidates[:2], runner="local", store=store, timing=FAST,
                                    progress=events.append)
        stored = store.measurements_of(result.run_id)
    assert [m.correct for m in result.measurements] == [True, True], [m.error for m in result.measurements]
    assert all(len(m.seconds) == 3 and m.best_seconds > 0 and m.build_seconds > 0 for m in result.measurements)
    assert [s.measurement.best_seconds for s in stored] == [m.best_seconds for m in result.measurements]
    assert sorted(e.phase for e in events) == ["build", "build", "measure", "measure"]


def test_a_build_past_its_timeout_is_recorded(tmp_path):
    c = mm64()
    result = profile_candidates(c.expr, TINY_CPU, c.candidates[:1], runner="local", build_timeout_s=1e-4, jobs=1)
    (m,) = result.measurements
    assert m.error == "build: timed out after 0.0001 s" and m.correct is None and result.best is None


def test_bad_input_is_a_user_error():
    c = mm64()
    with pytest.raises(UserError, match="unknown runner 'gpu'"):
        profile_candidates(c.expr, TINY_CPU, c.candidates, runner="gpu")
    with pytest.raises(UserError, match="--tracker"):
        profile_candidates(c.expr, TINY_CPU, c.candidates, runner="rpc")
    with pytest.raises(UserError, match="no candidates"):
        profile_candidates(c.expr, TINY_CPU, (), runner="fake")
