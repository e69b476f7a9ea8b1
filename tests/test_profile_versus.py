"""Comparing two sets of stored runs (`profile/versus.py`): selectors, the Mann-Whitney null
distribution and the Hodges-Lehmann interval, verdicts, and how often a comparison of the same
code cries wolf against how surely it catches a 5 % slowdown, on synthetic repeats drawn as timing
noise on a shared machine is."""

from __future__ import annotations

import math
import time
from datetime import datetime

import numpy as np
import pytest

from tests.helpers import fake_runs_store
from workbench.errors import UserError
from workbench.profile.fake import FakeRunner
from workbench.profile.store import RunStore
from workbench.profile.versus import (
    FASTER, NOT_COMPARABLE, SAME, SLOWER, Selector, compare_runs, mann_whitney_cdf, mapping_selector, ratio_interval,
    verdict,
)


def test_the_null_distribution_of_u_is_the_counted_one():
    # m = 3, n = 2: the 10 orderings give U = 0, 1, 2, 2, 3, 3, 4, 4, 5, 6 (counts 1 1 2 2 2 1 1)
    assert list(np.round(mann_whitney_cdf(3, 2) * 10, 9)) == [1, 2, 4, 6, 8, 9, 10]
    # m = n = 5: P(U <= 2) = 4 / 252, the tables' two-sided 5 % critical value U = 2
    assert mann_whitney_cdf(5, 5)[2] == pytest.approx(4 / 252)
    assert mann_whitney_cdf(7, 4)[-1] == pytest.approx(1.0)


def test_the_ratio_interval_covers_the_shift_and_reaches_its_level():
    a = [1.00, 1.01, 1.02, 1.05, 1.10]
    same = ratio_interval(a, a)
    assert same.ratio == pytest.approx(1.0) and same.low < 1 < same.high
    assert same.level == pytest.approx(1 - 2 * 4 / 252)  # k = 3 for 5 vs 5 at 95 %
    slow = ratio_interval(a, [t * 1.2 for t in a])
    assert slow.ratio == pytest.approx(1.2) and slow.low > 1
    assert ratio_interval(a, []) is None
    few = ratio_interval([1.0, 1.1], [1.0, 1.2])
    assert few.level < 0.95 and verdict(few, 0.95)[0] == NOT_COMPARABLE
    three = ratio_interval([1.0, 1.001, 1.002], [1.1, 1.101, 1.102], 0.9)  # timings settled after 3 repeats
    assert three.level == pytest.approx(0.9) and verdict(three, 0.9)[0] == SLOWER
    assert verdict(ratio_interval([1.0, 1.001, 1.002], [1.1, 1.101, 1.102]), 0.95)[0] == NOT_COMPARABLE


def test_verdicts_need_the_whole_interval_beyond_the_margin():
    a = list(np.linspace(1.0, 1.02, 9))
    assert verdict(ratio_interval(a, [t * 1.05 for t in a]), 0.95)[0] == SLOWER
    assert verdict(ratio_interval(a, [t / 1.05 for t in a]), 0.95)[0] == FASTER
    assert verdict(ratio_interval(a, [t * 1.005 for t in a]), 0.95)[0] == SAME  # under the 1 % margin


def noisy(rng, true: float, n: int) -> np.ndarray:
    """n repeats of a kernel of `true` seconds on a shared machine: only ever slowed, mostly by
    under 1 % (a half-normal of 0.5 % log sd), and 1 in 10 repeats hit by another process for a
    further 2-30 % (log-uniform): the shape of the stored cpu-core repeats (`profile/noise.py`:
    median spread 0.5 %, 95th percentile 7 %)."""
    slowed = np.abs(rng.normal(0.0, 0.005, n))
    hit = rng.random(n) < 0.1
    slowed += hit * np.exp(rng.uniform(math.log(0.02), math.log(0.3), n))
    return true * np.exp(slowed)


def rates(shift: float, workloads: int = 2000, repeats: int = 10, confidence: float = 0.95) -> dict[str, float]:
    """The share of each verdict over `workloads` comparisons of `repeats` repeats a side (10: two
    runs of `profile`'s default 5 pooled per side; one run of 5 a side catches a 5 % slowdown in
    about 70 % of workloads under this noise, 7 in 87 %)."""
    rng = np.random.default_rng(20261128)
    found = {FASTER: 0, SLOWER: 0, SAME: 0, NOT_COMPARABLE: 0}
    for _ in range(workloads):
        true = 10 ** rng.uniform(-6, -3)
        interval = ratio_interval(noisy(rng, true, repeats), noisy(rng, true * shift, repeats), confidence)
        found[verdict(interval, confidence)[0]] += 1
    return {v: n / workloads for v, n in found.items()}


def test_the_same_code_is_flagged_on_under_one_percent_of_workloads():
    same = rates(1.0)
    assert same[FASTER] + same[SLOWER] < 0.01, same
    assert same[NOT_COMPARABLE] == 0


def test_a_five_percent_slowdown_is_flagged():
    slow = rates(1.05)
    assert slow[SLOWER] >= 0.95, slow
    assert slow[FASTER] == 0


@pytest.mark.parametrize("text, needle", [
    ("label", "is not KEY=VALUE"),
    ("colour=red", "unknown key 'colour'"),
    ("commit=xyz", "is not a commit"),
    ("commit=ab", "is not a commit"),
    ("since=yesterday", "is not a date"),
    ("until=2026-13-01", "is not a date"),
    ("run=3-x", "is not a run id"),
    ("label=a,,device=b", "is not KEY=VALUE"),
])
def test_bad_selectors_are_one_line_errors(text, needle):
    with pytest.raises(UserError, match=needle) as err:
        Selector.parse(text, "--a")
    assert "\n" not in str(err.value) and str(err.value).startswith("--a")


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """Runs of two matmuls: "base" and "again" the same code (FakeRunner seeds differ only in the
    repeats' noise: the same kernels), "slow" every kernel 10 % slower."""
    path = tmp_path_factory.mktemp("versus") / "runs.sqlite3"
    return fake_runs_store(path, [("base", FakeRunner(seed=1)), ("again", FakeRunner(seed=1, noise=0.003)),
                                  ("slow", FakeRunner(seed=1, scale=2.2))])


def test_selectors_pick_runs_by_label_device_policy_date_and_id(store_path):
    with RunStore(store_path) as store:
        runs = store.runs()
    assert len(Selector.parse("label=base").select(runs)) == 2
    assert len(Selector.parse("label=base,label=slow").select(runs)) == 4
    assert len(Selector.parse("label=base,device=tiny-cpu,policy=roller").select(runs)) == 2
    assert Selector.parse("device=v100").select(runs) == ()
    assert [r.id for r in Selector.parse(f"run={runs[1].id}-{runs[2].id}").select(runs)] == [runs[1].id, runs[2].id]
    today = datetime.fromtimestamp(time.time()).strftime("%Y-%m-%d")
    assert len(Selector.parse(f"since={today},until={today}").select(runs)) == 6
    assert Selector.parse("until=2000-01-01").select(runs) == ()
    commit = runs[0].commit
    assert commit and len(Selector.parse(f"commit={commit[:7]}").select(runs)) == 6
    assert mapping_selector({"label": ["base", "again"]}).select(runs) == Selector.parse("label=base,label=again").select(runs)


def test_the_same_code_compares_as_no_change_and_a_slower_one_as_slower(store_path):
    with RunStore(store_path) as store:
        same = compare_runs(store, Selector.parse("label=base"), Selector.parse("label=again"))
        slow = compare_runs(store, Selector.parse("label=base"), Selector.parse("label=slow"))
        with pytest.raises(UserError, match="--b 'label=nothing': no finished run"):
            compare_runs(store, Selector.parse("label=base"), Selector.parse("label=nothing"))
    assert [w.verdict for w in same.workloads] == [SAME, SAME]
    assert [w.workload for w in slow.workloads] == ["mm-32", "mm-48"]
    assert [w.verdict for w in slow.workloads] == [SLOWER, SLOWER]
    assert all(w.interval.ratio == pytest.approx(1.1, rel=0.03) for w in slow.workloads)
    assert [w.workload for w in slow.regressions(5)] == ["mm-32", "mm-48"] and slow.regressions(20) == ()
    doc = slow.to_dict(5.0)
    assert doc["counts"][SLOWER] == 2 and doc["regressions"] == ["mm-32", "mm-48"]
    row = doc["workloads"][0]
    assert row["a"]["samples"] == 7 and row["a"]["median_low"] <= row["a"]["median_seconds"] <= row["a"]["median_high"]
    assert row["ratio_low"] < row["ratio"] < row["ratio_high"] and row["ratio_level"] >= 0.95


def test_runs_started_on_a_busy_machine_are_named(tmp_path):
    """A local run whose load average at the start was at least half the CPUs is named busy; a
    quiet one, a fake one (nothing timed here) and one without provenance are not."""
    from tests.helpers import TINY_CPU, matmul
    from workbench.construct.space import Options
    from workbench.construct.stepper import construct
    from workbench.profile.provenance import busy
    from workbench.profile.runner import Measurement

    assert busy({"runner": "local", "load_average": 1.0, "cpus": 2})
    assert not busy({"runner": "local", "load_average": 0.9, "cpus": 2})
    assert not busy({"runner": "fake", "load_average": 9.0, "cpus": 2}) and not busy({})
    cands = construct(matmul(32, 32, 32), TINY_CPU, options=Options(topk=1)).candidates
    workload = {"label": "mm-32", "op": "matmul", "dtype": "float32", "M": 32, "N": 32, "K": 32}
    with RunStore(tmp_path / "runs.sqlite3") as store:
        ids = []
        for label, load in (("quiet", 0.2), ("busy", 3.0)):
            run_id = store.start_run(workload=workload, device=TINY_CPU, policy="roller", runner="local",
                                     candidates=cands, label=label,
                                     provenance={"runner": "local", "load_average": load, "cpus": 2})
            store.add_measurement(run_id, Measurement(1, "local", (1e-6, 1.01e-6, 1.02e-6, 1.0e-6, 1.03e-6), True))
            store.finish_run(run_id)
            ids.append(run_id)
        c = compare_runs(store, Selector.parse("label=quiet"), Selector.parse("label=busy"))
    assert c.busy_runs == (ids[1],) and f"runs {ids[1]} started on a busy machine" in c.busy_note()
    assert c.to_dict()["busy_runs"] == [ids[1]]
