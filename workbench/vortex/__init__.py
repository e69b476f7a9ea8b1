"""Vortex (dynamic shapes): a small set of kernels with a symbolic outer extent, built once
without shape samples, and a run-time choice among them by predicted cost (docs/vortex.md)."""
