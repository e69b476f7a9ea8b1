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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.models.onnx_import import ImportedModel


@dataclass(frozen=True)
class MemoryPlan:
    slots: tuple[int, ...]  # each buffer's bytes
    where: dict  # (operator, output item) -> its slot

    @property
    def total_bytes(self) -> int:
        return sum(self.slots)


def value_bytes(shape: tuple[int, ...], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def plan(model: ImportedModel) -> MemoryPlan:
    """Each operator output's slot: the smallest free slot that holds it (best fit, so that a big
    buffer stays free for a big value), or a new one."""
    last: dict[tuple[int, int], int] = {}  # value -> the last operator reading it
    for i, op in enumerate(model.operators):
        for a in op.args:
            if a.source == "operator":
                last[(a.ref, a.item)] = i
    kept = set(model.outputs)
    slots: list[int] = []
    free: list[int] = []  # slot indices
    where: dict[tuple[int, int], int] = {}
    live: list[tuple[int, int]] = []  # values holding a slot that will be freed
    for i, op in enumerate(model.operators):
        for item, (shape, dtype) in enumerate(op.outputs):
            size = value_bytes(shape, dtype)
            fits = [s for s in free if slots[s] >= size]
            if fits:
                slot = min(fits, key=lambda s: (slots[s], s))
                free.remove(slot)
            else:
                slot = len(slots)
                slots.append(size)
            where[(i, item)] = slot
            if (i, item) not in kept:
                live.append((i, item))
        for value in [v for v in live if last.get(v, v[0]) == i]:  # read for the last time, or never
            live.remove(value)
            free.append(where[value])
    return MemoryPlan(tuple(slots), where)
