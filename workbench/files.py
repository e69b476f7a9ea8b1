"""Reading and writing the files a user names (device specs, suite TOMLs, ONNX models, a
detected spec, a construction graph) and checking uploads.

Only regular files are read or written, and never more than a cap read: a FIFO would block
`open` until some writer (or reader) comes, `/dev/zero` reads without end, and a directory or
socket cannot be read at all, so each of them is refused with one line naming the path. Every
reader of user files goes through `read_user_file`, every writer of one file through
`write_user_file`; an upload (already in memory) is checked with `check_size`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from workbench.errors import UserError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_size(size: int, what: str, max_bytes: int) -> None:
    """Refuse `size` bytes over `max_bytes`; `what` names the file, e.g. "model mlp.onnx"."""
    if size > max_bytes:
        raise UserError(f"{what}: {size:,} bytes is over the {max_bytes:,}-byte limit")


def read_user_file(path: str | Path, what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes`; UserError as "<what> <path>: ..."."""
    label = f"{what} {path}"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{label}: no such file") from None
    except OSError as err:
        raise UserError(f"{label}: cannot read ({err.strerror or err})") from None
    _check_regular(info, label)
    check_size(info.st_size, label, max_bytes)
    # O_NONBLOCK: should the path be swapped for a FIFO after the stat, open returns at once
    # instead of waiting for a writer (the fstat below then refuses it).
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise UserError(f"{label}: cannot read ({err.strerror or err})") from None
    with os.fdopen(fd, "rb") as file:
        _check_regular(os.fstat(fd), label)
        try:
            data = file.read(max_bytes + 1)  # one byte more tells a file that grew past the cap
        except OSError as err:
            raise UserError(f"{label}: cannot read ({err.strerror or err})") from None
    check_size(len(data), label, max_bytes)
    return data


def read_user_text(path: str | Path, what: str, max_bytes: int) -> str:
    """`read_user_file` decoded as UTF-8."""
    data = read_user_file(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{what} {path}: not UTF-8 text (byte {err.start})") from None


def write_user_file(path: str | Path, data: str | bytes, what: str) -> None:
    """Write `data` (text as UTF-8) to `path`, a new file (its missing parent directories made)
    or a regular file it replaces; UserError as "<what> <path>: ..." for anything else there."""
    label = f"{what} {path}"
    if not str(path).strip() or "\0" in str(path):
        raise UserError(f"{what}: give a file name")
    try:
        _check_regular(os.stat(path), label)
    except FileNotFoundError:
        pass  # a new file (or a dangling link, which open follows and creates its target)
    except OSError as err:
        raise UserError(f"{label}: cannot write ({err.strerror or err})") from None
    # O_NONBLOCK: should the path be swapped for a FIFO after the stat, open fails at once
    # (ENXIO, no reader) instead of waiting for one; no O_TRUNC before the fstat has seen a
    # regular file.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        raise UserError(f"{label}: cannot write ({err.strerror or err})") from None
    with os.fdopen(fd, "wb") as file:
        _check_regular(os.fstat(fd), label)
        try:
            file.truncate(0)
            file.write(data.encode("utf-8") if isinstance(data, str) else data)
        except OSError as err:
            raise UserError(f"{label}: cannot write ({err.strerror or err})") from None


def _check_regular(info: os.stat_result, label: str) -> None:
    if stat.S_ISREG(info.st_mode):
        return
    kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a plain file")
    raise UserError(f"{label}: not a regular file ({kind})")
