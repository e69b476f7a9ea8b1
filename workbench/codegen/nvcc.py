"""nvcc: does generated CUDA source compile, and what does ptxas make of it (registers, spills).

Used to check CUDA kernels on machines without a GPU, and to show the register / spill report.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence


_TOOL_SECONDS = 300  # nvcc on a large unrolled kernel takes seconds; a hang should not block forever



@dataclass(frozen=True)
class PtxasReport:
    """`ptxas -v` on one kernel: registers per thread and local-memory spills (for a file of
    several entry functions: the most registers, stack and shared memory of any, the spills of all)."""

    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    shared_bytes: int


@dataclass(frozen=True)
class PtxResult:
    """nvcc's verdict on one kernel: the PTX and ptxas's report, or the first error lines."""

    ok: bool
    ptx: str = ""
    ptxas_report: PtxasReport | None = None
    error: str = ""
    arch: str = ""  # the architecture compiled for (see `ptx_arch`)
    cubin: bytes = b""  # ptxas's output for `arch`, what a CUDA driver loads without JIT
    kernels: tuple[tuple[str, PtxasReport], ...] = ()  # each entry function's report, in ptxas's order


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


@lru_cache(maxsize=None)
def nvcc_archs() -> tuple[str, ...]:
    """The `sm_XX` codes this nvcc can compile for (nvcc 13 dropped Volta, sm_70)."""
    if nvcc_path() is None:
        return ()
    done = subprocess.run([nvcc_path(), "--list-gpu-code"], capture_output=True, text=True, timeout=60)
    return tuple(line.strip() for line in done.stdout.split() if line.strip().startswith("sm_"))


def ptx_arch(arch: str) -> str:
    """`arch` when nvcc supports it (an `a`/`f` suffix counts as its base), else the oldest
    newer architecture it supports: PTX for a dropped architecture still checks the source."""
    known = nvcc_archs()
    base = re.sub(r"[af]$", "", arch)
    if base in known or not known:
        return arch
    newer = [a for a in known if _sm(a) >= _sm(base)]
    return min(newer, key=_sm) if newer else arch


def compile_ptx(source: str, arch: str) -> PtxResult:
    """Compile CUDA source to PTX with `nvcc --ptx -arch=<arch>`, then `ptxas -v` for registers
    and spills. Returns a failed result naming the problem when nvcc is missing or refuses."""
    return compile_ptx_many((source,), arch)[0]


def compile_ptx_many(sources: Sequence[str], arch: str) -> tuple[PtxResult, ...]:
    """`compile_ptx` for several kernels in one nvcc call (nvcc's start-up dominates small
    kernels); a failing batch is retried kernel by kernel so each error lands on its kernel."""
    if nvcc_path() is None:
        return tuple(PtxResult(False, error="nvcc not found on PATH") for _ in sources)
    if not sources:
        return ()
    arch = ptx_arch(arch)
    with tempfile.TemporaryDirectory(prefix="workbench-nvcc-") as tmp:
        names = [f"k{i}" for i in range(len(sources))]
        for name, source in zip(names, sources):
            Path(tmp, f"{name}.cu").write_text(source)
        failed = _nvcc(tmp, names, arch)
        if failed and len(names) > 1:
            return tuple(compile_ptx(source, arch) for source in sources)
        if failed:
            return (PtxResult(False, error=failed, arch=arch),)
        return tuple(_ptxas(Path(tmp, f"{name}.ptx"), arch) for name in names)


def _nvcc(folder: str, names: Sequence[str], arch: str) -> str:
    """Run nvcc on `<name>.cu` files in `folder`; the error text, or "" on success."""
    # TVM's common-subexpression pass leaves unused temporaries: warning 177 is noise.
    command = [nvcc_path(), "--ptx", f"-arch={arch}", "-diag-suppress", "177", *(f"{n}.cu" for n in names)]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=_TOOL_SECONDS)
    return "" if done.returncode == 0 else _errors(done)


def _errors(done: subprocess.CompletedProcess) -> str:
    """The first error lines of a failed tool run, on one line."""
    lines = [l.strip() for l in (done.stderr + done.stdout).splitlines() if l.strip()]
    errors = [l for l in lines if "error" in l.lower()] or lines or [f"exit status {done.returncode}"]
    return "; ".join(errors[:3])


def _ptxas(ptx_file: Path, arch: str) -> PtxResult:
    ptx = ptx_file.read_text()
    ptxas = shutil.which("ptxas") or str(Path(nvcc_path()).with_name("ptxas"))
    if not Path(ptxas).exists():
        return PtxResult(True, ptx, None, "ptxas not found: no register report", arch)
    command = [ptxas, "-v", f"-arch={arch}", str(ptx_file), "-o", str(ptx_file.with_suffix(".cubin"))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=_TOOL_SECONDS)
    if done.returncode != 0:
        return PtxResult(False, ptx, None, f"ptxas: {_errors(done)}", arch)
    text = done.stderr + done.stdout
    kernels = _kernel_reports(text)
    return PtxResult(True, ptx, _total(kernels) if kernels else _parse_ptxas(text), "", arch,
                     ptx_file.with_suffix(".cubin").read_bytes(), kernels)


def _parse_ptxas(text: str) -> PtxasReport:
    def number(pattern: str) -> int:
        found = re.search(pattern, text)
        return int(found.group(1)) if found else 0

    return PtxasReport(
        registers=number(r"Used (\d+) registers"),
        spill_store_bytes=number(r"(\d+) bytes spill stores"),
        spill_load_bytes=number(r"(\d+) bytes spill loads"),
        stack_bytes=number(r"(\d+) bytes stack frame"),
        shared_bytes=number(r"(\d+) bytes smem"),
    )


# ptxas -v reports each entry function in a section opened by this line.
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")


def _kernel_reports(text: str) -> tuple[tuple[str, PtxasReport], ...]:
    """(entry function, its report) for each section of `ptxas -v` output."""
    starts = list(_ENTRY.finditer(text))
    ends = [m.start() for m in starts[1:]] + [len(text)]
    return tuple((m.group(1), _parse_ptxas(text[m.start():end])) for m, end in zip(starts, ends))


def _total(kernels: Sequence[tuple[str, PtxasReport]]) -> PtxasReport:
    """One report for a file of several kernels (see `PtxasReport`)."""
    reports = [r for _, r in kernels]
    return PtxasReport(
        registers=max(r.registers for r in reports),
        spill_store_bytes=sum(r.spill_store_bytes for r in reports),
        spill_load_bytes=sum(r.spill_load_bytes for r in reports),
        stack_bytes=max(r.stack_bytes for r in reports),
        shared_bytes=max(r.shared_bytes for r in reports),
    )


def _sm(arch: str) -> int:
    return int(re.sub(r"\D", "", arch) or 0)
