"""Gensor's construction (gensor-markov-construction.txt §IV) as a generator of steps.

A state is an ETIR program: per axis the tile of every memory layer fixed so far plus the one
being built (`State.recorded`, `State.tile`), the virtual threads of a GPU thread's tile
(`State.vthreads`, Gensor's per-thread stride S) and the current layer. The actions are the
stepper's vocabulary: `grow` (Gensor's tile: next aligned size of one axis), `inv_tile` (previous
aligned size), `descend` (Gensor's cache: record the tile, go to the next layer) and
`set_vthread`. Every legal action gets a benefit, benefits become probabilities, and a walk
picks actions by roulette wheel under simulated annealing. A walk that reaches the bottom layer
emits an rProgram (`Policy.emit`: scaled out over the units, shrunk like Roller-S while the grid
is smaller than the units) and the next walk starts again from the initial state.

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
  capacity or a thread limit or one leaving no aligned tile that fits the next layer. Only legal
  actions are offered (`space.legal_actions`): never a misaligned size, nor one the virtual
  threads do not divide.
- Annealing: T starts at T0 and halves every iteration; a move to a state whose program is
  predicted slower by the fraction delta is accepted with probability exp(-delta / T). Ours: T
  restarts at T0 after each descend, else every layer below the first would be entered cold and
  left at its smallest tile; a layer's iterations are capped at ITERATIONS_PER_WALK / layers, after
  which the walk descends (the paper's threshold on T).
"""

from __future__ import annotations

import random
from dataclasses import replace
from math import exp, inf
from typing import Iterator

from workbench.construct.banks import ThreadBinding, stored_tile, wavefronts
from workbench.construct.graph import Edge
from workbench.construct.policy import Policy
from workbench.construct.space import (
    Action, IllegalAction, Kind, OverCapacity, State, apply, descend_within_limits, legal_actions, with_axis,
)
from workbench.construct.step import Alternative, Step
from workbench.rtile.alignment import initial_tile, mma_axes
from workbench.rtile.model import estimate
from workbench.rtile.rprogram import storage_padding

T0 = 1.0
ITERATIONS_PER_WALK = 100  # Gensor §IV-D: "convergence can generally be achieved after about 100 iterations"
WALKS_PER_TOPK = 2  # walks per eps round, per program asked for: walks repeat programs
INV_WEIGHT = 1 / 16
FLOOR_WEIGHT = 1 / 256
FREE_WEIGHT = 16.0
ANNEALED = (Kind.DESCEND, Kind.SET_VTHREAD)  # weights multiplied by T0 / T


class MarkovPolicy(Policy):
    name = "markov"
    NOTES = {
        **Policy.NOTES,
        "emit": Policy.NOTES["emit"] + "; restart",
        "repeated": "this rProgram was emitted before: restart",
        "walk": "walk from the smallest aligned tile {tile} ({axes}), eps {eps}",
        "stuck": "no legal action: walk abandoned",
        "rejected": "{what}: rejected, predicted {delta:+.1f}% (accepted with probability {p:.3g} at T={t:.3g})",
        "accepted": "{what}: benefit {score:.4g}, probability {p:.3g}, predicted {delta:+.1f}%",
        "over": "over capacity: does not fit {layer} or exceeds the thread limits of a block",
        "over_below": "over capacity: leaves no aligned tile that fits {layer}",
        "no_fit_below": "over capacity: the smallest tile at {layer} does not fit",
        "waves": "{base} -> {waves} shared-memory wavefronts per warp",
    }
    marker_temperature = T0

    def __init__(self, space, options):
        super().__init__(space, options)
        self.rng = random.Random(options.seed)
        self._moves: dict = {}
        self._times: dict = {}
        self._waves: dict = {}
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
            program = self.space.scaled_out(tiles, state.eps) if tiles else None
            self._times[key] = estimate(program, self.space.device).predicted_seconds if program else inf
        return self._times[key]

    # -- driver --------------------------------------------------------------------------------
    def round(self, eps: float) -> Iterator[Step]:
        """Annealed walks from the initial state at `eps` (WALKS_PER_TOPK per program asked for)."""
        start = self.space.initial_state(eps)
        if start is None:
            return False
        for _ in range(WALKS_PER_TOPK * self.options.topk):
            if self.out_of_steps:
                return True
            emitted = yield from self._walk(start)
            if not emitted and not any(ok for _, ok in self._moves_of(start)):
                break  # a dead start: no walk can leave it at this eps
        return self.enough

    def _walk(self, state: State) -> Iterator[Step]:
        """One annealed walk from `state` down to the bottom layer; True when it emitted."""
        note = self.describe("walk", tile="x".join(map(str, state.tile)), axes=" x ".join(self.space.axes), eps=state.eps)
        yield self.record(Step(state.actions[-1], state, self.node(state, "start"), None, note=note, temperature=T0))
        temperature, spent, budget = T0, 0, -(-ITERATIONS_PER_WALK // self.n)
        while state.layer < self.n:
            if self.out_of_steps:
                return False
            alts = self.transitions(state, temperature)
            if spent >= budget:
                alts = tuple(replace(a, probability=1.0 if a.action.kind == Kind.DESCEND and a.probability else 0.0) for a in alts)
            chosen = self._roulette(alts)
            if chosen is None:
                yield self.marker(state, Action(Kind.PRUNE_VISITED, state.layer), self.describe("stuck"), temperature)
                return False
            step, accepted = self._move(state, chosen, alts, temperature)
            yield self.record(step)
            if accepted and chosen.action.kind == Kind.DESCEND:
                temperature, spent = T0, 0
            else:
                temperature, spent = temperature / 2, spent + 1
            state = step.state
        yield from self.emit(state)
        return True

    def repeated(self, state: State) -> Iterator[Step]:
        yield self.marker(state, Action(Kind.PRUNE_VISITED, self.n), self.describe("repeated"))

    def _move(self, state: State, chosen: Alternative, alts, temperature: float) -> tuple[Step, bool]:
        nxt = apply(self.space, state, chosen.action)
        alts = tuple(replace(a, note="chosen") if a is chosen else a for a in alts)
        what = chosen.action.describe(self.space.axes, self.space.layer_names)
        before, after = self.predicted_seconds(state), self.predicted_seconds(nxt)
        delta = (after - before) / before if before not in (0, inf) else 0.0
        accept = chosen.action.kind == Kind.DESCEND or delta <= 0 or self.rng.random() < exp(-delta / temperature)
        if not accept:
            note = self.describe("rejected", what=what, delta=delta * 100, p=exp(-delta / temperature), t=temperature)
            return Step(chosen.action, state, self.node(state, "explored"), None, alts, note, temperature=temperature), False
        node = self.node(nxt, "explored", score=chosen.score)
        edge = Edge(self.key(state), node.key, what, chosen.score, chosen.probability)
        note = self.describe("accepted", what=what, score=chosen.score, p=chosen.probability, delta=delta * 100)
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
        """(alternative, within the limits) for every legal action at `state` (`legal_actions`)."""
        key = (state.layer, state.tile, state.recorded, state.vthreads, state.eps)
        if key not in self._moves:
            legal = legal_actions(self.space, state)
            if state.layer >= self.n:
                self._moves[key] = ()
            else:
                self._moves[key] = (*self._tile_moves(state, legal), self._descend_move(state), *self._vthread_moves(state, legal))
        return self._moves[key]

    def _tile_moves(self, state: State, legal):
        space, layer, upper = self.space, state.layer, self.space.upper_of(state)
        scale = space.calc.traffic_bytes(state.tile) / max(1, space.footprint(layer, state.tile, upper))
        for action in legal:
            if action.kind not in (Kind.GROW, Kind.INV_TILE):
                continue
            tile = with_axis(state.tile, action.axis, action.size)
            if action.kind == Kind.GROW:
                ratio = space.reuse(layer, state.tile, tile, upper)
                benefit = FREE_WEIGHT * scale if ratio == inf else max(ratio, FLOOR_WEIGHT * scale)
            else:
                # a shrink that moves less (less padding past the axis' end) gives up no reuse
                ratio = max(0.0, space.reuse(layer, tile, state.tile, upper))
                benefit = max(INV_WEIGHT * scale / (1 + ratio / scale), FLOOR_WEIGHT * scale)
            why = self._over(state, tile)
            yield Alternative(action, tile, benefit, note=why), not why

    def _over(self, state: State, tile) -> str:
        """Why `tile` is over a limit at the state's layer ('' when within every limit)."""
        space, layer = self.space, state.layer
        if space.over_capacity(layer, tile, space.upper_of(state)):
            return self.describe("over", layer=space.layer_names[layer])
        if not space.fits_below(layer, tile, state.eps, space.stages_below(state.eps)):
            return self.describe("over_below", layer=space.layer_names[layer + 1])
        return ""

    def _descend_move(self, state: State) -> tuple[Alternative, bool]:
        action = Action(Kind.DESCEND, state.layer)
        try:
            nxt = descend_within_limits(self.space, state)
        except OverCapacity as over:
            below = over.state
            return Alternative(action, below.tile, 0.0, note=self.describe("no_fit_below", layer=self.space.layer_names[below.layer])), False
        except IllegalAction as err:
            return Alternative(action, state.tile, 0.0, note=str(err)), False
        here, below = self.space.device.layers[state.layer], self.space.device.layers[state.layer + 1]
        data = self.space.footprint(state.layer, state.tile, self.space.upper_of(state))
        benefit = (below.latency_ns + data / below.bandwidth_gbps) / (here.latency_ns + data / here.bandwidth_gbps)
        return Alternative(action, nxt.tile if nxt.layer < self.n else state.tile, benefit), True

    def _vthread_moves(self, state: State, legal):
        """Virtual threads of a GPU thread's tile, where its inputs are staged in banked shared
        memory: the CUDA template stages them only for operators with reduce axes and reuse, and
        tensor-core fragments are laid out by the MMA unit, not by threads."""
        space, reg = self.space, state.tile
        dev = space.device
        if not dev.has_virtual_threads or state.layer != 0 or mma_axes(space.expr, dev) or not space.expr.reduce or dev.layers[1].banks <= 0:
            return
        block = initial_tile(space.context(1, reg, state.eps)) if self.n > 1 else None
        current = state.vthreads or tuple(1 for _ in reg)
        if block is None or not space.stages_below(state.eps):
            return
        base = self._wavefronts(reg, block, current)
        for action in legal:
            if action.kind != Kind.SET_VTHREAD or block[action.axis] == reg[action.axis]:
                continue  # one thread along the axis: striding it moves no lane
            waves = self._wavefronts(reg, block, with_axis(current, action.axis, action.count))
            yield Alternative(action, reg, base / waves, note=self.describe("waves", base=base, waves=waves)), True

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
