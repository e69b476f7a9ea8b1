"""Two sets of stored runs compared workload by workload: what got faster, what got slower, and
whether the runs can tell (`workbench runs compare`, the Runs page's Compare view, the comparison
report).

A side's time for a workload is its best kernel's: in each of the side's runs of the workload, the
correct candidate with the lowest median repeat; that median is the run's time. Runs are the unit:
a host drifts between runs by more than a run's repeats show (within-run repeats share the run's
load, clock and placement), so the repeats only make each run's time; the ratio compares runs.

The model is hierarchical: a run's log time is the code's true log time plus a between-run drift of
sd sigma (the run's own repeat noise folded in). B / A is exp of the difference of the sides' mean
log run times, and its interval Student's t on sigma * sqrt(1/m + 1/n) for m and n runs a side.
sigma is moderated (`Noise`): each workload's spread of its runs within each side, pooled over the
two sides, joins a prior worth DRIFT_DF degrees of freedom; the prior is `--drift` where given,
else the spread pooled over every compared workload whose sides hold several runs, else (too few)
the drift measured on a shared host (DRIFT). With one run a side the prior alone sets the width (the "drift
floor" model); the output says which model each workload used and how many runs each side pooled.
The stated confidence is the interval's coverage under this model.

A verdict claims a change only when the whole interval lies beyond MARGIN: a change smaller than
that is below what the benchmarks resolve (`noise.SETTLE`). The default confidence is 99 %: a
same-code comparison may then flag at most 1 % of workloads, which is the false-alarm target; 95 %
would allow 5 %. How many runs a side a 5 % slowdown needs depends on the host's drift
(docs/benchmarks.md, "Same code, two runs").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from workbench.errors import UserError
from workbench.fmt import duration
from workbench.profile.noise import SETTLE, median_interval
from workbench.profile.provenance import busy
from workbench.profile.store import RunRecord, RunStore

MARGIN = SETTLE  # a ratio within 1 +- 1 % is "no detectable change" whatever the interval
CONFIDENCE = 0.99
# The sd of a run's log time about the code's true time: the prior a comparison of one run a side
# leans on. Measured on this project's shared 2-core AVX2 EPYC (2026-11-28 20:33-21:23 UTC, commit
# eff2e92, load average 2.7 to 20): twelve same-code `bench kernels --suite cpu-core --topk 3` runs,
# the spread of each workload's run times pooled over its 13 workloads, 0.70 with 143 degrees of
# freedom (docs/benchmarks.md, "Same code, two runs"). A quiet machine drifts far less: `--drift`.
DRIFT = 0.70
# The degrees of freedom the prior is worth beside a workload's own runs: as much as three runs a side
# (4), so that a workload's own spread outweighs it from four runs a side on.
DRIFT_DF = 4
RUNS, FLOOR = "between-run spread", "drift floor"  # the noise models: the sides' own runs, or the prior alone
FASTER, SLOWER, SAME, NOT_COMPARABLE = "faster", "slower", "no detectable change", "not comparable"
VERDICTS = (FASTER, SLOWER, SAME, NOT_COMPARABLE)
KEYS = ("label", "device", "commit", "policy", "workload", "since", "until", "run")
BUSY_NAMED = 8  # busy runs named by id in the warning; more are counted
MIN_COMMIT = 4  # hex digits of a commit prefix; fewer would match commits by accident


# -- selectors ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """A set of runs: `KEY=VALUE` terms joined by commas; terms of one key are alternatives (any
    may match), terms of different keys must all match. Keys: label, device, policy, workload
    (exact), commit (a prefix of at least 4 hex digits), since / until (a date YYYY-MM-DD, or a
    date and time YYYY-MM-DDTHH:MM, local time; a bare `until` date includes that whole day), run
    (an id or a range FIRST-LAST)."""

    text: str
    terms: tuple[tuple[str, str], ...]

    @staticmethod
    def parse(text: str, option: str = "selector") -> "Selector":
        """The selector of `text`; UserError naming `option` for a malformed one."""
        terms = []
        for part in (p.strip() for p in text.split(",")):
            key, eq, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not value:
                raise UserError(f"{option} {text!r}: {part!r} is not KEY=VALUE (keys: {', '.join(KEYS)})")
            if key not in KEYS:
                raise UserError(f"{option} {text!r}: unknown key {key!r} (keys: {', '.join(KEYS)})")
            _check_value(option, text, key, value)
            terms.append((key, value))
        return Selector(text, tuple(terms))

    def matches(self, run: RunRecord) -> bool:
        by_key: dict[str, list[str]] = {}
        for key, value in self.terms:
            by_key.setdefault(key, []).append(value)
        return all(any(_match(run, key, value) for value in values) for key, values in by_key.items())

    def select(self, runs: Sequence[RunRecord]) -> tuple[RunRecord, ...]:
        return tuple(r for r in runs if self.matches(r))


def _check_value(option: str, text: str, key: str, value: str) -> None:
    if key == "commit" and not re.fullmatch(r"[0-9a-fA-F]{%d,40}" % MIN_COMMIT, value):
        raise UserError(f"{option} {text!r}: commit={value!r} is not a commit ({MIN_COMMIT} to 40 hex digits)")
    if key in ("since", "until"):
        _when(value, key == "until", f"{option} {text!r}: {key}")
    if key == "run" and not re.fullmatch(r"\d{1,18}(-\d{1,18})?", value):
        raise UserError(f"{option} {text!r}: run={value!r} is not a run id or a range FIRST-LAST")


def _when(value: str, end_of_day: bool, what: str) -> float:
    """The timestamp of a date (its start, or with `end_of_day` the start of the next day) or a
    date and time."""
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            day = datetime.strptime(value, "%Y-%m-%d")
            return (day + timedelta(days=1) if end_of_day else day).timestamp()
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise UserError(f"{what}={value!r} is not a date YYYY-MM-DD or a date and time YYYY-MM-DDTHH:MM") from None


def _match(run: RunRecord, key: str, value: str) -> bool:
    if key == "label":
        return run.label == value
    if key == "device":
        return run.device == value
    if key == "policy":
        return run.policy == value
    if key == "workload":
        return run.workload == value
    if key == "commit":
        return bool(run.commit) and run.commit.lower().startswith(value.lower())
    if key == "since":
        return run.started_at >= _when(value, False, key)
    if key == "until":
        return run.started_at < _when(value, True, key) if "T" not in value else run.started_at <= _when(value, False, key)
    first, _, last = value.partition("-")
    return int(first) <= run.id <= int(last or first)


def select_runs(store: RunStore, selector: Selector, option: str) -> tuple[RunRecord, ...]:
    """The finished runs of `store` that `selector` picks; UserError when there are none."""
    runs = tuple(r for r in selector.select(store.runs()) if r.finished_at is not None and not r.cancelled)
    if not runs:
        raise UserError(f"{option} {selector.text!r}: no finished run in {store.path} matches")
    return runs


# -- the run-level interval ----------------------------------------------------------------------


def t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's T with `df` (a positive integer) degrees of freedom, in closed form
    (Abramowitz & Stegun, Handbook of Mathematical Functions, 26.7.3 and 26.7.4)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be a positive integer, got {df}")
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2 4/(3 5) cos^4 + ...)), the sum's last power cos^(df-3)
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for j in range(1, (df - 1) // 2):
            term *= 2 * j / (2 * j + 1) * c2
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin (1 + 1/2 cos^2 + 1 3/(2 4) cos^4 + ...), the last power cos^(df-2)
    for j in range(1, df // 2):
        term *= (2 * j - 1) / (2 * j) * c2
        total += term
    return math.sin(theta) * total


@lru_cache(maxsize=256)
def t_quantile(confidence: float, df: int) -> float:
    """The t with P(|T| <= t) = `confidence` under `df` degrees of freedom (bisection to 1e-12)."""
    low, high = 0.0, 1.0
    while t_two_sided(high, df) < confidence:
        high *= 2
    while high - low > 1e-12 * high:
        mid = (low + high) / 2
        low, high = (mid, high) if t_two_sided(mid, df) < confidence else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class Noise:
    """How much a run's time of a workload moves from one run of the same code to the next.

    `drift` is the prior standard deviation of a run's log time (its best kernel's median repeat)
    about the code's true time, and `drift_df` the degrees of freedom it is worth: it joins each
    workload's own run-to-run spread as a prior joins a sample variance (Smyth, Linear models and
    empirical Bayes methods for assessing differential expression, 2004: the moderated variance).
    With one run a side the prior alone sets the interval's width."""

    drift: float = DRIFT
    drift_df: int = DRIFT_DF
    source: str = "default"  # "default" (DRIFT), "pooled ..." (`pooled`), or the option that set it

    @staticmethod
    def pooled(sides: Sequence[tuple[Sequence[float], Sequence[float]]], fallback: "Noise") -> "Noise":
        """The prior estimated from every workload's sides (per-run log times of A and of B): the
        sides' run-to-run spreads pooled over the workloads, the hierarchical model's between-run
        variance, worth DRIFT_DF; `fallback` when they hold fewer than DRIFT_DF degrees of freedom
        (too few sides of several runs)."""
        parts = [_spread(x) for pair in sides for x in pair]
        ss, d = sum(p[0] for p in parts), sum(p[1] for p in parts)
        if d < DRIFT_DF or ss <= 0:
            return fallback
        workloads = sum(any(len(x) > 1 for x in pair) for pair in sides)
        return Noise(math.sqrt(ss / d), DRIFT_DF, f"pooled over the compared runs: {d} degrees of freedom from "
                                                  f"{workloads} workloads")

    def spread(self, runs_a: Sequence[float], runs_b: Sequence[float]) -> tuple[float, int, str]:
        """(sd of one run's log time, its degrees of freedom, the model's name) for two sides'
        per-run log times: the within-side spreads pooled with the prior."""
        (ss_a, d_a), (ss_b, d_b) = _spread(runs_a), _spread(runs_b)
        d, ss = d_a + d_b, ss_a + ss_b
        df = self.drift_df + d
        if df < 1:
            raise UserError("a comparison of one run a side needs a between-run drift above 0 worth at least one "
                            "degree of freedom")
        return math.sqrt((self.drift_df * self.drift ** 2 + ss) / df), df, RUNS if d else FLOOR

    def to_dict(self) -> dict:
        return {"drift": self.drift, "drift_df": self.drift_df, "source": self.source}


def _spread(logs: Sequence[float]) -> tuple[float, int]:
    """(sum of squared deviations from their mean, degrees of freedom) of one side's per-run logs."""
    x = np.asarray(logs, dtype=float)
    return (float(((x - x.mean()) ** 2).sum()), len(x) - 1) if len(x) else (0.0, 0)


@dataclass(frozen=True)
class RatioInterval:
    ratio: float  # B / A: exp of the difference of the sides' mean log run times
    low: float
    high: float
    level: float  # the interval's coverage under the noise model (the confidence asked for)
    runs_a: int
    runs_b: int
    spread: float  # the sd of one run's log time used
    df: int
    model: str  # RUNS or FLOOR

    def to_dict(self) -> dict:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "level": self.level, "runs_a": self.runs_a,
                "runs_b": self.runs_b, "spread": self.spread, "df": self.df, "model": self.model}


def ratio_interval(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE,
                   noise: Noise = Noise()) -> RatioInterval | None:
    """B / A from each side's per-run times (`a`, `b`: one time per run, its best kernel's median
    repeat) with the Student-t interval of the difference of their mean logs at `confidence`: the
    sd of one run's log time from `noise.spread`, each side's mean over its runs; None when a side
    is empty."""
    if not len(a) or not len(b):
        return None
    x, y = np.log(np.asarray(a, dtype=float)), np.log(np.asarray(b, dtype=float))
    sd, df, model = noise.spread(x, y)
    shift = float(y.mean() - x.mean())
    half = t_quantile(confidence, df) * sd * math.sqrt(1 / len(x) + 1 / len(y))
    return RatioInterval(math.exp(shift), math.exp(shift - half), math.exp(shift + half), confidence,
                         len(x), len(y), sd, df, model)


def verdict(interval: RatioInterval | None, margin: float = MARGIN) -> tuple[str, str]:
    """(verdict, why) for a ratio interval."""
    if interval is None:
        return NOT_COMPARABLE, "no correct measurement on one side"
    if interval.low > 1 + margin:
        return SLOWER, ""
    if interval.high < 1 / (1 + margin):
        return FASTER, ""
    return SAME, ""


# -- the comparison -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One side's best kernel of a workload: which (run, rank) per run, each run's time (its best
    kernel's median repeat), and their repeats pooled (for the median's order-statistics interval
    shown beside it; the ratio's interval treats the runs as the unit)."""

    kernels: tuple[tuple[int, int], ...]  # (run id, candidate rank), one per run with a correct kernel
    run_seconds: tuple[float, ...]  # per run of `kernels`: its best kernel's median repeat
    seconds: tuple[float, ...]
    predicted_seconds: float  # the predicted time of the first run's best kernel
    # (run id, rank): each run's CONTENDERS fastest correct kernels, which `remeasure` times again
    contenders: tuple[tuple[int, int], ...] = ()

    @property
    def best_seconds(self) -> float:
        return min(self.seconds)

    @property
    def median_seconds(self) -> float:
        return float(np.median(self.seconds))

    def to_dict(self, confidence: float) -> dict:
        iv = median_interval(self.seconds, confidence)
        return {"runs": [r for r, _ in self.kernels], "kernels": [{"run": r, "rank": k} for r, k in self.kernels],
                "run_seconds": list(self.run_seconds), "samples": len(self.seconds), "best_seconds": self.best_seconds,
                "median_seconds": self.median_seconds, "median_low": iv.low, "median_high": iv.high,
                "median_level": iv.level, "predicted_seconds": self.predicted_seconds}


@dataclass(frozen=True)
class Remeasured:
    """One workload's kernels timed here in turn (`profile.remeasure`): each side's contenders
    (run, rank, the geometric mean of its rounds), the one each side ran fastest here, and per
    round that one's median repeat. A program both sides stored is timed once, for both."""

    kernel_a: tuple[int, int]
    kernel_b: tuple[int, int]
    seconds_a: tuple[float, ...]
    seconds_b: tuple[float, ...]
    contenders_a: tuple[tuple[int, int, float], ...] = ()
    contenders_b: tuple[tuple[int, int, float], ...] = ()
    same_program: bool = False  # both sides' fastest here is one program

    @property
    def here_seconds(self) -> tuple[float, float]:
        """The geometric mean of the rounds of the kernel each side ran fastest here (A, B)."""
        return tuple(next(t for r, k, t in contenders if (r, k) == kernel)
                     for kernel, contenders in ((self.kernel_a, self.contenders_a), (self.kernel_b, self.contenders_b)))

    def to_dict(self) -> dict:
        return {side: {"run": kernel[0], "rank": kernel[1], "round_seconds": list(seconds),
                       "contenders": [{"run": r, "rank": k, "seconds": t} for r, k, t in contenders]}
                for side, kernel, seconds, contenders in (("a", self.kernel_a, self.seconds_a, self.contenders_a),
                                                          ("b", self.kernel_b, self.seconds_b, self.contenders_b))} \
            | {"same_program": self.same_program}


@dataclass(frozen=True)
class WorkloadComparison:
    workload: str
    device: str  # the devices the two sides ran on, "A / B" when they differ
    a: Side | None
    b: Side | None
    interval: RatioInterval | None
    verdict: str
    why: str
    remeasured: Remeasured | None = None  # the two kernels timed here in turn (`remeasure`), when asked

    def slower_by_more_than(self, share: float) -> bool:
        """Slower beyond noise (the verdict) with even the interval's low end more than `share` slower."""
        return self.verdict == SLOWER and self.interval.low > 1 + share

    def to_dict(self, confidence: float) -> dict:
        return {"workload": self.workload, "device": self.device,
                "a": self.a.to_dict(confidence) if self.a else None,
                "b": self.b.to_dict(confidence) if self.b else None,
                "ratio": self.interval.ratio if self.interval else None,
                "ratio_low": self.interval.low if self.interval else None,
                "ratio_high": self.interval.high if self.interval else None,
                "ratio_level": self.interval.level if self.interval else None,
                "noise_model": self.interval.model if self.interval else None,
                "run_spread": self.interval.spread if self.interval else None,
                "run_spread_df": self.interval.df if self.interval else None,
                "verdict": self.verdict, "why": self.why,
                "remeasured": self.remeasured.to_dict() if self.remeasured else None}


@dataclass(frozen=True)
class RunsComparison:
    a: Selector
    b: Selector
    a_runs: tuple[int, ...]
    b_runs: tuple[int, ...]
    confidence: float
    margin: float
    workloads: tuple[WorkloadComparison, ...]
    busy_runs: tuple[int, ...] = ()  # runs that started on a busy machine (`provenance.busy`)
    noise: Noise = Noise()
    rounds: int = 0  # > 0: the workloads' kernels were timed here in turn, this many rounds (`remeasure`)

    def busy_note(self) -> str:
        """A sentence when runs of either side started on a busy machine, "" otherwise."""
        if not self.busy_runs:
            return ""
        total = len(set(self.a_runs + self.b_runs))
        named = ", ".join(map(str, self.busy_runs[:BUSY_NAMED])) + (
            f" and {len(self.busy_runs) - BUSY_NAMED} more" if len(self.busy_runs) > BUSY_NAMED else "")
        which = f"all {total} runs" if len(self.busy_runs) == total > 1 else f"runs {named}"
        return (f"{which} started on a busy machine (load average at least "
                f"half its CPUs): other work slowed them by amounts that differ from run to run, which their "
                f"repeats cannot show; a side of one run leans on the drift prior alone "
                f"({self.noise.drift:.1%}), so verdicts involving them may be false alarms: pool several runs a "
                f"side, or compare runs made on a quiet machine")

    def counts(self) -> dict[str, int]:
        return {v: sum(w.verdict == v for w in self.workloads) for v in VERDICTS}

    def regressions(self, pct: float) -> tuple[WorkloadComparison, ...]:
        return tuple(w for w in self.workloads if w.slower_by_more_than(pct / 100))

    def to_dict(self, fail_on_regression: float | None = None) -> dict:
        """The JSON document of `workbench runs compare --json` (docs/cli.md)."""
        return {
            "a": {"selector": self.a.text, "runs": list(self.a_runs)},
            "b": {"selector": self.b.text, "runs": list(self.b_runs)},
            "confidence": self.confidence,
            "margin": self.margin,
            "noise": self.noise.to_dict(),
            "remeasured_rounds": self.rounds,
            "workloads": [w.to_dict(self.confidence) for w in self.workloads],
            "counts": self.counts(),
            "busy_runs": list(self.busy_runs),
            "fail_on_regression": fail_on_regression,
            "regressions": [w.workload for w in self.regressions(fail_on_regression)]
            if fail_on_regression is not None else [],
        }


# A run's fastest few kernels are near ties more often than not (against one same-code run of
# cpu-core on the Zen 4, three others kept another of their top three on 3 to 10 of 13 workloads,
# and timed in turn the one a run kept was up to 5 % slower: docs/benchmarks.md, "Remeasured in
# turn"), so the remeasure times each run's three fastest again, not the one its drift picked.
CONTENDERS = 3


def ranked_kernels(store: RunStore, run: RunRecord) -> list[tuple[int, tuple[float, ...], float]]:
    """(rank, repeats, predicted seconds) of the run's correct, timed candidates, fastest median
    repeat first (ties: the lower rank)."""
    found = [(m.measurement.median_seconds, m.rank, tuple(m.measurement.seconds), m.predicted_seconds)
             for m in store.measurements_of(run.id) if m.measurement.ok and m.measurement.seconds]
    return [(rank, seconds, predicted) for _, rank, seconds, predicted in sorted(found, key=lambda f: (f[0], f[1]))]


def side_of(store: RunStore, runs: Sequence[RunRecord]) -> Side | None:
    kernels, per_run, seconds, predicted, contenders = [], [], [], None, []
    for run in runs:
        ranked = ranked_kernels(store, run)
        if not ranked:
            continue
        rank, repeats, p = ranked[0]
        kernels.append((run.id, rank))
        contenders.extend((run.id, r) for r, _, _ in ranked[:CONTENDERS])
        per_run.append(float(np.median(repeats)))
        seconds.extend(repeats)
        predicted = p if predicted is None else predicted
    return Side(tuple(kernels), tuple(per_run), tuple(seconds), predicted, tuple(contenders)) if kernels else None


def compare_sides(workload: str, device: str, a: Side | None, b: Side | None, confidence: float,
                  margin: float = MARGIN, noise: Noise = Noise()) -> WorkloadComparison:
    if a is None or b is None:
        why = "no correct measurement in " + ("A" if a is None and b is not None else "B" if b is None and a is not None
                                               else "either side")
        return WorkloadComparison(workload, device, a, b, None, NOT_COMPARABLE, why)
    interval = ratio_interval(a.run_seconds, b.run_seconds, confidence, noise)
    v, why = verdict(interval, margin)
    return WorkloadComparison(workload, device, a, b, interval, v, why)


def compare_runs(store: RunStore, a: Selector, b: Selector, confidence: float = CONFIDENCE,
                 margin: float = MARGIN, noise: Noise | None = None) -> RunsComparison:
    """Every workload either side ran, compared (see the module's docstring) under `noise`, by
    default the prior pooled over the compared runs (`Noise.pooled`), else `Noise()`; UserError
    when a selector picks no finished run or the confidence is not in (0, 1)."""
    if not 0 < confidence < 1:
        raise UserError(f"--confidence must be between 0 and 1 (exclusive), got {confidence}")
    runs_a, runs_b = select_runs(store, a, "--a"), select_runs(store, b, "--b")
    labels = list(dict.fromkeys([r.workload for r in runs_a] + [r.workload for r in runs_b]))
    sides = []
    for label in labels:
        mine = [r for r in runs_a if r.workload == label]
        theirs = [r for r in runs_b if r.workload == label]
        devices = list(dict.fromkeys(r.device for r in mine + theirs))
        sides.append((label, " / ".join(devices), side_of(store, mine), side_of(store, theirs)))
    if noise is None:
        noise = Noise.pooled([(np.log(sa.run_seconds), np.log(sb.run_seconds)) for *_, sa, sb in sides if sa and sb],
                             Noise())
    rows = [compare_sides(label, device, sa, sb, confidence, margin, noise) for label, device, sa, sb in sides]
    busy_runs = tuple(r.id for r in runs_a + runs_b if busy(dict(r.provenance)))
    return RunsComparison(a, b, tuple(r.id for r in runs_a), tuple(r.id for r in runs_b), confidence, margin,
                          tuple(rows), tuple(sorted(set(busy_runs))), noise)


def text(comparison: RunsComparison, fail_on_regression: float | None = None) -> str:
    """The comparison as `runs compare` prints it: a line per workload and the counts."""
    c = comparison
    lines = [f"A: {c.a.text} ({len(c.a_runs)} runs)   B: {c.b.text} ({len(c.b_runs)} runs)   "
             f"confidence {c.confidence:.0%}, changes under {c.margin:.0%} count as none",
             f"noise: {remeasured_text(c.rounds) if c.rounds else noise_text(c.noise)}",
             f"{'workload':24s} {'A median [interval]':>30s} {'B median [interval]':>30s} {'B/A [interval]':>22s} "
             f"{'runs':>5s} {'run sd':>6s}  verdict"]
    for w in c.workloads:
        cells = []
        here = (w.remeasured.seconds_a, w.remeasured.seconds_b) if w.remeasured else (None, None)
        for side, remeasured in zip((w.a, w.b), here):
            if side is None:
                cells.append(f"{'-':>30s}")
                continue
            seconds = remeasured or side.seconds  # the rounds timed here, when remeasured
            iv = median_interval(seconds, c.confidence)
            cells.append(f"{duration(float(np.median(seconds))):>9s} [{duration(iv.low)}, {duration(iv.high)}]".rjust(30))
        ratio = (f"{w.interval.ratio:.3f} [{w.interval.low:.3f}, {w.interval.high:.3f}]" if w.interval else "-")
        runs = f"{w.interval.runs_a}/{w.interval.runs_b}" if w.interval else "-"
        sd = f"{w.interval.spread:.1%}" + ("*" if w.interval.model == FLOOR else "") if w.interval else "-"
        lines.append(f"{w.workload[:24]:24s} {cells[0]} {cells[1]} {ratio:>22s} {runs:>5s} {sd:>6s}  {w.verdict}"
                     + (f" ({w.why})" if w.why else ""))
    counts = c.counts()
    lines.append(", ".join(f"{n} {v}" for v, n in counts.items()) + f" of {len(c.workloads)} workloads")
    if c.busy_runs:
        lines.append(f"warning: {c.busy_note()}")
    if fail_on_regression is not None:
        bad = c.regressions(fail_on_regression)
        lines.append(f"regressions beyond {fail_on_regression:g} %: " + (", ".join(w.workload for w in bad) or "none"))
    return "\n".join(lines)


def noise_text(noise: Noise) -> str:
    """The noise model in a sentence, as the text, the report and the Runs page state it."""
    return (f"runs are the unit: B/A is the ratio of the sides' mean log run times (a run's time: its best "
            f"kernel's median repeat), its interval Student's t on the sd of one run's log time, the sides' "
            f"run-to-run spread pooled with a drift prior of {noise.drift:.1%} worth {noise.drift_df} degrees of "
            f"freedom ({noise.source}); with one run a side the prior alone sets it (run sd marked *)")


def remeasured_text(rounds: int) -> str:
    """How a remeasured comparison decides, in a sentence (`remeasure`)."""
    return (f"remeasured here in turn: each side's stored kernels (each run's {CONTENDERS} fastest) rebuilt, checked "
            f"and timed one after another, {rounds} rounds (a time: the kernel's median repeat; a program both sides "
            f"stored timed once); each side's fastest here by the geometric mean of its rounds; B/A is exp of the mean "
            f"of the rounds' log ratios of those two, its interval Student's t on their spread (rounds in the runs "
            f"column, the rounds' sd in the run sd column)")


def mapping_selector(values: Mapping[str, str | Sequence[str]], text: str = "") -> Selector:
    """A selector from {key: value or values} (the dashboard's pickers), checked as `parse` does."""
    terms = tuple((key, v) for key, value in values.items() for v in ([value] if isinstance(value, str) else value))
    if not terms:
        raise UserError("pick at least one of label, device, commit, policy for each side")
    for key, v in terms:
        if key not in KEYS:
            raise UserError(f"unknown selector key {key!r} (keys: {', '.join(KEYS)})")
        _check_value("selector", text, key, v)
    return Selector(text or ",".join(f"{k}={v}" for k, v in terms), terms)
