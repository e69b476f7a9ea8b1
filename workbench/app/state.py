"""Session state holds core values: the workload, device name, policy options and the stepper."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from workbench.construct.space import Options
from workbench.construct.stepper import Stepper
from workbench.errors import UserError
from workbench.hardware.loader import load_spec
from workbench.workload import Workload, suite_workload

DEFAULT_WORKLOAD = "cpu-core:mm-512"  # the sample workload `make app` opens on
DEFAULT_DEVICE = "local-cpu"


@dataclass(frozen=True)
class Selection:
    workload: Workload
    device: str
    policy: str
    options: Options


def selection() -> Selection:
    if "selection" not in st.session_state:
        st.session_state.selection = Selection(suite_workload(DEFAULT_WORKLOAD), DEFAULT_DEVICE, "roller", Options())
    return st.session_state.selection


@st.cache_resource(show_spinner=False)
def _device(name: str):
    return load_spec(name)


def stepper() -> Stepper | None:
    """The stepper of the current selection (rebuilt when the selection changes); None plus an
    error message in the page when the selection is bad input."""
    sel = selection()
    if st.session_state.get("stepper_for") != sel:
        try:
            st.session_state.stepper = Stepper(sel.workload.build(), _device(sel.device), sel.policy, sel.options)
        except UserError as err:
            st.error(str(err))
            return None
        st.session_state.stepper_for = sel
    return st.session_state.stepper
