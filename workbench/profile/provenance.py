"""Where a run's numbers come from: the software, the machine and the options that made them,
recorded with every run in the store so that two runs can be told apart (`runs compare`'s
selectors) and a report can say what it measured on.

`collect` reads this process and machine (TVM imported, a `git` call where the package is a
checkout); `spec_sha256` is a pure function of a device spec.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from workbench.hardware.spec import DeviceSpec

# A 1-minute load average of this share of the logical CPUs, before a local session starts, means
# other work competes for the cores the kernels are timed on (TVM's pool uses them all).
BUSY_LOAD = 0.5
GIT_TIMEOUT_S = 5  # `git rev-parse` answers in milliseconds; a hung filesystem must not hang a run
CHECKOUT = Path(__file__).resolve().parents[2]  # the folder holding the `workbench` package


def spec_sha256(device: DeviceSpec) -> str:
    """SHA-256 of the spec's canonical JSON (sorted keys): equal specs, equal hashes, whatever
    file or preset they came from."""
    text = json.dumps(dataclasses.asdict(device), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def git_commit(folder: Path = CHECKOUT) -> tuple[str, bool]:
    """(HEAD's commit, whether tracked files differ from it) when `folder` is a git checkout;
    ("", False) for an installed package or where git is missing."""
    if not (folder / ".git").exists():
        return "", False
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                                capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return "", False
    if head.returncode != 0:
        return "", False
    return head.stdout.strip(), bool(status.stdout.strip())


@lru_cache(maxsize=1)
def cpu() -> tuple[str, str]:
    """(model name, flags separated by spaces) of this machine's CPU: /proc/cpuinfo on Linux,
    else what `platform` knows and no flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    # x86 names them "model name" and "flags", ARM "Features" (and often no model name)
    return fields.get("model name") or platform.machine(), fields.get("flags") or fields.get("Features", "")


def gpu() -> str:
    """"NAME, driver VERSION" of the first NVIDIA GPU (`nvidia-smi`), "" where there is none."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    first = done.stdout.strip().splitlines()[:1] if done.returncode == 0 else []
    if not first:
        return ""
    name, _, driver = first[0].partition(",")
    return f"{name.strip()}, driver {driver.strip()}" if driver else name.strip()


def blas() -> str:
    """numpy's BLAS as its build reports it ("scipy-openblas 0.3.31"), "" when it does not say."""
    import numpy

    try:
        found = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except (TypeError, KeyError):  # numpy before 1.25 prints its config and has no dicts mode
        return ""
    return f"{found.get('name', '')} {found.get('version', '')}".strip()


def collect(device: DeviceSpec, versions: Mapping[str, str], options: Mapping[str, object],
            threads: int | None, load: float | None) -> dict:
    """The provenance of a run starting now on this machine for `device`: `versions` (the
    packages', `workbench.versions`), the checkout's commit, the spec's hash, the CPU (and GPU for
    a GPU device), numpy's BLAS, the kernel threads, the 1-minute load average at the start and
    the run's `options` (policy, top-K, timing...), as one flat JSON-able dict."""
    commit, dirty = git_commit()
    model, flags = cpu()
    return {
        **{k: str(v) for k, v in versions.items()},
        "git_commit": commit,
        "git_dirty": dirty,
        "spec_sha256": spec_sha256(device),
        "cpu_model": model,
        "cpu_flags": flags,
        "gpu": "" if device.runs_on_cpu else gpu(),
        "blas": blas(),
        "threads": threads if threads is not None else (os.cpu_count() or 1),
        "cpus": os.cpu_count() or 1,
        "load_average": load,
        **dict(options),
    }


def busy(provenance: Mapping[str, object]) -> bool:
    """Whether a local run started on a machine whose other work competed for its cores (load
    average at least BUSY_LOAD per logical CPU): its times are inflated by an unknown amount
    that may differ from one run to the next. False where the provenance does not say."""
    load, cpus = provenance.get("load_average"), provenance.get("cpus") or provenance.get("threads")
    if provenance.get("runner") != "local" or not isinstance(load, (int, float)) or not cpus:
        return False
    return load >= BUSY_LOAD * float(cpus)
