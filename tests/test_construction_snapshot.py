"""Construction is a pure function of (expression, device, policy, options): the top-K of the
papers' and cpu-core's workloads on fixed specs, as a stored snapshot
(tests/fixtures/construction_topk.json), so that work on construction's speed (memoisation,
cheaper scans, a paused collector) is held to the same candidates in the same order with the
same predictions and the same actions.

A change meant to change candidates rewrites the snapshot, `PYTHONPATH=. python
tests/test_construction_snapshot.py`, and says why in its commit.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import pytest
from helpers import device, suite_workloads, workload_expr

from workbench.construct.space import Options
from workbench.construct.stepper import construct

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_invariants import detected_cpu, KIB  # noqa: E402

SNAPSHOT = Path(__file__).resolve().parent / "fixtures" / "construction_topk.json"
# A 2-core AVX2 core with this development machine's caches and an AVX-512 one, as detection
# builds them (never the machine the tests run on), and a GPU preset.
DEVICES = {
    "avx2": lambda: detected_cpu("avx2", 2, 32 * KIB, 512 * KIB),
    "avx512": lambda: detected_cpu("avx512", 2, 48 * KIB, 2048 * KIB),
    "v100": lambda: device("v100"),
}
# (suite, device, policy, top-K); Markov with its default seed.
CASES = (
    ("roller-table1", "v100", "roller", 10),
    ("cpu-core", "avx2", "roller", 10),
    ("cpu-core", "avx512", "roller", 10),
    ("roller-table1", "v100", "markov", 5),
    ("cpu-core", "avx2", "markov", 5),
)
MARKOV_WORKLOADS = {"M0", "M2", "C0", "D1", "P2", "R0", "mm-512", "mm-skinny", "bmm-attn", "conv-3x3", "dwconv-3x3", "relu"}


def case_id(case) -> str:
    return "-".join(map(str, case))


def _digest(actions: list) -> str:
    """A short digest of a candidate's actions (a Markov walk's run to hundreds)."""
    return hashlib.sha256(json.dumps(actions).encode()).hexdigest()[:16]


def snapshot(case) -> dict[str, list]:
    """The top-K of every workload of the case: per candidate its tiles, grid, split, virtual
    threads, predicted seconds and a digest of the actions that built it."""
    suite, dev, policy, topk = case
    spec = DEVICES[dev]()
    out = {}
    for w in suite_workloads(suite):
        if policy == "markov" and w["id"] not in MARKOV_WORKLOADS:
            continue
        c = construct(workload_expr(w), spec, policy, Options(topk=topk))
        out[w["id"]] = [
            {"tiles": [list(t) for t in cand.program.tiles], "grid": cand.program.grid, "split": cand.program.split,
             "vthreads": [list(v) for v in cand.program.vthreads], "predicted_seconds": cand.predicted_seconds,
             "actions": _digest([[a.kind.value, a.layer, a.axis, a.size, a.count, a.eps] for a in cand.actions])}
            for cand in c.candidates
        ]
    return out


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_construction_finds_the_stored_candidates(case):
    stored = json.loads(SNAPSHOT.read_text())[case_id(case)]
    found = snapshot(case)
    assert found.keys() == stored.keys()
    for wid in stored:
        assert len(found[wid]) == len(stored[wid]), wid
        for rank, (new, old) in enumerate(zip(found[wid], stored[wid]), 1):
            # the same program at the same rank, priced the same (to rounding: a sum taken in
            # another order may differ in its last bits)
            assert math.isclose(new.pop("predicted_seconds"), old["predicted_seconds"], rel_tol=1e-9), (wid, rank)
            assert new == {k: v for k, v in old.items() if k != "predicted_seconds"}, (wid, rank)


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps({case_id(c): snapshot(c) for c in CASES}, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {SNAPSHOT}")
