"""profile.remeasure: a comparison's fastest stored kernels rebuilt from the store and timed in turn. The
statistics and the plumbing with a deterministic `measure` (no timing asserted); the local runner's
path once, end to end through the CLI, asserting what was rebuilt and how many rounds, never how
fast."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from tests.helpers import fake_runs_store
from workbench.cli import main
from workbench.errors import UserError
from workbench.profile.fake import FakeRunner
from workbench.pipeline import stored_kernel
from workbench.profile.remeasure import IN_TURN, paired_interval, remeasure
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
    """A deterministic `measure`: round i of the kernel of rank r takes `seconds[r] * drift[i]` (the
    host's drift, shared by the kernels of a round) times a small per-kernel wobble."""

    def __init__(self, seconds: dict, fail: int | None = None):
        self.seconds, self.fail, self.calls = seconds, fail, []

    def __call__(self, kernels, rounds):
        self.calls.append(kernels)
        rng = np.random.default_rng(len(self.calls))
        drift = np.exp(rng.normal(0, 0.4, rounds))  # 40 % spells: far beyond the change sought
        out = []
        for _, _, candidate in kernels:
            if candidate.rank == self.fail:
                out.append([Measurement(candidate.rank, "local", error="wrong result: off by 1")] * rounds)
                continue
            wobble = np.exp(rng.normal(0, 0.005, rounds))
            out.append([Measurement(candidate.rank, "local", tuple([float(self.seconds[candidate.rank] * d * w)] * 3),
                                    correct=True) for d, w in zip(drift, wobble)])
        return out


def rebuild(store):
    return lambda run, rank: stored_kernel(store, run, rank)


def compared(store_path):
    with RunStore(store_path) as store:
        return compare_runs(store, Selector.parse("label=base"), Selector.parse("label=again"))


def without_rank(comparison, rank: int):
    """`comparison` with B's runs as if they had not stored their kernel of `rank` (a worse-ranked
    kernel is B's best: a deliberate slowdown)."""
    return replace(comparison, workloads=tuple(
        replace(w, b=replace(w.b, contenders=tuple(k for k in w.b.contenders if k[1] != rank)))
        for w in comparison.workloads))


SPEEDS = {1: 1e-3, 2: 1.05e-3, 3: 1.3e-3}  # rank 2 is 5 % slower than rank 1


def test_each_sides_stored_kernels_are_rebuilt_once_each_and_the_same_program_is_no_change(store_path):
    base = compared(store_path)
    turns = Turns(SPEEDS)
    with RunStore(store_path) as store:
        same = remeasure(base, rebuild(store), 10, measure=turns, cannot_run=lambda spec: "")
        for w, kernels in zip(base.workloads, turns.calls):
            assert len(w.a.contenders) == len(w.b.contenders) == 3  # each run's three fastest
            # the two same-code runs stored the same three programs: each is built and timed once
            assert sorted(c.rank for _, _, c in kernels) == sorted(k for _, k in w.a.contenders) == [1, 2, 3]
            for _, spec, candidate in kernels:
                (run,) = [r for r, k in w.a.contenders if k == candidate.rank]
                assert spec == store.device_of(run)
                stored = candidate.program.to_dict() | {"plan": candidate.plan.to_dict(candidate.expr)}
                assert stored == store.programs_of(run)[candidate.rank]  # the stored program, built as stored
    for w in same.workloads:
        assert w.verdict == SAME and w.why == "both sides' fastest here is the same program"
        assert (w.interval.ratio, w.interval.low, w.interval.high) == (1.0, 1.0, 1.0)
        r = w.remeasured
        assert r.same_program and r.kernel_a[1] == r.kernel_b[1] == 1 and r.seconds_a == r.seconds_b
        assert [k for _, k, _ in r.contenders_a] == [k for _, k in w.a.contenders]


def test_a_five_percent_slower_best_is_told_through_drift(store_path):
    """B lost its fastest kernel (rank 1): its best here is rank 2, 5 % slower, under 40 % drift."""
    with RunStore(store_path) as store:
        slower = remeasure(without_rank(compared(store_path), 1), rebuild(store), 10, measure=Turns(SPEEDS),
                           cannot_run=lambda spec: "")
    assert [w.verdict for w in slower.workloads] == [SLOWER, SLOWER]
    for w in slower.workloads:
        assert w.interval.ratio == pytest.approx(1.05, rel=0.01) and w.interval.model == IN_TURN
        assert (w.remeasured.kernel_a[1], w.remeasured.kernel_b[1], w.remeasured.same_program) == (1, 2, False)
        assert [k for _, k, _ in w.remeasured.contenders_b] == [k for _, k in w.b.contenders if k != 1]
        here = [math.exp(np.mean(np.log(t))) for t in (w.remeasured.seconds_a, w.remeasured.seconds_b)]
        assert w.remeasured.here_seconds == pytest.approx(here)  # the chosen kernels' own rounds
    doc = slower.to_dict(3.0)
    assert doc["remeasured_rounds"] == 10 and doc["regressions"] == ["mm-32", "mm-48"]
    row = doc["workloads"][0]
    assert len(row["remeasured"]["a"]["round_seconds"]) == 10 and row["noise_model"] == IN_TURN
    assert [c["rank"] for c in row["remeasured"]["b"]["contenders"]] == [k for _, k in slower.workloads[0].b.contenders]
    assert row["remeasured"]["b"]["contenders"][0]["seconds"] == pytest.approx(SPEEDS[2], rel=0.5)
    from workbench.profile.versus import text

    assert "remeasured here in turn" in text(slower)


def test_kernels_that_cannot_run_here_or_fail_are_not_comparable_with_the_reason(store_path):
    base = compared(store_path)
    with RunStore(store_path) as store:
        away = remeasure(base, rebuild(store), 3, measure=Turns(SPEEDS), cannot_run=lambda spec: "no AVX-512 here")
        failed = remeasure(without_rank(base, 1), rebuild(store), 3, measure=Turns(SPEEDS, fail=2),
                           cannot_run=lambda spec: "")
        with pytest.raises(UserError, match="--rounds must be 2 to 100, got 1"):
            remeasure(base, rebuild(store), 1, measure=Turns(SPEEDS), cannot_run=lambda spec: "")
        with pytest.raises(UserError, match="stored no candidate of rank 99"):
            stored_kernel(store, base.a_runs[0], 99)
    assert {w.verdict for w in away.workloads} == {NOT_COMPARABLE}
    assert away.workloads[0].why == "cannot run tiny-cpu's kernels here: no AVX-512 here"
    (w,) = [w for w in failed.workloads if w.workload == "mm-32"]
    assert w.verdict == NOT_COMPARABLE and "failed here: wrong result: off by 1" in w.why
    assert w.why.startswith("A's kernel (run ")  # rank 2 is a contender of both sides; A's is named first


def test_the_cli_remeasures_real_kernels_here(tmp_path, capsys):
    """Two local profile runs of a small matmul, then `runs compare --remeasure --rounds 2`: each
    side's stored kernels are built and timed here twice; what was rebuilt and how many rounds are
    asserted, and that the same code's programs are one kernel for both sides, never how fast."""
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
    for s in "ab":  # each run's two stored kernels were the contenders, its fastest here one of them
        contenders = row["remeasured"][s]["contenders"]
        assert sorted(c["rank"] for c in contenders) == [1, 2] and {c["run"] for c in contenders} == set(row[s]["runs"])
        assert row["remeasured"][s]["rank"] in [c["rank"] for c in contenders]
    # the same code on the same spec stored the same two programs: timed once, for both sides
    assert row["remeasured"]["same_program"] and row["ratio"] == row["ratio_low"] == row["ratio_high"] == 1.0
    assert row["verdict"] == SAME and row["ratio_level"] == CONFIDENCE
    assert main(["runs", "compare", "--db", db, "--a", "label=a", "--b", "label=b", "--rounds", "3"]) == 2
    assert "--rounds needs --remeasure" in capsys.readouterr().err
    # the report of the comparison, remeasured the same way: its noise line and the kernels timed here
    out = tmp_path / "report.html"
    assert main(["report", "--db", db, "--a", "label=a", "--b", "label=b", "--remeasure", "--rounds", "2",
                 "--out", str(out)]) == 0
    page = out.read_text()
    assert "Noise: remeasured here in turn" in page and "A here (run#rank: geometric mean)" in page
    assert "fastest here is the same program" in page
    assert main(["report", "--db", db, "--run", "1", "--remeasure", "--out", str(out)]) == 2
    assert "report: --remeasure needs a comparison (--a SEL and --b SEL)" in capsys.readouterr().err
