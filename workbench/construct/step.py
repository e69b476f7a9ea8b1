"""Steps and candidates: what a policy produces, one frozen value at a time."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.construct.graph import Edge, Node
from workbench.construct.space import Action, Space, State
from workbench.frozen import direct_init
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.model import Estimate
from workbench.rtile.plan import Plan, describe, plan_for
from workbench.rtile.rprogram import RProgram

Tile = tuple[int, ...]


@direct_init
@dataclass(frozen=True)
class Alternative:
    """One option a step chose among: its action, resulting tile and score or probability."""

    action: Action
    tile: Tile
    score: float | None
    probability: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Candidate:
    """An emitted program, complete: its expression (`program.expr`), the device it was built
    for, its estimate there, and the actions that built it (`replay(space, actions)` gives the
    same program)."""

    program: RProgram
    estimate: Estimate
    device: DeviceSpec
    actions: tuple[Action, ...]
    rank: int = 0

    @property
    def expr(self) -> TensorExpr:
        return self.program.expr

    @property
    def predicted_seconds(self) -> float:
        return self.estimate.predicted_seconds

    @property
    def plan(self) -> Plan:
        """The template's decisions for this program (`rtile.plan`): what codegen carries out
        and the estimate priced."""
        return plan_for(self.program, self.device)

    @property
    def plan_text(self) -> str:
        """`plan` in words ("A, B packed in 6x16 panels, lanes along j, tails padded, ...")."""
        return describe(self.plan, self.program)

    def to_dict(self, measurement=None) -> dict:
        """The one JSON form of a candidate (shared/design/CLI.md: `workbench construct`, and with
        its `measurement`, a `profile.runner.Measurement`, `workbench profile`): rank, prediction,
        grid, each layer's tile against its capacity, the whole rProgram and its estimate."""
        program, device = self.program, self.device
        data = {
            "rank": self.rank,
            "predicted_seconds": self.predicted_seconds,
            "bottleneck": self.estimate.bottleneck,
            "grid": program.grid,
            "waves": self.estimate.waves,
            "layers": [
                {
                    "name": name,
                    "tile": program.tile_dict(l),
                    "footprint_bytes": self.estimate.footprints[l],
                    "capacity_bytes": device.layers[l].capacity_bytes,
                }
                for l, name in enumerate(program.layers)
            ],
            "rprogram": program.to_dict(),
            "vthreads": dict(program.vthreads),
            "estimate": self.estimate.to_dict(),
            "plan": {**self.plan.to_dict(program.expr), "text": self.plan_text},
        }
        if measurement is not None:
            m = measurement
            interval = m.interval
            data |= {"measured_seconds": m.best_seconds, "median_seconds": m.median_seconds, "seconds": list(m.seconds),
                     "median_interval": None if interval is None else
                     {"low": interval.low, "high": interval.high, "level": interval.level},
                     "correct": m.correct, "error": m.error, "build_seconds": m.build_seconds}
        return data


@direct_init
@dataclass(frozen=True)
class Step:
    action: Action
    state: State
    node: Node | None
    edge: Edge | None
    alternatives: tuple[Alternative, ...] = ()
    note: str = ""
    candidate: Candidate | None = None
    temperature: float | None = None  # Markov walks only


def node_facts(space: Space, state: State, tile: Tile | None = None, suffix: str = "") -> tuple:
    """What the graph node of `tile` (default: the state's tile) at the state's layer says
    whatever its status and score: key (with `suffix`), layer and its name, tile, footprint,
    capacity and traffic, in `Node`'s field order."""
    tile = tuple(state.tile if tile is None else tile)
    layer = state.layer
    if layer >= space.n_tile_layers:  # the bottom layer: the node is the whole program
        layer, tile, recorded = space.n_tile_layers, tuple(state.recorded[-1]), state.recorded[:-1]
        footprint = 0
    else:
        recorded = state.recorded
        footprint = space.footprint(layer, tile, space.upper_of(state))
    return (space.node_key(layer, tile, recorded) + suffix, layer, space.layer_names[layer], tile, footprint,
            space.capacity(layer), space.calc.traffic_bytes(tile))


def state_key(space: Space, state: State) -> str:
    if state.layer >= space.n_tile_layers:
        return space.node_key(space.n_tile_layers, state.recorded[-1], state.recorded[:-1])
    return space.node_key(state.layer, state.tile, state.recorded)
