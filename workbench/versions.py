"""The versions of the packages that build and run a kernel: recorded in every bundle's manifest
and with every run, so a number can be traced to the software that made it."""


def versions() -> dict:
    """{"workbench", "tvm", "tvm_ffi", "numpy": version} of this process (imports TVM)."""
    import numpy
    import tvm
    import tvm_ffi

    import workbench

    return {"workbench": workbench.__version__, "tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__, "numpy": numpy.__version__}
