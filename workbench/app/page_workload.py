"""Workload page: what to construct (catalog operator, expression or suite entry), on which
device, with which policy and options. Inputs are checked as they change; Apply replaces the
session's selection only with a workload that builds, so bad input never loses the current one."""

from __future__ import annotations

import streamlit as st

from workbench import pipeline
from workbench.app.device_controls import device_controls
from workbench.app.messages import message
from workbench.app.state import OPTION_BOUNDS, built, construction, constructed, keep, selection
from workbench.errors import UserError
from workbench.fmt import prefixed
from workbench.pipeline import DTYPES, POLICIES, Options, Request, Workload

SOURCES = ("Suite entry", "Catalog operator", "Expression")
DEFAULT_EXPR = ("C[i,j] += A[i,k] * B[k,j]", "i=256,j=256,k=256")


def _source_index(w: Workload) -> int:
    return 0 if w.label else (2 if w.expr is not None else 1)


def _suite_controls(current: Workload) -> Workload:
    suites = pipeline.suites() + pipeline.random_suites()
    now = current.label.split(":", 1)[0] if current.label else "cpu-core"
    kind = now.partition("@")[0]  # a drawn shape's suite is KIND@SEED
    suite = st.selectbox("Suite", suites, index=suites.index(kind) if kind in suites else 0,
                         help="random and random-conv: shapes drawn per seed, as `workbench bench kernels --suite "
                         "random:N` draws them")
    if suite in pipeline.random_suites():
        return _drawn_controls(suite, current)
    _, workloads = pipeline.suite(suite)
    labels = [w.label for w in workloads]
    chosen = st.selectbox("Workload", labels, index=labels.index(current.label) if current.label in labels else 0)
    return workloads[labels.index(chosen)]


def _drawn_controls(kind: str, current: Workload) -> Workload:
    """Shape rI of a random suite's seed, the workload `bench` labels KIND@SEED:rI."""
    suite, _, wid = current.label.rpartition(":")
    same = suite.partition("@")[0] == kind
    cols = st.columns(2)
    seed = cols[0].text_input("Seed", value=suite.partition("@")[2] if same else "0",
                              help="0 to 2^64-1: the seed a `bench` run reports")
    index = int(cols[1].number_input("Shape", min_value=0, max_value=pipeline.MAX_RANDOM_COUNT - 1,
                                     value=int(wid[1:]) if same else 0, step=1, help="rI: the I-th shape drawn"))
    return pipeline.parse_workload(None, None, None, f"{kind}@{seed.strip()}:r{index}", "float32")


def _catalog_controls(current: Workload) -> Workload:
    infos = {i.name: i for i in pipeline.operators()}
    names = list(infos)
    info = infos[st.selectbox("Operator", names, index=names.index(current.op) if current.op in names and not current.label else 0)]
    # The current operator's values, else a layer of a real network (the catalog's example).
    now = dict(current.params) if current.op == info.name else dict(info.example)
    st.caption(info.description + ("" if current.op == info.name else f"; starts from {info.example_source}"))
    params, cols = {}, st.columns(3)
    for i, p in enumerate(info.params):
        value = now.get(p.name, p.default)
        with cols[i % 3]:
            if p.kind == "int":
                # No min_value: the catalog says what is wrong with 0, in words (shown below).
                params[p.name] = int(st.number_input(p.name, value=int(value), step=1, help=p.doc))
            elif p.kind == "bool":
                params[p.name] = st.checkbox(p.name, value=bool(value), help=p.doc)
            else:
                text = st.text_input(f"{p.name} (AxBxC)", value="x".join(map(str, value)), help=p.doc)
                params[p.name] = _ints(p.name, text)
    return Workload(op=info.name, params=tuple(sorted(params.items())))


def _ints(name: str, text: str) -> tuple[int, ...]:
    value = pipeline.parse_shape(f"{name}={text.strip()}")[name]
    if isinstance(value, (bool, str)):  # true/false, or `dyn` (a dynamic extent: the Dynamic shapes page)
        raise UserError(f"{name}: expected integers such as 17x11x3, got {text!r}")
    return value if isinstance(value, tuple) else (value,)


def _expression_controls(current: Workload) -> Workload:
    expr, extents = (current.expr, ",".join(f"{k}={v}" for k, v in current.params)) if current.expr else DEFAULT_EXPR
    text = st.text_input("Expression", value=expr, help="e.g. C[i,j] += A[i,k] * B[k,j]; reductions +=, *=, max=, min=")
    sizes = st.text_input("Extents", value=extents, help="one NAME=SIZE per axis, comma-separated")
    return Workload(expr=text, params=tuple(sorted(pipeline.parse_shape(sizes).items())))


def _workload_controls(current: Workload) -> Workload | None:
    """The workload the inputs describe, built now so errors show as the user types; None (and
    the error) when it does not build."""
    source = st.radio("Source", SOURCES, index=_source_index(current), horizontal=True)
    dtype = st.selectbox("dtype", DTYPES, index=DTYPES.index(current.dtype) if current.dtype in DTYPES else 1)
    try:
        controls = (_suite_controls, _catalog_controls, _expression_controls)[SOURCES.index(source)]
        w = controls(current)
        w = Workload(w.op, w.params, w.expr, dtype, w.label)
        expr = built(w)
    except UserError as err:
        st.error(message(err, {"--shape": "Extents" if source == SOURCES[2] else "shape"}))
        return None
    axes = ", ".join(f"{a.name}={a.extent}{'' if a.kind == 'spatial' else ' (reduce)'}" for a in expr.axes)
    tensors = ", ".join(f"{t.name}[{'x'.join(map(str, t.shape))}]" for t in expr.tensors)
    st.success(f"{expr.op}: axes {axes}; tensors {tensors}; {prefixed(expr.flops, 'FLOP')}")
    return w


def _policy_controls(current: Request) -> tuple[str, Options]:
    names = sorted(POLICIES)
    policy = st.selectbox("Policy", names, index=names.index(current.policy) if current.policy in names else 0)
    o = current.options
    cols = st.columns(4)
    b = OPTION_BOUNDS
    topk = int(cols[0].number_input("top-K", min_value=b["topk"][0], max_value=b["topk"][1], value=o.topk))
    eps = float(cols[1].number_input("eps (tensor-shape waste)", min_value=b["eps"][0], max_value=b["eps"][1],
                                     value=o.eps, step=0.05))
    seed = int(cols[2].number_input("seed", min_value=b["seed"][0], max_value=b["seed"][1], value=o.seed, step=1))
    steps = int(cols[3].number_input("max steps", min_value=b["max_steps"][0], max_value=b["max_steps"][1],
                                     value=o.max_steps, step=500))
    return policy, Options(topk=topk, eps=eps, max_steps=steps, seed=seed)


def _apply(new: Request) -> None:
    """Make `new` the session's selection once its construction has run; a construction that
    fails leaves the current selection and its results alone."""
    try:
        s, c = constructed(new)
    except UserError as err:
        st.error(message(err))
        return
    keep(new, s, c)
    st.success(f"Selected {new.describe()}: {len(c.candidates)} candidates in {c.steps} steps.")


def _at_stake(sel: Request) -> str:
    """What replacing `sel` would lose that Apply cannot bring back: a profile of it, or a model's
    operator (the form cannot select one); "" when nothing."""
    lost = []
    if isinstance(sel.workload, Workload) and sel.workload.model is not None:
        lost.append("a model's operator opened from the Models page")
    if st.session_state.get("profile") is not None:
        lost.append("its profile results on this page (the runs store keeps them)")
    return " and ".join(lost)


def _confirm(sel: Request) -> None:
    """Ask before a pending Apply replaces a selection with something at stake."""
    pending = st.session_state.get("pending")
    if pending is None:
        return
    st.warning(f"Apply replaces {sel.describe()}: {_at_stake(sel)}. Replace it with {pending.describe()}?")
    yes, no = st.columns(2)
    if yes.button("Replace it"):
        st.session_state.pop("pending")
        _apply(pending)
    elif no.button("Keep the current selection"):
        st.session_state.pop("pending")
        st.info("The current selection stays.")


def page() -> None:
    st.title("Workload")
    now = st.empty()  # filled last: Apply may change the selection below
    sel = selection()
    left, right = st.columns(2)
    with left:
        st.subheader("Operator")
        workload = _workload_controls(sel.workload)
    with right:
        st.subheader("Device")
        device = device_controls(sel.device)
        st.subheader("Construction")
        policy, options = _policy_controls(sel)
    if st.button("Apply", type="primary", disabled=workload is None or device is None):
        new = Request(workload, device, policy, options)
        if new == sel:
            st.info("Nothing changed: the current construction stays.")
        elif _at_stake(sel):
            st.session_state.pending = new  # asked below: replacing it loses something
        else:
            _apply(new)
    _confirm(sel)
    # Constructing here means the dashboard opens on a finished construction (`make app`).
    c = construction()
    done = f": {len(c.candidates)} candidates in {c.steps} steps" if c is not None else ""
    now.caption(f"Now: **{selection().describe()}**{done}")


page()
