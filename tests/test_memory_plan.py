"""models.memory_plan: values whose lifetimes overlap never share a buffer, and sharing saves
memory; a concatenation's parts are written into it where they can be, and the model run on such
a plan matches ONNX Runtime (fire modules built here; the sample models run on their plans in
test_models and test_model_operators)."""

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from workbench.models.memory_plan import plan, value_bytes
from workbench.models.onnx_import import import_model

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"
NAMES = ("mlp", "bert_layer", "resnet_block", "mobilenet_block", "shufflenet_block", "mlp_dynamic")


@cache
def imported(name):
    return import_model(SAMPLES / f"{name}.onnx")


def lifetimes(model) -> dict:
    """Each value's (first, last) operator, computed apart from the plan: written by its
    operator, alive through its last reader, a model output through the end."""
    out = {(i, item): (i, i) for i, op in enumerate(model.operators) for item in range(len(op.outputs))}
    for i, op in enumerate(model.operators):
        for a in op.args:
            if a.source == "operator":
                first, _ = out[(a.ref, a.item)]
                out[(a.ref, a.item)] = (first, max(out[(a.ref, a.item)][1], i))
    for value in model.outputs:
        out[value] = (out[value][0], len(model.operators))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_values_alive_together_never_share_a_buffer_and_each_fits_its_own(name):
    model = imported(name)
    p = plan(model)
    life = lifetimes(model)
    assert set(p.where) == set(life)
    for (i, item), slot in p.where.items():
        assert p.slots[slot] >= value_bytes(*model.operators[i].outputs[item])
    values = sorted(life)
    for k, a in enumerate(values):
        for b in values[k + 1:]:
            if p.where[a] == p.where[b]:
                (a0, a1), (b0, b1) = life[a], life[b]
                # closed intervals: an operator's outputs never take the buffer of what it reads
                assert a1 < b0 or b1 < a0, (name, a, b, life[a], life[b])


@pytest.mark.parametrize("name", ["resnet_block", "bert_layer", "mlp"])
def test_a_chain_of_operators_reuses_buffers(name):
    model = imported(name)
    p = plan(model)
    every = sum(value_bytes(*out) for op in model.operators for out in op.outputs)
    assert len(p.slots) < sum(len(op.outputs) for op in model.operators)
    assert p.total_bytes < every


def fire(tmp_path, name: str, nodes_after=(), channels=(16, 16), hw=8, concat_axis=1, more_weights=None):
    """A SqueezeNet fire module: a 1x1 squeeze conv and relu, two expand convs (1x1 and 3x3, with
    relu) concatenated along `concat_axis`, then a 1x1 conv over the result, or `nodes_after`
    (reading the named values and `more_weights`) where they write y."""
    import onnx

    from tests.test_model_operators import _conv, _model, _node

    a, b = channels
    nodes = [_node("Conv", ["x", "ws"], "s"), _node("Relu", ["s"], "sr"),
             _node("Conv", ["sr", "wa"], "ea"), _node("Relu", ["ea"], "ear"),
             _node("Conv", ["sr", "wb"], "eb", pads=[1, 1, 1, 1]), _node("Relu", ["eb"], "ebr"),
             _node("Concat", ["ear", "ebr"], "cat", axis=concat_axis), *nodes_after]
    out_channels = a + b if concat_axis == 1 else a
    inits = {"ws": _conv(8, 3, 1), "wa": _conv(a, 8, 1), "wb": _conv(b, 8, 3), "wy": _conv(4, out_channels, 1),
             **(more_weights or {})}
    if not any(n.output[0] == "y" for n in nodes):
        nodes.append(_node("Conv", ["cat", "wy"], "y"))
    y_hw = (hw * 2, hw) if concat_axis == 2 else (hw, hw)
    path = tmp_path / f"{name}.onnx"
    onnx.save(_model(nodes, (1, 3, hw, hw), (1, 4, *y_hw), inits), path)
    return path


def check_against_onnxruntime(path):
    """The model run on its planned buffers gives ONNX Runtime's output, on inputs and an output
    of both signs (no constant answer passes); returns the model, the concatenations its kernels
    compute and the plan it ran on."""
    import onnxruntime as ort

    from workbench import pipeline
    from workbench.models.execute import ATOL, RTOL, build_model_kernels, concat_axes, model_inputs, run_model

    mc = pipeline.construct_model(path, "local-cpu", options=pipeline.Options(topk=1))
    kernels = build_model_kernels(mc)
    inputs = model_inputs(mc.model, 0)
    (ours,) = run_model(mc, kernels, inputs)
    (expected,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, inputs)
    assert expected.min() < 0 < expected.max()
    np.testing.assert_allclose(ours, expected, rtol=RTOL, atol=ATOL)
    axes = concat_axes(mc.model, kernels)
    return mc.model, axes, plan(mc.model, axes)


def test_a_concatenation_of_two_convs_is_placed_in_place_and_computes_the_model(tmp_path):
    model, axes, p = check_against_onnxruntime(fire(tmp_path, "fire"))
    (c,) = [i for i, op in enumerate(model.operators) if len(op.args) == 2 and op.outputs[0][0] == (1, 32, 8, 8)]
    assert axes == {c: 1} and p.in_place == {c}
    parts = [(a.ref, a.item) for a in model.operators[c].args]
    assert {p.where[v] for v in parts} == {p.where[(c, 0)]}  # the parts live in the concatenation's buffer
    assert [p.offset(v) for v in parts] == [0, 16 * 8 * 8 * 4]
    life = lifetimes(model)
    whole = (min(life[v][0] for v in parts), life[(c, 0)][1])  # from the first part on
    for value, slot in p.where.items():
        if slot == p.where[(c, 0)] and value not in parts and value != (c, 0):
            assert life[value][1] < whole[0] or whole[1] < life[value][0], (value, life[value], whole)


@pytest.mark.parametrize("case", ["part read elsewhere", "unaligned", "not the leading axis", "fused with relu"])
def test_a_concatenation_that_cannot_be_in_place_runs_and_the_model_stays_right(tmp_path, case):
    from tests.test_model_operators import _node

    if case == "part read elsewhere":  # y = conv(cat) + conv(ear): the part lives on past the concatenation
        from tests.test_model_operators import _conv

        path = fire(tmp_path, "shared", [_node("Conv", ["cat", "wy"], "t"), _node("Conv", ["ear", "wz"], "u"),
                                         _node("Add", ["t", "u"], "y")], more_weights={"wz": _conv(4, 16, 1)})
    elif case == "unaligned":  # 3 channels of 5 x 5 floats: the second part starts 300 bytes in
        path = fire(tmp_path, "unaligned", channels=(3, 3), hw=5)
    elif case == "not the leading axis":  # along H with 16 channels before it: the parts interleave
        path = fire(tmp_path, "rows", concat_axis=2)
    else:
        path = fire(tmp_path, "relu", [_node("Relu", ["cat"], "catr"), _node("Conv", ["catr", "wy"], "y")])
    model, axes, p = check_against_onnxruntime(path)
    # a concatenation fused with its relu is not one; the others are, along their axis
    assert list(axes.values()) == ([] if case == "fused with relu" else [2] if case == "not the leading axis" else [1])
    assert p.in_place == frozenset() and p.offsets == {}


def test_the_run_report_marks_the_concatenation_in_place(tmp_path):
    from workbench import pipeline

    path = fire(tmp_path, "fire")
    run = pipeline.run_model_report(pipeline.construct_model(path, "local-cpu", options=pipeline.Options(topk=1)), path)
    assert run.outputs_match
    assert [o.in_place for o in run.operators] == [o.name.startswith("concatenate") for o in run.operators]
    (row,) = [o.to_dict() for o in run.operators if o.in_place]
    assert row["in_place"] and row["measured_seconds"] > 0  # its kernel alone, beside the mark
    assert "(in place: not run in the whole model)" in run.text()
