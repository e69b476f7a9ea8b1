"""A Vortex bundle for an expression with one `dyn` axis (`--expr ... --shape i=dyn,...`), compiled
on this CPU with small static extents so it builds in seconds: the manifest records the text and
the axis, loading parses it (never evaluates it), and every run is verified against numpy at 1,
a prime and a value beyond the template and the declared bound. Refusals are one line, exit 2."""

import json

import pytest

from workbench import pipeline
from workbench.cli import main
from workbench.errors import UserError
from workbench.vortex import bundle as vortex
from workbench.workload import workload_from_args

pytestmark = pytest.mark.tvm

MATMUL = "C[i,j] += A[i,k] * B[k,j]"
MAX = 64  # the declared bound: values above it still run (padded), as the test checks


def _workload(text=MATMUL, shape="i=dyn,k=32,j=32"):
    return workload_from_args(None, shape, text, None, "float32")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("vortex-expr") / "mm"
    return vortex.compile_bundle(_workload(), pipeline.load_device("local-cpu"), out, max_extent=MAX, limit=2)


def test_the_manifest_records_the_expression_and_its_dynamic_axis(small):
    m = small.manifest
    assert m["workload"] == {"op": "expr", "dtype": "float32", "expr": MATMUL, "k": 32, "j": 32, "i": "dyn"}
    assert m["dynamic"] == {"param": "i", "axis": "i", "max_extent": MAX}
    assert m["verified"] is True and m["failed"] == [] and 1 <= len(m["kernels"]) <= 2
    for k in m["kernels"]:
        assert [c["value"] for c in k["verified"]][0] == 1 and all(c["correct"] for c in k["verified"])
    assert small.params == {"k": 32, "j": 32, "i": "dyn"}


def test_runs_are_verified_at_one_a_prime_and_beyond_the_template(small):
    beyond = vortex.TEMPLATE_STEPS * max(k["outer"] for k in small.manifest["kernels"]) + MAX + 1
    for value in (1, 13, beyond):
        doc = vortex.run(small, value, seed=5)
        assert doc["correct"], doc["error"]
        assert doc["shape"] == {"k": 32, "j": 32, "i": value}
        assert doc["kernel"] == vortex.dispatch(small.table, value)[0] and doc["measured_seconds"] > 0


def test_vortex_run_through_the_cli(small, capsys):
    code = main(["vortex", "run", str(small.path), "--shape", "i=77", "--json"])
    out, _ = capsys.readouterr()
    doc = json.loads(out)
    assert code == 0 and doc["correct"] is True and doc["shape"]["i"] == 77
    code = main(["vortex", "run", str(small.path), "--shape", "i=5,k=31"])
    _, err = capsys.readouterr()
    assert code == 2 and "k=31 does not match the bundle's k=32" in err and err.count("\n") == 1


def test_a_reloaded_bundle_is_the_same_and_a_tampered_text_is_parsed_never_run(small, tmp_path):
    import shutil

    assert vortex.load_bundle(small.path).manifest == small.manifest
    copy = tmp_path / "copy"
    shutil.copytree(small.path, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["workload"]["expr"] = "C[i,j] = __import__('os').system('touch pwned')"
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match="malformed bundle: expression:") as err:
        vortex.load_bundle(copy)
    assert "\n" not in str(err.value) and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "text, shape",
    [
        ("B[i,j] = A[i,j] * 2.0", "i=dyn,j=24"),  # elementwise
        ("C[i] += A[i,k]", "i=dyn,k=40"),  # a row reduction
        ("C[j,i] += A[i,k] * B[k,j]", "i=dyn,k=16,j=8"),  # the dynamic axis last in the output
    ],
)
def test_other_classes_compile_and_run_verified(tmp_path, text, shape):
    b = vortex.compile_bundle(_workload(text, shape), pipeline.load_device("local-cpu"), tmp_path / "b",
                              max_extent=32, limit=1)
    assert b.manifest["failed"] == []
    for value in (1, 7, 61):
        doc = vortex.run(b, value, seed=1)
        assert doc["correct"], doc["error"]


@pytest.mark.parametrize(
    "shape, text, message",
    [
        ("i=8,k=dyn,j=8", MATMUL, "k is a reduce axis; only an output axis can be dyn"),
        ("i=dyn", "B[i] = A[i+1] * 2.0", "dyn axis i is read as 'i+1' in A"),
        ("i=dyn,k=8,j=dyn", MATMUL, "one dynamic extent per workload, got i, j"),
    ],
)
def test_refusals_are_one_line_with_exit_2(tmp_path, capsys, shape, text, message):
    code = main(["vortex", "compile", "--expr", text, "--shape", shape, "--out", str(tmp_path / "b")])
    _, err = capsys.readouterr()
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "b").exists()
