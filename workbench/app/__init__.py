"""Streamlit pages: thin faces over the core (they call it, they never compute)."""
