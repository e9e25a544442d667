"""The one reader of config-like files: regular files only, bounded, `bundled:` names confined."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from vllm_watchdog.config.files import UnreadableFileError, read_bounded, read_text, resolve_bundled


def test_a_regular_file_is_read_as_utf8(tmp_path: Path) -> None:
    path = tmp_path / "c.yml"
    path.write_text("targets: []  # é\n", encoding="utf-8")
    assert read_text(path) == "targets: []  # é\n"
    assert read_text(tmp_path / "c.yml", limit=len(path.read_bytes())) == "targets: []  # é\n"


def test_a_fifo_is_refused_at_once_without_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "rules.yml"
    os.mkfifo(fifo)
    done = threading.Event()
    errors: list[str] = []

    def read() -> None:
        try:
            read_text(fifo)
        except UnreadableFileError as exc:
            errors.append(str(exc))
        done.set()

    threading.Thread(target=read, daemon=True).start()  # a blocking open would hang the thread, not pytest
    assert done.wait(5), "reading a FIFO blocked"
    assert errors == ["not a regular file but a FIFO"]


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/dev/zero", "not a regular file but a character device"),
        ("/dev/null", "not a regular file but a character device"),
        ("/proc/self/environ", "not a regular file but a kernel pseudo-file"),
        ("/proc/self/status", "not a regular file but a kernel pseudo-file"),
        ("/", "not a regular file but a directory"),
    ],
)
def test_devices_directories_and_proc_files_are_refused(path: str, reason: str) -> None:
    with pytest.raises(UnreadableFileError) as info:
        read_text(path)
    assert str(info.value) == reason


def test_a_symlink_to_a_device_is_refused(tmp_path: Path) -> None:
    (tmp_path / "inc.yml").symlink_to("/dev/zero")
    with pytest.raises(UnreadableFileError, match="character device"):
        read_text(tmp_path / "inc.yml")


def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yml"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(UnreadableFileError, match=r"a socket"):
            read_text(path)


def test_a_file_over_the_size_cap_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "big.yml"
    path.write_bytes(b"#" * 1001)
    with pytest.raises(UnreadableFileError, match="larger than the 1000-byte limit"):
        read_text(path, limit=1000)


def test_a_file_growing_while_read_is_bounded() -> None:
    """The size seen at fstat is not trusted: a source that goes on is read up to limit + 1 bytes, no more."""
    rfd, wfd = os.pipe()
    try:
        os.write(wfd, b"x" * 5000)  # more than the limit is already there, and the writer stays open
        assert read_bounded(rfd, 64) == b"x" * 65
        assert os.read(rfd, 10_000) == b"x" * (5000 - 65)
    finally:
        os.close(rfd)
        os.close(wfd)


def test_binary_contents_are_refused_without_quoting_them(tmp_path: Path) -> None:
    path = tmp_path / "blob.yml"
    path.write_bytes(b"a: \xff\xfesecret-bytes\n")
    with pytest.raises(UnreadableFileError) as info:
        read_text(path)
    assert str(info.value) == "not UTF-8 text at byte 3"


def test_a_missing_file_names_the_os_reason(tmp_path: Path) -> None:
    with pytest.raises(UnreadableFileError, match="No such file or directory"):
        read_text(tmp_path / "nothere.yml")


@pytest.mark.parametrize(
    "name", ["../../../../etc/passwd", "/etc/passwd", "sub/../../outside.yml", "", ".", "sub/.."]
)
def test_bundled_names_cannot_leave_the_bundled_folder(tmp_path: Path, name: str) -> None:
    root = tmp_path / "rules"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside.yml").write_text("actions: {}\n")
    with pytest.raises(UnreadableFileError, match="must stay inside the bundled folder"):
        resolve_bundled(name, root)


def test_a_bundled_symlink_pointing_outside_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "rules"
    root.mkdir()
    (tmp_path / "secret.yml").write_text("x: 1\n")
    (root / "evil.yml").symlink_to(tmp_path / "secret.yml")
    (root / "fine.yml").write_text("x: 1\n")
    (root / "alias.yml").symlink_to("fine.yml")
    with pytest.raises(UnreadableFileError):
        resolve_bundled("evil.yml", root)
    assert resolve_bundled("alias.yml", root) == (root / "fine.yml").resolve()
    assert resolve_bundled("sub/../fine.yml", root) == (root / "fine.yml").resolve()
