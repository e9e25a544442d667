"""Reading config, include, rule and rule-test files: regular files only, bounded, `bundled:` confined.

Every file the watchdog loads as configuration goes through `read_text`: a FIFO, a device, a socket or a
`/proc` file is refused before a byte is read (a FIFO would hang `check` and freeze a reload; `/dev/zero`
would read until MemoryError), and a regular file is read up to `MAX_FILE_BYTES` only, however much it
grows meanwhile. `resolve_bundled` keeps `bundled:NAME` inside the bundled folder, symlinks included.
Refusals say why in a few words and never quote the file's contents.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_FILE_BYTES = 8 * 1024 * 1024  # far above any real config or rule file
_PSEUDO_ROOTS = ("/proc", "/sys")  # regular-looking files whose contents are the kernel's, not a config
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UnreadableFileError(ValueError):
    """A config-like file was refused or could not be read; the message names no contents."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "another kind of file")


def _pseudo_devices() -> set[int]:
    devices: set[int] = set()
    for root in _PSEUDO_ROOTS:
        try:
            devices.add(os.stat(root).st_dev)
        except OSError:
            continue
    return devices


def _check(st: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UnreadableFileError(f"not a regular file but {_kind(st.st_mode)}")
    if st.st_dev in _pseudo_devices():
        raise UnreadableFileError("not a regular file but a kernel pseudo-file")
    if st.st_size > limit:
        raise UnreadableFileError(f"larger than the {limit}-byte limit for config files")


def read_text(path: str | os.PathLike[str], limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes; UnreadableFileError otherwise."""
    try:
        _check(os.stat(path), limit)  # before opening: opening some devices has side effects
        # O_NONBLOCK: a FIFO swapped in after the stat must not block the open; the fstat refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise UnreadableFileError(exc.strerror or type(exc).__name__) from None
    try:
        st = os.fstat(fd)
        _check(st, limit)
        data = read_bounded(fd, limit)
    except OSError as exc:
        raise UnreadableFileError(exc.strerror or type(exc).__name__) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnreadableFileError(f"larger than the {limit}-byte limit for config files")
    if data and st.st_size == 0:
        raise UnreadableFileError("not a regular file but a pseudo-file (size 0, yet it has contents)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFileError(f"not UTF-8 text at byte {exc.start}") from None


def read_bounded(fd: int, limit: int) -> bytes:
    """At most limit + 1 bytes from fd (one more than allowed says "too large"), however long fd goes on."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def resolve_bundled(name: str, root: Path) -> Path:
    """The bundled file `name` under `root`; UnreadableFileError if it resolves anywhere outside root."""
    base = root.resolve()
    path = (base / name).resolve()
    if not name or not path.is_relative_to(base) or path == base:
        raise UnreadableFileError("a bundled name must stay inside the bundled folder")
    return path
