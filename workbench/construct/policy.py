"""The policy base: what a construction policy is, and what every policy shares.

A policy is a class with

- `name`: its key in the registry (construct/policies.py);
- `__init__(space, options)`: a `Space` (expression on a device) and the run's `Options`;
- `round(eps)`: a generator of the steps one eps round takes, returning True when construction
  is finished (enough programs or out of steps) and False to go on to the next eps;
- `NOTES`: the templates its step notes are written from (`describe`).

`Policy` supplies the rest, the same for every policy: the eps schedule (`steps`: Roller raises eps
in EPS_STEPS while fewer than K programs, and MIN_PROGRAMS at least, came out, keeping steps for
the last round, `ROUNDS_KEPT`; one more round where a finished one ran its register rows in
LLVM's pieces or without reuse that a larger eps has, one where its register tiles hold fewer
accumulators than the FMA chains ask for, and one from a second start where the
first's register tile issues more loads than FMAs or a one-row matmul's holds chains its stream
may not need, `_extra_round`), emission (`emit`: scale-out over the units,
Roller-S shrinking while the grid is smaller than the units, split-K where the grid still leaves
units idle (`split_k`), the estimate, the `Candidate`) and the
step bookkeeping (`record` counts steps against `max_steps`, `marker` records a
step that changes no tile, `node` / `key` name graph nodes, virtual threads included).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from workbench.construct.graph import Edge, Node
from workbench.construct.space import EPS_STEPS, Action, Kind, Options, Space, State, apply
from workbench.construct.step import Candidate, Step, node_facts, state_key
from workbench.fmt import duration
from workbench.hardware.spec import DeviceSpec
from workbench.rtile.axes import lane_axis
from workbench.rtile.model import Estimate, estimate
from workbench.rtile.panels import reads_in_place
from workbench.rtile.plan import cpu_plan, loop_nest_key, splits_reduction
from workbench.rtile.staging import pipelined, pipelined_axis
from workbench.rtile.rprogram import RProgram, split_axis, split_counts, split_steps
from workbench.rtile.alignment import required_accumulators
from workbench.rtile.rules import dividing_axes


# A round of the eps ladder before the last runs only while the steps left would hold this many
# rounds as long as the one before it; otherwise the steps are kept for the ladder's last round.
# Roller's last round on a CPU also emits the lowest cache layer's growth chain (`roller._fill`),
# and where the rounds before used up the step limit it never came: gemv-4096 on a 2-core SSE4.2
# CPU with a 2 MiB L2 grows its L2 tile one 2-row register tile at a time, ~650 steps a round,
# and ended at 4,000 steps with one program.
ROUNDS_KEPT = 3
# Programs a construction collects before Roller's early exit, whatever K it returns (the top K
# of them by the model): the search meets programs in its own order, not the model's, so an
# exit at K = 1 kept the first program found, not the fastest predicted. Over 100 drawn
# workloads (60 matmuls, 40 convs; the local Zen 5), the rank 1 of a search stopped at K was
# predicted slower than the best rank 1 of K <= 20 for 58 at K = 1, 29 at K = 5, 12 at K = 10,
# and 3 x 13 -> 239 1x1 over 19 x 19 ran 92 us at rank 1 of 5 (ONNX Runtime 27) and 21 us at
# rank 1 of 10. Ten is the default K, whose construction time the targets bound (20 ms median on
# the CPU suites); the rank 1 of every K up to it is the same program.
MIN_PROGRAMS = 10
# The share of the step limit a round of the eps ladder leaves for the rounds after it where the
# construction has second starts (`Space.second_starts`). A round that runs out of steps ends the
# construction, and the second rounds never came: the nest of 5 x 177 x 3459 with B transposed
# spent all 4,000 steps growing its L2 tile along N two rows of B a step, and its "ports" start
# (5 x 3 x 16, priced 46 us against the first round's best 93, run 32 against 61) built nothing
# (docs/evidence.md#second-rounds-kept).
SECOND_ROUNDS_SHARE = 0.25


class Policy:
    """Base of every construction policy (see the module docstring for the protocol)."""

    name = ""
    NOTES = {
        "widen_eps": "too few programs ({found} < {topk}): raise eps to {eps}",
        "whole_vectors": "every register row along {axis} is the whole axis in LLVM's narrower pieces: one more "
                         "round at eps {eps}, where whole vectors pad it; the model prices both",
        "reuse": "no growth eps {eps} aligns saves a byte, so that round staged nothing below the registers; "
                 "from eps {wider} growth saves: one more round there; the model prices both",
        "chains": "no register tile eps {eps} aligns holds the {need} accumulators the FMA chains ask for (the most: "
                  "{held}): one more round at eps {wider}, its output rows and columns ragged where they may be; "
                  "the model prices both",
        "ports": "the start {first} issues more loads than FMAs, which no growth of its rows changes: one more "
                 "round at eps {eps} from {tile}, its loads under its FMAs; the model prices both",
        "stream": "the start {first} holds the accumulators the FMA latency asks for, which a row streaming B may "
                  "not need: one more round at eps {eps} from {tile}, without that need; the model prices both",
        "dividing": "no cache tile of whole lines divides {axes}, so each leaves a tail the template pads, copying "
                    "every input in every call: one more round at eps {eps} from {tile}, its cache tiles along "
                    "{axes} dividing it; the model prices both",
        "keep_steps": "too few programs ({found} < {topk}), and {left} steps left: skip eps {eps}, keep them for "
                      "the last round (eps {last})",
        "shrink": "grid {before}: too few tiles for {units} units, shrink {axis} (smallest reuse) to {size}: grid {after}",
        "reshrink": "grid {before}: too few tiles for {units} units, also shrink {axis} to {size} (predicted faster "
                    "than shrinking the axis of smallest reuse): grid {after}",
        "balance": "grid {before} leaves some of the {units} cores idle in its last wave: also cut {axis} to {size}: grid {after}",
        "even": "grid {before}'s tiles pad {axis} more than as many even tiles would: also cut {axis} evenly to {size}: grid {after}",
        "reduction_cut": "grid {before} leaves some of the {units} cores idle and its unit tile too few steps of {axis} to split: "
                         "also cut {axis} to {size}, then split it over the cores",
        "rows": "{input} is read from DRAM in strips of its rows: also span them whole ({axis} to {width}) in steps "
                "of {size} of {k}, split over the cores",
        "emit": "emit rProgram #{number}: grid {grid}, {predicted} predicted, bound by {bottleneck}",
    }
    marker_temperature: float | None = None  # the temperature recorded with markers (annealing policies)

    def __init__(self, space: Space, options: Options):
        self.space = space
        self.options = options
        self.candidates: list[Candidate] = []
        self.wanted = max(options.topk, MIN_PROGRAMS)  # programs the search collects before it stops
        self._extras = 0  # candidates that are balanced cuts of another (`emit`): extras
        self._found_before = 0  # programs of the rounds before an extra round (`_extra_round`)
        self._second: State | None = None  # the start of the second round running (`start_state`)
        self._emitted: set = set()
        self._count = 0
        self._limit = options.max_steps  # steps the round running may reach (`steps`)
        self._priced: dict[RProgram, tuple[RProgram, Estimate]] = {}  # `priced`
        # graph keys and nodes by what makes them (`key`, `node`): the eps ladder's rounds and a
        # walk's revisits record the same ones again
        self._keys: dict[tuple, str] = {}
        self._facts: dict[tuple, tuple] = {}  # `node`: what a node says whatever its status and score

    def round(self, eps: float) -> Iterator[Step]:
        raise NotImplementedError

    def start_state(self, eps: float) -> State | None:
        """Where a round at `eps` starts: the initial state, or in the second round its start."""
        return self._second if self._second is not None else self.space.initial_state(eps)

    # -- eps schedule --------------------------------------------------------------------------
    def steps(self) -> Iterator[Step]:
        """Every step of the construction: a round at the initial eps, then one per larger eps
        of EPS_STEPS while a round ends without finishing; a round before the last is skipped,
        with a note, where the steps left would not hold `ROUNDS_KEPT` rounds as long as the one
        before it. The extra rounds (`_whole_vector_round`, `_reuse_round`, `_chains_round`,
        `_second_round`) follow the round that finishes, or the last one where none does: a one-row matmul whose
        every eps gives the same few programs of its filled start still gets its stream round's
        (1 x 2780 x 881 on AVX2: rank 1 345 -> 205 us predicted, 241 -> 104-156 measured;
        docs/evidence.md#second-start). A round of the ladder stops `_kept_steps` short of the
        step limit, so that a round which runs out of steps leaves the second rounds some."""
        schedule = [self.options.eps] + [e for e in EPS_STEPS if e > self.options.eps]
        used = 0  # steps the last round took
        for i, eps in enumerate(schedule):
            if i:
                found, topk, left = self.found, self.wanted, self.options.max_steps - self._count
                keep = i < len(schedule) - 1 and left < ROUNDS_KEPT * used
                note = (self.describe("keep_steps", found=found, topk=topk, left=left, eps=eps, last=schedule[-1])
                        if keep else self.describe("widen_eps", found=found, topk=topk, eps=eps))
                yield self.marker(None, Action(Kind.WIDEN_EPS, eps=eps), note)
                if keep:
                    continue
            start = self._count
            self._limit = self.options.max_steps - self._kept_steps(eps)
            try:
                finished = yield from self.round(eps)
            finally:
                self._limit = self.options.max_steps
            used = self._count - start
            if finished or i == len(schedule) - 1:
                yield from self._whole_vector_round(eps)
                yield from self._reuse_round(eps)
                yield from self._chains_round(eps)
                yield from self._second_round(eps)
                return

    def _whole_vector_round(self, eps: float) -> Iterator[Step]:
        """One more round, at `Space.whole_vector_eps`, where the round at `eps` could run its
        register rows only as LLVM's pieces: it searches as far as a round of its own (its
        programs are counted from none), and the top K is taken over both rounds'."""
        wider = self.space.whole_vector_eps(eps)
        if wider is None or self.out_of_steps:
            return
        axis = self.space.axes[lane_axis(self.space.expr, self.space.device)]
        yield self.marker(None, Action(Kind.WIDEN_EPS, eps=wider), self.describe("whole_vectors", axis=axis, eps=wider))
        yield from self._extra_round(wider)

    def _reuse_round(self, eps: float) -> Iterator[Step]:
        """One more round, at `Space.reuse_eps`, where the round at `eps` ran without reuse
        though the operator has it at a larger eps; counted and taken as `_whole_vector_round`'s."""
        wider = self.space.reuse_eps(eps)
        if wider is None or self.out_of_steps:
            return
        yield self.marker(None, Action(Kind.WIDEN_EPS, eps=wider), self.describe("reuse", eps=eps, wider=wider))
        yield from self._extra_round(wider)

    def _chains_round(self, eps: float) -> Iterator[Step]:
        """One more round, at `Space.chains_eps`, where the round at `eps` could align no register
        tile holding the accumulators the FMA chains ask for; counted and taken as
        `_whole_vector_round`'s."""
        wider = self.space.chains_eps(eps)
        if wider is None or self.out_of_steps:
            return
        held = required_accumulators(self.space.context(0, self.space.ones(), eps))
        note = self.describe("chains", eps=eps, need=self.space.device.fma_accumulators, held=held, wider=wider)
        yield self.marker(None, Action(Kind.WIDEN_EPS, eps=wider), note)
        self._second = self.space.chains_start(wider)
        try:
            with self.space.round_of("chains"):
                yield from self._extra_round(wider)
        finally:
            self._second = None

    def _second_round(self, eps: float) -> Iterator[Step]:
        """One more round at `eps` from each of `Space.second_starts` (a register tile with more
        loads than FMAs; a one-row matmul's tile filled to chains its stream does not need,
        searched without that need; a reduction's cache tiles dividing it where no tile of whole
        lines does), each aligned as its kind asks (`Space.round_of`); counted and taken as
        `_whole_vector_round`'s."""
        first = self.space.initial_state(eps)
        axes = ", ".join(self.space.axes[a] for a in dividing_axes(self.space.expr, self.space.device))
        for why, start in self._second_starts(eps):
            if self.out_of_steps:
                return
            note = self.describe(why, first="x".join(map(str, first.tile)), tile="x".join(map(str, start.tile)),
                                 eps=eps, axes=axes)
            yield self.marker(None, Action(Kind.WIDEN_EPS, eps=eps), note)
            self._second = start
            try:
                with self.space.round_of(why):
                    yield from self._extra_round(eps)
            finally:
                self._second = None

    def _extra_round(self, eps: float) -> Iterator[Step]:
        self._found_before += self.found  # the rounds before keep theirs; this one counts from none
        yield from self.round(eps)

    def _split_unshrunk(self, state: State, shrinks) -> bool:
        """Whether the program of `state` as it arrived, split over its reduce axis until its
        blocks fill the units (`split_k`), is predicted faster than the program Roller-S's
        `shrinks` make of it (split too where that one's grid still leaves units idle): a
        long reduction over few outputs (roller-table1 M1, 128 x 4032 x 1000) keeps a tile
        with reuse instead of shrinking it to a few outputs a thread."""
        space = self.space
        whole = self.priced(space.program_of(state))
        if whole[0].split <= 1:
            return False
        for axis, tiles in shrinks:  # as `emit` applies them
            state = apply(space, state, Action(Kind.SHRINK, len(tiles) - 1, axis, tiles[-1][axis]))
        shrunk = self.priced(space.program_of(state))
        return whole[1].predicted_seconds < shrunk[1].predicted_seconds

    @property
    def enough(self) -> bool:
        return self.found >= self.wanted

    @property
    def found(self) -> int:
        """Programs emitted, less the balanced cuts emitted beside them: those are extras, so a
        round searches as far as it would without them (the top K is taken over all)."""
        return len(self.candidates) - self._extras - self._found_before

    @property
    def out_of_steps(self) -> bool:
        return self._count >= self._limit

    def _second_starts(self, eps: float) -> tuple:
        """`Space.second_starts` at `eps` where a round there has a start, else none."""
        return self.space.second_starts(eps) if self.space.initial_state(eps) is not None else ()

    def _kept_steps(self, eps: float) -> int:
        """Steps a round at `eps` leaves for the rounds after it: SECOND_ROUNDS_SHARE of the
        limit where the construction has second starts at `eps` (`_second_starts`), else none."""
        return int(SECOND_ROUNDS_SHARE * self.options.max_steps) if self._second_starts(eps) else 0

    # -- emission ------------------------------------------------------------------------------
    def emit(self, state: State) -> Iterator[Step]:
        """Emit the program of `state` (at the bottom layer): scaled out over the units, its unit
        tile shrunk along the axis of smallest reuse while the grid has fewer tiles than the
        device has units (Roller-S, §3.2), each shrink a step; then, on a CPU whose cores the
        grid leaves idle (or whose tiles pad an axis more than as many even ones would), the
        fastest predicted of the balanced (or even) cuts (`Space.balances`) as well,
        where it is predicted faster: of the program Roller-S made, and of the program as it
        arrived where Roller-S cut it into more than twice the cores' tiles (it pads at most eps:
        64 x 11239 x 449 on 2 cores arrived as one 66 x 464 unit tile and shrank N to 16, 29
        tiles, A's panel copied 29 times, 0.4-0.5x numpy, where two tiles of 240, padding 7 %,
        keep A's reuse: 0.9x; where it cut no more than that, the cuts only trade its padding
        for other register tiles, which cpu-core's conv-1x1 measured 3-6 % slower); and where
        the program reads an input from DRAM in strips of its rows, the program whose unit tile
        spans those rows whole (`Space.whole_rows`, a rows step), where predicted faster. A program
        emitted before is not emitted again (`repeated`); a program is its loop nest
        (`plan.loop_nest_key`: its tiles, less a CPU L1 tile's K where that only splits a loop)
        and its virtual threads."""
        arrived = state
        shrinks = self.ask(shrinks_at, state.eps, state.recorded)
        if shrinks and self._split_unshrunk(state, shrinks):
            shrinks = ()  # split-K fills the units with the whole tile (`_split_unshrunk`)
        state = yield from self._shrunk(state, shrinks, "shrink")
        est = yield from self._emit_program(state, arrived)
        if est is None:
            return
        other = self._reshrunk(arrived, shrinks)
        if other is not None and other[1] < est.predicted_seconds:
            shrunk = yield from self._shrunk(arrived, other[0], "reshrink")
            if (yield from self._emit_program(shrunk, arrived)) is not None:
                self._extras += 1
        cut = self.ask(reduction_cut_at, state.eps, state.recorded)
        if cut is not None and self.priced(self.space.program_of(state))[0].split <= 1:
            program = self.space.program(cut[1], state.eps, state.vthreads)
            if self.priced(program)[1].predicted_seconds < est.predicted_seconds:
                deeper = yield from self._shrunk(state, (cut,), "reduction_cut")
                if (yield from self._emit_program(deeper, arrived)) is not None:
                    self._extras += 1
        rows = self.ask(whole_rows_at, state.eps, state.recorded)
        spanned = self.priced(self.space.program(rows[3], state.eps, state.vthreads))[1] if rows is not None else None
        if spanned is not None and spanned.predicted_seconds < est.predicted_seconds:
            name, axis, size, tiles = rows
            whole = apply(self.space, state, Action(Kind.ROWS, self.space.n_tile_layers, axis, size))
            k = self.space.axes[split_axis(self.space.expr, self.space.device)]
            note = self.describe("rows", input=name, axis=self.space.axes[axis], width=tiles[-1][axis], size=size, k=k)
            yield self.marker(whole, whole.actions[-1], note)
            if (yield from self._emit_program(whole, arrived)) is not None:
                self._extras += 1
        cuts = [(self._balanced(state), state)]
        if shrinks and self.space.calc.spatial_tiles(state.recorded[-1]) > 2 * self.space.device.compute_units:
            cuts.append((self._balanced(arrived), arrived))
        cuts = [c for c in cuts if c[0] is not None]
        if not cuts:
            return
        (axis, tiles, bound, predicted), start = min(cuts, key=lambda c: (c[0][3], c[0][0]))
        if predicted < est.predicted_seconds:
            even = self.space.calc.spatial_tiles(start.recorded[-1]) % self.space.device.compute_units == 0
            state = yield from self._shrunk(start, ((axis, tiles),), "even" if even else "balance", bound)
            if (yield from self._emit_program(state, arrived)) is not None:
                self._extras += 1

    def _shrunk(self, state: State, shrinks, event: str, bound: float = 0.0):
        """`state` after `shrinks` ((axis, tiles) each, padding up to `bound` where that is more
        than its eps), each a step noted as `event`; returns the state."""
        space, units, grid = self.space, self.space.device.compute_units, self.space.calc.spatial_tiles
        for axis, tiles in shrinks:
            before = grid(state.recorded[-1])
            state = apply(space, state, Action(Kind.SHRINK, len(tiles) - 1, axis, tiles[-1][axis], eps=bound))
            note = self.describe(event, before=before, units=units, axis=space.axes[axis], size=tiles[-1][axis],
                                 after=grid(tiles[-1]), bound=bound)
            yield self.marker(state, state.actions[-1], note)
        return state

    def _reshrunk(self, arrived: State, shrinks) -> tuple[tuple, float] | None:
        """On a CPU, Roller-S's shrinks of the program that arrived, started along each axis but
        the smallest reuse's (`Space.shrink_choices`) and continued as Roller-S's: the fastest
        predicted, as (shrinks, predicted seconds), or None where no other axis can shrink. The
        reuse score does not see what a cut costs the template: 16 channels to 21 5x5 filters
        over 19 x 19 on two cores shrank its 20 columns to 10 (the grid then splits a row its
        5-column register tiles leave ragged: every statement of the cut tile guarded, 57 us)
        where halving its 32 filters ran 21 us."""
        if not (shrinks and self.space.device.runs_on_cpu):
            return None
        eps, best = arrived.eps, None
        for axis, tiles in self.ask(shrink_choices_at, eps, arrived.recorded)[1:]:
            path = ((axis, tiles),) + self.ask(shrinks_at, eps, tiles)
            predicted = self.priced(self.space.program(path[-1][1], eps, arrived.vthreads))[1].predicted_seconds
            if best is None or predicted < best[1]:
                best = (path, predicted)
        return best

    def _balanced(self, state: State) -> tuple[int, tuple, float, float] | None:
        """The fastest predicted of `Space.balances` of the program of `state` (axis, tiles,
        padding bound, predicted seconds), or None where it has none."""
        priced = [(axis, tiles, bound, self.priced(self.space.program(tiles, bound, state.vthreads))[1].predicted_seconds)
                  for axis, tiles, bound in self.ask(balances_at, state.eps, state.recorded)]
        return min(priced, key=lambda b: (b[3], b[0]), default=None)

    def _emit_program(self, state: State, arrived: State):
        """Emit the program of `state` (its unit tile final) as a candidate; returns its estimate,
        or None where the same loop nest was emitted before."""
        space = self.space
        program = space.program_of(state)
        key = (loop_nest_key(program, space.device), program.vthreads)
        if key in self._emitted:
            yield from self.repeated(state)
            return None
        self._emitted.add(key)
        program, est = self.priced(program)
        split = program.split if program.split > 1 else 0  # recorded so that `replay` splits it too
        emit = Action(Kind.EMIT, space.n_tile_layers, size=int(program.in_place), count=split)  # and reads in place
        done = replace(state, tile=(), actions=state.actions + (emit,))
        cand = Candidate(program, est, space.device, done.actions)
        self.candidates.append(cand)
        node = self.node(done, "emitted", predicted=est.predicted_seconds)
        edge = Edge(self.key(arrived), node.key, "emit") if node.key != self.key(arrived) else None
        grid = f"{program.grid} ({program.split}-way split-K)" if program.split > 1 else str(program.grid)
        if program.in_place:
            grid += ", inputs read in place, edges split off"
        note = self.describe("emit", number=len(self.candidates), grid=grid,
                             predicted=duration(est.predicted_seconds), bottleneck=est.bottleneck)
        yield self.record(Step(done.actions[-1], done, node, edge, note=note, candidate=cand, temperature=self.marker_temperature))
        return est

    def priced(self, program: RProgram) -> tuple[RProgram, Estimate]:
        """`split_k` of `program` on the space's device (the program unsplit where the options
        turn split-K off), or of its variant that reads its inputs in place (`in_place`) where
        that is predicted faster; memoised: `_split_unshrunk` prices the program that `emit` then
        emits."""
        found = self._priced.get(program)
        if found is None:
            found = self._split(program)
            variant = in_place(program, self.space.device)
            if variant is not None:
                other = self._split(variant)
                if other[1].predicted_seconds < found[1].predicted_seconds:
                    found = other
            self._priced[program] = found
        return found

    def _split(self, program: RProgram) -> tuple[RProgram, Estimate]:
        device = self.space.device
        return split_k(program, device) if self.options.split_k else (program, estimate(program, device))

    def repeated(self, state: State) -> Iterator[Step]:
        """Steps taken when `emit` meets a program emitted before: none by default."""
        return iter(())

    def ask(self, query, eps: float, *args):
        """`query(space, eps, *args)`: an answer of the space that depends on eps (a policy that
        replays rounds keeps them: `roller.RollerPolicy`)."""
        return query(self.space, eps, *args)

    # -- step records --------------------------------------------------------------------------
    def describe(self, event: str, **facts) -> str:
        """The note of a step: the policy's template for `event`, filled in with `facts`."""
        return self.NOTES[event].format(**facts)

    def record(self, step: Step) -> Step:
        """Count a step (against `max_steps`)."""
        self._count += 1
        return step

    def marker(self, state: State | None, action: Action, note: str, temperature: float | None = None) -> Step:
        """A step that changes no tile (a compute-saturated tile is still drawn as a node)."""
        node = self.node(state, "compute_bound") if action.kind == Kind.COMPUTE_SATURATED else None
        temperature = self.marker_temperature if temperature is None else temperature
        return self.record(Step(action, state, node, None, (), note, temperature=temperature))

    def key(self, state: State) -> str:
        """The graph key of a state: its tiles, plus its virtual threads where any are set."""
        found = (state.layer, state.tile, state.recorded, state.vthreads)
        key = self._keys.get(found)
        if key is None:
            key = self._keys[found] = state_key(self.space, state) + _vthread_suffix(state)
        return key

    def node(self, state: State, status: str, tile=None, score=None, predicted=None) -> Node:
        """The graph node of `state` (of `tile` at its layer, where given)."""
        where = (state.layer, state.tile if tile is None else tile, state.recorded, state.vthreads)
        facts = self._facts.get(where)
        if facts is None:
            facts = self._facts[where] = node_facts(self.space, state, tile, _vthread_suffix(state))
        return Node(*facts, score, status, predicted)


def in_place(program: RProgram, device: DeviceSpec) -> RProgram | None:
    """The variant of a CPU `program` that reads its inputs as stored where its tiles leave tails
    (`RProgram.in_place`, `panels.reads_in_place`), its row's edges split off rather than padded
    (`CpuPlan.split_edges`); None where it has none. Which of the two is faster depends on what
    the copy costs against the guarded edge, which the model prices (`Policy.priced`)."""
    if not device.runs_on_cpu or not reads_in_place(program.expr, program, device):
        return None
    variant = replace(program, in_place=True)
    return variant if cpu_plan(variant, device).split_edges else None


def split_k(program: RProgram, device: DeviceSpec) -> tuple[RProgram, Estimate]:
    """`program` and its estimate, or, where its grid leaves units idle, the same program split
    over its reduce axis (`RProgram.split`: `rprogram.split_counts`, where the template realises
    a split, `plan.splits_reduction`) and the split's estimate. Priced by the model: the splits
    from the smallest that fills the units up to the most whose blocks are all resident at once
    (the unsplit program's blocks per unit; the wave quantisation of each in between differs), the fastest
    kept where it beats the unsplit program (its partial sums and their sum,
    `gpu.split_k_seconds` and `cpu.split_sum_seconds`, against the busier units)."""
    est = estimate(program, device)
    units = device.compute_units
    counts = split_counts(program, device) if program.grid < units and splits_reduction(program, device) else ()
    if not counts:
        return program, est
    resident = units * est.blocks_per_unit
    fill = next((s for s in counts if program.grid * s >= units), counts[-1])
    best = (est.predicted_seconds, program, est)
    for count in (s for s in counts if s == fill or fill < s and program.grid * s <= resident):
        split = replace(program, split=count, grid=program.grid * count)
        if pipelined(split, device) and pipelined_axis(split, device) == split_axis(split.expr, device) \
                and split_steps(split, split_axis(split.expr, device)) < 2:
            continue  # a double-buffered part needs a second step to overlap (`codegen.cuda_splitk`)
        split_est = estimate(split, device)
        if split_est.predicted_seconds < best[0]:
            best = (split_est.predicted_seconds, split, split_est)
    return best[1], best[2]


def shrinks_at(space: Space, eps: float, tiles) -> tuple:
    """`Space.shrinks` of `tiles` at `eps` (a query for `Policy.ask`)."""
    return space.shrinks(tiles, eps)


def shrink_choices_at(space: Space, eps: float, tiles) -> tuple:
    """`Space.shrink_choices` of `tiles` at `eps` (a query for `Policy.ask`)."""
    return space.shrink_choices(tiles, eps)


def whole_rows_at(space: Space, eps: float, tiles):
    """`Space.whole_rows` of `tiles` at `eps` (a query for `Policy.ask`)."""
    return space.whole_rows(tiles, eps)


def reduction_cut_at(space: Space, eps: float, tiles):
    """`Space.reduction_cut` of `tiles` at `eps` (a query for `Policy.ask`)."""
    return space.reduction_cut(tiles, eps)


def balances_at(space: Space, eps: float, tiles) -> tuple:
    """`Space.balances` of `tiles` at `eps` (a query for `Policy.ask`)."""
    return space.balances(tiles, eps)


def _vthread_suffix(state: State) -> str:
    if not state.vthreads:  # none set (every Roller state)
        return ""
    return "+v" + "x".join(map(str, state.vthreads)) if any(v > 1 for v in state.vthreads) else ""
