"""Markov's pick against Roller's, in words: where the Markov walk's rank 1 is predicted slower
than Roller's on the same workload and device, and why.

Both policies rank what they emit by the same model (`rtile.model.estimate`), so the two rank-1
predictions compare like for like; the measured speed is the profile's and `bench kernels
--policy roller,markov`'s business, and where Markov's pick is predicted faster the text says
so with `CAUTION`. The reasons are facts read off the two programs: Markov's
walks never emitted Roller's pick, the first layer whose tiles differ and how full each tile
leaves it (a walk descends when the annealing hands over to the cache action, often before the
layer is full, where Roller grows a tile while the layer holds it: `construct.markov`,
`construct.roller`), what bounds each program, and how many distinct programs the walks found.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.construct.step import Candidate
from workbench.construct.stepper import Construction
from workbench.fmt import duration
from workbench.rtile.plan import loop_nest_key
from workbench.rtile.rprogram import layer_capacity

# Predictions within this fraction of each other are "as fast": the model's own resolution is
# far coarser (docs/benchmarks.md: measured best within the predicted top 3, not at rank 1).
SAME = 0.01


# Said with every Markov pick predicted faster: the walk accepts its moves by the model's
# predicted time, so it goes where the model predicts best, the model's errors included, which
# Roller's growth by data reuse does not seek out.
CAUTION = ("but only predicted: Markov's walk moves by the model's predictions, so it seeks out what the model "
           "prices too low; measured on CPUs, Markov's best ran from 0.80x to 1.39x Roller's speed per workload, "
           "0.83x in the geometric mean on a 2-core AVX2 core (docs/benchmarks.md). Profile both before trusting it: "
           "`workbench bench kernels --policy roller,markov`.")


@dataclass(frozen=True)
class Versus:
    """Markov's rank 1 against Roller's on one workload and device. `ratio`: Markov's predicted
    seconds over Roller's (above 1: Markov's pick is predicted slower; None where either has no
    candidate); `worse`: predicted slower by more than SAME; `text`: one paragraph saying so and
    why, or that it is not."""

    markov_seconds: float | None
    roller_seconds: float | None
    ratio: float | None
    worse: bool
    text: str

    def to_dict(self) -> dict:
        return {"markov_seconds": self.markov_seconds, "roller_seconds": self.roller_seconds, "ratio": self.ratio,
                "worse": self.worse, "text": self.text}


def markov_versus_roller(markov: Construction, roller: Construction) -> Versus:
    """`markov` (a Markov construction) against `roller` (Roller's of the same expression on the
    same device): the predicted ratio of their rank-1 programs and, where Markov's is slower,
    the reasons (module docstring)."""
    if not roller.candidates:
        m = markov.candidates[0].predicted_seconds if markov.candidates else None
        return Versus(m, None, None, False, "Roller constructs no candidate here: nothing to compare Markov's pick with.")
    r = roller.candidates[0]
    if not markov.candidates:
        return Versus(None, r.predicted_seconds, None, True,
                      f"Markov's walks emitted no program at any eps; Roller's pick is predicted {duration(r.predicted_seconds)}.")
    m = markov.candidates[0]
    ratio = m.predicted_seconds / r.predicted_seconds
    if ratio <= 1 - SAME:
        return Versus(m.predicted_seconds, r.predicted_seconds, ratio, False,
                      f"Markov's pick is predicted {1 / ratio:.2f}x faster than Roller's "
                      f"({duration(m.predicted_seconds)} against {duration(r.predicted_seconds)}), {CAUTION}")
    if ratio < 1 + SAME:
        return Versus(m.predicted_seconds, r.predicted_seconds, ratio, False,
                      f"Markov's pick is predicted as fast as Roller's ({duration(m.predicted_seconds)} against "
                      f"{duration(r.predicted_seconds)}).")
    why = _reasons(markov, m, r)
    return Versus(m.predicted_seconds, r.predicted_seconds, ratio, True,
                  f"Markov's pick is predicted {ratio:.2f}x slower than Roller's ({duration(m.predicted_seconds)} against "
                  f"{duration(r.predicted_seconds)}). Why: {'; '.join(why)}.")


def _reasons(markov: Construction, m: Candidate, r: Candidate) -> list[str]:
    device, program = m.device, m.program
    out = []
    key = loop_nest_key(r.program, device)
    if all(loop_nest_key(c.program, device) != key for c in markov.candidates):
        out.append(f"its walks never emitted Roller's pick ({_tiles(r)})")
    layer = next((l for l, (a, b) in enumerate(zip(program.tiles, r.program.tiles)) if a != b), None)
    if layer is not None:
        name = program.layers[layer]
        fill_m, fill_r = (c.estimate.footprints[layer] / layer_capacity(device, layer) for c in (m, r))
        text = (f"at {name} its tile is {'x'.join(map(str, program.tiles[layer]))}, filling {fill_m:.0%} of {name}, "
                f"where Roller's is {'x'.join(map(str, r.program.tiles[layer]))}, filling {fill_r:.0%}")
        if fill_m < fill_r:
            text += " (the walk took the cache action, which the annealing favours as it cools, before growing the tile as far)"
        out.append(text)
    if m.estimate.bottleneck != r.estimate.bottleneck:
        out.append(f"it is bound by {_bound(m)}, Roller's by {_bound(r)}")
    if len(markov.candidates) < markov.options.topk:
        out.append(f"its walks emitted {len(markov.candidates)} distinct programs of the {markov.options.topk} asked for")
    return out or ["the two picks differ only in what the model prices finer than their tiles (split, virtual threads)"]


def _bound(c: Candidate) -> str:
    b = c.estimate.bottleneck
    return "compute" if b == "compute" else f"loads from {b}"


def _tiles(c: Candidate) -> str:
    return ", ".join(f"{n} {'x'.join(map(str, t))}" for n, t in zip(c.program.layers, c.program.tiles))
