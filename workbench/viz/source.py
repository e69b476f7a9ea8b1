"""Where a kernel's source starts to matter: the line that defines its computation.

TVM's LLVM module opens with string constants (argument-check messages) and the FFI wrapper
`__tvm_ffi_<entry>` that unpacks arguments; the loops live in `<entry>_compute_`. CUDA C opens with
includes and helper macros before the `__global__` kernel. A reader wants the loops first.
"""

from __future__ import annotations

import re


def entry_line(text: str, suffix: str, entry: str) -> int:
    """The 0-based line where the kernel's computation is defined in `text` (a source with file
    suffix `suffix`, of the PrimFunc named `entry`); 0 when no definition is recognised."""
    lines = text.splitlines()
    compute = re.escape(f"{entry}_compute_")
    patterns = {
        "ll": (rf"^define\b.*@{compute}\(", r"^define\b"),
        "s": (rf"^{compute}:", r"^[A-Za-z_][\w$]*:"),
        "cu": (r"__global__",),
    }.get(suffix, ())
    for pattern in patterns:  # the computation first, else the first function
        for i, line in enumerate(lines):
            if re.search(pattern, line):
                return i
    return 0
