"""Roller's construction (OSDI'22 §3.2, Figure 8) as a generator of steps.

EnlargeTile grows the rTile at the top layer (registers) along the axis of best data-reuse score,
recursively; when the next tile would not fit the layer (or would overflow a block's threads),
the current tile is recorded and enlargement continues at the next layer; when loading a tile is
faster than computing it (MemPerf > MaxComputePerf) the tile is recorded and enlargement both
descends and goes on at the same layer. At the lowest layer a program is emitted, scaled out over
the units, and shrunk along its least-reusing axis while it has too few tiles for the units
(Roller-S). A visited tile ends its branch. The search stops at K programs (the paper's early
exit); with fewer, eps is raised and the search runs again.

Operators without reuse (elementwise, most reductions: every score is 0) build the top tile only
and load straight from the bottom (§3.2). Our choice, since scores cannot rank them: every
aligned top tile on the growth chain is a program, so K candidates exist for the model to rank.
"""

from __future__ import annotations

from typing import Iterator

from workbench.construct.graph import Edge
from workbench.construct.space import EPS_STEPS, Action, IllegalAction, Options, Space, State, apply, with_axis
from workbench.construct.step import Alternative, Candidate, Step, make_node, state_key
from workbench.rtile.alignment import next_aligned_sizes
from workbench.rtile.model import estimate


class RollerPolicy:
    name = "roller"

    def __init__(self, space: Space, options: Options):
        self.space = space
        self.options = options
        self.candidates: list[Candidate] = []
        self._emitted: set = set()
        self._visited: set = set()
        self._descended: set = set()
        self._count = 0
        self.no_reuse = False

    # -- driver ------------------------------------------------------------------------------
    def steps(self) -> Iterator[Step]:
        schedule = [self.options.eps] + [e for e in EPS_STEPS if e > self.options.eps]
        for i, eps in enumerate(schedule):
            if i:
                yield self._marker(None, Action("widen_eps", amount=round(eps * 1000)), f"too few programs ({len(self.candidates)} < {self.options.topk}): raise eps to {eps}")
            state = self.space.initial_state(eps)
            if state is None:
                yield self._marker(None, Action("prune_visited", 0), f"no aligned tile fits {self.space.layer_names[0]} at eps {eps}")
                continue
            self._visited, self._descended = set(), set()
            self.no_reuse = self.space.no_reuse(state)
            yield Step(state.actions[-1], state, make_node(self.space, state, "start"), None, note=self._start_note(state))
            yield from self._enlarge(state)
            if self._done():
                return

    def _done(self) -> bool:
        return len(self.candidates) >= self.options.topk or self._count >= self.options.max_steps

    # -- EnlargeTile -------------------------------------------------------------------------
    def _options(self, state: State):
        space, upper = self.space, self.space.upper_of(state)
        starts = None
        if self.no_reuse and state.layer > 0:
            # Nothing to gain per step without reuse: double (next aligned size >= 2x) so a
            # lower layer fills in log steps rather than one transaction at a time.
            starts = tuple(max(t, 2 * t - u) for t, u in zip(state.tile, upper))
        sizes = next_aligned_sizes(space.context(state.layer, upper, state.eps), state.tile, starts=starts)
        options = []
        for axis, size in enumerate(sizes):
            if size is not None:
                grown = with_axis(state.tile, axis, size)
                options.append((axis, grown, space.reuse(state.layer, state.tile, grown, upper)))
        # Best reuse first; ties go to the innermost axis (contiguous data, fewer transactions).
        options.sort(key=lambda o: (-o[2], -o[0]))
        if self.no_reuse and state.layer > 0:
            options = options[:1]  # no reuse to choose by: one growth path below the top layer
        return options

    def _enlarge(self, state: State) -> Iterator[Step]:
        if state.layer == self.space.n_tile_layers:
            yield from self._emit(state)
            return
        options = self._options(state)
        if not options:
            yield self._marker(state, Action("layer_full", state.layer), "no axis can grow further")
            yield from self._descend(state)
            return
        upper = self.space.upper_of(state)
        alternatives = tuple(
            Alternative(Action("grow", state.layer, a, t[a]), t, s) for a, t, s in options
        )
        for axis, grown, score in options:
            if self._done():
                return
            action = Action("grow", state.layer, axis, grown[axis])
            key = (state.layer, grown, state.recorded)
            if key in self._visited:
                yield self._step(state, Action("prune_visited", state.layer, axis, grown[axis]), "pruned_visited", grown, score, alternatives, "tile visited before: branch ends (Figure 8, line 11)")
                return
            self._visited.add(key)
            full = self._full(state, grown, upper)
            if full:
                yield self._step(state, Action("layer_full", state.layer, axis, grown[axis]), "over_capacity", grown, score, alternatives, f"{self._name(axis)}={grown[axis]} {full}: record the tile, go down a layer")
                yield from self._descend(state)
                continue
            nxt = apply(self.space, state, action)
            yield self._step(state, action, "explored", grown, score, alternatives, f"grow {self._name(axis)} to {grown[axis]}: reuse score {score:.4g}", nxt)
            if self.no_reuse and state.layer == 0:
                yield from self._descend(nxt)
            elif self.space.compute_bound(state.layer, grown):
                yield self._marker(nxt, Action("compute_saturated", state.layer), "loads now outrun compute (MemPerf > MaxComputePerf): record, go down a layer, and keep growing here")
                yield from self._descend(nxt)
            yield from self._enlarge(nxt)

    def _full(self, state: State, grown, upper) -> str:
        """Why `grown` cannot be staged at the state's layer ('' when it can). A tile whose
        smallest aligned multiple at the next layer overflows that layer is full as well: a GPU
        thread tile whose warp of threads, bank padding included, overflows shared memory would
        otherwise be recorded and leave only an over-capacity block tile (gemv)."""
        space, layer = self.space, state.layer
        if space.over_thread_limits(layer, grown, upper):
            return f"needs more threads or registers than a block of {space.layer_names[layer]} may have"
        if space.over_capacity(layer, grown, upper):
            return f"does not fit {space.layer_names[layer]}"
        if not self.no_reuse and not space.fits_below(layer, grown, state.eps):
            return f"leaves no aligned tile that fits {space.layer_names[layer + 1]}"
        return ""

    def _descend(self, state: State) -> Iterator[Step]:
        key = (state.layer, state.tile, state.recorded)
        if key in self._descended or self._done():
            return
        self._descended.add(key)
        try:
            nxt = apply(self.space, state, Action("descend", state.layer))
        except IllegalAction as err:
            yield self._marker(state, Action("prune_visited", state.layer), str(err))
            return
        if nxt.layer < self.space.n_tile_layers and self.space.over_capacity(nxt.layer, nxt.tile, state.tile, not self.no_reuse):
            yield self._marker(state, Action("prune_visited", state.layer), f"descend: the smallest aligned tile at {self._layer_label(nxt.layer)} does not fit it (or the block's thread limits)")
            return
        yield self._step(state, nxt.actions[-1], "explored", None, None, (), f"descend to {self._layer_label(nxt.layer)}", nxt)
        yield from self._enlarge(nxt)

    # -- scale-out and emission --------------------------------------------------------------
    def _emit(self, state: State) -> Iterator[Step]:
        tiles = state.recorded
        cached = tuple(l == 0 or not self.no_reuse for l in range(len(tiles)))
        program = self.space.program(tiles, state.eps, cached)
        while program.grid < self.space.device.compute_units:
            shrunk = self.space.shrink_unit(program.tiles, state.eps, cached)
            if shrunk is None:
                break
            axis, tiles = shrunk
            before = program.grid
            program = self.space.program(tiles, state.eps, cached)
            state = State(state.layer, (), tiles, state.eps, actions=state.actions + (Action("shrink", len(tiles) - 1, axis, tiles[-1][axis]),))
            yield self._marker(state, state.actions[-1], f"grid {before}: too few tiles for {self.space.device.compute_units} units, shrink {self._name(axis)} (smallest reuse) to {tiles[-1][axis]}: grid {program.grid}")
        if program.tiles in self._emitted:
            return
        self._emitted.add(program.tiles)
        est = estimate(self.space.calc, self.space.device, program)
        cand = Candidate(program, est)
        self.candidates.append(cand)
        action = Action("emit", self.space.n_tile_layers)
        done = State(state.layer, (), tiles, state.eps, actions=state.actions + (action,))
        node = make_node(self.space, done, "emitted", predicted=est.predicted_seconds)
        edge = Edge(state_key(self.space, state), node.key, "emit") if state.actions[-1].kind == "shrink" else None
        yield self._counted(Step(action, done, node, edge, note=f"emit rProgram #{len(self.candidates)}: grid {program.grid}, {est.predicted_seconds * 1e6:.1f} us predicted, bound by {est.bottleneck}", candidate=cand))

    # -- step records ------------------------------------------------------------------------
    def _step(self, state, action, status, tile, score, alternatives, note, nxt=None) -> Step:
        target = nxt if nxt is not None else state
        node = make_node(self.space, state if nxt is None else nxt, status, tile if nxt is None else None, score)
        edge = Edge(state_key(self.space, state), node.key, action.describe(self.space.axes, self.space.layer_names), score)
        alts = tuple(
            Alternative(a.action, a.tile, a.score, None, "chosen" if a.tile == tile else "")
            for a in alternatives
        )
        return self._counted(Step(action, target, node, edge, alts, note))

    def _marker(self, state, action, note) -> Step:
        node = make_node(self.space, state, "compute_bound") if action.kind == "compute_saturated" else None
        return self._counted(Step(action, state, node, None, (), note))

    def _counted(self, step: Step) -> Step:
        self._count += 1
        return step

    def _name(self, axis: int) -> str:
        return self.space.axes[axis]

    def _layer_label(self, layer: int) -> str:
        return self.space.layer_names[min(layer, len(self.space.layer_names) - 1)]

    def _start_note(self, state: State) -> str:
        mode = " (no data reuse: top layer only, loads straight from the bottom)" if self.no_reuse else ""
        return f"start: smallest aligned tile {dict(zip(self.space.axes, state.tile))} at {self.space.layer_names[0]}, eps {state.eps}{mode}"

