"""Two sets of stored runs compared workload by workload: what got faster, what got slower, and
whether the repeats can tell (`workbench runs compare`, the Runs page's Compare view, the
comparison report).

A side's time for a workload is its best kernel's: in each of the side's runs of the workload,
the correct candidate with the lowest median repeat, the repeats of those kernels pooled over the
side's runs (so run-to-run drift widens the side's spread instead of hiding). Its interval is the
order-statistics interval of their median (`profile.noise`).

The ratio B / A is the Hodges-Lehmann estimate of the shift between the two sides' log times
(the median of all pairwise differences), and its interval the distribution-free one that
inverts the Mann-Whitney test: [d(k), d(mn+1-k)] of the m x n sorted differences, k chosen from
the exact null distribution of U (Hollander, Wolfe & Chicken, Nonparametric Statistical Methods,
3rd ed., chapter 4: the two-sample location problem). It assumes only that noise acts alike on both sides, as timing noise on one machine
does (a repeat is only ever slowed down, by the same kinds of interference).

A verdict claims a change only when the whole interval lies beyond MARGIN: a change smaller than
that is below what the benchmarks resolve (`noise.SETTLE`), and without the margin a comparison of
the same code would call one workload in 1 / (1 - confidence) slower or faster by chance.
"""

from __future__ import annotations

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
CONFIDENCE = 0.95
# The exact levels are fractions (3 vs 3 repeats: 1 - 2/20 = 0.9); one asked for at exactly such a
# level is reached, whatever the last bit of its floating-point sum.
LEVEL_TOLERANCE = 1e-9
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


# -- the Hodges-Lehmann interval ----------------------------------------------------------------


@lru_cache(maxsize=256)
def mann_whitney_cdf(m: int, n: int) -> np.ndarray:
    """P(U <= u) for u = 0 .. m n under the null (no shift), U the Mann-Whitney count of pairs
    (x, y) with y < x of m x's and n y's, by the recurrence p(u; m, n) = m/(m+n) p(u-n; m-1, n) +
    n/(m+n) p(u; m, n-1) (the largest of the m + n values is an x or a y)."""
    # rows[j]: the distribution for (i, j) at the current i, as an array over u
    rows = [np.ones(1) for _ in range(n + 1)]  # i = 0: U = 0 for any n
    for i in range(1, m + 1):
        new = [np.ones(1)]  # j = 0: U = 0
        for j in range(1, n + 1):
            p = np.zeros(i * j + 1)
            p[j:j + len(rows[j])] += i / (i + j) * rows[j]  # the largest is an x: it beats all j y's
            p[:len(new[j - 1])] += j / (i + j) * new[j - 1]  # the largest is a y
            new.append(p)
        rows = new
    return np.cumsum(rows[n])


@dataclass(frozen=True)
class RatioInterval:
    ratio: float  # the Hodges-Lehmann estimate of B / A
    low: float
    high: float
    level: float  # the interval's exact coverage under the model

    def to_dict(self) -> dict:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "level": self.level}


def ratio_interval(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> RatioInterval | None:
    """The Hodges-Lehmann estimate of the ratio of `b`'s times to `a`'s and the narrowest
    rank-based interval covering it with at least `confidence` (the widest, [min, max] of the
    ratios, with its own lower level when the samples are too few); None when a side is empty."""
    if not len(a) or not len(b):
        return None
    x, y = np.log(np.asarray(a, dtype=float)), np.log(np.asarray(b, dtype=float))
    d = np.sort((y[None, :] - x[:, None]).ravel())
    m, n = len(x), len(y)
    cdf = mann_whitney_cdf(m, n)  # cached: read only
    k = 1  # 1-based: [d(k), d(mn+1-k)] has coverage 1 - 2 P(U <= k-1)
    while k + 1 <= (m * n + 1) // 2 and 1 - 2 * cdf[k] >= confidence - LEVEL_TOLERANCE:
        k += 1
    level = 1 - 2 * cdf[k - 1] if m * n > 1 else 0.0
    return RatioInterval(float(np.exp(np.median(d))), float(np.exp(d[k - 1])), float(np.exp(d[m * n - k])),
                         float(level))


def verdict(interval: RatioInterval | None, confidence: float, margin: float = MARGIN) -> tuple[str, str]:
    """(verdict, why) for a ratio interval at `confidence`."""
    if interval is None:
        return NOT_COMPARABLE, "no correct measurement on one side"
    if interval.level < confidence - LEVEL_TOLERANCE:
        return NOT_COMPARABLE, (f"too few repeats: the widest interval covers {interval.level:.1%}, less than "
                                f"{confidence:.0%}; pool more runs a side, or lower --confidence")
    if interval.low > 1 + margin:
        return SLOWER, ""
    if interval.high < 1 / (1 + margin):
        return FASTER, ""
    return SAME, ""


# -- the comparison -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One side's best kernel of a workload: which (run, rank) per run, its pooled repeats, the
    median with its order-statistics interval."""

    kernels: tuple[tuple[int, int], ...]  # (run id, candidate rank), one per run with a correct kernel
    seconds: tuple[float, ...]
    predicted_seconds: float  # the predicted time of the first run's best kernel

    @property
    def best_seconds(self) -> float:
        return min(self.seconds)

    @property
    def median_seconds(self) -> float:
        return float(np.median(self.seconds))

    def to_dict(self, confidence: float) -> dict:
        iv = median_interval(self.seconds, confidence)
        return {"runs": [r for r, _ in self.kernels], "kernels": [{"run": r, "rank": k} for r, k in self.kernels],
                "samples": len(self.seconds), "best_seconds": self.best_seconds,
                "median_seconds": self.median_seconds, "median_low": iv.low, "median_high": iv.high,
                "median_level": iv.level, "predicted_seconds": self.predicted_seconds}


@dataclass(frozen=True)
class WorkloadComparison:
    workload: str
    device: str  # the devices the two sides ran on, "A / B" when they differ
    a: Side | None
    b: Side | None
    interval: RatioInterval | None
    verdict: str
    why: str

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
                "verdict": self.verdict, "why": self.why}


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
                f"repeats cannot show, so verdicts involving them may be false alarms; compare runs made on a "
                f"quiet machine")

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
            "workloads": [w.to_dict(self.confidence) for w in self.workloads],
            "counts": self.counts(),
            "busy_runs": list(self.busy_runs),
            "fail_on_regression": fail_on_regression,
            "regressions": [w.workload for w in self.regressions(fail_on_regression)]
            if fail_on_regression is not None else [],
        }


def best_kernel(store: RunStore, run: RunRecord) -> tuple[int, tuple[float, ...], float] | None:
    """(rank, repeats, predicted seconds) of the run's correct candidate with the lowest median
    repeat (ties: the lower rank); None when none was correct and timed."""
    found = [(m.measurement.median_seconds, m.rank, m.measurement.seconds, m.predicted_seconds)
             for m in store.measurements_of(run.id) if m.measurement.ok and m.measurement.seconds]
    if not found:
        return None
    _, rank, seconds, predicted = min(found, key=lambda f: (f[0], f[1]))
    return rank, tuple(seconds), predicted


def side_of(store: RunStore, runs: Sequence[RunRecord]) -> Side | None:
    kernels, seconds, predicted = [], [], None
    for run in runs:
        found = best_kernel(store, run)
        if found is None:
            continue
        rank, repeats, p = found
        kernels.append((run.id, rank))
        seconds.extend(repeats)
        predicted = p if predicted is None else predicted
    return Side(tuple(kernels), tuple(seconds), predicted) if kernels else None


def compare_sides(workload: str, device: str, a: Side | None, b: Side | None, confidence: float,
                  margin: float = MARGIN) -> WorkloadComparison:
    interval = ratio_interval(a.seconds, b.seconds, confidence) if a and b else None
    if a is None or b is None:
        why = "no correct measurement in " + ("A" if a is None and b is not None else "B" if b is None and a is not None
                                               else "either side")
        return WorkloadComparison(workload, device, a, b, None, NOT_COMPARABLE, why)
    v, why = verdict(interval, confidence, margin)
    return WorkloadComparison(workload, device, a, b, interval, v, why)


def compare_runs(store: RunStore, a: Selector, b: Selector, confidence: float = CONFIDENCE,
                 margin: float = MARGIN) -> RunsComparison:
    """Every workload either side ran, compared (see the module's docstring); UserError when a
    selector picks no finished run or the confidence is not in (0, 1)."""
    if not 0 < confidence < 1:
        raise UserError(f"--confidence must be between 0 and 1 (exclusive), got {confidence}")
    runs_a, runs_b = select_runs(store, a, "--a"), select_runs(store, b, "--b")
    labels = list(dict.fromkeys([r.workload for r in runs_a] + [r.workload for r in runs_b]))
    rows = []
    for label in labels:
        mine = [r for r in runs_a if r.workload == label]
        theirs = [r for r in runs_b if r.workload == label]
        devices = list(dict.fromkeys(r.device for r in mine + theirs))
        rows.append(compare_sides(label, " / ".join(devices), side_of(store, mine), side_of(store, theirs),
                                  confidence, margin))
    busy_runs = tuple(r.id for r in runs_a + runs_b if busy(dict(r.provenance)))
    return RunsComparison(a, b, tuple(r.id for r in runs_a), tuple(r.id for r in runs_b), confidence, margin,
                          tuple(rows), tuple(sorted(set(busy_runs))))


def text(comparison: RunsComparison, fail_on_regression: float | None = None) -> str:
    """The comparison as `runs compare` prints it: a line per workload and the counts."""
    c = comparison
    lines = [f"A: {c.a.text} ({len(c.a_runs)} runs)   B: {c.b.text} ({len(c.b_runs)} runs)   "
             f"confidence {c.confidence:.0%}, changes under {c.margin:.0%} count as none",
             f"{'workload':24s} {'A median [interval]':>30s} {'B median [interval]':>30s} {'B/A [interval]':>22s}  verdict"]
    for w in c.workloads:
        cells = []
        for side in (w.a, w.b):
            if side is None:
                cells.append(f"{'-':>30s}")
                continue
            iv = median_interval(side.seconds, c.confidence)
            cells.append(f"{duration(side.median_seconds):>9s} [{duration(iv.low)}, {duration(iv.high)}]".rjust(30))
        ratio = (f"{w.interval.ratio:.3f} [{w.interval.low:.3f}, {w.interval.high:.3f}]" if w.interval else "-")
        lines.append(f"{w.workload[:24]:24s} {cells[0]} {cells[1]} {ratio:>22s}  {w.verdict}"
                     + (f" ({w.why})" if w.why else ""))
    counts = c.counts()
    lines.append(", ".join(f"{n} {v}" for v, n in counts.items()) + f" of {len(c.workloads)} workloads")
    if c.busy_runs:
        lines.append(f"warning: {c.busy_note()}")
    if fail_on_regression is not None:
        bad = c.regressions(fail_on_regression)
        lines.append(f"regressions beyond {fail_on_regression:g} %: " + (", ".join(w.workload for w in bad) or "none"))
    return "\n".join(lines)


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
