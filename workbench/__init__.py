"""tile-workbench: construct tensor kernels step by step (Roller, Gensor), build them with TVM,
check the construction's predictions against profiled runs, and export them."""

__version__ = "0.1.0"
