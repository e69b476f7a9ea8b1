"""Gensor's construction (gensor-markov-construction.txt §IV) as a generator of steps.

A state is an ETIR program: per axis the tile of every memory layer fixed so far plus the one
being built (`State.recorded`, `State.tile`), the virtual threads of a GPU thread's tile
(`State.vthreads`, Gensor's per-thread stride S) and the current layer. The actions are the
stepper's vocabulary: `grow` (Gensor's tile: next aligned size of one axis), `inv_tile` (previous
aligned size), `descend` (Gensor's cache: record the tile, go to the next layer) and
`set_vthread`. Every legal action gets a benefit, benefits become probabilities, and a walk
picks actions by roulette wheel under simulated annealing. A walk that reaches the bottom layer
emits an rProgram (scaled out over the units, shrunk like Roller-S while the grid is smaller
than the units) and the next walk starts again from the initial state.

The paper's formulas were lost in extraction. Reconstruction (ours, ALGORITHMS.md §2):
- grow: Roller's reuse ratio S = (Q(T) - Q(T')) / (F(T') - F(T)). A legal move that buys no
  reuse keeps a floor of FLOOR_WEIGHT * s0, s0 = Q(T) / F(T) the state's own traffic per byte of
  footprint, so every legal move stays possible (irreducibility); a move that costs no footprint
  (S infinite) counts FREE_WEIGHT * s0.
- inv_tile: the inverse of the ratio S_rev of the grow it undoes, INV_WEIGHT * s0 / (1 + S_rev / s0):
  positive, at most INV_WEIGHT * s0 (so less likely than a typical grow), and largest where the
  shrink gives up the least reuse, the axis Roller-S would shrink (S_rev < 0, a shrink that saves
  padded traffic, counts as 0).
- descend: t_below / t_here, t = latency + bytes / bandwidth of the layer for the F(T) bytes the
  tile reads: how much faster the staged copy feeds it than the layer below (ALGORITHMS.md's
  t_l / t_{l+1} in Gensor's outermost-first numbering; our layers are numbered top first).
- set_vthread (GPU, register layer): shared-memory wavefronts of the first warp without / with
  the new virtual threads, counted exactly from its 32 lane addresses (banks.py) under the thread
  binding of the block the state would emit (the next layer's smallest aligned tile).
- P(a) = B_a / sum of positive B, with the weights of descend and set_vthread multiplied by T0 / T
  (ours for set_vthread: its benefit is a speed ratio like descend's, many orders of magnitude
  below the reuse ratios, so unscaled a thread's tile would never be split); 0 for a move over a
  capacity or a thread limit, one leaving no aligned tile that fits the next layer, or one whose
  virtual threads no longer divide the tile (misaligned sizes are never offered).
- Annealing: T starts at T0 and halves every iteration; a move to a state whose program is
  predicted slower by the fraction delta is accepted with probability exp(-delta / T). Ours: T
  restarts at T0 after each descend, else every layer below the first would be entered cold and
  left at its smallest tile; a layer's iterations are capped at ITERATIONS_PER_WALK / layers, after
  which the walk descends (the paper's threshold on T).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from math import exp, inf
from typing import Iterator

from workbench.construct.banks import ThreadBinding, stored_tile, wavefronts
from workbench.construct.graph import Edge, Node
from workbench.construct.space import EPS_STEPS, Action, IllegalAction, Options, Space, State, apply, with_axis
from workbench.construct.step import Alternative, Candidate, Step, make_node, state_key
from workbench.rtile.alignment import initial_tile, mma_axes, next_aligned_sizes, prev_aligned_sizes
from workbench.rtile.model import estimate
from workbench.rtile.rprogram import storage_padding

T0 = 1.0
ITERATIONS_PER_WALK = 100  # Gensor §IV-D: "convergence can generally be achieved after about 100 iterations"
WALKS_PER_TOPK = 2  # walks per eps round, per program asked for: walks repeat programs
INV_WEIGHT = 1 / 16
FLOOR_WEIGHT = 1 / 256
FREE_WEIGHT = 16.0
VTHREAD_COUNTS = (1, 2, 4, 8)  # Gensor's setVthread sizes; 1 undoes a split
ANNEALED = ("descend", "set_vthread")  # weights multiplied by T0 / T


class MarkovPolicy:
    name = "markov"

    def __init__(self, space: Space, options: Options):
        self.space = space
        self.options = options
        self.rng = random.Random(options.seed)
        self.candidates: list[Candidate] = []
        self._emitted: set = set()
        self._visits: Counter = Counter()
        self._count = 0
        self._moves: dict = {}
        self._times: dict = {}
        self._waves: dict = {}
        self._no_reuse: dict = {}
        self.n = space.n_tile_layers

    # -- public questions ----------------------------------------------------------------------
    def transitions(self, state: State, temperature: float = T0) -> tuple[Alternative, ...]:
        """Every action offered at `state` with its benefit (`score`) and probability at
        `temperature`; illegal ones have probability 0 and say why in `note`."""
        moves = self._moves_of(state)
        weights = [alt.score * (T0 / temperature if alt.action.kind in ANNEALED else 1.0) if ok else 0.0 for alt, ok in moves]
        total = sum(weights)
        return tuple(
            replace(alt, probability=(w / total if total > 0 else 0.0)) for (alt, _), w in zip(moves, weights)
        )

    def probability(self, state: State, action: Action, temperature: float = T0) -> float:
        """P(action | state); 0 for anything not offered (misaligned sizes, other layers)."""
        return sum(a.probability for a in self.transitions(state, temperature) if a.action == action)

    def stationary(self) -> dict[str, float]:
        """Empirical stationary distribution: node key -> share of the walk's visits so far."""
        total = sum(self._visits.values())
        return {k: v / total for k, v in self._visits.items()} if total else {}

    def predicted_seconds(self, state: State) -> float:
        """Predicted time of the program the state would emit: its tiles, then at every layer
        below it the smallest aligned tile (where `descend` would start)."""
        key = (state.layer, state.tile, state.recorded, state.eps)
        if key not in self._times:
            tiles = self._completion(state)
            program = self._scaled_out(tiles, state.eps, self._cached(tiles, state.eps))[0] if tiles else None
            self._times[key] = estimate(self.space.calc, self.space.device, program).predicted_seconds if program else inf
        return self._times[key]

    # -- driver --------------------------------------------------------------------------------
    def steps(self) -> Iterator[Step]:
        schedule = [self.options.eps] + [e for e in EPS_STEPS if e > self.options.eps]
        for i, eps in enumerate(schedule):
            if i:
                note = f"too few programs ({len(self.candidates)} < {self.options.topk}): raise eps to {eps}"
                yield self._marker(None, Action("widen_eps", amount=round(eps * 1000)), note)
            start = self.space.initial_state(eps)
            if start is None:
                continue
            for _ in range(WALKS_PER_TOPK * self.options.topk):
                if self._count >= self.options.max_steps:
                    return
                emitted = yield from self._walk(start)
                if not emitted and not self._moves_of_legal(start):
                    break  # a dead start: no walk can leave it at this eps
            if len(self.candidates) >= self.options.topk:
                return

    def _walk(self, state: State) -> Iterator[Step]:
        """One annealed walk from `state` down to the bottom layer; True when it emitted."""
        note = f"walk from the smallest aligned tile {dict(zip(self.space.axes, state.tile))}, eps {state.eps}"
        yield self._record(Step(state.actions[-1], state, self._node(state, "start"), None, note=note, temperature=T0))
        temperature, spent, budget = T0, 0, -(-ITERATIONS_PER_WALK // self.n)
        while state.layer < self.n:
            if self._count >= self.options.max_steps:
                return False
            alts = self.transitions(state, temperature)
            if spent >= budget:
                alts = tuple(replace(a, probability=1.0 if a.action.kind == "descend" and a.probability else 0.0) for a in alts)
            chosen = self._roulette(alts)
            if chosen is None:
                yield self._marker(state, Action("prune_visited", state.layer), "no legal action: walk abandoned", temperature)
                return False
            step, accepted = self._move(state, chosen, alts, temperature)
            yield self._record(step)
            if accepted and chosen.action.kind == "descend":
                temperature, spent = T0, 0
            else:
                temperature, spent = temperature / 2, spent + 1
            state = step.state
        yield from self._emit(state)
        return True

    def _move(self, state: State, chosen: Alternative, alts, temperature: float) -> tuple[Step, bool]:
        nxt = apply(self.space, state, chosen.action)
        alts = tuple(replace(a, note="chosen") if a is chosen else a for a in alts)
        what = chosen.action.describe(self.space.axes, self.space.layer_names)
        before, after = self.predicted_seconds(state), self.predicted_seconds(nxt)
        delta = (after - before) / before if before not in (0, inf) else 0.0
        accept = chosen.action.kind == "descend" or delta <= 0 or self.rng.random() < exp(-delta / temperature)
        change = f"predicted {delta * 100:+.1f}%"
        if not accept:
            note = f"{what}: rejected, {change} (accepted with probability {exp(-delta / temperature):.3g} at T={temperature:.3g})"
            return Step(chosen.action, state, self._node(state, "explored"), None, alts, note, temperature=temperature), False
        node = self._node(nxt, "explored", chosen.score)
        edge = Edge(self._key(state), node.key, what, chosen.score, chosen.probability)
        note = f"{what}: benefit {chosen.score:.4g}, probability {chosen.probability:.3g}, {change}"
        return Step(chosen.action, nxt, node, edge, alts, note, temperature=temperature), True

    def _roulette(self, alts) -> Alternative | None:
        legal = [a for a in alts if a.probability]
        if not legal:
            return None
        r = self.rng.random() * sum(a.probability for a in legal)
        for alt in legal:
            r -= alt.probability
            if r < 0:
                return alt
        return legal[-1]

    # -- benefits ------------------------------------------------------------------------------
    def _moves_of(self, state: State) -> tuple[tuple[Alternative, bool], ...]:
        key = (state.layer, state.tile, state.recorded, state.vthreads, state.eps)
        if key not in self._moves:
            if state.layer >= self.n:
                self._moves[key] = ()
            else:
                self._moves[key] = (*self._tile_moves(state), self._descend_move(state), *self._vthread_moves(state))
        return self._moves[key]

    def _moves_of_legal(self, state: State) -> bool:
        return any(ok for _, ok in self._moves_of(state))

    def _tile_moves(self, state: State):
        space, layer, upper = self.space, state.layer, self.space.upper_of(state)
        ctx = space.context(layer, upper, state.eps)
        scale = space.calc.traffic_bytes(state.tile) / max(1, space.footprint(layer, state.tile, upper))
        for kind, sizes in (("grow", next_aligned_sizes(ctx, state.tile)), ("inv_tile", prev_aligned_sizes(ctx, state.tile))):
            for axis, size in enumerate(sizes):
                if size is None:
                    continue
                tile = with_axis(state.tile, axis, size)
                if kind == "grow":
                    ratio = space.reuse(layer, state.tile, tile, upper)
                    benefit = FREE_WEIGHT * scale if ratio == inf else max(ratio, FLOOR_WEIGHT * scale)
                else:
                    # a shrink that moves less (less padding past the axis' end) gives up no reuse
                    ratio = max(0.0, space.reuse(layer, tile, state.tile, upper))
                    benefit = max(INV_WEIGHT * scale / (1 + ratio / scale), FLOOR_WEIGHT * scale)
                why = self._illegal(state, tile, axis)
                yield Alternative(Action(kind, layer, axis, size), tile, benefit, note=why), not why

    def _illegal(self, state: State, tile, axis: int) -> str:
        space, layer = self.space, state.layer
        if space.over_capacity(layer, tile, space.upper_of(state)):
            return f"over capacity: does not fit {space.layer_names[layer]} (or the block's thread limits)"
        if not space.fits_below(layer, tile, state.eps, self.stages_below(state.eps)):
            return f"over capacity: leaves no aligned tile that fits {space.layer_names[layer + 1]}"
        if layer == 0 and state.vthreads and tile[axis] % state.vthreads[axis]:
            return f"misaligned: {state.vthreads[axis]} virtual threads do not divide {tile[axis]}"
        return ""

    def _descend_move(self, state: State) -> tuple[Alternative, bool]:
        action = Action("descend", state.layer)
        try:
            nxt = apply(self.space, state, action)
        except IllegalAction as err:
            return Alternative(action, state.tile, 0.0, note=str(err)), False
        if nxt.layer < self.n and self.space.over_capacity(nxt.layer, nxt.tile, state.tile, self.stages_below(state.eps)):
            return Alternative(action, nxt.tile, 0.0, note=f"over capacity: the smallest tile at {self.space.layer_names[nxt.layer]} does not fit"), False
        here, below = self.space.device.layers[state.layer], self.space.device.layers[state.layer + 1]
        data = self.space.footprint(state.layer, state.tile, self.space.upper_of(state))
        benefit = (below.latency_ns + data / below.bandwidth_gbps) / (here.latency_ns + data / here.bandwidth_gbps)
        return Alternative(action, nxt.tile if nxt.layer < self.n else state.tile, benefit), True

    def _vthread_moves(self, state: State):
        """Virtual threads of a GPU thread's tile, where its inputs are staged in banked shared
        memory: the CUDA template stages them only for operators with reduce axes and reuse, and
        tensor-core fragments are laid out by the MMA unit, not by threads."""
        space, reg = self.space, state.tile
        dev = space.device
        if dev.kind != "gpu" or state.layer != 0 or mma_axes(space.expr, dev) or not space.expr.reduce or dev.layers[1].banks <= 0:
            return
        block = initial_tile(space.context(1, reg, state.eps)) if self.n > 1 else None
        current = state.vthreads or tuple(1 for _ in reg)
        if block is None or not self._cached((reg, block), state.eps)[1]:
            return
        base = self._wavefronts(reg, block, current)
        for axis in space.expr.spatial:
            if block[axis] == reg[axis]:
                continue  # one thread along the axis: striding it moves no lane
            for v in VTHREAD_COUNTS:
                if v == current[axis] or reg[axis] % v:
                    continue
                new = with_axis(current, axis, v)
                waves = self._wavefronts(reg, block, new)
                yield Alternative(Action("set_vthread", 0, axis, v), reg, base / waves, note=f"{base} -> {waves} shared-memory wavefronts per warp"), True

    def _wavefronts(self, reg, block, vthreads) -> int:
        """Wavefronts the first warp of `block` needs to read its inputs' register tiles from
        shared memory (bank padding included) with `vthreads`."""
        key = (reg, block, vthreads)
        if key not in self._waves:
            space, dev = self.space, self.space.device
            threads = tuple(b // r if a in space.expr.spatial else 1 for a, (b, r) in enumerate(zip(block, reg)))
            binding = ThreadBinding(threads, reg, vthreads)
            shapes, pads = space.calc.data_tiles(block), storage_padding(space.calc, dev, 1, block, reg)
            total = 0
            for t, tensor in enumerate(space.expr.tensors):
                if tensor.role != "input":
                    continue
                tile = stored_tile([c for c, _ in tensor.index], shapes[t], pads[t], tensor.itemsize)
                total += wavefronts(tile, binding, dev.layers[1].banks, dev.layers[1].bank_width_bytes, dev.warp_size)
            self._waves[key] = total
        return self._waves[key]

    # -- programs ------------------------------------------------------------------------------
    def _completion(self, state: State) -> tuple:
        tiles = list(state.recorded) + ([state.tile] if state.layer < self.n else [])
        while len(tiles) < self.n:
            nxt = initial_tile(self.space.context(len(tiles), tiles[-1], state.eps))
            if nxt is None:
                return ()
            tiles.append(nxt)
        return tuple(tiles)

    def stages_below(self, eps: float) -> bool:
        """Whether programs at `eps` stage data below the top layer: not for an operator without
        reuse, which loads straight from the bottom (Roller §3.2, decided as Roller does at the
        initial tile); then a lower layer's capacity does not bound what the top layer holds."""
        if eps not in self._no_reuse:
            start = self.space.initial_state(eps)
            self._no_reuse[eps] = start is not None and self.space.no_reuse(start)
        return not self._no_reuse[eps]

    def _cached(self, tiles, eps: float) -> tuple[bool, ...]:
        """Layers that stage data: all, or only the top one (`stages_below`)."""
        below = self.stages_below(eps)
        return tuple(l == 0 or below for l in range(len(tiles)))

    def _scaled_out(self, tiles, eps: float, cached) -> tuple:
        """(program, shrinks): Roller-S, the unit tile shrunk while the grid has fewer tiles than
        the device has units; `shrinks` lists (axis, tiles) after each shrink."""
        program, shrinks = self.space.program(tiles, eps, cached), []
        while program.grid < self.space.device.compute_units:
            shrunk = self.space.shrink_unit(program.tiles, eps, cached)
            if shrunk is None:
                break
            shrinks.append(shrunk)
            program = self.space.program(shrunk[1], eps, cached)
        return program, shrinks

    def _emit(self, state: State) -> Iterator[Step]:
        eps = state.eps
        program, shrinks = self._scaled_out(state.recorded, eps, self._cached(state.recorded, eps))
        for axis, tiles in shrinks:
            vthreads = tuple(v if t % v == 0 else 1 for v, t in zip(state.vthreads, tiles[0]))
            shrink = Action("shrink", len(tiles) - 1, axis, tiles[-1][axis])
            state = State(state.layer, (), tiles, eps, vthreads, state.actions + (shrink,))
            grid, units = self.space.calc.spatial_tiles(tiles[-1]), self.space.device.compute_units
            yield self._marker(state, shrink, f"grid {grid}: too few tiles for {units} units, shrink {self.space.axes[axis]} (smallest reuse)")
        tiles = program.tiles
        if program.tiles in self._emitted:
            yield self._marker(state, Action("prune_visited", self.n), "this rProgram was emitted before: restart")
            return
        self._emitted.add(program.tiles)
        est = estimate(self.space.calc, self.space.device, program)
        pairs = tuple((self.space.axes[a], v) for a, v in enumerate(state.vthreads) if v > 1)
        cand = Candidate(program, est, vthreads=pairs)
        self.candidates.append(cand)
        action = Action("emit", self.n)
        done = State(state.layer, (), tiles, eps, state.vthreads, state.actions + (action,))
        node = self._node(done, "emitted", predicted=est.predicted_seconds)
        edge = Edge(self._key(state), node.key, "emit") if node.key != self._key(state) else None
        note = f"emit rProgram #{len(self.candidates)}: grid {program.grid}, {est.predicted_seconds * 1e6:.1f} us predicted, bound by {est.bottleneck}; restart"
        yield self._record(Step(action, done, node, edge, note=note, candidate=cand, temperature=T0))

    # -- step records --------------------------------------------------------------------------
    def _key(self, state: State) -> str:
        """The graph key: the Roller key of the tiles, plus the virtual threads where set."""
        key = state_key(self.space, state)
        return key + "+v" + "x".join(map(str, state.vthreads)) if any(v > 1 for v in state.vthreads) else key

    def _node(self, state: State, status: str, score=None, predicted=None) -> Node:
        node = make_node(self.space, state, status, score=score, predicted=predicted)
        return replace(node, key=self._key(state))

    def _marker(self, state, action, note, temperature=T0) -> Step:
        return self._record(Step(action, state, None, None, (), note, temperature=temperature))

    def _record(self, step: Step) -> Step:
        self._count += 1
        if step.node is not None:
            self._visits[step.node.key] += 1
        return step
