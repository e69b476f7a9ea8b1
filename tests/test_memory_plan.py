"""models.memory_plan: values whose lifetimes overlap never share a buffer, and sharing saves
memory. That the kernels compute the model's outputs on the planned buffers is checked against
ONNX Runtime where the models run (test_models, test_model_operators)."""

from functools import cache
from pathlib import Path

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
