"""Comparing two sets of stored runs (`profile/versus.py`): selectors, Student's t, the run-level
interval and its noise models, verdicts, and how often a comparison of the same code cries wolf
against how surely it catches a 5 % slowdown, on synthetic runs whose whole time drifts from run to
run and whose repeats are drawn as timing noise on a shared machine is (fixed seeds)."""

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
    CONFIDENCE, DRIFT_DF, FASTER, FLOOR, NOT_COMPARABLE, RUNS, SAME, SLOWER, Noise, Selector, compare_runs,
    mapping_selector, ratio_interval, t_quantile, t_two_sided, verdict,
)


@pytest.mark.parametrize("confidence, df, t", [
    (0.95, 1, 12.7062), (0.95, 2, 4.3027), (0.95, 4, 2.7764), (0.95, 8, 2.3060), (0.99, 5, 4.0321),
    (0.99, 10, 3.1693), (0.90, 3, 2.3534), (0.99, 60, 2.6603),
])
def test_the_t_quantiles_are_the_tables(confidence, df, t):
    # two-sided critical values of Student's t, from the usual tables (4 decimals)
    assert t_quantile(confidence, df) == pytest.approx(t, abs=1e-4)
    assert t_two_sided(t_quantile(confidence, df), df) == pytest.approx(confidence, abs=1e-9)


def test_a_side_of_one_run_leans_on_the_drift_prior_and_several_on_their_own_spread():
    prior = Noise(drift=0.02, drift_df=4)
    one = ratio_interval([1.0], [1.1], 0.95, prior)
    assert one.model == FLOOR and one.df == 4 and one.spread == pytest.approx(0.02)
    half = t_quantile(0.95, 4) * 0.02 * math.sqrt(2)
    assert one.ratio == pytest.approx(1.1) and one.low == pytest.approx(1.1 * math.exp(-half))
    assert one.runs_a == one.runs_b == 1 and one.level == 0.95
    # three runs a side that spread 10 %: the pooled sd moves from the prior towards theirs
    a, b = [1.0, 1.1, 1.21], [1.1, 1.21, 1.331]
    several = ratio_interval(a, b, 0.95, prior)
    own = np.log(a).std(ddof=1)
    assert several.model == RUNS and several.df == 8 and 0.02 < several.spread < own
    assert several.spread == pytest.approx(math.sqrt((4 * 0.02 ** 2 + 4 * own ** 2) / 8))
    assert several.ratio == pytest.approx(1.1) and several.low < 1 < several.high
    assert verdict(several)[0] == SAME and verdict(ratio_interval(a, [t * 1.5 for t in a], 0.95, prior))[0] == SLOWER
    assert ratio_interval(a, [], 0.95, prior) is None and verdict(None)[0] == NOT_COMPARABLE


def test_the_prior_pools_the_compared_runs_where_they_have_degrees_of_freedom():
    fallback = Noise(0.05, DRIFT_DF)
    assert Noise.pooled([([0.0], [0.1]), ([0.0], [0.0])], fallback) is fallback  # one run a side: nothing to pool
    sides = [(np.log([1.0, 1.02, 0.99]), np.log([1.01, 1.0, 0.98])) for _ in range(3)]
    pooled = Noise.pooled(sides, fallback)
    ss = sum(((x - x.mean()) ** 2).sum() for pair in sides for x in pair)
    assert pooled.drift == pytest.approx(math.sqrt(ss / 12)) and pooled.drift_df == DRIFT_DF
    assert "12 degrees of freedom from 3 workloads" in pooled.source


def test_verdicts_need_the_whole_interval_beyond_the_margin():
    quiet = Noise(drift=0.001, drift_df=4)
    a = [1.0, 1.001, 0.999]
    assert verdict(ratio_interval(a, [t * 1.05 for t in a], 0.95, quiet))[0] == SLOWER
    assert verdict(ratio_interval(a, [t / 1.05 for t in a], 0.95, quiet))[0] == FASTER
    assert verdict(ratio_interval(a, [t * 1.005 for t in a], 0.95, quiet))[0] == SAME  # under the 1 % margin


def noisy(rng, true: float, n: int) -> np.ndarray:
    """n repeats of a kernel of `true` seconds on a shared machine: only ever slowed, mostly by
    under 1 % (a half-normal of 0.5 % log sd), and 1 in 10 repeats hit by another process for a
    further 2-30 % (log-uniform): the shape of the stored cpu-core repeats (`profile/noise.py`:
    median spread 0.5 %, 95th percentile 7 %)."""
    slowed = np.abs(rng.normal(0.0, 0.005, n))
    hit = rng.random(n) < 0.1
    slowed += hit * np.exp(rng.uniform(math.log(0.02), math.log(0.3), n))
    return true * np.exp(slowed)


def run_times(rng, true: float, runs: int, drift: float, repeats: int = 5) -> list[float]:
    """Each run's time (its median repeat) of a kernel of `true` seconds: the whole run slowed or
    sped up by a log-normal drift of sd `drift` (the host between runs), then its repeats `noisy`."""
    return [float(np.median(noisy(rng, true * math.exp(rng.normal(0.0, drift)), repeats))) for _ in range(runs)]


def rates(shift: float, runs: int, drift: float, noise: Noise | None = None, confidence: float = CONFIDENCE,
          workloads: int = 2000, seed: int = 20261128) -> dict[str, float]:
    """The share of each verdict over `workloads` comparisons of `runs` runs a side on a host that
    drifts by `drift` between runs, B `shift` times A's time, under `noise` (by default a prior
    equal to the host's drift)."""
    rng = np.random.default_rng(seed)
    noise = noise or Noise(drift=drift)
    found = {FASTER: 0, SLOWER: 0, SAME: 0, NOT_COMPARABLE: 0}
    for _ in range(workloads):
        true = 10 ** rng.uniform(-6, -3)
        interval = ratio_interval(run_times(rng, true, runs, drift), run_times(rng, true * shift, runs, drift),
                                  confidence, noise)
        found[verdict(interval)[0]] += 1
    return {v: n / workloads for v, n in found.items()}


@pytest.mark.parametrize("runs, drift", [(1, 0.02), (3, 0.02), (3, 0.10), (5, 0.05)])
def test_the_same_code_is_flagged_on_under_one_percent_of_workloads_despite_drift(runs, drift):
    same = rates(1.0, runs, drift)
    assert same[FASTER] + same[SLOWER] < 0.01, same


def test_pooling_runs_protects_when_the_prior_understates_the_drift():
    """A prior of 1 % on a host that drifts 10 %: one run a side cries wolf on most workloads, five
    runs a side, whose own spread outweighs the prior, on few."""
    wrong = Noise(drift=0.01)
    assert sum(rates(1.0, 1, 0.10, wrong, workloads=500)[v] for v in (FASTER, SLOWER)) > 0.5
    assert sum(rates(1.0, 5, 0.10, wrong, workloads=500)[v] for v in (FASTER, SLOWER)) < 0.03


@pytest.mark.parametrize("runs, drift, least", [(3, 0.01, 0.80), (8, 0.02, 0.75), (1, 0.003, 0.90)])
def test_a_five_percent_slowdown_is_flagged(runs, drift, least):
    """The trade-off at CONFIDENCE: a host drifting 1 % between runs catches a 5 % slowdown with 3
    runs a side, one drifting 2 % needs 8, one drifting 0.3 % one run a side (docs/benchmarks.md)."""
    slow = rates(1.05, runs, drift, workloads=1000)
    assert slow[SLOWER] >= least, slow
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
    fake = Noise(drift=0.003, source="the fake runner does not drift")  # one run a side: the prior decides
    with RunStore(store_path) as store:
        same = compare_runs(store, Selector.parse("label=base"), Selector.parse("label=again"), noise=fake)
        slow = compare_runs(store, Selector.parse("label=base"), Selector.parse("label=slow"), noise=fake)
        default = compare_runs(store, Selector.parse("label=base"), Selector.parse("label=slow"))
        pooled = compare_runs(store, Selector.parse("label=base,label=again"), Selector.parse("label=slow"))
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
    assert row["a"]["run_seconds"] == [pytest.approx(row["a"]["median_seconds"])]
    assert row["ratio_low"] < row["ratio"] < row["ratio_high"] and row["ratio_level"] == CONFIDENCE
    assert row["noise_model"] == FLOOR and row["run_spread"] == pytest.approx(0.003) and row["run_spread_df"] == DRIFT_DF
    assert doc["noise"] == {"drift": 0.003, "drift_df": DRIFT_DF, "source": "the fake runner does not drift"}
    # by default one run a side leans on the measured drift prior; two a side on A bring their own spread,
    # too few degrees of freedom (2) to replace the prior
    assert default.noise == Noise() and all(w.interval.model == FLOOR for w in default.workloads)
    assert pooled.noise == Noise() and all(w.interval.model == RUNS and w.interval.runs_a == 2 for w in pooled.workloads)


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
