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

The paper's formulas were lost in extraction. Reconstruction (ours, ALGORITHMS.md §2). The paper
calls every benefit an "acceleration ratio" and normalises them into one roulette wheel, so each
is made dimensionless here: a benefit that grew with the operator's size (Roller's S is bytes of
traffic saved per byte of footprint, ~2e10 for a 4096^3 matmul's first register tile against a
cache ratio of ~5) left the cache action to win only once T0 / T had grown as large, at
T ~ 2^-16 .. 2^-30 (notes: issue 16).
- grow: Roller's reuse ratio S = (Q(T) - Q(T')) / (F(T') - F(T)) over s0 = Q(T) / F(T), the
  state's own traffic per byte of footprint: S / s0 = (dQ / Q) / (dF / F), the share of the
  traffic saved per share of footprint spent, the same for 512^3 and 4096^3 (matmul at 1x1x1:
  3K / (8K + 4)). A legal move that buys no reuse keeps FLOOR_WEIGHT, so every legal move stays
  possible (irreducibility); a move that costs no footprint (S infinite) counts FREE_WEIGHT.
- inv_tile: INV_WEIGHT / (1 + S_rev / s0), S_rev the ratio of the grow it undoes: positive, at
  most INV_WEIGHT (so less likely than a typical grow), and largest where the shrink gives up the
  least reuse, the axis Roller-S would shrink (S_rev < 0, a shrink that saves padded traffic,
  counts as 0).
- descend: CACHE_WEIGHT x (t_below / t_here) x fill^2, t = latency + bytes / bandwidth of the
  layer for the F(T) bytes the tile occupies (how much faster the staged copy feeds it than the
  layer below: ALGORITHMS.md's t_l / t_{l+1} in Gensor's outermost-first numbering; our layers
  are numbered top first), fill = F(T) / the layer's capacity: the speed-up is worth taking once
  the tile has used the layer, and a tile a tenth full is worth a hundredth. CACHE_WEIGHT =
  2^-10 sets when the annealing hands over: a full layer's cache action (speed-up ~5) weighs
  like a grow (~0.1 .. 0.3) after ~6 halvings. Measured (roller-table1 M0-M2, C0 and 4096^3 on
  the V100 and A100): descends drawn at T = 2^-1 .. 2^-18, none forced by the cap (before: to
  shared memory at 2^-9 .. 2^-30); 2^-8 descended sooner and found only 7 distinct programs of
  gemv 16384^2 on the V100 for 10 asked.
- set_vthread (GPU, register layer): the share of shared-memory wavefronts saved, 1 - w' / w,
  w and w' the first warp's wavefronts without / with the new virtual threads, counted exactly
  from its 32 lane addresses (banks.py, `model.shared_wavefronts`) under the thread binding of
  the block the state would emit (the next layer's smallest aligned tile); FLOOR_WEIGHT where it
  saves none. Like a grow's, a share: not annealed.
- P(a) = B_a / sum of positive B, with the cache action's weight multiplied by T0 / T (the
  paper's annealing of the cache action); 0 for a move over a capacity or a thread limit or one
  leaving no aligned tile that fits the next layer. Only legal actions are offered
  (`space.legal_actions`): never a misaligned size, nor one the virtual threads do not divide.
- Annealing: T starts at T0 and halves every iteration; a move to a state whose program is
  predicted slower by the fraction delta is accepted with probability exp(-delta / T). Ours: T
  restarts at T0 after each descend, else every layer below the first would be entered cold and
  left at its smallest tile; a layer's iterations are capped at ITERATIONS_PER_WALK / layers, after
  which the walk descends (the paper's threshold on T): a backstop the normalised benefits leave
  unused on those suites.
"""

from __future__ import annotations

import random
from collections import Counter
from math import exp, inf
from typing import Iterator

from workbench.construct.graph import Edge
from workbench.construct.policy import Policy
from workbench.construct.space import (
    Action, IllegalAction, Kind, OverCapacity, State, apply, descend_within_limits, legal_actions, with_axis,
)
from workbench.construct.step import Alternative, Step
from workbench.rtile.alignment import initial_tile
from workbench.rtile.axes import mma_axes
from workbench.rtile.model import estimate
from workbench.rtile.model.gpu import shared_wavefronts

T0 = 1.0
ITERATIONS_PER_WALK = 100  # Gensor §IV-D: "convergence can generally be achieved after about 100 iterations"
WALKS_PER_TOPK = 3  # walks per eps round, per program asked for: walks repeat programs
INV_WEIGHT = 1 / 16
FLOOR_WEIGHT = 1 / 256
FREE_WEIGHT = 16.0
CACHE_WEIGHT = 2.0**-10  # when the annealing hands over to the cache action (module docstring)
ANNEALED = (Kind.DESCEND,)  # weights multiplied by T0 / T


class MarkovPolicy(Policy):
    name = "markov"
    NOTES = {
        **Policy.NOTES,
        "emit": Policy.NOTES["emit"] + "; restart",
        "repeated": "the loop nest of this rProgram was emitted before: restart",
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
        self._moves: dict = {}  # by `_key`, as `_transitions` (with the temperature) and `_times`
        self._transitions: dict = {}
        self._times: dict = {}
        self._program_times: dict = {}
        self._visits: Counter = Counter()  # node key -> the walk's visits (`stationary`)
        self.n = space.n_tile_layers

    # -- public questions ----------------------------------------------------------------------
    def transitions(self, state: State, temperature: float = T0) -> tuple[Alternative, ...]:
        """Every action offered at `state` with its benefit (`score`) and probability at
        `temperature`; illegal ones have probability 0 and say why in `note`."""
        key = (*self._key(state), temperature)
        found = self._transitions.get(key)  # every walk starts from the same state at T0
        if found is None:
            moves = self._moves_of(state)
            weights = [alt.score * (T0 / temperature if alt.action.kind in ANNEALED else 1.0) if ok else 0.0 for alt, ok in moves]
            total = sum(weights)
            found = self._transitions[key] = tuple(
                Alternative(alt.action, alt.tile, alt.score, w / total if total > 0 else 0.0, alt.note)
                for (alt, _), w in zip(moves, weights)
            )
        return found

    def probability(self, state: State, action: Action, temperature: float = T0) -> float:
        """P(action | state); 0 for anything not offered (misaligned sizes, other layers)."""
        return sum(a.probability for a in self.transitions(state, temperature) if a.action == action)

    def record(self, step: Step) -> Step:
        """Count a step (`Policy.record`) and the visit of its node."""
        if step.node is not None:
            self._visits[step.node.key] += 1
        return super().record(step)

    def stationary(self) -> dict[str, float]:
        """Empirical stationary distribution: node key -> share of the walk's visits so far."""
        total = sum(self._visits.values())
        return {k: v / total for k, v in self._visits.items()} if total else {}

    def predicted_seconds(self, state: State) -> float:
        """Predicted time of the program the state would emit: its tiles, then at every layer
        below it the smallest aligned tile (where `descend` would start)."""
        key = self._key(state)
        if key not in self._times:
            tiles = self._completion(state)
            program = self.space.scaled_out(tiles, state.eps) if tiles else None
            self._times[key] = self._program_seconds(program) if program else inf
        return self._times[key]

    def _program_seconds(self, program) -> float:
        """The predicted time of `program`, estimated once: states that differ in the tiles the
        walk has fixed so far complete to the same programs (`_completion`)."""
        if program not in self._program_times:
            self._program_times[program] = estimate(program, self.space.device).predicted_seconds
        return self._program_times[program]

    def _key(self, state: State) -> tuple:
        """What the walk's memos key a state by: its tiles, virtual threads and eps, and the
        space's mode, since a second round aligns the same state otherwise (`Space.round_of`)."""
        return state.layer, state.tile, state.recorded, state.vthreads, state.eps, self.space.mode

    # -- driver --------------------------------------------------------------------------------
    def round(self, eps: float) -> Iterator[Step]:
        """Annealed walks from the initial state at `eps` (WALKS_PER_TOPK per program wanted, `wanted`)."""
        start = self.start_state(eps)
        if start is None:
            return False
        for _ in range(WALKS_PER_TOPK * self.wanted):
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
                alts = tuple(Alternative(a.action, a.tile, a.score, 1.0 if a.action.kind == Kind.DESCEND and a.probability else 0.0, a.note)
                         for a in alts)
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
        alts = tuple(Alternative(a.action, a.tile, a.score, a.probability, "chosen") if a is chosen else a for a in alts)
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
        key = self._key(state)
        if key not in self._moves:
            legal = legal_actions(self.space, state)
            if state.layer >= self.n:
                self._moves[key] = ()
            else:
                self._moves[key] = (*self._tile_moves(state, legal), self._descend_move(state), *self._vthread_moves(state, legal))
        return self._moves[key]

    def _tile_moves(self, state: State, legal):
        space, layer, upper = self.space, state.layer, self.space.upper_of(state)
        # s0: the state's traffic per byte of footprint; S / s0 is dimensionless (see the docstring)
        s0 = space.calc.traffic_bytes(state.tile) / max(1, space.footprint(layer, state.tile, upper))
        for action in legal:
            if action.kind not in (Kind.GROW, Kind.INV_TILE):
                continue
            tile = with_axis(state.tile, action.axis, action.size)
            if action.kind == Kind.GROW:
                ratio = space.reuse(layer, state.tile, tile, upper)
                benefit = FREE_WEIGHT if ratio == inf else max(ratio / s0, FLOOR_WEIGHT)
            else:
                # a shrink that moves less (less padding past the axis' end) gives up no reuse
                ratio = max(0.0, space.reuse(layer, tile, state.tile, upper))
                benefit = max(INV_WEIGHT / (1 + ratio / s0), FLOOR_WEIGHT)
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
        speedup = (below.latency_ns + data / below.bandwidth_gbps) / (here.latency_ns + data / here.bandwidth_gbps)
        benefit = CACHE_WEIGHT * speedup * min(1.0, data / self.space.capacity(state.layer)) ** 2
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
            yield Alternative(action, reg, max(1 - waves / base, FLOOR_WEIGHT), note=self.describe("waves", base=base, waves=waves)), True

    def _wavefronts(self, reg, block, vthreads) -> int:
        """Wavefronts the first warp of `block` needs to read its inputs' register tiles from
        shared memory (bank padding included) with `vthreads` (`model.shared_wavefronts`)."""
        return shared_wavefronts(self.space.expr, self.space.device, block, reg, vthreads)[0]

    # -- programs ------------------------------------------------------------------------------
    def _completion(self, state: State) -> tuple:
        tiles = list(state.recorded) + ([state.tile] if state.layer < self.n else [])
        while len(tiles) < self.n:
            nxt = initial_tile(self.space.context(len(tiles), tiles[-1], state.eps))
            if nxt is None:
                return ()
            tiles.append(nxt)
        return tuple(tiles)
