"""Incident bundles on disk: one tar.gz per incident in state_dir/incidents (0700; each file 0600, its members
too), written whole or not at all, kept by count and total size (the newest always), and read back bounded."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INCIDENTS_DIR = "incidents"
SUFFIX = ".tar.gz"
MANIFEST = "manifest.json"
MAX_ID = 128
MAX_MEMBERS = 32
MAX_MEMBER_BYTES = 64 * 1024 * 1024
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


class BundleError(Exception):
    """A bundle is not there or cannot be read."""


def valid_id(text: str) -> bool:
    """Whether `text` can be an incident id: letters, digits and `_.-`, a letter or digit first."""
    return 0 < len(text) <= MAX_ID and text[0].isascii() and text[0].isalnum() and set(text) <= _ID_CHARS


def new_id(now: float, target: str, action_id: int) -> str:
    """`<UTC time>-<target>-<audit row id>`: unique per action, sortable, safe in a path and a URL."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    safe = "".join(c if c in _ID_CHARS else "_" for c in target)[:64]
    return f"{stamp}-{safe}-{action_id}"


@dataclass(frozen=True)
class BundleInfo:
    """One bundle on disk."""

    id: str
    path: str
    size: int
    mtime: float


class Bundles:
    """The bundles of one state_dir, at most `keep` of them and `max_bytes` in all (the newest is kept
    whatever its size)."""

    def __init__(self, state_dir: str, keep: int = 20, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.dir = os.path.join(state_dir, INCIDENTS_DIR)
        self.keep = keep
        self.max_bytes = max_bytes

    def write(self, incident_id: str, files: Mapping[str, bytes], mtime: float) -> BundleInfo:
        """Write a bundle (manifest first), atomically, then apply the retention; OSError if it cannot."""
        if not valid_id(incident_id):
            raise ValueError(f"not an incident id: {incident_id!r}")
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        os.chmod(self.dir, 0o700)  # an existing directory (or a umask) must not leave it readable by others
        final = os.path.join(self.dir, incident_id + SUFFIX)
        tmp = os.path.join(self.dir, f".{incident_id}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as raw:
                with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6) as tar:
                    tar.addfile(_member(incident_id, "", 0, mtime, directory=True))
                    order = sorted(files, key=lambda name: (name != MANIFEST, name))
                    for name in order:
                        data = files[name]
                        tar.addfile(_member(incident_id, name, len(data), mtime), io.BytesIO(data))
                raw.flush()
                os.fsync(raw.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        info = self._info(incident_id + SUFFIX)
        self.prune()
        if info is None:
            raise OSError(f"{final} vanished right after it was written")
        return info

    def prune(self) -> list[str]:
        """Remove the oldest bundles beyond `keep` or `max_bytes`; the ids removed."""
        kept, total, removed = 0, 0, []
        for info in self.list():
            kept += 1
            total += info.size
            if kept > 1 and (kept > self.keep or total > self.max_bytes):
                try:
                    os.unlink(info.path)
                    removed.append(info.id)
                except OSError:
                    continue
                kept -= 1
                total -= info.size
        return removed

    def list(self) -> list[BundleInfo]:
        """Every bundle, newest first."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        found = [self._info(n) for n in names if n.endswith(SUFFIX) and valid_id(n[: -len(SUFFIX)])]
        return sorted((i for i in found if i is not None), key=lambda i: (i.mtime, i.id), reverse=True)

    def _info(self, name: str) -> BundleInfo | None:
        path = os.path.join(self.dir, name)
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not os.path.isfile(path) or os.path.islink(path):
            return None
        return BundleInfo(name[: -len(SUFFIX)], path, st.st_size, st.st_mtime)

    def info(self, incident_id: str) -> BundleInfo:
        """The bundle of this id; BundleError if there is none."""
        found = self._info(incident_id + SUFFIX) if valid_id(incident_id) else None
        if found is None:
            raise BundleError(f"no incident {incident_id!r} in {self.dir}")
        return found

    def read(self, incident_id: str, only: str | None = None) -> dict[str, bytes]:
        """The files of a bundle by name (or just `only`), each at most MAX_MEMBER_BYTES; BundleError."""
        info = self.info(incident_id)
        out: dict[str, bytes] = {}
        prefix = incident_id + "/"
        try:
            with tarfile.open(info.path, mode="r:gz") as tar:
                for n, member in enumerate(tar):
                    if n > MAX_MEMBERS:
                        break
                    name = member.name.removeprefix(prefix)
                    if not member.isfile() or not member.name.startswith(prefix) or "/" in name:
                        continue
                    if member.size > MAX_MEMBER_BYTES:
                        raise BundleError(f"{member.name} is larger than {MAX_MEMBER_BYTES} bytes")
                    if only is not None and name != only:
                        continue
                    data = tar.extractfile(member)
                    out[name] = data.read(MAX_MEMBER_BYTES) if data is not None else b""
                    if only is not None:
                        break
        except (OSError, tarfile.TarError, EOFError) as exc:
            raise BundleError(f"cannot read {info.path}: {exc}") from None
        return out

    def manifest(self, incident_id: str) -> dict[str, Any]:
        """A bundle's manifest; BundleError."""
        raw = self.read(incident_id, MANIFEST).get(MANIFEST)
        if raw is None:
            raise BundleError(f"incident {incident_id!r} has no {MANIFEST}")
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise BundleError(f"incident {incident_id!r}: {MANIFEST}: {exc}") from None
        if not isinstance(doc, dict):
            raise BundleError(f"incident {incident_id!r}: {MANIFEST} is not an object")
        return doc


def _member(incident_id: str, name: str, size: int, mtime: float, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(f"{incident_id}/{name}" if name else incident_id)
    info.size, info.mtime = size, int(mtime)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o700 if directory else 0o600
    return info
