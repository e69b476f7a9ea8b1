"""Session state holds core values only: the selection (workload, device spec, policy, options),
its stepper, the last profile result and the candidates picked for the Kernel and Export pages.

Every browser session has its own `st.session_state`; what is shared between sessions is cached
by value (`st.cache_resource` keyed by frozen core values), so sharing is never visible.

Files the dashboard writes (bundles, runs stores) stay inside one workspace directory: whoever
can reach the page can type a path, and the server must not write wherever its account can.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from workbench.construct.space import Options
from workbench.construct.step import Candidate
from workbench.construct.stepper import Stepper
from workbench.errors import UserError
from workbench.hardware.loader import load_spec
from workbench.hardware.spec import DeviceSpec
from workbench.ops.tensor_expr import TensorExpr
from workbench.profile.store import default_path
from workbench.workload import Workload, suite_workload

DEFAULT_WORKLOAD = "cpu-core:mm-512"  # the sample workload `make app` opens on
DEFAULT_DEVICE = "local-cpu"
PROGRESS_EVERY = 100  # steps between progress-bar updates (a step takes well under a millisecond)
WORKSPACE_ENV = "WORKBENCH_WORKSPACE"


def workspace() -> Path:
    """The directory the dashboard writes in: $WORKBENCH_WORKSPACE, else the user's data
    directory of tile-workbench (which holds the runs store the CLI uses). Made on first use;
    UserError when it cannot be."""
    folder = Path(os.environ.get(WORKSPACE_ENV) or default_path().parent).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return folder.resolve(strict=True)
    except OSError as err:
        raise UserError(f"workspace {folder} (${WORKSPACE_ENV}): {err.strerror or err}") from None


def in_workspace(text: str) -> Path:
    """The path typed as `text`, relative to the workspace or absolute inside it, resolved
    (symbolic links followed, `..` applied); UserError for a path that leads out of it."""
    text = text.strip()
    if not text or "\0" in text:
        raise UserError("give a path inside the workspace")
    root = workspace()
    try:
        path = (root / Path(text).expanduser()).resolve()
    except (OSError, RuntimeError) as err:  # a symbolic link loop
        raise UserError(f"{text}: {getattr(err, 'strerror', None) or err}") from None
    if not path.is_relative_to(root):
        raise UserError(f"{text} is outside the workspace {root}: the dashboard writes only there "
                        f"(start it with {WORKSPACE_ENV}=DIR to choose another)")
    return path


@dataclass(frozen=True)
class Selection:
    workload: Workload
    device: DeviceSpec
    policy: str
    options: Options

    def describe(self) -> str:
        dtype = "" if self.workload.dtype == "float32" else f" {self.workload.dtype}"
        return f"{self.workload.describe()}{dtype} on {self.device.name} ({self.policy}, top-{self.options.topk})"


@st.cache_resource(show_spinner=False, max_entries=64)
def built(workload: Workload) -> TensorExpr:
    """`workload.build()`, shared by sessions (a TensorExpr is immutable); UserError for bad input
    (exceptions are not cached, so a fixed input is built afresh)."""
    return workload.build()


@st.cache_resource(show_spinner=False)
def preset(name: str) -> DeviceSpec:
    return load_spec(name)


def selection() -> Selection:
    if "selection" not in st.session_state:
        st.session_state.selection = Selection(suite_workload(DEFAULT_WORKLOAD), preset(DEFAULT_DEVICE), "roller", Options())
    return st.session_state.selection


def set_selection(new: Selection) -> None:
    """Replace the selection; the stepper, profile and picks of the old one go with it."""
    st.session_state.selection = new
    for key in ("stepper", "stepper_for", "profile", "picked", "bundle"):
        st.session_state.pop(key, None)


def stepper() -> Stepper | None:
    """The stepper of the current selection, built and run to the end on first use (so every page
    opens on a finished construction); None plus an error message when the selection is bad."""
    sel = selection()
    if st.session_state.get("stepper_for") != sel:
        try:
            s = Stepper(built(sel.workload), sel.device, sel.policy, sel.options)
            run_with_progress(s)
        except UserError as err:
            st.error(str(err))
            return None
        st.session_state.stepper, st.session_state.stepper_for = s, sel
    return st.session_state.stepper


def run_with_progress(s: Stepper) -> None:
    """Generate the rest of the construction (the position moves to the end) under a progress bar
    that counts steps against the options' step bound."""
    s.seek(len(s.steps))  # replaying recorded steps is instant; only new ones are worth a bar
    if s.done:
        return
    bar = st.progress(0.0, text="constructing...")
    bound = max(1, s.options.max_steps)
    while s.next() is not None:
        if len(s.steps) % PROGRESS_EVERY == 0:
            bar.progress(min(1.0, len(s.steps) / bound), text=f"constructing: {len(s.steps)} steps")
    bar.empty()


def finished_candidates(s: Stepper) -> list[Candidate]:
    """The top-K of the whole construction, leaving the stepper's position where it was."""
    here = s.position
    run_with_progress(s)
    found = s.candidates()
    s.seek(here)
    return found


def candidates_page(title: str, empty: str = "The construction found no candidates."):
    """The common head of the pages that work on candidates: title, the selection's stepper and
    its finished top-K; None (with the page's message shown) when there is nothing to show."""
    st.title(title)
    s = stepper()
    if s is None:
        return None
    sel = selection()
    st.caption(sel.describe())
    cands = finished_candidates(s)
    if not cands:
        st.warning(empty)
        return None
    return s, sel, cands


def candidate(s: Stepper, rank: int) -> Candidate | None:
    return next((c for c in finished_candidates(s) if c.rank == rank), None)


def profile():
    """The last profile result of the current selection (a core `ProfileResult`), or None."""
    return st.session_state.get("profile")


def picked() -> tuple[int, ...]:
    """Candidate ranks picked on the Candidates page (default: the best predicted)."""
    return st.session_state.get("picked", (1,))


def ordered_ranks(cands) -> list[int]:
    """All candidate ranks, the picked ones first."""
    ranks = [c.rank for c in cands]
    first = [r for r in picked() if r in ranks]
    return first + [r for r in ranks if r not in first]


def set_picked(ranks) -> None:
    st.session_state.picked = tuple(sorted({int(r) for r in ranks})) or (1,)
