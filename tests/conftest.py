"""Test-wide settings.

No test reads or writes the user's data directory (runs store, a calibrated local-cpu spec), so
results never depend on what a user did on this machine, and none calibrates this machine by
itself on first use (WORKBENCH_AUTO_CALIBRATE=0).

Lanes (WORKBENCH_TEST_LANE): unset runs everything (`make test`, after the fast lane); `fast` runs
the pure-core tests in CORE_TESTS, less the parts of sweeps in FULL_LANE_ONLY, with TVM made
unimportable (`make test-fast`), their catalog expressions read from
tests/fixtures/tensor_exprs.json; `record` runs the same tests with TVM and rewrites that file
from the expressions they built (`make fixtures`).
"""

import json
import os
import sys
from pathlib import Path

import pytest

LANE = os.environ.get("WORKBENCH_TEST_LANE", "")
# The tests of the pure core: construction, the rTile model, specs, the expression syntax and the
# package's layers.
CORE_TESTS = frozenset({
    "test_alignment.py",
    "test_banks.py",
    "test_construction_snapshot.py",
    "test_expr_syntax.py",
    "test_frozen.py",
    "test_gpu_runner.py",
    "test_graph.py",
    "test_hardware_detect.py",
    "test_hardware_edit.py",
    "test_invariants.py",
    "test_layers.py",
    "test_markov.py",
    "test_model.py",
    "test_plan.py",
    "test_profile_compare.py",
    "test_profile_correction.py",
    "test_profile_diagnose.py",
    "test_profile_importance.py",
    "test_profile_noise.py",
    "test_profile_runner.py",
    "test_rammer.py",
    "test_roller.py",
    "test_shapes.py",
    "test_stepper.py",
    "test_traffic.py",
    "test_viz_dataflow.py",
    "test_whatif.py",
})


# Sweeps the full lane runs whole and the fast lane (at most 90 s on 2 cores) runs in part: of
# each, the fast lane keeps the parametrized cases the predicate accepts (none of a hypothesis
# sweep), the rest being the same property over more devices or drawn cases: 40 % of the fast
# lane's CPU time (278 s without these cuts, 161 s with them, 2026-11-28).
FULL_LANE_ONLY = {
    "test_invariants.py::test_presets_keep_every_invariant":
        lambda p: (p["preset"], p["policy"]) in {("xeon-avx512", "markov"), ("v100", "roller")},
    "test_invariants.py::test_roller_keeps_every_invariant_on_any_detected_cpu": None,
    "test_invariants.py::test_markov_keeps_every_invariant_on_any_detected_cpu": None,
    "test_invariants.py::test_every_policy_keeps_every_invariant_on_a_preset": None,
    "test_markov.py::test_the_gensor_suite_constructs_within_the_limits_on_the_v100": None,
    "test_roller.py::test_every_suite_workload_constructs_within_the_limits":
        lambda p: p["dev"] in ("local-cpu", "v100"),
    "test_whatif.py::test_one_unit_never_predicts_faster": lambda p: p["preset"] == "v100",
}


def _fast_lane_keeps(item) -> bool:
    if item.get_closest_marker("tvm") is not None:
        return False
    name = f"{item.path.name}::{item.originalname}"
    if name not in FULL_LANE_ONLY:
        return True
    keeps = FULL_LANE_ONLY[name]
    return keeps is not None and hasattr(item, "callspec") and keeps(item.callspec.params)


class _NoTVM:
    """A meta-path finder that makes `import tvm` fail: the fast lane proves the core needs none."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tvm", "tvm_ffi"):
            raise ImportError(f"the fast lane runs without TVM, but {name} was imported")
        return None


if LANE == "fast":
    sys.meta_path.insert(0, _NoTVM())


def pytest_ignore_collect(collection_path: Path, config):
    if LANE and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return collection_path.name not in CORE_TESTS
    return None


def pytest_collection_modifyitems(config, items):
    """The fast lane leaves out the core tests marked `tvm` (they build or check with TVM) and the
    parts of the sweeps in FULL_LANE_ONLY."""
    if LANE == "fast":
        kept = [item for item in items if _fast_lane_keeps(item)]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


def pytest_sessionfinish(session, exitstatus):
    if LANE == "record" and exitstatus == 0:
        from helpers import EXPR_FIXTURES, RECORDED

        EXPR_FIXTURES.parent.mkdir(exist_ok=True)
        lines = (f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in sorted(RECORDED.items()))
        EXPR_FIXTURES.write_text("{\n" + ",\n".join(lines) + "\n}\n")  # one expression a line


@pytest.fixture(autouse=True)
def private_data_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))
    # No test calibrates this machine by accident (`hardware.calibrate.first_use_due`): the ones
    # of the first-use calibration turn it on with a fake measurement.
    monkeypatch.setenv("WORKBENCH_AUTO_CALIBRATE", "0")
