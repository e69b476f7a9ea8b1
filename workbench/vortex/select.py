"""The offline choice of a small kernel set, and the run-time dispatcher (pure, no TVM).

Offline, without shape samples: every candidate's predicted time (`analyzer.cost`) over the
whole declared range 1..max_extent of the dynamic extent (`sweep`: every value up to 64, then
every 16th up to the bound; a kernel's cost changes only where the padded extent does, at
multiples of its outer tile), and a greedy cover of that lower envelope: start from the
envelope's kernel at the smallest value, then add the candidate that most lowers the summed
log-ratio of the chosen set's best time to the envelope's, until the set is on the envelope
everywhere or has `MAX_KERNELS`.

Why the smallest value first: there every kernel with more than one row along the dynamic axis
pads the most (6 rows computed for 1) and packs its inputs for rows it throws away, and the sum
over the sweep would never reach it: a kernel that wins only at the smallest values (the
single-row kernel of `hierarchy.single_row_tiles`) lowers the sum less than many others and
would never be kept (evidence: docs/evidence.md#select-smallest-value-first).

At run time `dispatch` prices each chosen kernel at the actual value with the same analyzer and
takes the cheapest: no samples, no re-tuning, a few model evaluations.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import log

from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.rprogram import RProgram
from workbench.vortex.analyzer import Dynamic, cost, outer_tile, padded_extent

# The "small set": each kernel is one compiled library. 16 leave the BERT GEMM's cover
# within a few per cent of the predicted envelope of all candidates, where 10 left about twice
# that, for about half again the compile time (evidence: docs/evidence.md#select-max-kernels).
MAX_KERNELS = 16
DENSE_UP_TO, STRIDE = 64, 16  # `sweep`: every value up to 64, then every 16th
# A greedy step that lowers the summed log-ratio by less than this stops the cover: the
# remaining gap is below a 1% slowdown at one value of the sweep.
MIN_GAIN = 0.01


@dataclass(frozen=True)
class DispatchTable:
    """The chosen kernels (id, program on the template expression) and what pricing them needs."""

    dyn: Dynamic
    device: DeviceSpec
    kernels: tuple[tuple[str, RProgram], ...]

    @property
    def template(self) -> TensorExpr:
        return self.kernels[0][1].expr

    def program(self, kernel_id: str) -> RProgram:
        return dict(self.kernels)[kernel_id]

    def to_dict(self) -> dict:
        """JSON: the dynamic extent, the template expression and each kernel's program (the
        device is written beside it, as its spec file)."""
        return {"dynamic": self.dyn.to_dict(), "template": self.template.to_dict(),
                "kernels": [{"id": k, "program": p.to_dict()} for k, p in self.kernels]}

    @classmethod
    def from_dict(cls, data: dict, device: DeviceSpec) -> "DispatchTable":
        template = TensorExpr.from_dict(data["template"])
        kernels = tuple((str(k["id"]), RProgram.from_dict(k["program"], template)) for k in data["kernels"])
        if not kernels:
            raise ValueError("no kernels")
        return cls(Dynamic.from_dict(data["dynamic"]), device, kernels)


def sweep(max_extent: int) -> tuple[int, ...]:
    """The values the offline choice prices every candidate at (module docstring)."""
    dense = range(1, min(DENSE_UP_TO, max_extent) + 1)
    return tuple(sorted(set(dense) | set(range(DENSE_UP_TO, max_extent + 1, STRIDE)) | {max_extent}))


def cost_table(programs: tuple[RProgram, ...], device: DeviceSpec, dyn: Dynamic,
               values: tuple[int, ...]) -> list[list[float]]:
    """Predicted seconds of every program at every value; a program is priced once per padded
    extent (its cost depends on the value only through it)."""
    rows = []
    for program in programs:
        outer, seen = outer_tile(program, dyn), {}
        row = []
        for v in values:
            padded = padded_extent(v, outer)
            if padded not in seen:
                seen[padded] = cost(program, device, dyn, padded).predicted_seconds
            row.append(seen[padded])
        rows.append(row)
    return rows


def choose(costs: list[list[float]], limit: int = MAX_KERNELS) -> tuple[int, ...]:
    """Indices of the greedy cover of the lower envelope of `costs` (columns: the sweep's values,
    smallest first), seeded with the least at the first value (module docstring)."""
    if not costs or limit < 1:
        return ()
    best = [min(col) for col in zip(*costs)]
    first = min(range(len(costs)), key=lambda i: (costs[i][0], i))
    current = list(costs[first])
    chosen: list[int] = [first]

    def loss(times) -> float:
        return sum(log(t / b) for t, b in zip(times, best))

    while len(chosen) < limit:
        options = []
        for i, row in enumerate(costs):
            if i not in chosen:
                merged = [min(a, b) for a, b in zip(current, row)]
                options.append((loss(merged), i, merged))
        if not options:
            break
        value, i, merged = min(options)
        if loss(current) - value < MIN_GAIN:
            break
        chosen.append(i)
        current = merged
    return tuple(chosen)


def select(programs: tuple[RProgram, ...], device: DeviceSpec, dyn: Dynamic,
           limit: int = MAX_KERNELS) -> tuple[RProgram, ...]:
    """The small kernel set for `programs` over 1..dyn.max_extent, best-covering first."""
    return tuple(programs[i] for i in choose(cost_table(programs, device, dyn, sweep(dyn.max_extent)), limit))


def dispatch(table: DispatchTable, value: int) -> tuple[str, float]:
    """(kernel id, predicted seconds) of the chosen kernel of least predicted time at `value`;
    ties go to the kernel listed first."""
    priced = [(cost(p, table.device, table.dyn, value).predicted_seconds, n, k) for n, (k, p) in enumerate(table.kernels)]
    seconds, _, kernel = min(priced)
    return kernel, seconds
