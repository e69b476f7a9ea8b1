"""Session state holds core values only: the selection (a `pipeline.Request`: workload, device
spec, policy, options), the what-if edit that made its device where the What-if page edited it
(`edited`, a `pipeline.EditedSpec`), its stepper and finished construction, the last profile
result and the candidates picked for the Kernel and Export pages.

Every browser session has its own `st.session_state`; what is shared between sessions is cached
by value (`st.cache_resource` keyed by frozen core values), so sharing is never visible.

Files the dashboard writes (bundles, runs stores) stay inside one workspace directory: whoever
can reach the page can type a path, and the server must not write wherever its account can.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode
from typing import TYPE_CHECKING

import streamlit as st

from workbench import pipeline
from workbench.app.messages import message
from workbench.errors import UserError
from workbench.pipeline import Construction, Request, Stepper, Workload

if TYPE_CHECKING:  # annotations only
    from workbench.pipeline import DeviceSpec, EditedSpec, TensorExpr

DEFAULT_WORKLOAD = "cpu-core:mm-512"  # the sample workload `make app` opens on
DEFAULT_DEVICE = "local-cpu"
PROGRESS_EVERY = 100  # steps between progress-bar updates (a step takes well under a millisecond)
WORKSPACE_ENV = "WORKBENCH_WORKSPACE"


def workspace() -> Path:
    """The directory the dashboard writes in: $WORKBENCH_WORKSPACE, else the user's data
    directory of tile-workbench (which holds the runs store the CLI uses). Made on first use;
    UserError when it cannot be."""
    folder = Path(os.environ.get(WORKSPACE_ENV) or pipeline.default_store_path().parent).expanduser()
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


@st.cache_resource(show_spinner=False, max_entries=64)
def built(workload: Workload) -> TensorExpr:
    """`workload.build()`, shared by sessions (a TensorExpr is immutable); UserError for bad input
    (exceptions are not cached, so a fixed input is built afresh)."""
    return workload.build()


@st.cache_resource(show_spinner=False)
def preset(name: str) -> DeviceSpec:
    return pipeline.load_device(name)


def selection() -> Request:
    """The session's selection: on a new session the one the URL names (a shared link, a
    reload; with its what-if edits and the construction step it opens at), else the sample
    workload on this machine; a URL that names nothing valid shows why and opens the sample."""
    if "selection" not in st.session_state:
        sel = pipeline.request(DEFAULT_WORKLOAD, preset(DEFAULT_DEVICE))
        if st.query_params:
            try:
                link = request_from_query(st.query_params.to_dict())
                sel = link.request
                st.session_state.edited = link.edited
                if link.step is not None:
                    st.session_state.open_step = link.step
            except UserError as err:
                st.error(f"the link's selection: {message(err)}")
        st.session_state.selection = sel
        _to_url(sel)
    return st.session_state.selection


def edited() -> EditedSpec | None:
    """The what-if edit whose spec is the selection's device (None when the device is not an
    edited one)."""
    e = st.session_state.get("edited")
    return e if e is not None and e.spec == selection().device else None


def set_selection(new: Request, edit: EditedSpec | None = None) -> None:
    """Replace the selection; the stepper, construction, profile and picks of the old one go with
    it. `edit` is the what-if edit whose spec is `new.device`; without one, the session's edit
    stays where it is still the device (another workload on the same edited device)."""
    edit = edit or st.session_state.get("edited")
    st.session_state.edited = edit if edit is not None and edit.spec == new.device else None
    st.session_state.selection = new
    _to_url(new)
    for key in ("stepper", "construction", "stepper_for", "profile", "picked", "bundle", "pending", "open_step"):
        st.session_state.pop(key, None)


# Options written to the URL only where they differ from these (short links for the usual case).
_DEFAULT_OPTIONS = pipeline.Options()
# What the Workload page's inputs allow, and so what a URL may ask for (a link must not start a
# construction of a million steps on the server).
OPTION_BOUNDS = {"topk": (1, 100), "eps": (0.0, 1.0), "seed": (0, 2**31 - 1), "max_steps": (10, 100_000)}
_OPTION_KEYS = tuple(OPTION_BOUNDS)
# What-if edits travel as one parameter, `set=FIELD=VALUE,FIELD=VALUE` (the CLI's `--set`s): a
# field name and a value (a number, a size, a factor or a name) never hold a comma.
EDITS_SEPARATOR = ","


@dataclass(frozen=True)
class Link:
    """What a URL names: the selection (its device edited where the URL carries `set`), the
    what-if edit that made that device, and the construction step to open at (`step`)."""

    request: Request
    edited: EditedSpec | None = None
    step: int | None = None


def request_query(req: Request, edit: EditedSpec | None = None) -> dict[str, str]:
    """The selection as URL query parameters, in the CLI's words (`workload` or `op`/`expr` with
    `shape`, `dtype`, `device`, `policy`, options); a device that is the what-if `edit` of a
    named one as that name and the edits (`set`). A model's operator and an uploaded or
    calibrated device spec have no name a URL could carry: they are left out (the link then
    opens the sample workload, or the workload on this machine)."""
    w = req.workload
    if not isinstance(w, Workload) or w.model is not None:
        return {}
    if w.label:
        query = {"workload": w.label}
    else:
        shape = ",".join(f"{k}={'x'.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in w.params)
        query = {"expr": w.expr} if w.expr is not None else {"op": w.op}
        query["shape"] = shape
    if w.dtype != "float32":
        query["dtype"] = w.dtype
    if req.device == _named_device(req.device.name):
        query["device"] = req.device.name
    elif edit is not None and edit.spec == req.device and edit.base == _named_device(edit.base.name):
        query["device"] = edit.base.name
        query["set"] = EDITS_SEPARATOR.join(map(str, edit.edits))
    query["policy"] = req.policy
    for key in _OPTION_KEYS:
        if getattr(req.options, key) != getattr(_DEFAULT_OPTIONS, key):
            query[key] = str(getattr(req.options, key))
    return query


def step_link(req: Request, edit: EditedSpec | None, step: int) -> str:
    """A relative link to the Construction page opening `req` (its device `edit.spec` where
    `edit` is given) at construction step `step`; "" when the URL cannot name the device."""
    query = request_query(req, edit)
    if "device" not in query:
        return ""
    return "construction?" + urlencode({**query, "step": str(step)})


def request_from_query(query: dict[str, str]) -> Link:
    """The selection a URL's query parameters name (`request_query`, `step_link`); UserError
    naming what is wrong."""
    unknown = sorted(set(query) - {"workload", "op", "expr", "shape", "dtype", "device", "policy", "set", "step",
                                   *_OPTION_KEYS})
    if unknown:
        raise UserError(f"unknown parameter {unknown[0]!r}")
    suite = query.get("workload", "").rpartition(":")[0]
    if "/" in suite or suite.endswith(".toml"):  # as a device: never a file on the server
        raise UserError(f"workload {query['workload']!r:.60}: a link names a workload of a shipped or random suite, "
                        f"not a suite file")
    workload = pipeline.parse_workload(query.get("op"), query.get("shape"), query.get("expr"), query.get("workload"),
                                       query.get("dtype", "float32"))
    options = {}
    for key in _OPTION_KEYS:
        if key in query:
            kind = float if key == "eps" else int
            low, high = OPTION_BOUNDS[key]
            try:
                options[key] = kind(query[key])
            except ValueError:
                raise UserError(f"{key} must be a number, got {query[key]!r:.40}") from None
            if not low <= options[key] <= high:
                raise UserError(f"{key} must be within {low}..{high}, got {query[key]!r:.40}")
    name = query.get("device", DEFAULT_DEVICE)
    if name not in _device_names():  # a URL names presets only: never a file on the server
        raise UserError(f"unknown device {name!r:.40} (known: {', '.join(_device_names())})")
    device, edit = preset(name), None
    if query.get("set"):
        edit = pipeline.edit_device(device, query["set"].split(EDITS_SEPARATOR))
        device = edit.spec
    step = None
    if "step" in query:
        if not query["step"].isdigit() or int(query["step"]) > OPTION_BOUNDS["max_steps"][1]:
            raise UserError(f"step must be a whole number of steps, got {query['step']!r:.40}")
        step = int(query["step"])
    req = pipeline.request(workload, device, query.get("policy", "roller"), pipeline.Options(**options))
    return Link(req, edit, step)


def _device_names() -> tuple[str, ...]:
    return pipeline.device_presets() + (DEFAULT_DEVICE,)


def _named_device(name: str):
    return preset(name) if name in _device_names() else None


def _to_url(req: Request) -> None:
    query = request_query(req, st.session_state.get("edited"))
    if dict(st.query_params) != query:
        st.query_params.from_dict(query)


def constructed(req: Request) -> tuple[Stepper, Construction]:
    """A stepper of `req` and its finished construction (under a progress bar), the cursor at the
    end so the Construction page opens on the finished graph; UserError for bad input."""
    s = pipeline.stepper(req)
    construction = finish_with_progress(s)
    s.seek(len(s.steps))  # replaying recorded steps is instant
    return s, construction


def keep(req: Request, s: Stepper, construction: Construction) -> None:
    """Make `req` the session's selection, with its stepper and construction."""
    set_selection(req)
    _hold(req, s, construction)


def _hold(req: Request, s: Stepper, construction: Construction) -> None:
    st.session_state.stepper, st.session_state.construction, st.session_state.stepper_for = s, construction, req


def stepper() -> Stepper | None:
    """The stepper of the current selection, made and finished on first use (so every page opens
    on a finished construction); None plus an error message when the selection is bad."""
    sel = selection()
    if st.session_state.get("stepper_for") != sel:
        try:
            _hold(sel, *constructed(sel))
        except UserError as err:
            st.error(message(err))
            return None
        step = st.session_state.pop("open_step", None)  # a link's step (`step_link`)
        if step is not None:
            st.session_state.stepper.seek(min(step, len(st.session_state.stepper.steps)))
    return st.session_state.stepper


def construction() -> Construction | None:
    """The finished construction of the current selection (None, with the error shown, when the
    selection is bad)."""
    return st.session_state.construction if stepper() is not None else None


def finish_with_progress(s: Stepper) -> Construction:
    """`s.finish()`, with a progress bar that counts newly generated steps against the options'
    step bound (none when every step is generated already); the cursor stays where it is."""
    bar = None
    bound = max(1, s.options.max_steps)
    for _ in s.generate():
        if bar is None:
            bar = st.progress(0.0, text="constructing...")
        if len(s.steps) % PROGRESS_EVERY == 0:
            bar.progress(min(1.0, len(s.steps) / bound), text=f"constructing: {len(s.steps)} steps")
    if bar is not None:
        bar.empty()
    return s.finish()


def candidates_page(title: str, empty: str = "The construction found no candidates."):
    """The common head of the pages that work on candidates: title, the selection and its finished
    construction; None (with the page's message shown) when there is nothing to show."""
    st.title(title)
    c = construction()
    if c is None:
        return None
    sel = selection()
    st.caption(sel.describe())
    if not c.candidates:
        st.warning(empty)
        return None
    return sel, c


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
