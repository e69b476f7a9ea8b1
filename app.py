"""The dashboard: `streamlit run app.py` (or `make app`). Only starts the pages."""

from workbench.app.main import run

run()
