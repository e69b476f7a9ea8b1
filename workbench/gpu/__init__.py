"""GPU packs: kernels built here, run on a GPU machine by a standalone runner."""
