"""Suites as workloads: the shipped suites load, and a malformed or unreadable suite file is a
one-line UserError naming the problem (never a traceback, never a wait)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.errors import UserError
from workbench.ops.catalog import build
from workbench.ops.expr_lang import build_expr
from workbench.workload import MAX_SUITE_BYTES, Workload, list_suites, load_suite, suite_workload

ROOT = Path(__file__).resolve().parent.parent

GOOD = '[suite]\nname = "tiny"\n[[workload]]\nid = "mm"\nop = "matmul"\nM = 4\nN = 4\nK = 4\n'


@pytest.mark.parametrize("name", ["cpu-core", "gensor-table4", "roller-table1"])
def test_shipped_suites_load(name):
    assert name in list_suites()
    suite, workloads = load_suite(name)
    assert suite == name and workloads
    assert len({w.label for w in workloads}) == len(workloads)


def test_a_suite_file_loads_and_its_entry_builds(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(GOOD)
    workload = suite_workload(f"{path}:mm")
    assert workload.label == "tiny:mm" and dict(workload.params) == {"M": 4, "N": 4, "K": 4}
    assert [a.extent for a in workload.build().axes] == [4, 4, 4]


MALFORMED = [
    ('suite = "x"\n' + GOOD.split("\n", 2)[2], "'suite' must be a table ([suite] with name and source), got 'x'"),
    ("suite = [1, 2]\n" + GOOD.split("\n", 2)[2], "'suite' must be a table"),
    (GOOD.replace('name = "tiny"', "name = 5"), "suite.name must be a non-empty string without ':', got 5"),
    (GOOD.replace('name = "tiny"', 'name = "a:b"'), "suite.name must be a non-empty string without ':'"),
    (GOOD.replace('op = "matmul"', 'op = ["matmul"]'), "workload[0].op must be a non-empty string, got ['matmul']"),
    (GOOD.replace('id = "mm"', "id = 3"), "workload[0].id must be a non-empty string without :, got 3"),
    (GOOD.replace('id = "mm"', 'id = "a:b"'), "workload[0].id must be a non-empty string without :"),
    (GOOD.replace('op = "matmul"', 'op = "matmul"\ndtype = 32'), "workload[0].dtype must be a non-empty string, got 32"),
    (GOOD + GOOD.split("\n", 2)[2], "workload[1].id 'mm' is used by an earlier workload"),
    (GOOD.replace("M = 4", "M = [[4]]"), "workload[0].M must be a number, boolean or list of numbers, got [[4]]"),
    (GOOD.replace("M = 4", "M = {a = 1}"), "workload[0].M must be a number, boolean or list of numbers, got {'a': 1}"),
    (GOOD.replace("[[workload]]", "[workload]"), "no [[workload]] entries"),
    ('workload = [1]\n[suite]\nname = "tiny"\n', "workload[0] needs 'id' and 'op'"),
    ("[suite\n", "invalid TOML"),
    # each entry's operator, parameters and dtype, before a bench runs any entry
    (GOOD.replace("K = 4\n", ""), "workload 'mm': matmul: missing parameter K (reduction length)"),
    (GOOD.replace('op = "matmul"', 'op = "matmul"\ndtype = "int8"'), "workload 'mm': unsupported dtype 'int8'"),
    (GOOD.replace("M = 4", "M = true"), "workload 'mm': matmul: M must be a positive integer, got True"),
    (GOOD.replace('op = "matmul"', 'op = "conv3d"'), "workload 'mm': unknown operator 'conv3d'"),
]


@pytest.mark.parametrize("text, message", MALFORMED, ids=[case[1][:40] for case in MALFORMED])
def test_a_malformed_suite_is_one_line(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UserError) as info:
        load_suite(str(path))
    assert str(info.value).startswith(f"suite '{path}': ") and message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_or_oversized_suite_is_refused(tmp_path):
    with pytest.raises(UserError, match="suite 'nosuite' not found \\(known: cpu-core"):
        load_suite("nosuite")
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(MAX_SUITE_BYTES + 1)
    with pytest.raises(UserError, match=f"^suite {big}: {MAX_SUITE_BYTES + 1:,} bytes is over the"):
        load_suite(str(big))


def test_a_fifo_suite_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "suite.toml"
    os.mkfifo(fifo)  # no writer: reading it would block forever
    code = (
        "import sys\nfrom workbench.errors import UserError\nfrom workbench.workload import load_suite\n"
        "try:\n    load_suite(sys.argv[1])\nexcept UserError as err:\n    print(err)\n"
    )
    # In a child process with a time limit, so a regression fails instead of hanging the tests.
    done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.strip() == f"suite {fifo}: not a regular file (a FIFO)"


@pytest.mark.parametrize("made", [
    lambda: build("conv2d", dict(N=1, C=3, H=9, W=9, F=4, KH=3, KW=3, stride=2, pad=1), "float16"),
    lambda: build("relu", dict(shape=(17, 11, 3))),
    lambda: build_expr("Y[i, j] = B[j] * A[i, j + 2]", dict(i=3, j=4)),
])
def test_the_workload_dict_of_an_expression_builds_it_again(made):
    e = made()
    assert Workload.from_dict(e.workload_dict()).build() == e


@pytest.mark.parametrize("data, message", [
    ([], "workload must be a table"),
    ({"dtype": "float32"}, "workload.op must be a non-empty string"),
    ({"op": "relu", "dtype": "float32", "shape": {"a": 1}}, "workload.shape must be a number"),
    ({"op": "expr", "dtype": "float32", "i": 3}, "workload.expr must be the expression's text"),
])
def test_a_malformed_workload_dict_is_one_line(data, message):
    with pytest.raises(UserError, match=message):
        Workload.from_dict(data)


def test_dyn_in_an_expression_shape_is_parsed_and_refused_by_a_static_build():
    from workbench.workload import parse_shape, workload_from_args

    assert parse_shape("i=dyn,k=32,j=32") == {"i": "dyn", "k": 32, "j": 32}
    w = workload_from_args(None, "i=DYN, k=32,j=32", "C[i,j] += A[i,k] * B[k,j]", None, "float32")
    assert w.expr == "C[i,j] += A[i,k] * B[k,j]" and dict(w.params) == {"i": "dyn", "k": 32, "j": 32}
    with pytest.raises(UserError, match="i=dyn is a dynamic extent: compile it with `workbench vortex compile`"):
        w.build()
    for shape, message in (("i=dyn,i=dyn", "i is given twice"), ("i=dyn,i=4", "i is given twice")):
        with pytest.raises(UserError, match=message):
            parse_shape(shape)


def test_a_model_operator_is_built_at_its_bound_symbolic_dims():
    """mlp_dynamic.onnx declares x[batch, seq, 128]: its first matmul's leading axes are the
    bound dims (1 where not given), and the label says which binding it is."""
    model = str(ROOT / "sample_models" / "mlp_dynamic.onnx")
    default = Workload(model=model, operator=0)
    bound = Workload(model=model, operator=0, dims=(("batch", 3), ("seq", 7)))
    assert [a.extent for a in default.build().axes][:2] == [1, 1]
    assert [a.extent for a in bound.build().axes][:2] == [3, 7]
    assert bound.describe() == "mlp_dynamic.onnx#0 (batch=3,seq=7)"
    with pytest.raises(UserError, match="no symbolic dim 'heads'"):
        Workload(model=model, operator=0, dims=(("heads", 2),)).build()
