"""The construction space: states, actions and the one pure function that applies an action.

A `State` is an rTile being enlarged at one memory layer, plus the tiles already recorded for the
layers above it, plus the actions that made it (any state is `initial + actions` replayed). An
`Action` is a small frozen value; Roller steps, Markov steps, UI buttons and export manifests all
speak this vocabulary. `Space` binds an expression to a device and answers the questions both
policies ask: is a tile aligned, does it fit, is it compute-bound, what are its scores.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import Enum
from math import ceil, gcd

from workbench.construct.graph import node_key, recorded_prefix
from workbench.errors import UserError
from workbench.frozen import direct_init, interned
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.rtile.alignment import (
    initial_tile, is_aligned, next_aligned_sizes, port_free_tile, prev_aligned_sizes, required_accumulators,
    unfilled_tile,
)
from workbench.rtile.axes import always_streamed, even_tile, lane_axis, plain_projections, read_once_below
from workbench.rtile.model.common import is_compute_bound, is_stream_bound, past_llc
from workbench.rtile.model.cpu import tile_stream_runs
from workbench.rtile.registers import block_thread_count
from workbench.rtile.rprogram import (
    CPU_MIN_PART_STEPS, RProgram, holds_output, layer_capacity, layer_footprint, make_program, split_axis, storage_padding,
)
from workbench.rtile.rules import AlignContext, dividing_axes, whole_vector_bound, whole_vector_waste
from workbench.rtile.traffic import calculus

Tile = tuple[int, ...]

class Kind(str, Enum):
    """What an action does. Roller's: start, grow, layer_full, compute_saturated, descend, emit,
    shrink, widen_eps, fuse_axes, prune_visited. Gensor (Markov) adds inv_tile and set_vthread;
    its "cache" action is our "descend". Ours: rows, a CPU program's unit tile widened to span an
    input's rows (`Space.whole_rows`). A `str` so that faces and JSON read the plain name."""

    START = "start"
    FUSE_AXES = "fuse_axes"
    GROW = "grow"
    LAYER_FULL = "layer_full"
    COMPUTE_SATURATED = "compute_saturated"
    DESCEND = "descend"
    EMIT = "emit"
    SHRINK = "shrink"
    WIDEN_EPS = "widen_eps"
    PRUNE_VISITED = "prune_visited"
    INV_TILE = "inv_tile"
    SET_VTHREAD = "set_vthread"
    ROWS = "rows"

    def __str__(self) -> str:
        return self.value


RESIZES = (Kind.GROW, Kind.SHRINK, Kind.INV_TILE)  # actions that set one axis of a tile to `size`
# a start action's `count` where it starts a second round (`Space.second_starts`) or a chains
# round (`Space.chains_start`), 0 elsewhere, and the kind of round each names
PORTS_START, STREAM_START, DIVIDING_START, CHAINS_START = 1, 2, 3, 4
START_KINDS = {PORTS_START: "ports", STREAM_START: "stream", DIVIDING_START: "dividing", CHAINS_START: "chains"}


class IllegalAction(ValueError):
    """An action that cannot be applied to a state (names the rule it breaks)."""


class OverCapacity(IllegalAction):
    """A move `apply` accepts whose result (`state`) does not fit a layer (or a GPU block's
    limits)."""

    def __init__(self, message: str, state: "State"):
        super().__init__(message)
        self.state = state


@direct_init
@dataclass(frozen=True, order=True)
class Action:
    """One move. `size`: the new size of `axis` (grow, shrink, inv_tile; the size a Roller
    branch tried for layer_full / prune_visited; the reduction's step on rows, whose `axis` the
    unit tile then spans; 1 on an emit whose program reads its inputs in
    place, `RProgram.in_place`); `count`: V of set_vthread, S of a split-K emit
    (`RProgram.split`; 0 unsplit); `eps`: the padding bound a round starts at (start) or is
    raised to (widen_eps), or a balancing shrink may reach (`Space.balances`)."""

    kind: Kind
    layer: int = -1
    axis: int = -1
    size: int = 0
    count: int = 0
    eps: float = 0.0

    def __post_init__(self):
        if type(self.kind) is Kind:  # built by the policies: nothing to check
            return
        try:
            object.__setattr__(self, "kind", Kind(self.kind))
        except ValueError:
            raise UserError(f"unknown action kind '{self.kind}' (known: {', '.join(k.value for k in Kind)})") from None

    def describe(self, axes: tuple[str, ...], layers: tuple[str, ...]) -> str:
        where = f" at {layers[self.layer]}" if 0 <= self.layer < len(layers) else ""
        kind = self.kind.value  # its `str` (formatting the member goes through Enum.__format__)
        if self.kind in RESIZES:
            return f"{kind} {axes[self.axis]} to {self.size}{where}"
        if self.kind == Kind.SET_VTHREAD:
            return f"set_vthread {axes[self.axis]} x{self.count}{where}"
        if self.kind == Kind.ROWS:
            return f"rows of {axes[self.axis]} in steps of {self.size}"
        return f"{kind}{where}"


@direct_init
@dataclass(frozen=True)
class State:
    layer: int
    tile: Tile
    recorded: tuple[Tile, ...]  # tiles fixed for layers 0 .. layer-1
    eps: float
    vthreads: tuple[int, ...] = ()  # per axis (Markov's setVthread); empty = none
    actions: tuple[Action, ...] = ()

    @property
    def key(self) -> tuple:
        return (self.layer, self.tile, self.recorded, self.vthreads)


@dataclass(frozen=True)
class Options:
    topk: int = 10
    eps: float = 0.05  # initial tensor-shape waste bound (raised in EPS_STEPS when too few programs)
    max_steps: int = 4000  # hard bound on construction steps per run
    seed: int = 0
    # whether emission may split a reduction over idle units (`policy.split_k`); off for a
    # dynamic-shape bundle's programs, whose kernels run unsplit (`vortex.hierarchy.constructed_rows`)
    split_k: bool = True


# Roller raises eps "up to 1.0 in steps" when fewer than K programs come out. Its artifact
# (nnfusion osdi22_artifact, roller/policy/policy_rt.py, emit_config_without_trails) starts at 0
# and adds 0.2 up to 1.0. We start at 0.05: here a round at 0 already emits K programs of 1-wide
# tiles along a prime extent and stops (roller-table1 D1's 79 x 79 output, P2's 83 x 83: top-1
# 4x and 3x slower predicted on the V100, 6.6 % slower in the geometric mean over both papers'
# GPU workloads on v100/a100/h100), and at 0 no AVX2 register tile of a power-of-two matmul holds
# the 10 accumulators its FMA latency needs (5 or 6 rows pad 512).
EPS_STEPS = (0.05, 0.1, 0.2, 0.4, 0.7, 1.0)
VTHREAD_COUNTS = (1, 2, 4, 8)  # Gensor's setVthread sizes; 1 undoes a split
# A CPU grid of fewer waves over the cores than this whose last wave leaves cores idle gets
# balanced alternatives (`Space.balances`): from 4 waves on, the idle share of the cores' time
# is under an eighth on 2 cores, and cutting the unit tile to win it back costs reuse. Only for
# operators whose inputs are plain projections (matmuls): on the 2-core AVX2 Zen 3 (2 threads,
# quiet, one process, old and new top-1 alternately) 8 random matmuls ran 1.09x faster in the
# geometric mean (0.89-1.35), 6 random convs 0.98x (0.86-1.23): cutting a window's output rows
# or columns costs more than the model prices.
BALANCE_WAVES = 4


class Space:
    """An expression on a device: alignment contexts, capacity and the pure `apply`."""

    def __init__(self, expr: TensorExpr, device: DeviceSpec):
        device = interned(device, device.sources)
        self.expr = expr
        self.device = device
        self.calc = calculus(expr)
        self.n_tile_layers = len(device.layers) - 1  # every layer but the bottom holds a tile
        self.axes = tuple(a.name for a in expr.axes)
        self._ones = (1,) * len(expr.axes)  # `ones`: the tile above the top layer's
        self.layer_names = tuple(l.name for l in device.layers)
        # the round's alignment (`second_starts`, `round_of`): "" or a second round's kind, whose
        # contexts are `unfilled` ("stream") or `dividing` ("dividing"); the memos keyed by it
        self.mode = ""
        self._aligned: dict[tuple, bool] = {}
        self._choices: dict[tuple, tuple] = {}  # `shrink_choices`
        self._no_reuse: dict[tuple, bool] = {}
        self._contexts: dict[tuple, AlignContext] = {}
        self._footprints: dict[tuple, int] = {}
        self._reuse: dict[tuple, float] = {}
        self._keys: dict[tuple, str] = {}
        self._prefixes: dict[tuple, str] = {}  # `node_key`
        self.streamed = always_streamed(expr, device)
        self.stream_bound = is_stream_bound(expr, device)
        self.projections = plain_projections(expr)  # no windowed reads
        # a reduction over plain projections vectorised along an output axis (the matmul class)
        lane = lane_axis(expr, device) if device.runs_on_cpu else None
        self.plain = self.projections and lane is not None and expr.axes[lane].kind == "spatial"

    def ones(self) -> Tile:
        return self._ones

    def context(self, layer: int, upper: Tile, eps: float) -> AlignContext:
        """The alignment context of `layer` under `upper` at `eps`: one object per key, whose
        hash the memoised rules (`alignment`) then compute once."""
        key = (layer, upper, eps, self.mode)
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = self._contexts[key] = AlignContext(self.expr, self.device, layer, upper, eps, self.mode == "stream",
                                                     self.mode == "dividing", self.mode == "chains")
        return ctx

    def node_key(self, layer: int, tile: Tile, recorded: tuple[Tile, ...]) -> str:
        """`graph.node_key`, memoised, and the recorded tiles' part of it kept per recorded
        tiles: every step names its node, most of them seen before, the rest under the same
        recorded tiles as many others."""
        key = (layer, tile, recorded)
        text = self._keys.get(key)
        if text is None:
            prefix = self._prefixes.get(recorded)
            if prefix is None:
                prefix = self._prefixes[recorded] = recorded_prefix(recorded)
            text = self._keys[key] = node_key(layer, tile, recorded, prefix)
        return text

    def upper_of(self, state: State) -> Tile:
        return state.recorded[-1] if state.recorded else self.ones()

    def initial_state(self, eps: float) -> State | None:
        """The smallest aligned top-layer tile at `eps`, or None when there is none or it does
        not fit the top layer. Every aligned tile at that layer is at least as large on every
        axis, so then none fits: on a CPU, a short vectorised axis whose extent the SIMD lanes
        do not divide may only be taken whole until eps admits padding it to whole vectors."""
        ones = self.ones()
        tile = initial_tile(self.context(0, ones, eps))
        if tile is None or self.over_capacity(0, tile, ones):
            return None
        return State(0, tile, (), eps, actions=(Action(Kind.START, 0, eps=eps),))

    def second_starts(self, eps: float) -> tuple[tuple[str, State], ...]:
        """The construction's second rounds' starts at `eps`, each with its kind
        (`Policy._second_round`, which runs each under `round_of` its kind): "ports" where the
        initial register tile issues more loads than FMAs (`alignment.port_free_tile`; its start
        action's `count` PORTS_START), else "stream" where a one-row matmul's start is filled to
        the accumulators its stream does not need (`alignment.unfilled_tile`; STREAM_START); and
        "dividing", from the initial tile, where a reduction no cache tile of whole lines divides
        has tiles of a line or more that do (`rules.dividing_axes`; DIVIDING_START)."""
        ones = self.ones()
        ctx = self.context(0, ones, eps)
        out = []
        for why, tile, count in (("ports", port_free_tile(ctx), PORTS_START), ("stream", unfilled_tile(ctx), STREAM_START)):
            if tile is not None and not self.over_capacity(0, tile, ones):
                out.append((why, State(0, tile, (), eps, actions=(Action(Kind.START, 0, count=count, eps=eps),))))
                break
        first = self.initial_state(eps) if dividing_axes(self.expr, self.device) else None
        if first is not None:
            out.append(("dividing", replace(first, actions=(Action(Kind.START, 0, count=DIVIDING_START, eps=eps),))))
        return tuple(out)

    @contextmanager
    def round_of(self, kind: str = ""):
        """The alignment of a second round of `kind` (`second_starts`, `chains_eps`) while inside:
        "stream" without the accumulators a register tile must hold, "dividing" with a
        reduction's cache tiles dividing it, "chains" with a conv's register rows ragged where
        they may be (`AlignContext.ragged`); "" (or "ports") the first round's. The search and
        its replay."""
        before, self.mode = self.mode, kind if kind in ("stream", "dividing", "chains") else ""
        try:
            yield
        finally:
            self.mode = before

    def footprint(self, layer: int, tile: Tile, upper: Tile) -> int:
        """Bytes `tile` under `upper` occupies at `layer` (`rprogram.layer_footprint`); memoised."""
        key = (layer, tile, upper)
        size = self._footprints.get(key)
        if size is None:
            pad = storage_padding(self.calc, self.device, layer, tile, upper)
            size = self._footprints[key] = layer_footprint(self.calc, self.device, layer, tile, pad)
        return size

    def capacity(self, layer: int) -> int:
        return layer_capacity(self.device, layer)

    def over_capacity(self, layer: int, tile: Tile, upper: Tile, staged: bool = True) -> bool:
        """Footprint over the layer's capacity (where the program stages data there: `staged`),
        or (GPU block) threads / registers over limits (always: a block runs its threads
        whether or not it stages data in shared memory)."""
        if staged and self.footprint(layer, tile, upper) > self.capacity(layer):
            return True
        return self.over_thread_limits(layer, tile, upper)

    def over_thread_limits(self, layer: int, tile: Tile, upper: Tile) -> bool:
        """A GPU block tile with more threads, or threads x registers, than a block may have."""
        if not self.device.is_thread_block_layer(layer):
            return False
        threads = block_thread_count(self.expr, self.device, tile, upper)
        regs = max(1, ceil(self.footprint(0, upper, self.ones()) / 4))  # 32-bit registers per thread
        return threads > self.device.max_threads_per_block or threads * regs > self.device.registers_per_unit

    def fits_below(self, layer: int, tile: Tile, eps: float, staged: bool = True) -> bool:
        """Whether the smallest aligned tile containing `tile` at the next tile layer exists and
        fits there (its capacity counts where the program stages data there: `staged`)."""
        below = layer + 1
        if below >= self.n_tile_layers:
            return True
        nxt = initial_tile(self.context(below, tile, eps))
        return nxt is not None and not self.over_capacity(below, nxt, tile, staged)

    def no_reuse(self, start: State) -> bool:
        """Whether growing the initial top tile along any axis buys no reuse (elementwise, most
        reductions): such operators stage data in the top layer only (Roller §3.2)."""
        ones = self.ones()
        sizes = next_aligned_sizes(self.context(0, ones, start.eps), start.tile)
        scores = [self.reuse(0, start.tile, with_axis(start.tile, a, s), ones) for a, s in enumerate(sizes) if s]
        return all(s <= 1e-12 for s in scores)

    def stages_below(self, eps: float) -> bool:
        """Whether programs at `eps` stage data below the top layer: not for an operator without
        reuse (`no_reuse` at the initial tile), which loads straight from the bottom (Roller
        §3.2); then a lower layer's capacity does not bound what the top layer holds."""
        key = (eps, self.mode)
        if key not in self._no_reuse:
            start = self.initial_state(eps)
            self._no_reuse[key] = start is not None and self.no_reuse(start)
        return not self._no_reuse[key]

    def cached(self, n_tiles: int, eps: float) -> tuple[bool, ...]:
        """Layers a program of `n_tiles` tiles at `eps` stages data in: all, or only the top one
        (`stages_below`)."""
        below = self.stages_below(eps)
        return tuple(l == 0 or below for l in range(n_tiles))

    def compute_bound(self, layer: int, tile: Tile) -> bool:
        return is_compute_bound(self.calc, self.device, layer, tile, layer + 1)

    def reuse(self, layer: int, tile: Tile, grown: Tile, upper: Tile) -> float:
        """Roller's data-reuse score of growing `tile` to `grown` at `layer` under `upper`
        (`TileCalculus.reuse_score`, bank padding included); memoised: the eps ladder's rounds
        score the same growths again."""
        key = (layer, tile, grown, upper)
        score = self._reuse.get(key)
        if score is None:
            pad = storage_padding(self.calc, self.device, layer, tile, upper)
            gpad = storage_padding(self.calc, self.device, layer, grown, upper)
            score = self._reuse[key] = self.calc.reuse_score(tile, grown, pad, gpad, holds_output(self.device, layer))
        return score

    def stream_reuse(self, tile: Tile, grown: Tile) -> float:
        """The term a CPU's first cache tile adds to its reuse score for the input runs (`model.cpu.
        tile_stream_runs` of the `streamed` inputs) that growing `tile` to `grown` saves: each run
        costs the bottom layer's latency (`model.cpu.stream_seconds`), counted as the bytes the
        layer below moves per core in that time, per byte of footprint the growth adds (as
        `TileCalculus.reuse_score`). Without it a one-row matmul's L1 tile stopped at 112 columns
        (growing N saves no byte of B), which is read in 448-byte runs; whole rows run 5x faster
        (docs/model-evidence.md#stream-runs). Since `StreamRowsRule` a one-row matmul's L1 tile
        along N is its register tile's width in whole lines, and this term only takes it there
        (7 AVX2 vectors to two of them); an operator that streams an input along no vector row
        (a row reduction over one row) still grows by it."""
        if not self.streamed:
            return 0.0
        saved = tile_stream_runs(self.calc, tile, self.streamed) - tile_stream_runs(self.calc, grown, self.streamed)
        df = self.calc.footprint_bytes(grown) - self.calc.footprint_bytes(tile)
        if saved <= 0 or df <= 0:
            return 0.0
        bottom, below = self.device.layers[-1], self.device.layers[2]
        run_bytes = bottom.latency_ns * below.bandwidth_gbps / self.device.compute_units
        return saved * run_bytes / df

    def program(self, tiles: tuple[Tile, ...], eps: float, vthreads: tuple[int, ...] = ()) -> RProgram:
        """The rProgram of `tiles` at `eps` (staging as `cached` says) with per-axis virtual
        threads `vthreads` (empty or 1: none)."""
        pairs = tuple((self.axes[a], v) for a, v in enumerate(vthreads) if v > 1)
        return make_program(self.calc, self.device, tiles, self.cached(len(tiles), eps), eps, pairs)

    def program_of(self, state: State) -> RProgram:
        """The rProgram a state at the bottom layer stands for."""
        return self.program(state.recorded, state.eps, state.vthreads)

    def aligned(self, layer: int, tile: Tile, upper: Tile, eps: float) -> bool:
        key = (layer, tile, upper, eps, self.mode)
        ok = self._aligned.get(key)
        if ok is None:
            ok = self._aligned[key] = is_aligned(self.context(layer, upper, eps), tile)
        return ok

    def shrink_unit(self, tiles: tuple[Tile, ...], eps: float) -> tuple[int, tuple[Tile, ...]] | None:
        """Roller-S scale-out (§3.2, small operators): (axis, tiles) with the unit tile shrunk
        along the spatial axis of smallest reuse score (by `_reach`: to double the tiles along
        it while the grid stays within the units, else one aligned step), or None when none can
        shrink. Shared by every policy that emits programs; memoised."""
        choices = self.shrink_choices(tiles, eps)
        return choices[0] if choices else None

    def shrink_choices(self, tiles: tuple[Tile, ...], eps: float) -> tuple[tuple[int, tuple[Tile, ...]], ...]:
        """The first shrink of the unit tile along each spatial axis that can shrink, (axis,
        tiles) each, Roller-S's (`shrink_unit`) first: a CPU's `Policy.emit` prices the others."""
        key = (tiles, eps, self.mode)
        if key not in self._choices:
            self._choices[key] = _shrink_options(self, tiles, eps, self.cached(len(tiles), eps))
        return self._choices[key]

    def shrinks(self, tiles: tuple[Tile, ...], eps: float) -> tuple[tuple[int, tuple[Tile, ...]], ...]:
        """Roller-S: the shrinks (axis, tiles after it) of the unit tile (`shrink_unit`) while
        the grid has fewer tiles than the device has units; empty when it has enough."""
        out = []
        while self.calc.spatial_tiles(tiles[-1]) < self.device.compute_units:
            shrunk = self.shrink_unit(tiles, eps)
            if shrunk is None:
                break
            out.append(shrunk)
            tiles = shrunk[1]
        return tuple(out)

    def reduction_cut(self, tiles: tuple[Tile, ...], eps: float) -> tuple[int, tuple[Tile, ...]] | None:
        """On a CPU whose grid leaves cores idle, the unit tile cut along the axis a split program
        parts (`rprogram.split_axis`) to the largest whole number of the tile below's steps that
        gives every core a part of CPU_MIN_PART_STEPS steps or more (`rprogram.split_counts`), where
        the unit tile has too few steps for that: (axis, tiles after the cut), or None. Roller's
        scale-up grows a unit tile's K as far as the cache holds, which can leave a long reduction
        over few outputs one or two K-steps and nothing to split: 2 x 8147 x 41 arrived as one 2 x
        48 x 4256 unit tile on 2 cores, one core busy, 52 us, where K-steps of 448 split two ways
        run 23 us (numpy 26; evidence: docs/evidence.md#reduction-cut)."""
        units, unit = self.device.compute_units, tiles[-1]
        grid = self.calc.spatial_tiles(unit)
        axis = split_axis(self.expr, self.device) if self.device.runs_on_cpu and len(tiles) > 1 else None
        if axis is None or grid >= units:
            return None
        extent, below = self.expr.axes[axis].extent, tiles[-2][axis]
        needed = ceil(units / grid) * CPU_MIN_PART_STEPS
        if ceil(extent / unit[axis]) >= needed:
            return None  # split as it is (`policy.split_k`)
        size = next((m * below for m in range(unit[axis] // below, 0, -1) if ceil(extent / (m * below)) >= needed), None)
        if size is None:
            return None
        cut = _shrunk_stack(self, tiles, axis, size, eps, self.cached(len(tiles), eps))
        return None if cut is None else (axis, cut)

    def whole_rows(self, tiles: tuple[Tile, ...], eps: float) -> tuple[str, int, int, tuple[Tile, ...]] | None:
        """On a CPU, where a program reads an input once from DRAM (`axes.read_once_below` of its
        unit tile, the operator past the last-level cache the spec names: a few-row matmul's B)
        in strips, each unit tile a run of every row: the program whose unit tile spans those
        rows whole (the input's contiguous axis at its extent, in whole tiles of the layer above)
        in reduction steps of the longest whole number of register steps, up to the cache tiles'
        now, within every layer's limits, which `policy.split_k` then deals over the cores, each
        a block of whole rows: (the input's name, axis, step, tiles), or None. Two cores read
        whole rows at twice the rate of strips (`model.cpu.STRIPS_SHARE`): 16 x 4901 x 7705 on
        two Zen 4 cores, its rank 1 in unit tiles 176 columns wide 15.1 ms, as split-K over unit
        tiles of all of N 9.7 (numpy 13.9; evidence: docs/model-evidence.md#whole-rows)."""
        expr, device = self.expr, self.device
        if not device.runs_on_cpu or len(tiles) < 2 or not past_llc(expr, device):
            return None
        shapes = self.calc.data_tiles(tiles[-1])
        strips = [t for t in read_once_below(expr, device, tiles[-1]) if shapes[t][-1] < expr.inputs[t].shape[-1]]
        terms = expr.inputs[strips[0]].terms[-1] if strips else ()
        k = split_axis(expr, device)
        if len(terms) != 1 or terms[0][1] != 1 or k is None:
            return None
        axis, cached = terms[0][0], self.cached(len(tiles), eps)
        for size in range(tiles[-2][k], 0, -tiles[0][k]):
            new = _rows_stack(self, tiles, axis, size)
            if new is not None and _all_within(self, new, eps, cached):
                return expr.inputs[strips[0]].name, axis, size, new
        return None

    def balances(self, tiles: tuple[Tile, ...], eps: float) -> tuple[tuple[int, tuple[Tile, ...], float], ...]:
        """CPU scale-out past Roller-S: (axis, tiles, bound) for each spatial axis along which
        the unit tile can be cut into more, even tiles so that the grid fills the cores' last
        wave (its tile count a multiple of the cores), where the grid now leaves cores idle in
        its last wave (or has fewer tiles than cores: a program before Roller-S) and has fewer
        than BALANCE_WAVES waves. Along an axis of extent E now cut into n tiles, the fewest
        m > n tiles that balance the grid, each ceil(E / m) rounded up to whole tiles of the
        layer above (3 x 291 x 320 x 227 on 2 cores: 3 unit tiles of 294 rows, one batch each,
        leave a core idle a quarter of the time; 2 x 154 rows a batch fill both). The cut may
        pad up to `bound`: eps, or the idle share of the cores' time it wins back where that is
        more (154-row tiles pad 291 rows by 5.8 %). Empty on GPUs (a streaming multiprocessor
        holds several blocks at once, and Roller's scale-out is the paper's there), for
        operators with windowed reads, and where the grid fills its last wave.

        A grid that fills its last wave gets the even cut of each axis instead, where that pads
        less: as many tiles, each ceil(E / n) rounded up to whole tiles of the layer above (the
        state's eps bounds its padding). Roller's scale-up grows a unit tile as far as the cache
        holds, whatever the rest it leaves: 907 x 397 x 17 arrived as two tiles of 720 rows on 2
        cores, the second one 187 rows padded to 720 (the template pads the tails), 122-138 us,
        where two of 480 pad 5.8 %, 79-100 us (evidence: docs/evidence.md#even-cuts)."""
        units, unit = self.device.compute_units, tiles[-1]
        grid = self.calc.spatial_tiles(unit)
        if not self.device.runs_on_cpu or grid >= BALANCE_WAVES * units:
            return ()
        if not self.projections:
            return ()  # see BALANCE_WAVES: windowed reads (convs, poolings) measured no gain
        if grid % units == 0:
            return self._even_cuts(tiles, eps)
        slots = ceil(grid / units) * units
        bound = max(eps, (slots - grid) / slots)
        cached, out = self.cached(len(tiles), bound), []
        for axis in self.expr.spatial:
            extent, size = self.expr.axes[axis].extent, unit[axis]
            n = ceil(extent / size)
            rest, base = grid // n, tiles[-2][axis] if len(tiles) > 1 else 1
            for m in range(n + 1, extent + 1):
                new_size = even_tile(extent, m, base)
                if new_size >= size or ceil(extent / new_size) * rest % units:
                    continue
                new = _shrunk_stack(self, tiles, axis, new_size, bound, cached)
                if new is not None:
                    out.append((axis, new, bound))
                    break
        return tuple(out)

    def _even_cuts(self, tiles: tuple[Tile, ...], eps: float) -> tuple[tuple[int, tuple[Tile, ...], float], ...]:
        """`balances` of an even grid: per spatial axis, the tiles with the unit tile's n tiles
        along it cut into n even tiles of whole tiles of the layer above, where those are
        smaller (they pad less)."""
        unit, cached, out = tiles[-1], self.cached(len(tiles), eps), []
        for axis in self.expr.spatial:
            extent, size = self.expr.axes[axis].extent, unit[axis]
            n = ceil(extent / size)
            base = tiles[-2][axis] if len(tiles) > 1 else 1
            even = even_tile(extent, n, base)
            new = _shrunk_stack(self, tiles, axis, even, eps, cached) if even < size else None
            if new is not None:
                out.append((axis, new, eps))
        return tuple(out)

    def reuse_eps(self, eps: float) -> float | None:
        """The eps of one more round after a round at `eps` ran without reuse (`stages_below`
        false: no growth of its start tile that eps aligns saves a byte) where a larger eps of
        EPS_STEPS starts a round with reuse: the first such; None where the round had reuse or no
        larger eps has. A matmul of 2 rows whose next vector of columns pads N by 8 % grows
        only along K at eps 0.05, which saves nothing in registers; its round without reuse
        filled the top K with one register tile differing in K alone (2 x 3520 x 355: ten 2 x 16
        tiles, 172-247 us), where 2 x 96 from eps 0.1 ran 70. A round without reuse stages
        nothing below the registers, which is what small batched matmuls want, so both rounds'
        programs compete (evidence: docs/evidence.md#reuse-round)."""
        if self.stages_below(eps):
            return None
        return next((e for e in EPS_STEPS if e > eps + 1e-12 and self.stages_below(e)), None)

    def chains_eps(self, eps: float) -> float | None:
        """The eps of one more round, with a conv's register rows ragged (`round_of("chains")`),
        after a round at `eps` whose register tiles hold fewer accumulators than the core's FMA
        chains ask for because no larger tile is aligned (`alignment.required_accumulators`'
        fallback): `eps` or the first larger of EPS_STEPS at which that round's register tiles
        hold more; None where the round at `eps` filled the chains or nothing holds more. Over
        an output of 19 x 19 (prime) at eps 0.05 only rows and columns of 1 and 19 align, and 19
        overflow the registers (208 filters, stride 2: ten programs of one accumulator,
        predicted 1.27 ms, 0.2-0.9 ms measured); at 0.1, 5 x 2 pad 19 to 20. Over 38 x 38 only
        rows of 2 divide (four accumulators); ragged, 3 x 3 hold nine (1.12-1.31 -> 0.76 ms,
        ONNX Runtime 0.70; evidence: docs/evidence.md#chains-round). Both rounds' programs
        compete, the model pricing the chains against the padding and guards."""
        need = self.device.fma_accumulators if self.device.runs_on_cpu else 0
        held = required_accumulators(self.context(0, self.ones(), eps))
        if not need or not held or held >= need:
            return None
        with self.round_of("chains"):
            return next((e for e in EPS_STEPS
                         if e > eps - 1e-12 and required_accumulators(self.context(0, self.ones(), e)) > held), None)

    def chains_start(self, eps: float) -> State | None:
        """Where the chains round at `eps` (`chains_eps`) starts: the initial state aligned as
        that round is (`round_of("chains")`), its start action's `count` CHAINS_START."""
        with self.round_of("chains"):
            first = self.initial_state(eps)
        return None if first is None else replace(first, actions=(Action(Kind.START, 0, count=CHAINS_START, eps=eps),))

    def whole_vector_eps(self, eps: float) -> float | None:
        """The eps of one more round after a round at `eps` finished with its register rows in
        LLVM's pieces (`rules.whole_vector_waste`): the first of EPS_STEPS that admits whole
        vectors, up to `rules.whole_vector_bound`; None where no such round is due. Its programs
        and those of the rounds before compete, the model pricing pieces against padding."""
        waste = whole_vector_waste(self.expr, self.device)
        if waste is None or waste <= eps + 1e-12 or waste > whole_vector_bound(self.expr, self.device) + 1e-12:
            return None
        return next(e for e in EPS_STEPS if waste <= e + 1e-12)

    def scaled_out(self, tiles: tuple[Tile, ...], eps: float) -> RProgram:
        """The program of `tiles` after Roller-S (`shrinks`)."""
        shrinks = self.shrinks(tiles, eps)
        return self.program(shrinks[-1][1] if shrinks else tiles, eps)


def _shrink_options(space: Space, tiles: tuple[Tile, ...], eps: float, cached: tuple[bool, ...]):
    """(axis, tiles) of the first aligned shrink along each spatial axis that has one, smallest
    reuse score first (Roller-S's choice), ties to the outer axis."""
    unit, ranked = tiles[-1], []
    grid = space.calc.spatial_tiles(unit)
    for axis in space.expr.spatial:
        extent = space.expr.axes[axis].extent
        reach = _reach(extent, unit[axis], grid, space.device.compute_units)
        for size in _smaller_sizes(unit[axis], tiles[-2][axis] if len(tiles) > 1 else 1, reach):
            new = _shrunk_stack(space, tiles, axis, size, eps, cached)
            if new is not None:
                ranked.append((space.reuse(len(tiles) - 1, new[-1], unit, new[-2] if len(new) > 1 else space.ones()), axis, new))
                break
    return tuple((axis, new) for _, axis, new in sorted(ranked, key=lambda r: (r[0], r[1])))


def _shrunk_stack(space: Space, tiles, axis: int, size: int, eps: float, cached):
    """The tiles with the unit tile's `axis` at `size`, or None when no aligned stack within
    the limits exists. The tiles above are clamped to divide it (gcd); when that breaks a rule,
    the top (register) tile shrinks along the axis as well, largest divisor first: a GPU block
    keeps whole warps of threads only if its threads' tiles shrink with it (Roller shrinks the
    rTiles, §3.2). Smaller tiles need not have smaller footprints (bank padding depends on the
    tile above), so every layer is checked again."""
    above = [with_axis(t, axis, gcd(t[axis], size)) for t in tiles[:-1]]
    unit = with_axis(tiles[-1], axis, size)
    # The layers from the third down neither hold the register tile nor sit right under it, so
    # no `r` below changes their checks: where one fails, every `r` fails. Checked once, first
    # (on a many-core spec most of the sizes tried fail there).
    if not _all_within(space, tuple(above) + (unit,), eps, cached, start=2):
        return None
    top = above[0][axis]
    for r in (d for d in range(top, 0, -1) if top % d == 0):
        above[0] = with_axis(above[0], axis, r)
        new = tuple(above) + (unit,)
        if _all_within(space, new, eps, cached, stop=2):
            return new
    return None


def _all_within(space: Space, tiles, eps: float, cached, start: int = 0, stop: int | None = None) -> bool:
    """Every tile of layers `start` to `stop` (default: all) aligned at its layer and within that
    layer's limits (`over_capacity`), each under the tile above it."""
    upper = tiles[start - 1] if start else space.ones()
    for layer in range(start, len(tiles) if stop is None else min(stop, len(tiles))):
        tile = tiles[layer]
        if not space.aligned(layer, tile, upper, eps) or space.over_capacity(layer, tile, upper, cached[layer]):
            return False
        upper = tile
    return True


def _reach(extent: int, size: int, grid: int, units: int) -> int:
    """The largest size worth trying first for an axis of the unit tile (now `size`, the grid
    `grid` tiles): while doubling the tiles along the axis leaves the grid at most the units,
    the largest size that doubles them; nearer the units, `size - 1` (one aligned step, as
    Roller-S steps). One register tile at a time, a unit tile spanning a long axis took
    thousands of shrinks (gemv 16384x1000 over 128 cores, a 4 MiB L2: all of Roller's
    `max_steps`); doubling brings the grid to more than half the units in O(log) shrinks, and
    from there it steps as before."""
    tiles = ceil(extent / size)
    if 2 * grid > units:
        return size - 1
    return -(-extent // (2 * tiles - 1)) - 1  # the largest s with ceil(extent / s) >= 2 * tiles


def _smaller_sizes(size: int, base: int, reach: int):
    """Candidate smaller sizes for shrinking: steps of the tile above, then halvings; those at
    most `reach` (`_reach`) first, largest first, then the larger ones, nearest first."""
    seen = set()
    halvings = [size // 2**k for k in range(1, 12)]
    first = size - base * max(1, -(-(size - reach) // base))
    far = list(range(first, 0, -base))[:64] + [s for s in halvings if s <= reach]
    near = list(range(size - base, reach, -base))[:64] + [s for s in halvings if s > reach]
    for s in far + near:
        if 0 < s < size and s not in seen:
            seen.add(s)
            yield s


def with_axis(tile: Tile, axis: int, size: int) -> Tile:
    return tile[:axis] + (size,) + tile[axis + 1 :]


def apply(space: Space, state: State, action: Action) -> State:
    """The one pure transition function: the state `action` leads to, or IllegalAction."""
    acts = state.actions + (action,)
    kind = action.kind
    if kind == Kind.SHRINK and state.layer == space.n_tile_layers:
        return _shrink_program(space, state, action)
    if kind == Kind.ROWS:
        return _rows_program(space, state, action)
    if kind in RESIZES:
        if action.layer != state.layer or not 0 <= action.axis < len(state.tile):
            raise IllegalAction(f"{kind}: layer/axis do not match the state")
        if kind == Kind.INV_TILE and action.size >= state.tile[action.axis]:
            raise IllegalAction(f"inv_tile: {action.size} does not shrink axis {space.axes[action.axis]}")
        tile = with_axis(state.tile, action.axis, action.size)
        if not space.aligned(state.layer, tile, space.upper_of(state), state.eps):
            raise IllegalAction(f"{kind}: size {action.size} of axis {space.axes[action.axis]} is not aligned")
        if state.layer == 0 and state.vthreads and action.size % state.vthreads[action.axis]:
            raise IllegalAction(f"{kind}: {state.vthreads[action.axis]} virtual threads do not divide {action.size}")
        return State(state.layer, tile, state.recorded, state.eps, state.vthreads, acts)
    if kind == Kind.DESCEND:
        if state.layer + 1 > space.n_tile_layers:
            raise IllegalAction("descend: already at the lowest layer")
        recorded = state.recorded + (state.tile,)
        if state.layer + 1 == space.n_tile_layers:
            return State(state.layer + 1, state.tile, recorded, state.eps, state.vthreads, acts)
        tile = initial_tile(space.context(state.layer + 1, state.tile, state.eps))
        if tile is None:
            raise IllegalAction(f"descend: no aligned tile at {space.layer_names[state.layer + 1]}")
        return State(state.layer + 1, tile, recorded, state.eps, state.vthreads, acts)
    if kind == Kind.SET_VTHREAD:
        _check_vthread(space, state, action)
        v = list(state.vthreads or (1,) * len(state.tile))
        v[action.axis] = action.count
        return replace(state, vthreads=tuple(v), actions=acts)
    if kind == Kind.WIDEN_EPS:
        return replace(state, eps=action.eps, actions=acts)
    return replace(state, actions=acts)  # markers: no change to the tile


def descend_within_limits(space: Space, state: State) -> State:
    """`apply` of descend, refused (OverCapacity) where the smallest aligned tile at the next
    layer does not fit it or the block's thread limits (its capacity counts where programs at the
    state's eps stage data there: `stages_below`). Every policy descends through this check."""
    nxt = apply(space, state, Action(Kind.DESCEND, state.layer))
    if nxt.layer < space.n_tile_layers and space.over_capacity(nxt.layer, nxt.tile, state.tile, space.stages_below(state.eps)):
        raise OverCapacity(f"descend: the smallest aligned tile at {space.layer_names[nxt.layer]} does not fit", nxt)
    return nxt


def _shrink_program(space: Space, state: State, action: Action) -> State:
    """Roller-S at the bottom layer: the program's unit tile shrunk to `size` along `axis` (the
    tiles above clamped as `_shrunk_stack` says), padding at most the state's eps or the
    action's, where that is more (`Space.balances`: the state then carries that bound, as its
    program does); virtual threads that no longer divide the register tile are dropped."""
    tiles = state.recorded
    if not 0 <= action.axis < len(space.axes) or not 0 < action.size < tiles[-1][action.axis]:
        raise IllegalAction(f"shrink: {action.size} does not shrink the unit tile's axis {action.axis}")
    bound = max(state.eps, action.eps)
    new = _shrunk_stack(space, tiles, action.axis, action.size, bound, space.cached(len(tiles), bound))
    if new is None:
        raise IllegalAction(f"shrink: no aligned program within the limits has {space.axes[action.axis]}={action.size}")
    vthreads = tuple(v if t % v == 0 else 1 for v, t in zip(state.vthreads, new[0]))
    return replace(state, tile=(), recorded=new, eps=bound, vthreads=vthreads, actions=state.actions + (action,))


def _rows_program(space: Space, state: State, action: Action) -> State:
    """The program of a state at the bottom layer with its unit tile spanning `action.axis` whole
    in reduction steps of `action.size` (`Space.whole_rows`, `_rows_stack`)."""
    if state.layer != space.n_tile_layers:
        raise IllegalAction("rows: only a program's unit tile spans rows")
    tiles = _rows_stack(space, state.recorded, action.axis, action.size)
    if tiles is None or not _all_within(space, tiles, state.eps, space.cached(len(tiles), state.eps)):
        raise IllegalAction(f"rows: no aligned program within the limits spans {space.axes[action.axis]} "
                            f"in steps of {action.size}")
    return replace(state, tile=(), recorded=tiles, actions=state.actions + (action,))


def _rows_stack(space: Space, tiles, axis: int, size: int):
    """`tiles` with the unit tile's `axis` at its extent in whole tiles of the layer above, and
    every cache tile's reduction (`rprogram.split_axis`) at most `size`; None where `size` is no
    whole number of the register tile's steps, or longer than the cache tiles' steps now."""
    k = split_axis(space.expr, space.device)
    if k is None or not 0 <= axis < len(space.axes) or axis == k or len(tiles) < 2:
        return None
    if size < 1 or size % tiles[0][k] or size > tiles[-2][k]:
        return None
    below = tiles[-2][axis]
    unit = with_axis(with_axis(tiles[-1], axis, ceil(space.expr.axes[axis].extent / below) * below), k, size)
    return (tiles[0],) + tuple(with_axis(t, k, min(t[k], size)) for t in tiles[1:-1]) + (unit,)


def legal_actions(space: Space, state: State) -> tuple[Action, ...]:
    """Every tile move `apply` accepts at `state`, found by trying it (as tinygrad's
    `get_kernel_actions` does): grow / inv_tile to the next / previous aligned size of each
    axis, descend, set_vthread to each of VTHREAD_COUNTS. Capacity is the policies' question."""
    if state.layer >= space.n_tile_layers:
        return ()
    ctx = space.context(state.layer, space.upper_of(state), state.eps)
    tried = [Action(Kind.GROW, state.layer, a, s) for a, s in enumerate(next_aligned_sizes(ctx, state.tile)) if s]
    tried += [Action(Kind.INV_TILE, state.layer, a, s) for a, s in enumerate(prev_aligned_sizes(ctx, state.tile)) if s]
    tried.append(Action(Kind.DESCEND, state.layer))
    current = state.vthreads or space.ones()
    tried += [Action(Kind.SET_VTHREAD, state.layer, a, count=v) for a in space.expr.spatial for v in VTHREAD_COUNTS if v != current[a]]
    legal = []
    for action in tried:
        try:
            apply(space, state, action)
        except IllegalAction:
            continue
        legal.append(action)
    return tuple(legal)


def replay(space: Space, actions: tuple[Action, ...]) -> RProgram:
    """The program a candidate's actions build: from the initial state at the start action's
    eps (a second round's, `Space.second_starts`, or a chains round's, `Space.chains_start`, where
    its `count` says so), every action applied
    in turn, aligned as that start's round was (a candidate's actions end at the bottom layer)."""
    if not actions or actions[0].kind != Kind.START:
        raise UserError("replay: actions must begin with a start action")
    first = actions[0]
    if first.count == CHAINS_START:
        state = space.chains_start(first.eps)
    elif first.count:  # a second start: the one `second_starts` gives at its eps, if of its kind
        state = next((start for _, start in space.second_starts(first.eps) if start.actions[0] == first), None)
    else:
        state = space.initial_state(first.eps)
    if state is None:
        raise UserError(f"replay: no aligned tile fits {space.layer_names[0]} at eps {first.eps}")
    with space.round_of(START_KINDS.get(first.count, "")):
        for action in actions[1:]:
            state = apply(space, state, action)
        if state.layer < space.n_tile_layers:
            raise UserError(f"replay: the actions end at {space.layer_names[state.layer]}, not the bottom layer")
        program = space.program_of(state)
    emit = actions[-1] if actions[-1].kind == Kind.EMIT else Action(Kind.EMIT)
    if emit.size:  # inputs read in place (policy.in_place)
        program = replace(program, in_place=True)
    split = emit.count
    return replace(program, split=split, grid=program.grid * split) if split > 1 else program  # split-K (policy.split_k)


def _check_vthread(space: Space, state: State, action: Action) -> None:
    """Virtual threads split a GPU thread's register tile along a spatial axis (Gensor's
    setVthread): only at the register layer, and V must divide the thread's tile."""
    if not space.device.has_virtual_threads or state.layer != 0 or action.layer != 0:
        raise IllegalAction("set_vthread: only for a GPU thread's tile, at the register layer")
    if action.axis not in space.expr.spatial:
        raise IllegalAction("set_vthread: virtual threads split a spatial axis")
    if action.count < 1 or state.tile[action.axis] % action.count:
        raise IllegalAction(f"set_vthread: {action.count} does not divide the thread's tile {state.tile[action.axis]}")
