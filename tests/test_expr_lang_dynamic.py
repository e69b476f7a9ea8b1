"""`dyn` in the expression language: one output axis every tensor reads as a plain index may be
dynamic (`split_dynamic`); every other choice is a one-line UserError naming why; the symbolic
PrimFunc (`symbolic_func`) has that axis as T * tile and computes what the static statement
computes at every T."""

import re

import numpy as np
import pytest

from workbench.errors import UserError
from workbench.ops.expr_lang import build_expr, split_dynamic, symbolic_func
from workbench.ops.reference import random_inputs, reference

MATMUL = "C[i,j] += A[i,k] * B[k,j]"


def test_split_names_the_dynamic_axis_and_checks_the_others():
    assert split_dynamic(MATMUL, {"i": "dyn", "k": 32, "j": 16}) == ("i", {"i": 1, "j": 16, "k": 32})
    assert split_dynamic("C[i,j] += A[k,j] * B[i,k]", {"i": 4, "k": 8, "j": "dyn"})[0] == "j"


@pytest.mark.parametrize(
    "text, extents, message",
    [
        (MATMUL, {"i": 4, "k": "dyn", "j": 4}, "k is a reduce axis; only an output axis can be dyn (i, j)"),
        (MATMUL, {"i": "dyn", "k": 4, "j": "dyn"}, "one dynamic extent per workload, got i, j"),
        (MATMUL, {"i": 4, "k": 4, "j": 4}, "no dynamic extent; give one output axis as dyn"),
        ("B[i] = A[i+1] * 2.0", {"i": "dyn"}, "dyn axis i is read as 'i+1' in A (column 10)"),
        ("B[i,j] = A[2*i,j]", {"i": "dyn", "j": 4}, "dyn axis i is read as '2*i' in A"),
        ("B[i,j] = A[i+j]", {"i": "dyn", "j": 4}, "dyn axis i is read as 'i+j' in A"),
        ("B[i,j] = A[j] * 2.0", {"i": "dyn", "j": 4}, "dyn axis i is read by no input"),
        (MATMUL, {"i": "dyn", "k": 4, "j": 0}, "extent of j must be a positive integer"),
    ],
)
def test_axes_that_cannot_be_dynamic_are_one_line_errors(text, extents, message):
    with pytest.raises(UserError, match=re.escape(message)) as err:
        split_dynamic(text, extents)
    assert "\n" not in str(err.value)


def test_a_static_build_refuses_dyn_and_names_vortex_compile():
    with pytest.raises(UserError, match="i=dyn is a dynamic extent: compile it with `workbench vortex compile`"):
        build_expr(MATMUL, {"i": "dyn", "k": 4, "j": 4})


@pytest.mark.tvm
@pytest.mark.parametrize(
    "text, extents, axis",
    [
        (MATMUL, {"k": 5, "j": 3}, "i"),
        ("C[j,i] += A[i,k] * B[k,j]", {"k": 5, "j": 3}, "i"),  # the dynamic axis last in the output
        ("C[i] max= A[i,k]", {"k": 7}, "i"),
        ("B[i,j] = exp(A[i,j]) + D[j]", {"j": 6}, "i"),
    ],
)
def test_the_symbolic_func_computes_the_static_statement_at_every_step(text, extents, axis):
    import tvm

    tile = 4
    func = symbolic_func(text, extents, axis, tile)
    assert str(func.params[-1].name) == "T"
    run = tvm.compile(tvm.IRModule({"main": func}), target="llvm")["main"]
    dev = tvm.cpu()
    for steps in (1, 3):
        static = build_expr(text, {**extents, axis: steps * tile})
        inputs = random_inputs(static, seed=steps)
        expected = reference(static, inputs)
        assert np.abs(expected).max() > 0.1  # the check below can fail
        out = tvm.runtime.tensor(np.zeros(expected.shape, static.dtype), dev)
        run(*[tvm.runtime.tensor(x, dev) for x in inputs], out, steps)
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_the_symbolic_func_refuses_what_split_refuses():
    with pytest.raises(UserError, match="k is a reduce axis"):
        symbolic_func(MATMUL, {"i": 4, "j": 4}, "k", 4)
