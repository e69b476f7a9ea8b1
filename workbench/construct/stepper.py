"""The stepper: one construction, stepped through by a cursor or finished as a whole.

Steps come from a policy's generator and are recorded; `back()` moves the cursor back over the
record and `next()` replays forward before asking the policy for a new step, so stepping is cheap
and every position is reproducible from (workload, device, options).

The cursor and the result are two things: `candidates()` and `graph()` are what the steps up to
the cursor found (a lesson's view), `finish()` is the finished `Construction` (its top-K over all
steps), generated to the end without moving the cursor.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator

from workbench.construct.graph import ConstructionGraph
from workbench.construct.policies import POLICIES, policy_class
from workbench.construct.policy import Policy
from workbench.construct.space import Action, Kind, Options, Space, State
from workbench.construct.step import Candidate, Step
from workbench.errors import UserError
from workbench.hardware.spec import DeviceSpec
from workbench.ops.fusion import fuse_axes
from workbench.ops.gemm_view import construction_expr, view_alternative
from workbench.ops.tensor_expr import TensorExpr
from workbench.ops.window_gemm import is_window_view
from workbench.rtile.model.common import peak_gflops
from workbench.rtile.panels import gathered_inputs

__all__ = ["POLICIES", "Construction", "Stepper", "ViewChoice", "construct", "construction_view", "tiled_expr"]


@dataclass(frozen=True)
class ViewChoice:
    """What a construction tiles (`expr`: `ops.gemm_view.construction_expr`'s choice) and, where
    a view is priced against the nest (`ops.gemm_view.view_alternative`: a conv's window view, a
    GEMM's over its transposed operand's copy), the predicted time of Roller's rank 1 over each;
    0 where nothing was priced."""

    expr: TensorExpr
    nest_seconds: float = 0.0
    view_seconds: float = 0.0
    view: str = ""  # what the view priced was, in words ("" where nothing was priced)

    @property
    def priced(self) -> bool:
        return self.view_seconds > 0

    def text(self) -> str:
        """One line for the faces: which the model chose, at what prices; "" where nothing was priced."""
        if not self.priced:
            return ""
        taken = self.view if is_window_view(self.expr) or self.expr.transposed else "its own loop nest"
        return (f"priced as {self.view} {self.view_seconds * 1e6:.1f} us and in its own "
                f"loop nest {self.nest_seconds * 1e6:.1f} us (Roller's rank 1 of each): constructed as {taken}")

    def to_dict(self) -> dict:
        return {"window_view": is_window_view(self.expr), "transposed_view": bool(self.expr.transposed),
                "nest_seconds": self.nest_seconds, "view_seconds": self.view_seconds}


class Stepper:
    """Construction of one workload on one device by one policy, steppable both ways."""

    def __init__(self, expr: TensorExpr, device: DeviceSpec, policy: str = "roller", options: Options = Options(),
                 view: ViewChoice | None = None):
        cls = policy_class(policy)
        self.original = expr
        start = time.perf_counter()
        self.view = construction_view(expr, device) if view is None else view
        chose = time.perf_counter() - start  # pricing a conv's two views is part of its construction
        viewed = self.view.expr
        self.viewed = viewed is not expr  # a conv seen as a GEMM (ops.gemm_view, ops.pixel_gemm)
        self.space = Space(tiled_expr(viewed, device), device)
        self.options = options
        self.policy = cls(self.space, options)
        self.policy_name = policy
        self.steps: list[Step] = []
        self.position = 0
        searched = _SEARCHED.get((expr, device)) if view is None else None
        if searched is not None and _same_search(searched[0], self.policy):
            del _SEARCHED[expr, device]
            self.policy, self.space = searched[0], searched[0].space
            self._source: Iterator[Step] = self._generate(iter(searched[1]))
        else:
            self._source = self._generate(self.policy.steps())
        self._exhausted = False
        self._seconds = chose  # choosing the view and generating the steps: the construction's own time

    def _generate(self, policy_steps: Iterator[Step]) -> Iterator[Step]:
        if self.space.expr.axes != self.original.axes:
            before = "x".join(str(a.extent) for a in self.original.axes)
            after = "x".join(str(a.extent) for a in self.space.expr.axes)
            action = Action(Kind.FUSE_AXES)
            state = State(0, (), (), self.options.eps, actions=(action,))
            why = "Roller §3.2 axis fusion"
            if self.viewed and self.space.device.launches_thread_blocks:
                why = "conv as implicit GEMM M x N x K, ops.gemm_view"
            elif self.viewed and is_window_view(self.space.expr):
                why = "a conv of few channels as the GEMM over its pixels of its gathered windows (im2col), ops.window_gemm"
                if self.view.priced:
                    why = f"a conv as the GEMM over its pixels of its gathered windows, ops.window_gemm, {self.view.text()}"
            elif self.viewed and gathered_inputs(self.space.expr):
                why = "a strided 1x1 conv as the GEMM over its gathered pixels, ops.pixel_gemm"
            elif self.viewed:
                why = "a 1x1 conv as the GEMM over its pixels, ops.pixel_gemm"
            yield Step(action, state, None, None, note=f"fuse axes: [{before}] -> [{after}] ({why})")
        elif self.viewed and self.space.expr.transposed:  # the axes stay; an input is read as its copy
            action = Action(Kind.FUSE_AXES)
            state = State(0, (), (), self.options.eps, actions=(action,))
            yield Step(action, state, None, None, note=f"view: {self.view.text()}")
        yield from policy_steps

    @property
    def done(self) -> bool:
        return self._exhausted and self.position == len(self.steps)

    @property
    def current(self) -> Step | None:
        return self.steps[self.position - 1] if self.position else None

    def _pull(self) -> Step | None:
        """Generate and record one new step (the cursor stays); None once the policy is done."""
        if self._exhausted:
            return None
        start = time.perf_counter()
        step = next(self._source, None)
        self._seconds += time.perf_counter() - start
        if step is None:
            self._exhausted = True
            return None
        self.steps.append(step)
        return step

    def next(self) -> Step | None:
        """Advance one step; None when the construction is finished."""
        if self.position == len(self.steps) and self._pull() is None:
            return None
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

    def generate(self) -> Iterator[Step]:
        """Generate the rest of the construction, yielding each new step (for a progress
        display); the cursor stays where it is."""
        while (step := self._pull()) is not None:
            yield step

    def run_to_end(self) -> list[Step]:
        """Move the cursor to the last step, generating the rest (a lesson's End button)."""
        for _ in self.generate():
            pass
        self.position = len(self.steps)
        return self.steps

    def finish(self) -> "Construction":
        """The finished construction (top-K over every step), generated to the end if need be;
        the cursor stays where it is. The cyclic garbage collector is paused meanwhile
        (`collector_paused`)."""
        with collector_paused():
            for _ in self.generate():
                pass
        return Construction(self.space.expr, self.space.device, self.policy_name, self.options,
                            tuple(_ranked(self.steps, self.options.topk)), _graph(self.space, self.steps),
                            len(self.steps), self._seconds, self.view)

    def graph(self) -> ConstructionGraph:
        """The construction graph of the steps up to the cursor."""
        return _graph(self.space, self.steps[: self.position])

    def candidates(self) -> list[Candidate]:
        """Programs emitted up to the cursor, ranked by predicted time (rank 1 = fastest), top-K."""
        return _ranked(self.steps[: self.position], self.options.topk)


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector off for the block, as it was after it. Construction
    allocates hundreds of thousands of small acyclic values (tiles, states, steps), which
    reference counting frees, and makes no garbage cycles, while each allocation count past the
    collector's threshold has it walk the young objects, and now and then the whole heap, TVM's
    objects included (what that cost: docs/benchmarks.md, "Construction time"). The collector
    runs again at the next allocations after the block."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _graph(space: Space, steps: list[Step]) -> ConstructionGraph:
    graph = ConstructionGraph(space.axes, space.layer_names, space.expr.extents)
    for step in steps:
        graph.add(step.node, step.edge)
    return graph


def _ranked(steps: list[Step], topk: int) -> list[Candidate]:
    found = sorted((s.candidate for s in steps if s.candidate is not None), key=lambda c: c.predicted_seconds)
    return [replace(c, rank=i + 1) for i, c in enumerate(found[:topk])]


@dataclass(frozen=True)
class Construction:
    """A finished construction: the top-K candidates of `expr` on `device` by `policy`, the whole
    construction graph, its step count and the time the construction took."""

    expr: TensorExpr  # the expression as constructed (after axis fusion)
    device: DeviceSpec
    policy: str
    options: Options
    candidates: tuple[Candidate, ...]
    graph: ConstructionGraph
    steps: int
    seconds: float  # choosing the view (`construction_view`) and generating the steps, nothing else
    view: ViewChoice | None = None  # what was tiled, and the prices it was chosen by

    @property
    def peak_gflops(self) -> float:
        """The device's peak for this expression (the roofline's ceiling): `rtile.model.common.peak_gflops`."""
        return peak_gflops(self.expr, self.device)

    def candidate(self, rank: int) -> Candidate:
        """Candidate `rank` (1 = best predicted); UserError naming the ranks there are."""
        if not 1 <= rank <= len(self.candidates):
            raise UserError(f"rank {rank}: the construction has {len(self.candidates)} candidates")
        return self.candidates[rank - 1]


def construct(expr: TensorExpr, device: DeviceSpec, policy: str = "roller", options: Options = Options()) -> Construction:
    """Run a policy to the end; `seconds` is measured around the construction alone."""
    return Stepper(expr, device, policy, options).finish()


def tiled_expr(viewed: TensorExpr, device: DeviceSpec) -> TensorExpr:
    """The expression a construction on `device` tiles, from the one it views (`construction_view`):
    its neighbouring axes fused (`ops.fusion.fuse_axes`), those a CPU's panels need kept apart.
    The stepper, an export and a stored run's re-prediction all take their axes from here."""
    return fuse_axes(viewed, device.runs_on_cpu)


def construction_view(expr: TensorExpr, device: DeviceSpec) -> ViewChoice:
    """What a construction of `expr` on `device` tiles: `ops.gemm_view.construction_expr`'s
    choice, except where a view is priced against the nest (`ops.gemm_view.view_alternative`: a
    conv's window view, a GEMM's over its transposed operand's copy): then whichever of the two
    Roller's rank 1 (default options) is predicted faster over, both prices kept. A function of (expr, device) alone, so
    that an export or a stored run re-derives the same axes; the pricing is remembered
    (`MAX_PRICED`), as it costs two constructions, the expression kept as the caller's where the
    nest stays (`Stepper.viewed` tells a view by identity), and the search over the expression
    taken is kept for the construction that asked (`_SEARCHED`)."""
    viewed = construction_expr(expr, device)
    key = (expr, device)
    if key not in _PRICED:
        alternative = view_alternative(expr, device)
        if alternative is None:
            return ViewChoice(viewed)
        nest, view = (_rank1(expr, device, e) for e in (viewed, alternative))
        taken = view if view.seconds < nest.seconds else nest
        _PRICED[key] = (alternative if taken is view else None, nest.seconds, view.seconds, _view_words(alternative))
        _SEARCHED[key] = (taken.policy, taken.policy_steps)
        for cache, most in ((_PRICED, MAX_PRICED), (_SEARCHED, MAX_SEARCHED)):
            while len(cache) > most:
                del cache[next(iter(cache))]
    taken, nest, view, words = _PRICED[key]
    return ViewChoice(viewed if taken is None else taken, nest, view, words)


def _view_words(view: TensorExpr) -> str:
    """What a view priced against the nest is (`ops.gemm_view.view_alternative`), in words."""
    if view.transposed:
        names = " and ".join(view.transposed)
        return f"the GEMM over a copy of {names} laid along the output's rows (ops.transposed_gemm)"
    return "the GEMM over its gathered windows (im2col)"


# The prices `construction_view` found, by (expression, device), oldest first: the view taken
# (None where the nest stays), the nest's and the view's rank 1 seconds, the view in words.
_PRICED: dict[tuple, tuple] = {}
MAX_PRICED = 256


# The search that priced the view taken, by (expression, device), for the construction that
# asked for the pricing to take rather than repeat (`Stepper`, once): the policy and the steps it
# generated, the axis-fusion step left out (its note names the prices). A few only: a conv's
# steps are thousands of values, and the construction asks right after the pricing.
_SEARCHED: dict[tuple, tuple] = {}
MAX_SEARCHED = 4


@dataclass(frozen=True)
class _Priced:
    """Roller's construction of one view at the pricing's options: its rank 1's predicted
    seconds (inf where it found none), its policy and the steps that policy generated."""

    seconds: float
    policy: Policy
    policy_steps: tuple[Step, ...]


# The options a view is priced at: Roller's rank 1, from a search of `Policy.wanted` programs.
PRICING = Options(topk=1)


def _rank1(expr: TensorExpr, device: DeviceSpec, tiled: TensorExpr) -> _Priced:
    """Roller's rank 1 constructing `tiled` (a view of `expr`), at `PRICING` options."""
    stepper = Stepper(expr, device, options=PRICING, view=ViewChoice(tiled))
    found = stepper.finish().candidates
    fused = sum(s.action.kind is Kind.FUSE_AXES for s in stepper.steps)
    return _Priced(found[0].predicted_seconds if found else float("inf"), stepper.policy,
                   tuple(stepper.steps[fused:]))


def _same_search(priced: Policy, policy: Policy) -> bool:
    """Whether `policy` generates the steps the pricing's `priced` did: the same policy over the
    same expression, wanting as many programs (`Policy.wanted`: any K up to MIN_PROGRAMS) at the
    same eps, steps and seed; its options then differ in K alone."""
    return (type(policy) is type(priced) and policy.space.expr == priced.space.expr and policy.wanted == priced.wanted
            and replace(policy.options, topk=priced.options.topk) == priced.options)
