"""GPU kernels measured elsewhere: a pack of built kernels for a GPU machine without TVM, and its
results brought back into the runs store (docs/gpu.md; the format there)."""
