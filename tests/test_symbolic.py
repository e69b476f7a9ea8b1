"""Symbolic dims of ONNX models (workbench/models/symbolic.py): `--dim` parsing, binding the
inputs' dim_params, the operators that depend on a dim and the Vortex workload of a matmul."""

import pytest
from helpers import expr
from onnx import TensorProto, helper

from workbench.errors import UserError
from workbench.models.symbolic import (
    MatmulWorkload,
    SymbolicDim,
    bind,
    input_dims,
    matmul_params,
    matmul_workload,
    parse_dims,
    resolve,
    vortex_command,
)
from workbench.ops.shapes import MAX_ELEMENTS


def _tensor(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_dims_parse_from_one_or_several_options():
    assert parse_dims(None) == {} and parse_dims([]) == {}
    assert parse_dims("batch=4, seq = 16") == {"batch": 4, "seq": 16}
    assert parse_dims(["batch=4", "seq=16"]) == {"batch": 4, "seq": 16}
    assert parse_dims("unk__0=2") == {"unk__0": 2}  # exporters' generated names


@pytest.mark.parametrize(
    "text, message",
    [
        ("batch", "--dim: 'batch' is not of the form NAME=VALUE (e.g. batch=4)"),
        ("=4", "--dim: '=4' is not of the form NAME=VALUE (e.g. batch=4)"),
        ("batch=4,", "--dim: '' is not of the form NAME=VALUE (e.g. batch=4)"),
        ("batch=four", "--dim: 'batch=four': batch must be a positive integer"),
        ("batch=2.5", "--dim: 'batch=2.5': batch must be a positive integer"),
        ("batch=2,batch=3", "--dim: batch is given twice"),
    ],
)
def test_malformed_dims_are_one_line_errors(text, message):
    with pytest.raises(UserError) as err:
        parse_dims(text)
    assert str(err.value) == message


def test_dims_not_given_are_bound_to_one_and_marked_default():
    assert resolve(("batch", "seq"), {"seq": 16}, "m.onnx") == (
        SymbolicDim("batch", 1, True), SymbolicDim("seq", 16, False))
    assert resolve((), {}, "m.onnx") == ()


@pytest.mark.parametrize(
    "names, given, message",
    [
        (("batch", "seq"), {"heads": 2}, "m.onnx: --dim heads: the model has no symbolic dim 'heads' "
                                          "(its symbolic dims are batch, seq)"),
        ((), {"batch": 2}, "m.onnx: --dim batch: the model has no symbolic dim 'batch' (it has no symbolic dims)"),
        (("batch",), {"batch": 0}, "--dim batch=0: batch must be a positive integer"),
        (("batch",), {"batch": -3}, "--dim batch=-3: batch must be a positive integer"),
        (("batch",), {"batch": MAX_ELEMENTS + 1}, f"--dim batch={MAX_ELEMENTS + 1}: over the limit of "
                                                   f"{MAX_ELEMENTS} elements of a tensor (int32 indexing)"),
    ],
)
def test_unknown_dims_and_bad_values_are_refused(names, given, message):
    with pytest.raises(UserError) as err:
        resolve(names, given, "m.onnx")
    assert str(err.value) == message


def test_binding_rewrites_the_named_dims_everywhere_and_leaves_the_rest():
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    graph = helper.make_graph(nodes, "g", [_tensor("x", ["batch", "seq", 2]), _tensor("w", ["n"])],
                              [_tensor("y", ["batch", "seq", "out"])], [weight],
                              value_info=[_tensor("h", ["batch", 7, 2])])
    proto = helper.make_model(graph)
    assert input_dims(proto.graph) == ("batch", "seq")  # `n` names a weight listed as an input
    bound = bind(proto, {"batch": 3, "seq": 5})

    def dims(infos):
        return [[d.dim_value if d.HasField("dim_value") else d.dim_param for d in i.type.tensor_type.shape.dim]
                for i in infos]

    assert dims(bound.graph.input) == [[3, 5, 2], ["n"]]
    assert dims(bound.graph.output) == [[3, 5, "out"]]  # a name only outputs carry is TVM's to infer
    assert dims(bound.graph.value_info) == [[3, 7, 2]]
    assert dims(proto.graph.input) == [["batch", "seq", 2], ["n"]]  # the original is untouched


def test_matmul_parameters_are_read_off_the_axes():
    assert matmul_params(expr("matmul", M=12, N=20, K=8)) == {
        "M": 12, "N": 20, "K": 8, "B": 0, "trans_a": False, "trans_b": False}
    assert matmul_params(expr("matmul", M=12, N=20, K=8, B=3, trans_b=True)) == {
        "M": 12, "N": 20, "K": 8, "B": 3, "trans_a": False, "trans_b": True}
    assert matmul_params(expr("matmul", M=12, N=20, K=8, trans_a=True)) == {
        "M": 12, "N": 20, "K": 8, "B": 0, "trans_a": True, "trans_b": False}
    assert matmul_params(expr("relu", shape=(4, 4))) is None


def test_the_varying_parameter_becomes_dyn_when_the_catalog_allows_it():
    small, large = expr("matmul", M=12, N=20, K=8), expr("matmul", M=13, N=20, K=8)
    work = matmul_workload("mm", small, large, "seq")
    assert work == MatmulWorkload("mm", (("M", "dyn"), ("N", 20), ("K", 8), ("B", 0), ("trans_a", False),
                                         ("trans_b", False)), value=12)
    assert work.dynamic == "M"
    assert vortex_command(work, "h100") == "workbench vortex compile --op matmul --shape M=dyn,K=8,N=20 --device h100 --out DIR"
    batched = matmul_workload("bmm", expr("matmul", M=4, N=5, K=8, B=2, trans_b=True),
                              expr("matmul", M=4, N=5, K=8, B=3, trans_b=True), "b")
    assert vortex_command(batched, "local-cpu") == (
        "workbench vortex compile --op matmul --shape B=dyn,M=4,K=8,N=5,trans_b=true --device local-cpu --out DIR")


@pytest.mark.parametrize(
    "other, reason",
    [
        (dict(M=13, N=21, K=8), "M and N depend on seq; Vortex compiles a matmul with one dynamic extent, one of M, B"),
        (dict(M=12, N=21, K=8), "N depends on seq; Vortex compiles a matmul with one dynamic extent, one of M, B"),
        (dict(M=12, N=20, K=9), "K depends on seq; Vortex compiles a matmul with one dynamic extent, one of M, B"),
        (dict(M=12, N=20, K=8), "its M, N, K and B do not depend on seq"),
    ],
)
def test_no_command_where_vortex_cannot_compile_the_workload(other, reason):
    work = matmul_workload("mm", expr("matmul", M=12, N=20, K=8), expr("matmul", **other), "seq")
    assert work.params == () and work.reason == reason and vortex_command(work, "h100") == ""
