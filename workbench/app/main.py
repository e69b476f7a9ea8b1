"""Page registry: multipage navigation over the pages of `workbench/app/`."""

import streamlit as st


def run() -> None:
    st.set_page_config(page_title="tile-workbench", layout="wide")
    pages = [
        st.Page("workbench/app/page_workload.py", title="Workload", default=True),
        st.Page("workbench/app/page_construction.py", title="Construction"),
        st.Page("workbench/app/page_candidates.py", title="Candidates"),
    ]
    st.navigation(pages).run()
