"""profile.remeasure: a comparison's fastest kernels rebuilt from the store and timed in turn. The
statistics and the plumbing with a deterministic `measure` (no timing asserted); the local runner's
path once, end to end through the CLI, asserting what was rebuilt and how many rounds, never how
fast."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.helpers import fake_runs_store
from workbench.cli import main
from workbench.errors import UserError
from workbench.profile.fake import FakeRunner
from workbench.pipeline import stored_kernel
from workbench.profile.remeasure import IN_TURN, fastest_kernel, paired_interval, remeasure
from workbench.profile.runner import Measurement
from workbench.profile.store import RunStore
from workbench.profile.versus import CONFIDENCE, NOT_COMPARABLE, SAME, SLOWER, Selector, compare_runs, t_quantile


def test_the_paired_interval_is_the_t_interval_of_the_rounds_log_ratios():
    a = [1.0, 2.0, 1.5, 1.2]
    b = [1.05, 2.2, 1.5, 1.26]
    d = np.log(b) - np.log(a)
    iv = paired_interval(a, b, 0.95)
    half = t_quantile(0.95, 3) * d.std(ddof=1) / 2
    assert iv.ratio == pytest.approx(math.exp(d.mean()))
    assert (iv.low, iv.high) == (pytest.approx(math.exp(d.mean() - half)), pytest.approx(math.exp(d.mean() + half)))
    assert (iv.runs_a, iv.runs_b, iv.df, iv.model) == (4, 4, 3, IN_TURN)
    with pytest.raises(ValueError, match="at least two rounds"):
        paired_interval([1.0], [1.0], 0.95)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """Fake-profiled runs of two tiny matmuls: "base" and "again" the same code."""
    path = tmp_path_factory.mktemp("remeasure") / "runs.sqlite3"
    return fake_runs_store(path, [("base", FakeRunner(seed=1)), ("again", FakeRunner(seed=2))])


class Turns:
    """A deterministic `measure`: round i of side k takes `seconds[k] * drift[i]` (the host's drift,
    shared by the two sides of a round) times a small per-side wobble."""

    def __init__(self, seconds, fail: str = ""):
        self.seconds, self.fail, self.calls = seconds, fail, []

    def __call__(self, sides, rounds):
        self.calls.append(sides)
        rng = np.random.default_rng(len(self.calls))
        drift = np.exp(rng.normal(0, 0.4, rounds))  # 40 % spells: far beyond the change sought
        out = []
        for k, (_, _, candidate) in enumerate(sides):
            if self.fail and k == 1:
                out.append([Measurement(candidate.rank, "local", error=self.fail)] * rounds)
                continue
            wobble = np.exp(rng.normal(0, 0.005, rounds))
            out.append([Measurement(candidate.rank, "local", tuple([float(self.seconds[k] * d * w)] * 3), correct=True)
                        for d, w in zip(drift, wobble)])
        return out


def rebuild(store):
    return lambda run, rank: stored_kernel(store, run, rank)


def compared(store_path):
    with RunStore(store_path) as store:
        return compare_runs(store, Selector.parse("label=base"), Selector.parse("label=again"))


def test_the_fastest_stored_kernels_are_rebuilt_and_a_five_percent_change_is_told_through_drift(store_path):
    base = compared(store_path)
    with RunStore(store_path) as store:
        same = remeasure(base, rebuild(store), 10, measure=Turns((1e-3, 1e-3)), cannot_run=lambda spec: "")
        turns = Turns((1e-3, 1.05e-3))
        slower = remeasure(base, rebuild(store), 10, measure=turns, cannot_run=lambda spec: "")
        for w, sides in zip(base.workloads, turns.calls):
            for side, (run, rank) in zip(sides, (fastest_kernel(w.a), fastest_kernel(w.b))):
                expr, spec, candidate = side
                assert candidate.rank == rank and spec == store.device_of(run)
                assert candidate.program.to_dict() == store.programs_of(run)[rank]  # the stored program, rebuilt
    assert [w.verdict for w in same.workloads] == [SAME, SAME]
    assert [w.verdict for w in slower.workloads] == [SLOWER, SLOWER]
    assert all(w.interval.ratio == pytest.approx(1.05, rel=0.01) and w.interval.model == IN_TURN
               for w in slower.workloads)
    doc = slower.to_dict(3.0)
    assert doc["remeasured_rounds"] == 10 and doc["regressions"] == ["mm-32", "mm-48"]
    row = doc["workloads"][0]
    assert len(row["remeasured"]["a"]["round_seconds"]) == 10 and row["noise_model"] == IN_TURN
    from workbench.profile.versus import text

    assert "remeasured here in turn" in text(slower)


def test_kernels_that_cannot_run_here_or_fail_are_not_comparable_with_the_reason(store_path):
    base = compared(store_path)
    with RunStore(store_path) as store:
        away = remeasure(base, rebuild(store), 3, measure=Turns((1e-3, 1e-3)), cannot_run=lambda spec: "no AVX-512 here")
        failed = remeasure(base, rebuild(store), 3, measure=Turns((1e-3, 1e-3), fail="wrong result: off by 1"),
                           cannot_run=lambda spec: "")
        with pytest.raises(UserError, match="--rounds must be 2 to 100, got 1"):
            remeasure(base, rebuild(store), 1, measure=Turns((1, 1)), cannot_run=lambda spec: "")
        with pytest.raises(UserError, match="stored no candidate of rank 99"):
            stored_kernel(store, base.a_runs[0], 99)
    assert {w.verdict for w in away.workloads} == {NOT_COMPARABLE}
    assert away.workloads[0].why == "cannot run tiny-cpu's kernels here: no AVX-512 here"
    assert failed.workloads[0].verdict == NOT_COMPARABLE and "failed here: wrong result: off by 1" in failed.workloads[0].why


def test_the_cli_remeasures_real_kernels_here(tmp_path, capsys):
    """Two local profile runs of a small matmul, then `runs compare --remeasure --rounds 2`: each
    side's fastest kernel is built and timed here twice; what was rebuilt and how many rounds are
    asserted, not the verdict (it is a measurement)."""
    db = str(tmp_path / "runs.sqlite3")
    for label in ("a", "b"):
        assert main(["profile", "--op", "matmul", "--shape", "M=64,N=64,K=64", "--device", "local-cpu", "--topk", "2",
                     "--label", label, "--db", db, "--json"]) == 0
    capsys.readouterr()
    assert main(["runs", "compare", "--db", db, "--a", "label=a", "--b", "label=b", "--remeasure", "--rounds", "2",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["workloads"]
    assert doc["remeasured_rounds"] == 2 and row["noise_model"] == IN_TURN, row["why"]
    assert all(len(row["remeasured"][s]["round_seconds"]) == 2 for s in "ab")
    assert [row["remeasured"][s]["rank"] for s in "ab"] == [row[s]["kernels"][0]["rank"] for s in "ab"]
    assert row["ratio_level"] == CONFIDENCE and row["ratio_low"] <= row["ratio"] <= row["ratio_high"]
    assert main(["runs", "compare", "--db", db, "--a", "label=a", "--b", "label=b", "--rounds", "3"]) == 2
    assert "--rounds needs --remeasure" in capsys.readouterr().err
