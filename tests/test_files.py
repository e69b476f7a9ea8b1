"""Reading and writing user files: regular files only, reads within a size cap, one-line errors
naming the path."""

import os

import pytest
from helpers import user_error_in_child

from workbench.errors import UserError
from workbench.files import check_size, read_user_file, read_user_text, write_user_file


def test_a_regular_file_is_read_whole(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_bytes(b"[device]\nname = 'x'\n")
    assert read_user_file(path, "spec", 100) == b"[device]\nname = 'x'\n"
    assert read_user_text(path, "spec", 100) == "[device]\nname = 'x'\n"


def test_a_file_at_the_cap_is_read_and_one_byte_more_is_refused(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"x" * 64)
    assert len(read_user_file(path, "model", 64)) == 64
    with pytest.raises(UserError, match=f"^model {path}: 64 bytes is over the 63-byte limit$"):
        read_user_file(path, "model", 63)


def test_a_huge_sparse_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "big.toml"
    with open(path, "wb") as f:
        f.truncate(2**40)  # a terabyte that takes no disk: reading it would take hours
    with pytest.raises(UserError, match="1,099,511,627,776 bytes is over the 1,024-byte limit"):
        read_user_file(path, "suite", 1024)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "absent.toml", "no such file"),
        (lambda d: d, "not a regular file (a directory)"),
        (lambda d: _dangling(d), "no such file"),
    ],
)
def test_missing_files_and_directories_are_one_line(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(UserError) as info:
        read_user_file(path, "spec", 1024)
    assert str(info.value) == f"spec {path}: {message}"


def _dangling(directory):
    link = directory / "link.toml"
    link.symlink_to(directory / "gone.toml")
    return link


def test_text_that_is_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(UserError, match=f"^spec {path}: not UTF-8 text \\(byte 11\\)$"):
        read_user_text(path, "spec", 1024)


def test_check_size_of_an_upload():
    check_size(10, "model a.onnx", 10)
    with pytest.raises(UserError, match="^model a.onnx: 11 bytes is over the 10-byte limit$"):
        check_size(11, "model a.onnx", 10)


def _child_error(path) -> str:
    return user_error_in_child("workbench.files", 'read_user_file(PATH, "spec", 2**20)', path)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "spec.toml"
    os.mkfifo(fifo)
    assert _child_error(fifo) == f"spec {fifo}: not a regular file (a FIFO)"
    link = tmp_path / "link.toml"
    link.symlink_to(fifo)  # the link is followed: what counts is what it points to
    assert _child_error(link) == f"spec {link}: not a regular file (a FIFO)"


def test_a_device_that_never_ends_is_refused():
    assert _child_error("/dev/zero") == "spec /dev/zero: not a regular file (a character device)"


def test_a_written_file_is_new_or_replaces_a_regular_file(tmp_path):
    path = tmp_path / "new" / "dirs" / "spec.toml"
    write_user_file(path, "a much longer first text\n", "--out")
    write_user_file(path, "short\n", "--out")  # replaced whole, not overwritten in place
    assert path.read_text() == "short\n"
    write_user_file(path, b"\x00bytes", "--out")
    assert path.read_bytes() == b"\x00bytes"


def _write_error(path) -> str:
    return user_error_in_child("workbench.files", 'write_user_file(PATH, "x", "--out")', path)


def test_a_fifo_is_never_written_and_never_waited_on(tmp_path):
    fifo = tmp_path / "spec.toml"
    os.mkfifo(fifo)  # no reader: opening it to write would block for ever
    assert _write_error(fifo) == f"--out {fifo}: not a regular file (a FIFO)"
    link = tmp_path / "link.toml"
    link.symlink_to(fifo)
    assert _write_error(link) == f"--out {link}: not a regular file (a FIFO)"


@pytest.mark.parametrize(
    "path, message",
    [
        ("/dev/null", "--out /dev/null: not a regular file (a character device)"),
        ("/sys/workbench-spec.toml", "--out /sys/workbench-spec.toml: cannot write"),  # sysfs refuses even root
        ("", "--out: give a file name"),
    ],
)
def test_special_and_unwritable_targets_are_one_line(path, message):
    with pytest.raises(UserError) as info:
        write_user_file(path, "x", "--out")
    assert str(info.value).startswith(message)


def test_a_directory_or_a_file_in_the_way_is_refused(tmp_path):
    (tmp_path / "file").write_text("mine")
    for path, message in ((tmp_path, "not a regular file (a directory)"),
                          (tmp_path / "file" / "x.toml", "cannot write")):
        with pytest.raises(UserError) as info:
            write_user_file(path, "x", "--out")
        assert str(info.value).startswith(f"--out {path}: {message}")
    assert (tmp_path / "file").read_text() == "mine"
