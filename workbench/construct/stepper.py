"""The stepper: one construction, run to the end for the CLI or one step at a time for a face.

Steps come from a policy's generator and are recorded; `back()` moves the cursor back over the
record and `next()` replays forward before asking the policy for a new step, so stepping is cheap
and every position is reproducible from (workload, device, options).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Iterator

from workbench.construct.graph import ConstructionGraph
from workbench.construct.policies import POLICIES, policy_class
from workbench.construct.space import Action, Kind, Options, Space, State
from workbench.construct.step import Candidate, Step
from workbench.hardware.spec import DeviceSpec
from workbench.ops.fusion import fuse_axes
from workbench.ops.tensor_expr import TensorExpr

__all__ = ["POLICIES", "Construction", "Stepper", "construct"]


class Stepper:
    """Construction of one workload on one device by one policy, steppable both ways."""

    def __init__(self, expr: TensorExpr, device: DeviceSpec, policy: str = "roller", options: Options = Options()):
        cls = policy_class(policy)
        self.original = expr
        self.space = Space(fuse_axes(expr), device)
        self.options = options
        self.policy = cls(self.space, options)
        self.policy_name = policy
        self.steps: list[Step] = []
        self.position = 0
        self._source: Iterator[Step] = self._generate()
        self._exhausted = False

    def _generate(self) -> Iterator[Step]:
        if self.space.expr.axes != self.original.axes:
            before = "x".join(str(a.extent) for a in self.original.axes)
            after = "x".join(str(a.extent) for a in self.space.expr.axes)
            action = Action(Kind.FUSE_AXES)
            state = State(0, (), (), self.options.eps, actions=(action,))
            yield Step(action, state, None, None, note=f"fuse axes: [{before}] -> [{after}] (Roller §3.2 axis fusion)")
        yield from self.policy.steps()

    @property
    def done(self) -> bool:
        return self._exhausted and self.position == len(self.steps)

    @property
    def current(self) -> Step | None:
        return self.steps[self.position - 1] if self.position else None

    def next(self) -> Step | None:
        """Advance one step; None when the construction is finished."""
        if self.position == len(self.steps):
            if self._exhausted:
                return None
            step = next(self._source, None)
            if step is None:
                self._exhausted = True
                return None
            self.steps.append(step)
        self.position += 1
        return self.steps[self.position - 1]

    def back(self) -> Step | None:
        """Step back one step; returns the step now current (None at the start)."""
        if self.position:
            self.position -= 1
        return self.current

    def seek(self, position: int) -> Step | None:
        """Go to `position` steps from the start (replaying or generating as needed)."""
        position = max(0, position)
        while self.position < position and self.next() is not None:
            pass
        self.position = min(self.position, position)
        return self.current

    def reset(self) -> None:
        self.position = 0

    def run_to_end(self) -> list[Step]:
        while self.next() is not None:
            pass
        return self.steps

    def graph(self) -> ConstructionGraph:
        """The construction graph of the steps taken so far."""
        graph = ConstructionGraph(self.space.axes, self.space.layer_names)
        for step in self.steps[: self.position]:
            graph.add(step.node, step.edge)
        return graph

    def candidates(self) -> list[Candidate]:
        """Programs emitted so far, ranked by predicted time (rank 1 = fastest), top-K."""
        found = [s.candidate for s in self.steps[: self.position] if s.candidate is not None]
        found.sort(key=lambda c: c.predicted_seconds)
        return [replace(c, rank=i + 1) for i, c in enumerate(found[: self.options.topk])]


@dataclass(frozen=True)
class Construction:
    expr: TensorExpr  # the expression as constructed (after axis fusion)
    device: DeviceSpec
    policy: str
    candidates: tuple[Candidate, ...]
    graph: ConstructionGraph
    steps: int
    seconds: float


def construct(expr: TensorExpr, device: DeviceSpec, policy: str = "roller", options: Options = Options()) -> Construction:
    """Run a policy to the end; `seconds` is measured around the construction alone."""
    start = time.perf_counter()
    stepper = Stepper(expr, device, policy, options)
    stepper.run_to_end()
    candidates = tuple(stepper.candidates())
    seconds = time.perf_counter() - start
    return Construction(stepper.space.expr, device, policy, candidates, stepper.graph(), len(stepper.steps), seconds)
