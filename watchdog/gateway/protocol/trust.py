"""Whom the control channel trusts: the directories on the way to its socket, and the process at its end.

A directory is trusted when nobody but root or our own user can change what it holds: owned by one of the
two and not writable by group or others, or (like /tmp) root's (or ours) with the sticky bit, where nobody
can rename or remove another's entry. The socket's own directory must be ours (or root's) and not writable
by anyone else. A peer is trusted when the kernel says (SO_PEERCRED) that it runs as our user or as root.
Another local user who pre-creates the directory, plants a symlink or listens on the path is refused, with
an error that names the path, the owner found and the one expected.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
from collections import deque
from dataclasses import dataclass

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
MAX_LINKS = 40  # as the kernel's own limit on symlinks followed in one lookup


class NotTrusted(OSError):
    """The control socket, a directory on its way, or the process serving it may belong to another user."""


@dataclass(frozen=True)
class Peer:
    """Who is at the other end of a Unix socket, as the kernel recorded it (the listener: at listen())."""

    pid: int  # 0 when the peer lives in a pid namespace we cannot see (another container)
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    """The kernel's credentials of a connected Unix socket's peer; OSError if it has none."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    pid, uid, gid = _CRED.unpack(raw)
    return Peer(pid, uid, gid)


def trusted_uids(euid: int) -> tuple[int, ...]:
    """The users the channel trusts: ourselves and root."""
    return (euid, 0)


def check_peer(peer: Peer, path: str, euid: int) -> None:
    """NotTrusted unless the process serving `path` runs as our user or as root."""
    if peer.uid not in trusted_uids(euid):
        raise NotTrusted(
            f"the control socket {path} is served by uid {peer.uid} (pid {peer.pid}), expected uid {euid} "
            "(ours) or root: another user's process, not talking to it"
        )


def private_dir(directory: str, *, euid: int, create: bool) -> str:
    """Check the socket's directory and every directory and symlink on the way to it (with `create`, make
    the missing ones 0700; an existing one is left as it is); returns its real path. NotTrusted if anyone
    but root or `euid` could change any of them."""
    # Not os.path.abspath: it folds "x/.." without following x, where the kernel follows it.
    absolute = os.path.join(os.getcwd(), directory).rstrip("/")
    head, name = os.path.split(absolute)
    if name in ("", ".", ".."):
        raise NotTrusted(f"control socket directory {directory}: name it without a trailing . or ..")
    leaf = os.path.join(_walk(head, euid, create), name)
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(leaf, 0o700)
    info = os.lstat(leaf)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise NotTrusted(f"control socket directory {leaf} is not a directory (a symlink or a file): refused")
    _owned(leaf, info, euid, "control socket directory")
    if info.st_mode & 0o022:
        raise NotTrusted(
            f"control socket directory {leaf} has mode {stat.S_IMODE(info.st_mode):04o}: other users may "
            "write to it (expected 0700): refused"
        )
    return leaf


def check_socket(path: str, euid: int) -> None:
    """NotTrusted unless `path` is a socket (not a symlink) that our user or root created."""
    info = os.lstat(path)
    if not stat.S_ISSOCK(info.st_mode):
        raise NotTrusted(f"control socket {path} is not a socket: refused")
    _owned(path, info, euid, "control socket")


def _owned(path: str, info: os.stat_result, euid: int, what: str) -> None:
    if info.st_uid not in trusted_uids(euid):
        raise NotTrusted(
            f"{what} {path} belongs to uid {info.st_uid}, expected uid {euid} (ours) or root: refused"
        )


def _walk(path: str, euid: int, create: bool) -> str:
    """Resolve an absolute path one component at a time, checking each directory passed and each symlink
    followed (chains included); the real path. Missing directories are made 0700 with `create`."""
    _check_ancestor("/", os.lstat("/"), euid)
    pending = deque(part for part in path.split("/") if part)
    current, links = "/", 0
    while pending:
        part = pending.popleft()
        if part == ".":
            continue
        if part == "..":  # `current` holds no symlink, so its parent is the real one
            current = os.path.dirname(current)
            continue
        here = os.path.join(current, part)
        try:
            info = os.lstat(here)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(here, 0o700)
            info = os.lstat(here)
        if stat.S_ISLNK(info.st_mode):
            # Its directory is trusted already, so only root or we could have made it (a sticky /tmp aside,
            # where the owner check is what keeps another user's link out).
            _owned(here, info, euid, "symlink")
            links += 1
            if links > MAX_LINKS:
                raise NotTrusted(f"too many symlinks on the way to {path}")
            target = os.readlink(here)
            if target.startswith("/"):
                current = "/"
            pending.extendleft(reversed([p for p in target.split("/") if p]))
            continue
        _check_ancestor(here, info, euid)
        current = here
    return current


def _check_ancestor(path: str, info: os.stat_result, euid: int) -> None:
    if not stat.S_ISDIR(info.st_mode):
        raise NotTrusted(f"{path}, on the way to the control socket, is not a directory")
    _owned(path, info, euid, "directory")
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise NotTrusted(
            f"directory {path}, on the way to the control socket, has mode {stat.S_IMODE(info.st_mode):04o}: "
            "other users may replace what it holds: refused"
        )
