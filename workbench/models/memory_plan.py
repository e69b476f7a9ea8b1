"""Where each intermediate value of a model lives when the model runs: buffers shared by values
whose lifetimes do not overlap, as ONNX Runtime's memory patterns and Relax's static block memory
planning share them.

Without sharing, every operator writes a fresh buffer and a model's activations (17 MB for
SqueezeNet) stream through memory once each; with it, an operator mostly writes where a value
that just died was, still in cache (SqueezeNet's buffers: 6 MB, its run 4 % faster on a Zen 4,
evidence: docs/evidence.md#model-memory-plan). Pure: sizes and lifetimes in, slots out.

A value lives from the operator that writes it through the last operator that reads it (a model
output to the end). An operator's outputs are placed before its dead inputs are freed, so no
kernel writes over what it reads: the kernels are not written to run in place.

A concatenation whose parts are each one operator's output, read by nothing else, is placed in
place, as oneDNN places a concat's inputs: each part is written by its producer straight into its
slice of the concatenation's buffer, which lives from the first part's producer on, and the
concatenation itself does not run (SqueezeNet's fire modules: eight concats, 40-80 us each in a
whole run on the Zen 4, evidence: docs/evidence.md#model-memory-plan). Its slices must be
contiguous: every dim before the axis is 1, and each slice starts on ALIGNMENT bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from workbench.models.onnx_import import ImportedModel


# TVM's kernels assume their buffers start on 64 bytes (the runtime's allocation alignment,
# kAllocAlignment) and may load them with aligned vector instructions.
ALIGNMENT = 64


@dataclass(frozen=True)
class MemoryPlan:
    slots: tuple[int, ...]  # each buffer's bytes
    where: dict  # (operator, output item) -> its slot
    offsets: dict = field(default_factory=dict)  # (operator, output item) -> bytes into its slot (absent: 0)
    in_place: frozenset = frozenset()  # the concatenations placed in place: their kernels do not run

    @property
    def total_bytes(self) -> int:
        return sum(self.slots)

    def offset(self, value: tuple[int, int]) -> int:
        return self.offsets.get(value, 0)


def value_bytes(shape: tuple[int, ...], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def concat_parts(model: ImportedModel, concats: Mapping[int, int]) -> dict[int, tuple[int, ...]]:
    """Of `concats` (operator -> the axis it concatenates along, as `execute.concat_axes` found
    them), those that can be placed in place, with each part's byte offset into the output: each
    part another operator's output read by nothing else (not a model output), every dim of the
    output before the axis 1, each part starting on ALIGNMENT bytes."""
    readers: dict[tuple[int, int], int] = {}
    for op in model.operators:
        for a in op.args:
            if a.source == "operator":
                readers[(a.ref, a.item)] = readers.get((a.ref, a.item), 0) + 1
    out = {}
    for c, axis in concats.items():
        op = model.operators[c]
        (shape, dtype), = op.outputs
        values = [(a.ref, a.item) for a in op.args if a.source == "operator"]
        if (len(values) != len(op.args) or len(set(values)) != len(values) or any(readers[v] != 1 for v in values)
                or any(v in model.outputs for v in values) or any(d != 1 for d in shape[:axis])):
            continue
        offsets, at = [], 0
        for a in op.args:
            offsets.append(at)
            at += value_bytes(a.shape, a.dtype)
        if at == value_bytes(shape, dtype) and all(o % ALIGNMENT == 0 for o in offsets):
            out[c] = tuple(offsets)
    # a concatenation of concatenations: the inner ones stay in place, the outer one runs
    return {c: o for c, o in out.items() if not any(a.ref in out for a in model.operators[c].args)}


def plan(model: ImportedModel, concats: Mapping[int, int] | None = None) -> MemoryPlan:
    """Each operator output's slot: the smallest free slot that holds it (best fit, so that a big
    buffer stays free for a big value), or a new one; the parts of `concats` that `concat_parts`
    allows in their concatenation's slot."""
    parts = concat_parts(model, concats or {})
    part_of = {(a.ref, a.item): (c, off) for c, offsets in parts.items()
               for a, off in zip(model.operators[c].args, offsets)}
    last: dict[tuple[int, int], int] = {}  # value -> the last operator reading it
    for i, op in enumerate(model.operators):
        for a in op.args:
            if a.source == "operator":
                last[(a.ref, a.item)] = i
    kept = set(model.outputs)
    slots: list[int] = []
    free: list[int] = []  # slot indices
    where: dict[tuple[int, int], int] = {}
    offsets: dict[tuple[int, int], int] = {}
    live: list[tuple[int, int]] = []  # values holding a slot that will be freed

    def place(value: tuple[int, int], size: int) -> None:
        fits = [s for s in free if slots[s] >= size]
        if fits:
            slot = min(fits, key=lambda s: (slots[s], s))
            free.remove(slot)
        else:
            slot = len(slots)
            slots.append(size)
        where[value] = slot
        if value not in kept:
            live.append(value)

    for i, op in enumerate(model.operators):
        for item, (shape, dtype) in enumerate(op.outputs):
            if (i, item) in where:  # a concatenation placed when its first part was
                continue
            if (i, item) in part_of:
                c, off = part_of[(i, item)]
                if (c, 0) not in where:
                    place((c, 0), value_bytes(*model.operators[c].outputs[0]))
                where[(i, item)], offsets[(i, item)] = where[(c, 0)], off  # lives as long as the whole
                continue
            place((i, item), value_bytes(shape, dtype))
        for value in [v for v in live if last.get(v, v[0]) == i]:  # read for the last time, or never
            live.remove(value)
            free.append(where[value])
    return MemoryPlan(tuple(slots), where, offsets, frozenset(parts))
