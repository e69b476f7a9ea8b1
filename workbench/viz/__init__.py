"""Plotly figure builders: pure functions from core values to `plotly.graph_objects.Figure`.

No Streamlit and no ipywidgets here: the dashboard pages and the notebook widgets both draw with
these. Nothing here computes a model quantity; numbers come from the core.
"""
