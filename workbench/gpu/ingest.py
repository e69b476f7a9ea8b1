"""A GPU runner's result (docs/gpu.md) stored as ordinary runs in the runs store.

Each workload of the result becomes one run, as `workbench profile` records one: the workload
(label `SUITE:ID`, op, dtype, parameters), the pack's device spec, the roller policy, its
candidates with their programs and estimates, and one measurement per candidate (runner
`gpu-pack`: the repeats' seconds, verified or not, the one-line error). The result carries no
programs; they come from constructing the workload again at the pack's top-K, which is
deterministic: a candidate whose prediction differs from the one the pack recorded (the
construction changed since the pack was made) is not stored, and the workload is reported
skipped. torch's time (cuBLAS / cuDNN) has no column in the store: it is kept in the run's
`versions` record (`baseline_torch_seconds`, `baseline_torch`) and in the report.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from workbench.construct.space import Options
from workbench.construct.stepper import Stepper
from workbench.errors import UserError
from workbench.files import read_user_text
from workbench.gpu.pack import FORMAT, POLICY
from workbench.hardware.loader import load_spec
from workbench.profile.runner import Measurement
from workbench.profile.store import RunStore
from workbench.workload import Workload

RUNNER = "gpu-pack"  # the runner name the runs store shows for these measurements
MAX_RESULT_BYTES = 64 * 2**20  # a result of a few hundred candidates with their repeats is under a megabyte
PREDICTION_RTOL = 1e-9  # a reconstruction predicts the same float, up to printing through JSON


@dataclass(frozen=True)
class Ingested:
    """One workload of the result: its run id in the store (None: skipped, `reason` says why)."""

    id: str
    label: str
    run_id: int | None
    candidates: int
    best_seconds: float | None  # the fastest verified candidate's median
    torch_seconds: float | None
    reason: str = ""

    def to_dict(self) -> dict:
        ratio = self.torch_seconds / self.best_seconds if self.best_seconds and self.torch_seconds else None
        return {"id": self.id, "label": self.label, "run_id": self.run_id, "candidates": self.candidates,
                "best_seconds": self.best_seconds, "torch_seconds": self.torch_seconds,
                "speed_vs_torch": ratio, "reason": self.reason}


def load_result(path: str | Path) -> dict:
    """The result JSON at `path`, its shape checked; UserError in one line otherwise."""
    text = read_user_text(path, "result", MAX_RESULT_BYTES)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"result {path}: not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UserError(f"result {path}: not a GPU runner result of format {FORMAT}")
    pack, workloads = doc.get("pack"), doc.get("workloads")
    if not isinstance(pack, dict) or not isinstance(pack.get("device"), str) or not isinstance(workloads, list):
        raise UserError(f"result {path}: needs \"pack\" with its \"device\" and a list of \"workloads\"")
    for n, w in enumerate(workloads):
        if not isinstance(w, dict) or not all(isinstance(w.get(k), t) for k, t in
                                              (("id", str), ("op", str), ("params", dict), ("dtype", str),
                                               ("candidates", list))):
            raise UserError(f"result {path}: workload {n} needs id, op, params, dtype and candidates")
        for c in w["candidates"]:
            if not isinstance(c, dict) or not isinstance(c.get("rank"), int) or isinstance(c.get("rank"), bool):
                raise UserError(f"result {path}: workload {w['id']}: each candidate needs an integer rank")
    return doc


def ingest(doc: dict, store: RunStore) -> tuple[Ingested, ...]:
    """Store every workload of the checked result `doc` (`load_result`) as a run in `store`."""
    device = load_spec(doc["pack"]["device"])
    versions = _versions(doc)
    return tuple(_ingest_workload(w, device, versions, store) for w in doc["workloads"])


def _ingest_workload(w: dict, device, versions: dict, store: RunStore) -> Ingested:
    label = f"{w.get('suite') or 'gpu'}:{w['id'].rsplit('/', 1)[-1]}"
    torch = _torch_seconds(w)
    ranks = sorted(c["rank"] for c in w["candidates"])
    if not ranks:
        return Ingested(w["id"], label, None, 0, None, torch, "no candidates")
    workload = Workload.from_dict({"op": w["op"], "dtype": w["dtype"], **w["params"]})
    expr = workload.build()
    construction = Stepper(expr, device, POLICY, Options(topk=max(ranks))).finish()
    built = {c.rank: c for c in construction.candidates}
    for c in w["candidates"]:
        mine = built.get(c["rank"])
        recorded = c.get("predicted_seconds")
        if mine is None or (isinstance(recorded, (int, float)) and
                            not math.isclose(mine.predicted_seconds, recorded, rel_tol=PREDICTION_RTOL)):
            return Ingested(w["id"], label, None, len(ranks), None, torch,
                            f"candidate {c['rank']}: this construction does not give the pack's program "
                            "(the construction changed since the pack was made)")
    chosen = [built[r] for r in ranks]
    baseline = {"baseline_torch_seconds": repr(torch), "baseline_torch": str(w["torch"].get("what", ""))}
    run_versions = versions | (baseline if torch is not None else {})
    run_id = store.start_run(workload={"label": label, **expr.workload_dict()}, device=device, policy=POLICY,
                             runner=RUNNER, candidates=chosen, topk=max(ranks), versions=run_versions)
    for c in w["candidates"]:
        store.add_measurement(run_id, _measurement(c, versions))
    store.finish_run(run_id)
    times = [_median(c) for c in w["candidates"] if _verified(c)]
    best = min((t for t in times if t is not None), default=None)
    return Ingested(w["id"], label, run_id, len(ranks), best, torch)


def _measurement(c: dict, versions: dict) -> Measurement:
    samples = c.get("samples")
    seconds = tuple(float(s) for s in samples if _positive(s)) if isinstance(samples, list) else ()
    if not seconds and _positive(c.get("seconds")):
        seconds = (float(c["seconds"]),)
    ok = c.get("ok") is True
    verified = c.get("verified")
    correct = bool(verified) if isinstance(verified, bool) else None
    error = "" if ok else (str(c.get("error") or "").strip().splitlines() or ["failed on the GPU"])[0]
    return Measurement(rank=c["rank"], runner=RUNNER, seconds=seconds if ok else (), correct=correct, error=error,
                       versions=tuple(sorted(versions.items())))


def _verified(c: dict) -> bool:
    return c.get("ok") is True and c.get("verified") is True


def _median(c: dict) -> float | None:
    return float(c["seconds"]) if _positive(c.get("seconds")) else None


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _torch_seconds(w: dict) -> float | None:
    torch = w.get("torch")
    return float(torch["seconds"]) if isinstance(torch, dict) and _positive(torch.get("seconds")) else None


def _versions(doc: dict) -> dict[str, str]:
    """What produced the numbers: the GPU machine and its software, and the pack's origin."""
    machine = doc.get("machine") if isinstance(doc.get("machine"), dict) else {}
    pack = doc["pack"]
    found = {"gpu": machine.get("gpu")}
    found |= {f"gpu_{k}": machine.get(k) for k in ("driver", "cuda_runtime", "torch", "cupy")}
    found |= {"pack_created": pack.get("created"), "pack_git_commit": pack.get("git_commit")}
    return {k: str(v) for k, v in found.items() if v is not None}
