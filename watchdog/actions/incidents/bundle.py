"""Incident bundles on disk: one tar.gz per incident in state_dir/incidents (0700; each file 0600, its members
too), written whole or not at all, kept by count and total size (the newest always), and read back bounded.

Reading trusts nothing in the file (any local user who can write state_dir/incidents, or a damaged disk, may
have put it there): at most `ReadLimits.unpacked_bytes` are decompressed in all, kept or skipped; a member is
kept only if asked for and no larger than `member_bytes` (the manifest: `manifest_bytes`), so zero-filled or
sparse members cost nothing unless asked for, and then at most the cap; an extended tar header (pax, GNU long
name), which tarfile reads whole into memory, may hold at most EXTENDED_BYTES; JSON is parsed to at most
`json_depth` levels (`load_json`). A bundle that breaks any of these is a BundleError, for that bundle only.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import tarfile
import time
import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ...jsontext import parse
from ...statehealth import private_dir

INCIDENTS_DIR = "incidents"
SUFFIX = ".tar.gz"
MANIFEST = "manifest.json"
MAX_ID = 128
MAX_MEMBERS = 32
EXTENDED_BYTES = 4096  # a pax header or GNU long name; the watchdog's own bundles need none
_HEAD_SLACK = 16 * 1024  # the tar headers before a manifest and after it (the stream reads 10 KiB ahead)
_EXTENDED = frozenset(
    {
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
    }
)
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


@dataclass(frozen=True)
class ReadLimits:
    """What reading one bundle may cost. A bundle the watchdog wrote stays below each: its log is at most
    4 MiB, py-spy's output 4 MiB, a manifest a few KiB, the metrics (written last, never kept by a read that
    does not ask for them) at most 2 million samples."""

    member_bytes: int = 8 * 1024 * 1024  # each file kept
    manifest_bytes: int = 1024 * 1024
    unpacked_bytes: int = 256 * 1024 * 1024  # decompressed in all, kept or skipped; and the file's own size
    json_depth: int = 32  # a manifest nests 4 levels, stacks.json 5


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

    def __init__(
        self,
        state_dir: str,
        keep: int = 20,
        max_bytes: int = 256 * 1024 * 1024,
        limits: ReadLimits = ReadLimits(),
    ) -> None:
        self.state_dir = state_dir
        self.dir = os.path.join(state_dir, INCIDENTS_DIR)
        self.keep = keep
        self.max_bytes = max_bytes
        self.limits = limits

    def write(self, incident_id: str, files: Mapping[str, bytes], mtime: float) -> BundleInfo:
        """Write a bundle, atomically, then apply the retention; OSError if it cannot. The manifest comes
        first and the others smallest first, so that a read of the manifest, or of what a summary shows,
        stops before the metrics."""
        if not valid_id(incident_id):
            raise ValueError(f"not an incident id: {incident_id!r}")
        private_dir(self.state_dir)
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        os.chmod(self.dir, 0o700)  # an existing directory (or a umask) must not leave it readable by others
        final = os.path.join(self.dir, incident_id + SUFFIX)
        tmp = os.path.join(self.dir, f".{incident_id}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as raw:
                with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6) as tar:
                    tar.addfile(_member(incident_id, "", 0, mtime, directory=True))
                    order = sorted(files, key=lambda name: (name != MANIFEST, len(files[name]), name))
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

    def read(self, incident_id: str, names: Collection[str] | None = None) -> dict[str, bytes]:
        """The files of a bundle by name (every one, or those in `names`), read within the limits; BundleError
        if it is not there, not a bundle, or breaks a limit."""
        return self.contents(incident_id, names).files

    def contents(self, incident_id: str, names: Collection[str] | None = None) -> Contents:
        """As `read`, with the size of every file passed on the way (the metrics' too, unread)."""
        return self._contents(incident_id, names, self.limits.unpacked_bytes)

    def _contents(self, incident_id: str, names: Collection[str] | None, unpacked_bytes: int) -> Contents:
        info = self.info(incident_id)
        if info.size > self.limits.unpacked_bytes:
            raise BundleError(
                f"{info.path}: {info.size} bytes, more than the {self.limits.unpacked_bytes} read"
            )
        try:
            with open(info.path, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as packed:
                unpacked = _Unpacked(packed, unpacked_bytes, info.path)
                with tarfile.open(fileobj=unpacked, mode="r|", tarinfo=_Header) as tar:
                    return _members(tar, incident_id + "/", names, self.limits)
        except (OSError, tarfile.TarError, EOFError, ValueError, zlib.error) as exc:
            raise BundleError(f"cannot read {info.path}: {exc}") from None

    def manifest(self, incident_id: str) -> dict[str, Any]:
        """A bundle's manifest; BundleError. It must come first (after the bundle's directory), as `write`
        puts it: a list reads every bundle's manifest, and nothing placed before it is decompressed."""
        head = self.limits.manifest_bytes + _HEAD_SLACK
        raw = self._contents(incident_id, (MANIFEST,), head).files.get(MANIFEST)
        if raw is None:
            raise BundleError(f"incident {incident_id!r} has no {MANIFEST}")
        try:
            doc = load_json(raw, self.limits.json_depth, MANIFEST)
        except ValueError as exc:
            raise BundleError(f"incident {incident_id!r}: {exc}") from None
        if not isinstance(doc, dict):
            raise BundleError(f"incident {incident_id!r}: {MANIFEST} is not an object")
        return doc


def load_json(raw: bytes, max_depth: int = ReadLimits.json_depth, name: str = "bundle file") -> Any:
    """A bundle file's JSON, nested at most `max_depth` levels and valid Unicode; ValueError, beginning with
    `name`, if not (json recurses once per level: 200k levels end in RecursionError, a few hundred in answers
    that the API's encoders recurse over again)."""
    return parse(raw, max_depth, root=name)


@dataclass(frozen=True)
class Contents:
    """What a read found: the files asked for, and the size of each file passed until it stopped."""

    files: dict[str, bytes]
    sizes: dict[str, int]


def _members(
    tar: tarfile.TarFile, prefix: str, names: Collection[str] | None, limits: ReadLimits
) -> Contents:
    """The asked-for files of a bundle's tar stream; the others pass by unread (but decompressed)."""
    out: dict[str, bytes] = {}
    sizes: dict[str, int] = {}
    for n, member in enumerate(tar):
        if n > MAX_MEMBERS:
            break
        name = member.name.removeprefix(prefix)
        if not member.isfile() or not member.name.startswith(prefix) or "/" in name:
            continue
        sizes[name] = member.size
        if names is not None and name not in names:
            continue
        cap = limits.manifest_bytes if name == MANIFEST else limits.member_bytes
        if member.size > cap:
            raise BundleError(f"{member.name!r} holds {member.size} bytes, more than the {cap} read")
        data = tar.extractfile(member)
        out[name] = data.read() if data is not None else b""
        if names is not None and len(out) == len(names):
            break
    return Contents(out, sizes)


class _Header(tarfile.TarInfo):
    """A member's header, refused when it announces an extended header longer than EXTENDED_BYTES: tarfile
    reads a pax header or GNU long name whole into memory, as long as its header says."""

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> _Header:
        """The header in `buf`; BundleError for an extended one that is too long."""
        info = super().frombuf(buf, encoding, errors)
        if info.type in _EXTENDED and info.size > EXTENDED_BYTES:
            raise BundleError(f"an extended tar header of {info.size} bytes, more than {EXTENDED_BYTES}")
        return info


class _Unpacked(io.RawIOBase):
    """A bundle's tar stream as gzip decompresses it, ending in BundleError past `limit` bytes in all."""

    def __init__(self, packed: gzip.GzipFile, limit: int, path: str) -> None:
        super().__init__()
        self._packed, self._limit, self._left, self._path = packed, limit, limit, path

    def readable(self) -> bool:
        """It is."""
        return True

    def readinto(self, buffer: Any) -> int:
        """Decompress into `buffer`; BundleError once more than the limit has come out."""
        view = memoryview(buffer).cast("B")
        got = self._packed.readinto(view[: min(len(view), self._left + 1)])
        self._left -= got
        if self._left < 0:
            raise BundleError(f"{self._path}: more than {self._limit} bytes uncompressed")
        return got


def _member(incident_id: str, name: str, size: int, mtime: float, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(f"{incident_id}/{name}" if name else incident_id)
    info.size, info.mtime = size, int(mtime)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o700 if directory else 0o600
    return info
