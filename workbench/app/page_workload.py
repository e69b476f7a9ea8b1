"""Workload page: what to construct, on which device, with which policy."""

from __future__ import annotations

import streamlit as st

from workbench.app.state import selection, Selection
from workbench.construct.space import Options
from workbench.construct.stepper import POLICIES
from workbench.errors import UserError
from workbench.hardware.loader import list_presets
from workbench.ops.catalog import list_ops
from workbench.workload import Workload, list_suites, load_suite

SOURCES = ("Suite entry", "Catalog operator", "Expression")


def _suite_controls() -> Workload:
    suite = st.selectbox("Suite", list_suites(), index=list_suites().index("cpu-core"))
    _, workloads = load_suite(suite)
    labels = [w.label for w in workloads]
    return workloads[st.selectbox("Workload", range(len(labels)), format_func=labels.__getitem__)]


def _catalog_controls(dtype: str) -> Workload:
    infos = {i.name: i for i in list_ops()}
    info = infos[st.selectbox("Operator", list(infos))]
    params = {}
    for p in info.params:
        if p.kind == "int":
            params[p.name] = int(st.number_input(p.name, value=int(p.default or 64), step=1, help=p.doc))
        elif p.kind == "bool":
            params[p.name] = st.checkbox(p.name, value=bool(p.default), help=p.doc)
        else:
            text = st.text_input(f"{p.name} (AxBxC)", value="x".join(map(str, p.default or (64, 64))), help=p.doc)
            params[p.name] = tuple(int(v) for v in text.split("x") if v.strip().lstrip("-").isdigit())
    return Workload(op=info.name, params=tuple(sorted(params.items())), dtype=dtype)


def _expression_controls(dtype: str) -> Workload:
    from workbench.ops.shapes import parse_kv

    text = st.text_input("Expression", value="C[i,j] += A[i,k] * B[k,j]")
    extents = st.text_input("Extents", value="i=256,j=256,k=256")
    return Workload(expr=text, params=tuple(sorted(parse_kv(extents).items())), dtype=dtype)


def _device_controls(current: str) -> str:
    names = ("local-cpu",) + list_presets()
    return st.selectbox("Device", names, index=names.index(current) if current in names else 0)


def page() -> None:
    st.title("Workload")
    sel = selection()
    st.caption(f"Now: **{sel.workload.describe()}** on **{sel.device}**, policy {sel.policy}, top-{sel.options.topk}")
    source = st.radio("Source", SOURCES, horizontal=True)  # outside the form: it changes the form
    with st.form("workload"):
        dtype = st.selectbox("dtype", ("float32", "float16"))
        try:
            if source == SOURCES[0]:
                workload = _suite_controls()
            elif source == SOURCES[1]:
                workload = _catalog_controls(dtype)
            else:
                workload = _expression_controls(dtype)
        except UserError as err:
            workload = None
            st.error(str(err))
        device = _device_controls(sel.device)
        policy = st.selectbox("Policy", sorted(POLICIES))
        topk = int(st.number_input("top-K", min_value=1, max_value=50, value=sel.options.topk))
        eps = float(st.number_input("eps (initial tensor-shape waste bound)", min_value=0.0, max_value=1.0, value=sel.options.eps))
        if st.form_submit_button("Apply") and workload is not None:
            _apply(Selection(workload, device, policy, Options(topk=topk, eps=eps)))


def _apply(new: Selection) -> None:
    try:
        new.workload.build()  # validate before replacing the session's selection
    except UserError as err:
        st.error(str(err))
        return
    st.session_state.selection = new
    st.success(f"Selected {new.workload.describe()} on {new.device}.")


page()
