"""Profiling: build candidates in worker processes, verify them against numpy, time them with a
runner (local CPU/GPU, TVM RPC tracker, or a fake for tests), store runs in SQLite, and compare
the construction's predictions with the measurements.

Entry point for the faces: `workbench.profile.session.profile_candidates`.
"""
