"""Roller's construction (OSDI'22 §3.2, Figure 8) as a generator of steps.

EnlargeTile grows the rTile at the top layer (registers) along the axis of best data-reuse score,
recursively; when the next tile would not fit the layer (or would overflow a block's threads),
the current tile is recorded and enlargement continues at the next layer; when loading a tile is
faster than computing it (MemPerf > MaxComputePerf) the tile is recorded and enlargement both
descends and goes on at the same layer. At the lowest layer a program is emitted, scaled out over
the units, and shrunk along its least-reusing axis while it has too few tiles for the units
(Roller-S). A visited tile ends its branch. The search stops at K programs (the paper's early
exit), but not before `policy.MIN_PROGRAMS` (the model ranks what the search found, in the
search's order); with fewer, eps is raised and the search runs again.

On a CPU (our rule, after BLIS's cache blocking) a tile is recorded when it is full, or, above
the lowest cache layer, when growing it saves nothing more, not at its first compute-bound size:
below the registers a core's transfers add to its compute rather than overlap it (the model's
`combine_stages`, but for a plain projection's inputs streaming into L1, which hide only up to
the L2's rate, and the part of its reads from the bottom layer that the L2's streamer hides),
so growth that saves traffic keeps paying until the layer is full, while growth that saves
nothing only takes capacity. The lowest cache layer loads from DRAM, where a
longer contiguous run serves the prefetcher better even when it saves no byte. At the first
cache layer over a reduction's register micro-kernel the score also counts the accumulator trips
the growth saves (`TileCalculus.accumulator_reuse`: the template's accumulators leave the
registers after every L1 K-step, which Roller's Q does not see), and once that tile's loads from
the layer below hide under the operator's floor (its compute, or reading each byte once from the
bottom layer: `model.is_load_hidden`, Roller's own compute-bound test where compute is the floor)
only those count, while each accumulator trip still stalls the FMA chains (a load before the
first FMA, a store after the last). matmul on AVX2 gets BLIS's blocking: 6x16x1 registers under
6x16x256 L1 tiles (kc = 256). Evidence: docs/evidence.md#roller-cpu-tile-recording. Where the
floor is the inputs' stream from DRAM (`model.is_stream_bound`: a matmul of 5 rows over a 51 MB
B) the trips hide under it as well, and that L1 tile grows by Roller's own score: along the
columns rather than K, which leaves the lowest cache tile room for wide rows of B that its panel
copies read in long runs (`model.cpu.packed_runs`; 5 x 3491 x 3681: 12.5 -> 8.4 ms on the 2-core
Zen 3).

A CPU tile recorded only when full leaves few programs where growth has one path: roller-table1's
M0 (65536 x 1024, K = 2) on an AVX2 core with a 1 MiB L2 reached two full L2 tiles (252 x 1024 x 2
over 6 x 16, 250 x 1024 x 2 over 5 x 16) at every eps. So in the last round of the eps ladder, a
round that still runs because fewer than K programs came out, the lowest cache layer's tiles on
the growth chain are programs as well, recorded after the chain's full tile (largest first), so
the full tiles keep their places and the model ranks the rest.

A cache tile of a program that reads an input once from below its lowest cache layer
(`axes.read_once_below`: a few-row matmul's B, where the register tile spans A's rows) is full
where its L1 tiles would walk more of that input's rows in turn, a line at a visit, than the
prefetchers follow (`axes.walked_rows`, `axes.PREFETCH_ROWS`): 19 x 6469 x 7104 ran 17.4 ms
under 288 of B's rows and 5.9 under 48 on two Xeon cores (docs/model-evidence.md#prefetch-rows).

A one-row matmul whose core's share of N fits L1 (`axes.share_streams_from_l1`) reads B once, so
no growth of its register tile saves a byte; it grows by the FMA chains it adds instead, through
the widths that divide a core's share (`rules.StreamRowsRule`), to the widest the registers hold:
1 x 1151 x 671 in 7 vectors under its 21-vector share ran 28-30 us, in 3 (where growth stopped
when it scored the bytes saved) 34-38 (docs/evidence.md#one-row-shares). Each width on that
chain is a program, the widest first, for the model to rank: the chains stop paying before the
widest (1 x 2927 x 451's 1 vector under its 15-vector share ran 38-49 us, its 5 vectors 55-66).

Operators without reuse (elementwise, most reductions: every score is 0) build the top tile only
and load straight from the bottom (§3.2). Our choice, since scores cannot rank them: every
aligned top tile on the growth chain is a program, so K candidates exist for the model to rank;
on a CPU, in the eps ladder's last round, the start tile as well (gemv-4096 on a 12-way L1 has
two top tiles, 8 x 16 and 8 x 32, and the start's four programs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from workbench.construct.graph import Edge
from workbench.construct.policy import Policy
from workbench.construct.space import (
    EPS_STEPS, Action, IllegalAction, Kind, OverCapacity, State, apply, descend_within_limits, with_axis,
)
from workbench.construct.step import Alternative, Step
from workbench.rtile.alignment import next_aligned_sizes
from workbench.rtile.model.common import is_load_hidden
from workbench.rtile.axes import prefetch_rows, share_streams_from_l1, unfollowed_inputs
from workbench.rtile.registers import accumulators, partial_sums

# Most growth steps on one chain of EnlargeTile (all layers): each is a nested generator, and
# Python stops at 1,000 frames (with a caller's frames below). A layer whose tile is still
# growing there is recorded as full. The longest chain we know of a real workload is 523 steps
# (gensor-table4's gemv V3, 16384 x 1000, on a 128-core SSE4.2 CPU with a 4 MiB L2: its L2 tile
# grows over the 16384 rows one register tile at a time); hypothesis found a generated 154 x 103
# x 229 float64 output over a 49-long reduction that no output index reads, whose tile on a
# 2 MiB L2 grew one element at a time for 3,997 steps (the step budget) and past the limit.
MAX_CHAIN = 600


class RollerPolicy(Policy):
    name = "roller"
    NOTES = {
        **Policy.NOTES,
        "no_start": "no aligned tile fits {layer} at eps {eps}",
        "start": "start: smallest aligned tile {tile} ({axes}) at {layer}, eps {eps}{mode}",
        "no_reuse": " (no data reuse: top layer only, loads straight from the bottom)",
        "no_growth": "no axis can grow further",
        "long": "{steps} growth steps on this chain, the construction's bound: record the tile, go down a layer",
        "visited": "tile visited before: branch ends (Figure 8, line 11)",
        "full": "{axis}={size} {why}: record the tile, go down a layer",
        "threads": "needs more threads or registers than a block of {layer} may have",
        "capacity": "does not fit {layer}",
        "prefetch": "walks more rows of an input read once from memory than the prefetchers follow ({rows})",
        "below": "leaves no aligned tile that fits {layer}",
        "no_gain": "saves nothing (a CPU tile grows only while growing pays)",
        "grow": "grow {axis} to {size}: reuse score {score:.4g}",
        "saturated": "loads now outrun compute (MemPerf > MaxComputePerf): record, go down a layer, and keep growing here",
        "descend": "descend to {layer}",
        "no_fit_below": "descend: the smallest aligned tile at {layer} does not fit it or exceeds the thread limits of a block",
    }

    def __init__(self, space, options):
        super().__init__(space, options)
        self._visited: set = set()
        self._descended: set = set()
        self.no_reuse = False
        self._fill = False  # the eps ladder's last round: the lowest cache layer's chain are programs too
        self._share_chain = False  # a one-row matmul's register widths are programs each (module docstring)
        self._scores: dict[tuple, float] = {}  # `_reuse` at a CPU's first cache layer
        # step records the eps ladder's rounds make again (`_alternatives`, `_step`)
        self._alts: dict[tuple, tuple[Alternative, ...]] = {}
        self._marked: dict[tuple, tuple[Alternative, ...]] = {}
        self._log: list | None = None  # the eps-dependent answers of the round running (`ask`)
        self._round_steps: list[Step] | None = None  # and its steps (`record`)
        self._last: _Round | None = None  # the last round a later one may replay (`_replayable`)

    # -- driver ------------------------------------------------------------------------------
    def round(self, eps: float) -> Iterator[Step]:
        """ConstructProg(expr, dev): T = initial rTile; EnlargeTile(T, top layer, empty P)."""
        state = self.start_state(eps)
        if state is None:
            yield self.marker(None, Action(Kind.PRUNE_VISITED, 0), self.describe("no_start", layer=self.space.layer_names[0], eps=eps))
            return False
        self._visited, self._descended = set(), set()
        self.no_reuse = not self.space.stages_below(eps)
        self._fill = self.space.device.runs_on_cpu and eps >= max(self.options.eps, *EPS_STEPS)
        self._share_chain = share_streams_from_l1(self.space.expr, self.space.device)  # a CPU's one-row matmul
        mode = self.describe("no_reuse") if self.no_reuse else ""
        note = self.describe("start", tile="x".join(map(str, state.tile)), axes=" x ".join(self.space.axes), layer=self.space.layer_names[0],
                             eps=eps, mode=mode)
        start = Step(state.actions[-1], state, self.node(state, "start"), None, note=note)
        if self._replayable(eps, state):
            yield from self._replay(eps, start)
            return self._done()
        found, self._log, self._round_steps = len(self.candidates), [], []
        yield self.record(start)
        yield from self._enlarge(state)
        if self.no_reuse and self._fill:  # the start tile is on the growth chain too (module docstring)
            yield from self._descend(state)
        self._last = None
        if len(self.candidates) == found and not self._done():
            self._last = _Round(state.tile, self.no_reuse, self._fill, tuple(self._round_steps), tuple(self._log),
                                frozenset(self._visited), frozenset(self._descended))
        self._log = self._round_steps = None
        return self._done()

    # -- replaying a round -------------------------------------------------------------------
    # A round at a larger eps often takes the very steps of the one before it (gemv-4096 on an
    # AVX2 core: the rounds at eps 0.1 to 0.7, 424 steps each): eps reaches a round only through
    # the answers `ask` keeps (aligned sizes, fits, descents, Roller-S's shrinks) and the start
    # (its tile, whether the operator has reuse), so where each of them is the same at the new
    # eps, and the last round emitted nothing new, the new round is the last one's steps with
    # the new eps in their states, and is replayed so rather than searched again.
    def ask(self, query, eps: float, *args):
        answer = query(self.space, eps, *args)
        self._keep(query, args, answer)
        return answer

    def _keep(self, query, args: tuple, answer) -> None:
        """Keep `query`'s answer for `args` in the log of the round running, if any (`ask`)."""
        if self._log is not None:
            self._log.append((query, args, answer))

    def record(self, step: Step) -> Step:
        if self._round_steps is not None:
            self._round_steps.append(step)
        return super().record(step)

    def _replayable(self, eps: float, start: State) -> bool:
        """Whether the round at `eps` from `start` takes the steps of the last round kept
        (`_Round`): the same start, the same eps-free choices of the driver, room for its steps,
        and every answer it asked the same at `eps`."""
        last = self._last
        if last is None or (last.tile, last.no_reuse, last.fill) != (start.tile, self.no_reuse, self._fill):
            return False
        if self._count + len(last.steps) >= self._limit:
            return False
        return all(query(self.space, eps, *args) == answer for query, args, answer in last.log)

    def _replay(self, eps: float, start: Step) -> Iterator[Step]:
        """The last round's steps again, from `start`, each state at `eps` (`_replayable`)."""
        last, first = self._last, start.state.actions[0]
        self._visited, self._descended = set(last.visited), set(last.descended)
        yield self.record(start)
        states: dict[int, State] = {}  # by the identity of the last round's state (steps share them)
        for step in last.steps[1:]:
            old, new = step.state, None
            if old is not None:
                new = states.get(id(old))
                if new is None:
                    new = states[id(old)] = State(old.layer, old.tile, old.recorded, eps, old.vthreads, (first,) + old.actions[1:])
            yield self.record(Step(step.action, new, step.node, step.edge, step.alternatives, step.note, step.candidate, step.temperature))

    def _done(self) -> bool:
        return self.enough or self.out_of_steps

    # -- EnlargeTile (Figure 8) ----------------------------------------------------------------
    def _enlarge(self, state: State, depth: int = 0) -> Iterator[Step]:
        """EnlargeTile(T, mem, P): T = state.tile at mem = state.layer, P = state.recorded;
        `depth` growth steps and descents so far on this chain (MAX_CHAIN)."""
        if state.layer == self.space.n_tile_layers:  # mem is the lowest layer: emit P
            yield from self.emit(state)
            return
        if depth >= MAX_CHAIN:
            yield self.marker(state, Action(Kind.LAYER_FULL, state.layer), self.describe("long", steps=depth))
            yield from self._descend(state, depth)
            return
        options = self._options(state)  # next aligned shapes T' of T, best data-reuse score first
        if not options:
            yield self.marker(state, Action(Kind.LAYER_FULL, state.layer), self.describe("no_growth"))
            yield from self._descend(state, depth)
            return
        alternatives = self._alternatives(state.layer, options)
        for axis, grown, score in options:
            if self._done():  # stop after TopK programs
                return
            size = grown[axis]
            if self._seen(state, grown):  # if visited(T'): return
                yield self._step(state, Action(Kind.PRUNE_VISITED, state.layer, axis, size), "pruned_visited", grown, score, alternatives, self.describe("visited"))
                return
            why = self._full(state, grown, score)
            if why:  # MemFootprint(T') > mem.capacity: P.add(mem, T); EnlargeTile(T, mem.next, P)
                note = self.describe("full", axis=self.space.axes[axis], size=size, why=why)
                yield self._step(state, Action(Kind.LAYER_FULL, state.layer, axis, size), "over_capacity", grown, score, alternatives, note)
                yield from self._descend(state, depth)
                continue
            nxt = apply(self.space, state, Action(Kind.GROW, state.layer, axis, size))
            self._keep(_aligned, (state.layer, grown, self.space.upper_of(state)), True)  # what `apply` asked
            note = self.describe("grow", axis=self.space.axes[axis], size=size, score=score)
            yield self._step(state, nxt.actions[-1], "explored", grown, score, alternatives, note, nxt)
            if self.no_reuse and state.layer == 0:  # no reuse: every top tile is a program (module doc)
                yield from self._descend(nxt, depth + 1)
            elif not self.space.device.runs_on_cpu and self.space.compute_bound(state.layer, grown):
                # MemPerf(T') > MaxComputePerf: P.add(mem, T'); EnlargeTile(T', mem.next, P).
                # A CPU tile is recorded when full only (module docstring).
                yield self.marker(nxt, Action(Kind.COMPUTE_SATURATED, state.layer), self.describe("saturated"))
                yield from self._descend(nxt, depth + 1)
            yield from self._enlarge(nxt, depth + 1)  # EnlargeTile(T', mem, P)
            if self._fill and state.layer == self.space.n_tile_layers - 1:
                yield from self._descend(nxt, depth + 1)  # after the chain's full tile (module docstring)
            if state.layer == 0 and self._share_chain:  # every width on the chain, widest first (module docstring)
                yield from self._descend(nxt, depth + 1)
                yield from self._descend(state, depth)

    def _options(self, state: State):
        """(axis, T', reuse score) for the next aligned shapes T' of the state's tile, best score
        first; ties go to the innermost axis (contiguous data, fewer transactions)."""
        space, upper = self.space, self.space.upper_of(state)
        starts = None
        if self.no_reuse and state.layer > 0:
            # Nothing to gain per step without reuse: double (next aligned size >= 2x) so a
            # lower layer fills in log steps rather than one transaction at a time.
            starts = tuple(max(t, 2 * t - u) for t, u in zip(state.tile, upper))
        sizes = self.ask(_aligned_sizes, state.eps, state.layer, upper, state.tile, starts)
        options = []
        for axis, size in enumerate(sizes):
            if size is not None:
                grown = with_axis(state.tile, axis, size)
                options.append((axis, grown, self._reuse(state, grown, upper)))
        options.sort(key=lambda o: (-o[2], -o[0]))
        if self.no_reuse and state.layer > 0:
            options = options[:1]  # no reuse to choose by: one growth path below the top layer
        return options

    def _reuse(self, state: State, grown, upper) -> float:
        """The data-reuse score of growing the state's tile to `grown`: Roller's, and at a CPU's
        first cache layer over a reduction's micro-kernel the accumulator trips saved as well,
        or those alone once its loads hide under the operator's floor (module docstring)."""
        space = self.space
        if state.layer == 0 and self._share_chain:
            # B read once: no growth saves a byte; the FMA chains it adds (module docstring)
            expr, device = space.expr, space.device
            return float(accumulators(expr, device, grown) - accumulators(expr, device, state.tile))
        if not (space.device.runs_on_cpu and state.layer == 1 and space.expr.reduce):
            return space.reuse(state.layer, state.tile, grown, upper)
        register = state.recorded[0]
        key = (register, state.tile, grown, upper)  # memoised: the eps ladder's rounds score them again
        score = self._scores.get(key)
        if score is None:
            trips = space.calc.accumulator_reuse(register, state.tile, grown, partial_sums(space.expr, space.device, register))
            if space.stream_bound and space.plain and not space.streamed:
                # the trips hide under the DRAM stream as the L1's loads do: Roller's own score,
                # which spends L1 on the contiguous axis rather than on K (module docstring)
                score = space.reuse(state.layer, state.tile, grown, upper)
            elif is_load_hidden(space.calc, space.device, state.tile, state.layer + 1):
                score = trips
            else:
                score = space.reuse(state.layer, state.tile, grown, upper) + trips
            score += space.stream_reuse(state.tile, grown)
            self._scores[key] = score
        return score

    def _seen(self, state: State, grown) -> bool:
        """visited(T'), marking T' visited."""
        key = (state.layer, grown, state.recorded)
        if key in self._visited:
            return True
        self._visited.add(key)
        return False

    def _full(self, state: State, grown, score: float) -> str:
        """Why `grown` cannot be staged at the state's layer ('' when it can). A tile whose
        smallest aligned multiple at the next layer overflows that layer is full as well: a GPU
        thread tile whose warp of threads, bank padding included, overflows shared memory would
        otherwise be recorded and leave only an over-capacity block tile (gemv). On a CPU a
        growth that saves nothing (`score` 0) ends the tile as well above the lowest cache
        layer (module docstring)."""
        space, layer, upper = self.space, state.layer, self.space.upper_of(state)
        if space.over_thread_limits(layer, grown, upper):
            return self.describe("threads", layer=space.layer_names[layer])
        if space.footprint(layer, grown, upper) > space.capacity(layer):  # `over_capacity`, its thread limits just checked
            return self.describe("capacity", layer=space.layer_names[layer])
        if layer and unfollowed_inputs(space.expr, space.device, state.recorded[0],
                                       grown if layer == 1 else state.recorded[1], grown):
            return self.describe("prefetch", rows=prefetch_rows(space.device))
        if not self.no_reuse and not self.ask(_fits_below, state.eps, layer, grown):
            return self.describe("below", layer=space.layer_names[layer + 1])
        if space.device.runs_on_cpu and not self.no_reuse and score <= 0 and layer < space.n_tile_layers - 1:
            return self.describe("no_gain")
        return ""

    def _descend(self, state: State, depth: int = 0) -> Iterator[Step]:
        """P.add(mem, T) and go on at mem.next: a tile recorded once per (layer, tiles)."""
        key = (state.layer, state.tile, state.recorded)
        if key in self._descended or self._done():
            return
        self._descended.add(key)
        asked = (state.layer, state.tile, state.recorded, state.vthreads)
        try:
            nxt = descend_within_limits(self.space, state)
        except OverCapacity as err:
            self._keep(_descent, asked, _descent_answer(err))
            note = self.describe("no_fit_below", layer=self._layer_label(state.layer + 1))
            yield self.marker(state, Action(Kind.PRUNE_VISITED, state.layer), note)
            return
        except IllegalAction as err:
            self._keep(_descent, asked, _descent_answer(err))
            yield self.marker(state, Action(Kind.PRUNE_VISITED, state.layer), str(err))
            return
        self._keep(_descent, asked, _descent_answer(nxt))
        yield self._step(state, nxt.actions[-1], "explored", None, None, (), self.describe("descend", layer=self._layer_label(nxt.layer)), nxt)
        yield from self._enlarge(nxt, depth + 1)

    # -- step records ------------------------------------------------------------------------
    def _alternatives(self, layer: int, options) -> tuple[Alternative, ...]:
        """The options of `_options` at `layer` as a step records them; one tuple per distinct
        options, which the eps ladder's rounds meet again."""
        key = (layer, tuple(options))
        alternatives = self._alts.get(key)
        if alternatives is None:
            alternatives = self._alts[key] = tuple([Alternative(Action(Kind.GROW, layer, a, t[a]), t, s) for a, t, s in options])
        return alternatives

    def _step(self, state, action, status, tile, score, alternatives, note, nxt=None) -> Step:
        """A step that moves from `state` (to `nxt`, or tries `tile` there), with the options it
        chose among, the one at `tile` marked chosen."""
        node = self.node(state, status, tile, score) if nxt is None else self.node(nxt, status, None, score)
        edge = Edge(self.key(state), node.key, action.describe(self.space.axes, self.space.layer_names), score)
        # the options as `_enlarge` built them (no probability, no note), the one at `tile` marked;
        # by the options' identity (`_alternatives` keeps each tuple alive)
        marked = (id(alternatives), tile)
        alts = self._marked.get(marked)
        if alts is None:
            alts = self._marked[marked] = tuple([Alternative(a.action, a.tile, a.score, None, "chosen") if a.tile == tile else a
                                                 for a in alternatives])
        return self.record(Step(action, nxt if nxt is not None else state, node, edge, alts, note))

    def _layer_label(self, layer: int) -> str:
        return self.space.layer_names[min(layer, len(self.space.layer_names) - 1)]


@dataclass(frozen=True)
class _Round:
    """A finished round that emitted nothing new, as `RollerPolicy._replayable` compares a
    later one with it: its start tile and driver flags, its steps, the eps-dependent answers it
    asked (`ask`: query, arguments, answer) and the tiles it visited and recorded."""

    tile: tuple[int, ...]
    no_reuse: bool
    fill: bool
    steps: tuple[Step, ...]
    log: tuple[tuple, ...]
    visited: frozenset
    descended: frozenset


# The eps-dependent questions a round asks (`RollerPolicy.ask`), each (space, eps, *arguments).
def _aligned_sizes(space, eps: float, layer: int, upper, tile, starts):
    return next_aligned_sizes(space.context(layer, upper, eps), tile, starts=starts)


def _fits_below(space, eps: float, layer: int, tile) -> bool:
    return space.fits_below(layer, tile, eps)


def _aligned(space, eps: float, layer: int, tile, upper) -> bool:
    return space.aligned(layer, tile, upper, eps)


def _descent(space, eps: float, layer: int, tile, recorded, vthreads) -> tuple:
    """Where `descend_within_limits` takes the state: its layer and tiles, or the refusal."""
    try:
        return _descent_answer(descend_within_limits(space, State(layer, tile, recorded, eps, vthreads)))
    except IllegalAction as err:
        return _descent_answer(err)


def _descent_answer(outcome: State | IllegalAction) -> tuple:
    """What `_descent` answers for a descent's outcome, as `RollerPolicy._descend` keeps it."""
    if isinstance(outcome, IllegalAction):
        return type(outcome).__name__, str(outcome)
    return outcome.layer, outcome.tile, outcome.recorded
