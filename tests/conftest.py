"""Test-wide settings.

No test reads or writes the user's data directory (runs store, a calibrated local-cpu spec), so
results never depend on what a user did on this machine.

Lanes (WORKBENCH_TEST_LANE): unset runs everything (`make test`); `fast` runs the pure-core tests
in CORE_TESTS with TVM made unimportable (`make test-fast`), their catalog expressions read from
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
    "test_expr_syntax.py",
    "test_graph.py",
    "test_hardware_detect.py",
    "test_invariants.py",
    "test_layers.py",
    "test_markov.py",
    "test_model.py",
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
})


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
    """The fast lane leaves out the core tests marked `tvm` (they build or check with TVM)."""
    if LANE == "fast":
        kept = [item for item in items if item.get_closest_marker("tvm") is None]
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
