"""Rammer's wavefront co-schedule (OSDI'20, Algorithm 1) of a model's constructed kernels.

Vocabulary from the paper: an operator is an *rOperator*; each of its candidate kernels is an
*rKernel* that splits it into homogeneous *rTasks*; the device is a *vDevice* of *vEUs* (one per
SM on a GPU, one per core on a CPU), each running one rTask at a time, in the order planned.

From a constructed candidate (`Candidate` of the construction) the rKernel has one rTask per unit
tile of the grid (`tasks = grid`), and the rTask time is derived from the Estimate: the
micro-performance model deals tiles round-robin over the units, so the busiest unit runs
`ceil(grid / units)` tiles one after the other in `predicted_seconds`, and one tile takes
`predicted_seconds / ceil(grid / units)`. Alone on the device the rKernel thus takes exactly its
predicted time, and the one-by-one baseline is the sum of the operators' fastest predictions.

Launches: run one kernel at a time, every operator is its own kernel launch; Rammer's plan is
one rProgram, emitted as one kernel (the paper, section 5.2.3: "packing operators into rProgram so
that several operators can be executed by a single GPU kernel launch"), so it is launched once.
`schedule` takes the device's `launch_seconds` (`DeviceSpec.launch_overhead_us`): the sequential
baseline pays it per operator, the plan once, before its first rTask starts. On x86 a launch is
a function call and a thread pool's fork and join, about a microsecond, so little gain shows
there (the paper, section 4.2.3); on a GPU a few microseconds per launch against kernels of a
few microseconds each is where the co-schedule's gain comes from.

Policy (Algorithm 1):
- waves: the fringes of a breadth-first walk of the dataflow graph (an operator's wave is one
  more than its latest predecessor's), scheduled in order;
- SelectRKernels: if the wave's fastest rKernels together have no more rTasks than vEUs they are
  used; otherwise the most efficient ones (least rTask time x rTasks, i.e. vEU-seconds) are tried
  too and kept only if the wave then finishes earlier;
- SelectvEU: each rTask goes to the vEU that can start it earliest; an rTask waits for every
  rTask of its operator's predecessors (Rammer's `Wait`, a barrier-rTask, costed at zero here).

Rammer also starts a new rProgram (a global barrier) where appending a wave to the current one
would take longer than running it after it. With barrier-rTasks costed at zero that never
happens: at the barrier every vEU is free no later than the current rProgram's end, and greedy
earliest-start placement keeps that lead rTask by rTask, so appending finishes no later (and a
new rProgram would pay another launch). The plan
is therefore one rProgram, and the test suite checks the bound it implies (never slower than
one kernel at a time).

Everything here is pure: plain frozen values in, a `Plan` out.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from math import ceil
from typing import Sequence


@dataclass(frozen=True)
class RKernel:
    """One candidate of an operator: `tasks` rTasks of `task_seconds` each."""

    rank: int
    tasks: int
    task_seconds: float

    def alone_seconds(self, veus: int) -> float:
        """Time on a device of `veus` vEUs with nothing else running."""
        return ceil(self.tasks / veus) * self.task_seconds

    @property
    def work(self) -> float:
        """vEU-seconds: Rammer's efficiency measure (rTask time x number of rTasks)."""
        return self.tasks * self.task_seconds


@dataclass(frozen=True)
class ROperator:
    name: str
    preds: tuple[int, ...]  # indices of operators (earlier in the list) whose outputs it reads
    kernels: tuple[RKernel, ...]


@dataclass(frozen=True)
class Placement:
    """One rTask on one vEU."""

    op: int
    task: int
    veu: int
    start: float
    end: float


@dataclass(frozen=True)
class Wave:
    index: int
    ops: tuple[int, ...]
    ranks: tuple[int, ...]  # chosen rKernel (candidate rank) per operator of `ops`
    selection: str  # "fastest" | "efficient"
    start: float
    end: float
    placements: tuple[Placement, ...]


@dataclass(frozen=True)
class Plan:
    veus: int
    waves: tuple[Wave, ...]
    seconds: float  # co-scheduled: the end of the last rTask, after the rProgram's one launch
    sequential_seconds: float  # one kernel at a time, each operator's fastest rKernel and its launch
    launch_seconds: float = 0.0  # one kernel launch on the device

    @property
    def launches(self) -> int:
        """Kernel launches of the plan: its one rProgram (none for an empty model)."""
        return 1 if self.waves else 0

    @property
    def sequential_launches(self) -> int:
        """Kernel launches one kernel at a time: one per operator."""
        return sum(len(wave.ops) for wave in self.waves)


def rkernel(rank: int, grid: int, predicted_seconds: float, units: int) -> RKernel:
    """The rKernel of a constructed candidate (see the module docstring for the rTask time)."""
    grid = max(1, grid)
    return RKernel(rank, grid, predicted_seconds / ceil(grid / units))


def wavefronts(ops: Sequence[ROperator]) -> tuple[tuple[int, ...], ...]:
    """Operators grouped by breadth-first level: one more than the latest predecessor's."""
    level: list[int] = []
    for i, op in enumerate(ops):
        if any(not 0 <= p < i for p in op.preds):
            raise ValueError(f"operator {op.name}: predecessors must come earlier in the list, got {op.preds}")
        level.append(1 + max((level[p] for p in op.preds), default=-1))
    return tuple(tuple(i for i, l in enumerate(level) if l == w) for w in range(max(level, default=-1) + 1))


def schedule(ops: Sequence[ROperator], veus: int, launch_seconds: float = 0.0) -> Plan:
    """Co-schedule `ops` (a DAG in topological order) on `veus` vEUs with Algorithm 1, as one
    rProgram whose launch takes `launch_seconds` (its rTasks start after it)."""
    if launch_seconds < 0:
        raise ValueError(f"a launch cannot take negative time, got {launch_seconds}")
    if veus < 1:
        raise ValueError(f"a vDevice needs at least one vEU, got {veus}")
    if any(not op.kernels for op in ops):
        raise ValueError("every operator needs at least one rKernel")
    free = (launch_seconds,) * veus  # when each vEU finishes its last rTask: first, the launch
    finish: dict[int, float] = {}  # when each scheduled operator's last rTask ends
    waves = []
    for index, wave in enumerate(wavefronts(ops)):
        free, done, placed = _schedule_wave(ops, wave, free, finish, veus, index)
        finish.update(done)
        waves.append(placed)
    sequential = sum(min(k.alone_seconds(veus) for k in op.kernels) + launch_seconds for op in ops)
    return Plan(veus, tuple(waves), max(finish.values(), default=0.0), sequential, launch_seconds)


def _schedule_wave(ops, wave, free, finish: dict, veus: int, index: int):
    """ScheduleWave with SelectRKernels: (vEU free times after, operator finish times, Wave)."""
    fastest = tuple(min(ops[i].kernels, key=lambda k: (k.alone_seconds(veus), k.rank)) for i in wave)
    best = _place(ops, wave, fastest, free, finish, index, "fastest")
    if sum(k.tasks for k in fastest) <= veus:
        return best
    efficient = tuple(min(ops[i].kernels, key=lambda k: (k.work, k.alone_seconds(veus), k.rank)) for i in wave)
    if efficient == fastest:
        return best
    trial = _place(ops, wave, efficient, free, finish, index, "efficient")
    return trial if trial[2].end < best[2].end else best


def _place(ops, wave, kernels, free, finish: dict, index: int, selection: str):
    """Append every rTask of the wave to the vEU that can start it earliest."""
    heap = [(t, v) for v, t in enumerate(free)]
    heapq.heapify(heap)
    placements, done = [], []
    for op, kernel in zip(wave, kernels):
        ready = max((finish[p] for p in ops[op].preds), default=0.0)
        last = ready
        for task in range(kernel.tasks):
            available, veu = heapq.heappop(heap)
            start = max(available, ready)
            end = start + kernel.task_seconds
            placements.append(Placement(op, task, veu, start, end))
            heapq.heappush(heap, (end, veu))
            last = max(last, end)
        done.append((op, last))
    after = [0.0] * len(free)
    for t, v in heap:
        after[v] = t
    start = min(p.start for p in placements)
    end = max(p.end for p in placements)
    ranks = tuple(k.rank for k in kernels)
    return tuple(after), tuple(done), Wave(index, tuple(wave), ranks, selection, start, end, tuple(placements))
