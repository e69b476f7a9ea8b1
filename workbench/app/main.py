"""Page registry: multipage navigation over the pages of `workbench/app/` (`app.py` calls `run`)."""

from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent
PAGES = (
    ("page_workload.py", "Workload", "workload"),
    ("page_construction.py", "Construction", "construction"),
    ("page_candidates.py", "Candidates", "candidates"),
    ("page_kernel.py", "Kernel", "kernel"),
    ("page_export.py", "Export", "export"),
    ("page_runs.py", "Runs", "runs"),
    ("page_models.py", "Models", "models"),
    ("page_dynamic.py", "Dynamic shapes", "dynamic"),
    ("page_whatif.py", "What-if", "whatif"),
)


def run() -> None:
    st.set_page_config(page_title="tile-workbench", layout="wide")
    pages = [st.Page(HERE / file, title=title, url_path=path, default=i == 0) for i, (file, title, path) in enumerate(PAGES)]
    st.navigation(pages).run()
