"""The target table: what the workbench knows about each TVM target kind, in one place.

A kernel is compiled for a TVM target dict (`DeviceSpec.target_dict`); its `kind` says where
the kernel runs (`runtime_device`, the argument of `tvm.device`), which texts the build keeps
(`sources`: file suffix and `inspect_source` format, the main one first) and how the dashboard
names and highlights each text (`SOURCE_TEXTS`, by suffix). A kind missing from the table (a GPU kind TVM knows but no preset
uses) likewise runs on the TVM device of its own name and keeps its device code under its own name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    kind: str  # TVM target kind
    runtime_device: str  # `tvm.device(runtime_device, 0)` runs its kernels
    sources: tuple[tuple[str, str], ...]  # (suffix, format) of the texts a build keeps
    on_host: bool  # the host module is the kernel (LLVM on a CPU); else it sits in a device module


TARGETS = {
    "llvm": Target("llvm", "cpu", (("ll", "ll"), ("s", "asm")), on_host=True),  # LLVM IR, assembly
    "cuda": Target("cuda", "cuda", (("cu", ""),), on_host=False),  # the device code as CUDA C
    "rocm": Target("rocm", "rocm", (("rocm", ""),), on_host=False),  # AMD GPUs (the mi50 preset)
}

# A source text's display name and `st.code` language (a Prism name) by its suffix; a suffix
# missing here shows under its own name as plain text.
SOURCE_TEXTS = {"cu": ("CUDA C", "cpp"), "ll": ("LLVM IR", "llvm"), "s": ("assembly", "nasm")}


def target(kind: str) -> Target:
    """The table's entry for `kind`, or one built from the kind's own name (see the docstring)."""
    return TARGETS.get(kind) or Target(kind, kind, ((kind, ""),), on_host=False)


def runtime_device(kind: str, index: int = 0):
    """The `tvm.runtime.Device` that runs kernels built for target kind `kind`."""
    import tvm

    return tvm.device(target(kind).runtime_device, index)


def source_name(suffix: str) -> str:
    return SOURCE_TEXTS.get(suffix, (suffix, "text"))[0]


def language(suffix: str) -> str:
    return SOURCE_TEXTS.get(suffix, (suffix, "text"))[1]
