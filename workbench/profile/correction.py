"""Learning from the runs store: a per-device correction of the model, fitted on stored measurements
(`profile.store.refit` reads them, fits, and keeps the correction in the store).

The model's stage times (compute, and the loads from each memory layer, `rtile/model.py`) are
taken as features and the measured time as the target:

    measured ~ a_compute * compute_seconds + sum_layer a_layer * load_seconds[layer] + c

with every coefficient >= 0 (a stage cannot make a kernel faster; non-negative least squares,
Lawson-Hanson). The fit is in relative error: it minimises sum ((fit_i - measured_i) / measured_i)^2,
so a 10 us kernel weighs as much as a 10 ms one, and each workload's rows together weigh as much as
another's (a workload profiled three times does not outvote one profiled once). Only the stage
times are fitted, never `predicted_seconds`: how the stages combine into a prediction is the
model's business and changes with it.

**Shrinkage.** A fit is trusted in proportion to its evidence (credibility weighting, in log
time, where the errors are measured: a fit that says 10x slower and one that says 10x faster pull
equally hard):

    log corrected = (1 - w) * log predicted_seconds + w * log fit,   w = W / (W + p)

where W is the number of workloads the fit saw and p its number of coefficients. Workloads, not
measurements, are the evidence: the candidates of one workload share its compute time (the
register tile barely changes it) and differ in a load or two, so twenty of them cannot tell
a_compute from c, and what the correction is for is the next workload, not the next candidate of
this one. A fit is determined by p workloads at the least (below that, many coefficient sets match
its data and it says nothing about the next workload), so p is where it earns half the weight, and
10 p workloads give it 0.91; with no data the correction is the model itself. Per operator class
(matmul-class, conv, elementwise, reduction: `op_class`) the same rule blends the class's own fit
with the device's: a class seen in few workloads speaks through the device's fit.

**Applied by default where it has earned it** (`earned`): the faces rank a construction's
candidates by the corrected prediction, instead of the model's, only for a device whose stored
correction ranked its held-out workloads better than the model did (mean Spearman after above
before) without making their times worse (median |log error| after at most before). A ranking is
what the correction changes for a user (the top-K that gets built and timed), so the ranking is
what it must have improved; the signed-rank claim below is about the times and may stay unmet on
few workloads while the ranks already gain.

**Honest evaluation.** `evaluate` scores the correction by leave-one-workload-out
cross-validation: each workload is predicted by a correction fitted on the other workloads alone,
so "after" is never fitted on what it scores. Reported before and after: the median
|log(predicted / measured)| over the measurements and the mean Spearman(predicted, measured) over
the workloads. An improvement is *claimed* only when the held-out workloads' errors fell by more
than chance allows: a one-sided Wilcoxon signed-rank test of the per-workload differences,
p < 0.05. It weighs how much each workload gained or lost, so ten workloads that gain a little do
not outvote three that lose a lot, as a count of winners would; on noise it claims nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from workbench.errors import UserError
from workbench.fmt import signed
from workbench.profile.compare import average_ranks, json_float, nan_mean, spearman

COMPUTE = "compute"
CONSTANT = "constant"
OTHER = "other"
# Operator classes by catalog op. Pooling sums or maxes windows of one input with no second
# operand to reuse: it behaves as a reduction, not as a convolution. An expression ("expr") or a
# model's operator has no class: the device's fit serves it.
OP_CLASSES: Mapping[str, str] = {
    "matmul": "matmul", "gemv": "matmul",
    "conv2d": "conv", "depthwise_conv2d": "conv", "group_conv2d": "conv",
    "relu": "elementwise", "add": "elementwise", "gelu": "elementwise",
    "reduce_sum": "reduction", "reduce_mean": "reduction", "avgpool": "reduction", "maxpool": "reduction",
}
MIN_WORKLOADS = 2  # leave-one-workload-out needs one workload to hold out and one to fit on
CLAIM_LEVEL = 0.05  # the chance a claimed improvement is luck: the usual 5 %


def op_class(op: str) -> str:
    """The operator class of catalog op `op`; `OTHER` for expressions and models' operators."""
    return OP_CLASSES.get(op, OTHER)


@dataclass(frozen=True)
class Stages:
    """The parts of an estimate the correction reads: stage times and the model's own prediction."""

    compute_seconds: float
    load_seconds: tuple[tuple[str, float], ...]
    predicted_seconds: float


def stages_of(estimate) -> Stages:
    """The stages of an `Estimate`, or of its `to_dict()` form as the runs store keeps it."""
    if isinstance(estimate, Stages):
        return estimate
    if isinstance(estimate, Mapping):
        return Stages(float(estimate["compute_seconds"]),
                      tuple((str(k), float(v)) for k, v in dict(estimate["load_seconds"]).items()),
                      float(estimate["predicted_seconds"]))
    return Stages(estimate.compute_seconds, tuple(estimate.load_seconds), estimate.predicted_seconds)


@dataclass(frozen=True)
class Row:
    """One correct measurement of a stored candidate: its workload, operator, stages and time."""

    workload: str
    op: str
    run_id: int
    rank: int
    stages: Stages
    measured_seconds: float


@dataclass(frozen=True)
class StageFit:
    """measured ~ compute * compute_seconds + sum loads[layer] * load_seconds[layer] + constant,
    fitted on `measurements` rows of `workloads` workloads."""

    compute: float
    loads: tuple[tuple[str, float], ...]
    constant: float
    measurements: int
    workloads: int

    @property
    def coefficients(self) -> int:
        return 2 + len(self.loads)

    @property
    def weight(self) -> float:
        """The credibility of the fit: W / (W + p), W workloads, p coefficients (module docstring)."""
        return self.workloads / (self.workloads + self.coefficients)

    def seconds(self, stages: Stages) -> float:
        """The fitted time of `stages`; a layer the fit never saw adds nothing (no evidence)."""
        loads = dict(self.loads)
        return (self.compute * stages.compute_seconds
                + sum(loads.get(layer, 0.0) * t for layer, t in stages.load_seconds) + self.constant)

    def to_dict(self) -> dict:
        return {"compute": self.compute, "loads": dict(self.loads), "constant": self.constant,
                "measurements": self.measurements, "workloads": self.workloads, "weight": self.weight}

    @classmethod
    def from_dict(cls, data: Mapping) -> "StageFit":
        return cls(float(data["compute"]), tuple((str(k), float(v)) for k, v in data["loads"].items()),
                   float(data["constant"]), int(data["measurements"]), int(data["workloads"]))


@dataclass(frozen=True)
class Correction:
    """A device's correction: its fit over every operator, and a fit per operator class."""

    device: str
    overall: StageFit
    classes: tuple[tuple[str, StageFit], ...] = ()

    @property
    def measurements(self) -> int:
        return self.overall.measurements

    def fitted(self, stages: Stages, op: str | None = None) -> float:
        """The fit's time for `stages` of operator `op`: the class's fit blended with the device's
        by the class's weight (the device's alone for no op, or an op without a class fit)."""
        device = self.overall.seconds(stages)
        own = dict(self.classes).get(op_class(op)) if op is not None else None
        if own is None:
            return device
        return blend(device, own.seconds(stages), own.weight)

    def apply(self, estimate, op: str | None = None) -> float:
        """Corrected seconds of `estimate` (an `Estimate` or its stored dict) of operator `op`:
        the model's prediction blended with the fit by the fit's weight."""
        stages = stages_of(estimate)
        return blend(stages.predicted_seconds, self.fitted(stages, op), self.overall.weight)

    def to_dict(self) -> dict:
        return {"device": self.device, "measurements": self.measurements, "overall": self.overall.to_dict(),
                "classes": {name: fit.to_dict() for name, fit in self.classes}}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Correction":
        return cls(str(data["device"]), StageFit.from_dict(data["overall"]),
                   tuple((str(k), StageFit.from_dict(v)) for k, v in data.get("classes", {}).items()))


def blend(prior: float, fitted: float, weight: float) -> float:
    """prior^(1 - weight) x fitted^weight. A fit of 0 s (every coefficient 0 for these stages)
    is no time at all and no evidence: the prior stands."""
    if fitted <= 0.0 or prior <= 0.0:
        return prior
    return math.exp((1.0 - weight) * math.log(prior) + weight * math.log(fitted))


def corrected_seconds(estimate, correction: Correction | None, op: str | None = None) -> float:
    """What the front door shows as the corrected prediction: `correction.apply`, or the model's
    own prediction where the device has no correction yet."""
    if correction is None:
        return stages_of(estimate).predicted_seconds
    return correction.apply(estimate, op)


# -- fitting ---------------------------------------------------------------------------------------


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method: free
    variables join the passive set by largest gradient; a step that would turn one negative stops
    at the boundary and drops it)."""
    m, n = a.shape
    norms = np.linalg.norm(a, axis=0)
    usable = norms > 0  # a stage absent from every row: its coefficient stays 0
    scaled = np.where(usable, a / np.where(usable, norms, 1.0), 0.0)  # unit columns: well conditioned
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * max(m, n) * max(1.0, float(np.abs(scaled).sum(axis=0).max()))
    for _ in range(3 * n + 3):  # each round adds one variable; drops are bounded by the adds
        gradient = scaled.T @ (b - scaled @ x)
        candidates = ~passive & usable & (gradient > tol)
        if not candidates.any():
            break
        passive[int(np.argmax(np.where(candidates, gradient, -np.inf)))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(scaled[:, passive], b, rcond=None)[0]
            if (z[passive] > tol).all():
                x = z
                break
            blocked = passive & (z <= tol)
            gap = x[blocked] - z[blocked]  # > 0 but for a just-added variable that stayed at 0
            alpha = float(np.min(np.divide(x[blocked], gap, out=np.zeros_like(gap), where=gap > 0)))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return np.where(usable, x / np.where(usable, norms, 1.0), 0.0)


def layers_of(rows: Iterable[Row]) -> tuple[str, ...]:
    """The memory layers loaded from in `rows`, in first-seen order."""
    seen: dict[str, None] = {}
    for row in rows:
        for layer, _ in row.stages.load_seconds:
            seen.setdefault(layer)
    return tuple(seen)


def fit_stages(rows: Sequence[Row], layers: Sequence[str]) -> StageFit:
    """The non-negative relative-error fit of `rows` (module docstring), each workload's rows
    weighing 1 together."""
    if not rows:
        raise ValueError("no rows to fit")
    columns = [COMPUTE, *layers, CONSTANT]
    x = np.array([[r.stages.compute_seconds, *(dict(r.stages.load_seconds).get(l, 0.0) for l in layers), 1.0]
                  for r in rows])
    y = np.array([r.measured_seconds for r in rows])
    per_workload: dict[str, int] = {}
    for r in rows:
        per_workload[r.workload] = per_workload.get(r.workload, 0) + 1
    row_weight = np.sqrt([1.0 / per_workload[r.workload] for r in rows])  # squared residuals: sqrt
    coef = nnls(x / y[:, None] * row_weight[:, None], row_weight)
    fitted = dict(zip(columns, coef.tolist()))
    return StageFit(fitted[COMPUTE], tuple((l, fitted[l]) for l in layers), fitted[CONSTANT], len(rows),
                    len(per_workload))


def fit(rows: Sequence[Row], device: str) -> Correction:
    """The correction of `device` fitted on `rows` (its measurements): one fit over all of them,
    and one per operator class that has rows (`OTHER` excluded: it is no class)."""
    if not rows:
        raise UserError(f"device {device}: no correct measurements to fit a correction on")
    layers = layers_of(rows)
    by_class: dict[str, list[Row]] = {}
    for r in rows:
        if op_class(r.op) != OTHER:
            by_class.setdefault(op_class(r.op), []).append(r)
    return Correction(device, fit_stages(rows, layers),
                      tuple((name, fit_stages(rs, layers)) for name, rs in sorted(by_class.items())))


# -- evaluation ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadScore:
    """Before and after for one held-out workload."""

    workload: str
    measurements: int
    before_error: float  # median |log(predicted / measured)|
    after_error: float
    before_spearman: float  # NaN: fewer than two measurements, or a constant prediction
    after_spearman: float

    def to_dict(self) -> dict:
        return {"workload": self.workload, "measurements": self.measurements,
                "before_error": self.before_error, "after_error": self.after_error,
                "before_spearman": json_float(self.before_spearman), "after_spearman": json_float(self.after_spearman)}


def earned(evaluation: Mapping) -> bool:
    """Whether a correction with this evaluation (`Evaluation.to_dict`, as the store keeps it)
    applies by default (module docstring): held-out mean Spearman after > before, both defined,
    and held-out median |log error| after <= before."""
    before, after = evaluation["before"], evaluation["after"]
    if before["spearman"] is None or after["spearman"] is None:
        return False
    return after["spearman"] > before["spearman"] and after["error"] <= before["error"]


def verdict(claim: bool, p_value: str) -> str:
    """What an evaluation allows one to say, with its p-value as the face formats it."""
    return f"the correction helps (signed-rank p = {p_value})" if claim else f"no improvement shown (signed-rank p = {p_value})"


@dataclass(frozen=True)
class Evaluation:
    """Leave-one-workload-out before/after of a device's correction (module docstring)."""

    device: str
    measurements: int
    workloads: tuple[WorkloadScore, ...]
    before_error: float  # median over all measurements of |log(predicted / measured)|
    after_error: float
    before_spearman: float  # mean over the workloads where it is defined
    after_spearman: float
    improved: int  # held-out workloads whose error fell
    p_value: float  # one-sided Wilcoxon signed-rank test of the per-workload error differences

    @property
    def claim(self) -> bool:
        """Whether the correction demonstrably helps: the signed-rank test rejects chance."""
        return self.p_value < CLAIM_LEVEL

    def summary(self) -> str:
        """One line: the numbers, and what they allow one to say."""
        return (f"{self.device}: {self.measurements} measurements of {len(self.workloads)} workloads, "
                f"held-out median |log(pred/meas)| {self.before_error:.3f} -> {self.after_error:.3f} "
                f"(x{math.exp(self.before_error):.2f} -> x{math.exp(self.after_error):.2f}), "
                f"mean Spearman {signed(self.before_spearman)} -> {signed(self.after_spearman)}; "
                f"error lower in {self.improved}/{len(self.workloads)} workloads: "
                f"{verdict(self.claim, f'{self.p_value:.3g}')}")

    def to_dict(self) -> dict:
        doc = {"device": self.device, "measurements": self.measurements,
               "before": {"error": self.before_error, "spearman": json_float(self.before_spearman)},
               "after": {"error": self.after_error, "spearman": json_float(self.after_spearman)},
               "improved": self.improved, "p_value": self.p_value, "claim": self.claim,
               "workloads": [w.to_dict() for w in self.workloads]}
        return doc | {"earned": earned(doc)}

    @property
    def earned(self) -> bool:
        """Whether the correction applies by default (`earned`)."""
        return self.to_dict()["earned"]


def evaluate(rows: Sequence[Row], device: str) -> Evaluation:
    """Score the correction of `device` on `rows` by leave-one-workload-out cross-validation."""
    names = sorted({r.workload for r in rows})
    if len(names) < MIN_WORKLOADS:
        raise UserError(f"device {device}: {len(rows)} measurements of {len(names)} workload(s); fitting and "
                        f"scoring a correction needs correct measurements of at least {MIN_WORKLOADS} workloads")
    scores, before_all, after_all = [], [], []
    for name in names:
        held = [r for r in rows if r.workload == name]
        correction = fit([r for r in rows if r.workload != name], device)
        measured = [r.measured_seconds for r in held]
        before = [r.stages.predicted_seconds for r in held]
        after = [correction.apply(r.stages, r.op) for r in held]
        b_err, a_err = _log_errors(before, measured), _log_errors(after, measured)
        before_all += b_err
        after_all += a_err
        scores.append(WorkloadScore(name, len(held), float(np.median(b_err)), float(np.median(a_err)),
                                    spearman(before, measured), spearman(after, measured)))
    improved = sum(s.after_error < s.before_error for s in scores)
    return Evaluation(device, len(rows), tuple(scores), float(np.median(before_all)), float(np.median(after_all)),
                      nan_mean([s.before_spearman for s in scores]), nan_mean([s.after_spearman for s in scores]),
                      improved, signed_rank_test([s.before_error - s.after_error for s in scores]))


def signed_rank_test(gains: Sequence[float]) -> float:
    """One-sided exact Wilcoxon signed-rank test that `gains` are centred above 0: the chance of
    a positive rank sum at least this large when every sign is a fair coin. Zero gains are left
    out; tied magnitudes share their average rank (counted in half-ranks to stay whole numbers).
    1 when no gain is non-zero."""
    nonzero = [g for g in gains if g != 0]
    if not nonzero:
        return 1.0
    half_ranks = np.rint(2 * average_ranks([abs(g) for g in nonzero])).astype(int)
    observed = int(sum(r for r, g in zip(half_ranks, nonzero) if g > 0))
    ways = np.zeros(int(half_ranks.sum()) + 1)  # ways[t]: sign patterns whose positive half-ranks sum to t
    ways[0] = 1.0
    for r in half_ranks:
        ways[r:] = ways[r:] + ways[:-r].copy()
    return float(ways[observed:].sum() / 2.0 ** len(nonzero))


def _log_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    return [abs(math.log(p / m)) for p, m in zip(predicted, measured)]
