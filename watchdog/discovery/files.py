"""file_sd: the files a discovery's patterns match, looked at every `refresh_interval` and read again when
they change.

Without inotify, a change is seen by polling: each matching file's identity (inode, size, mtime and ctime
in nanoseconds) is compared with what it was when last read. A file rewritten within the clock granularity
of its file system could keep all four, so a file whose mtime was less than `RACY` seconds before it was
read is read once more at the next look (git's "racily clean" rule). A file that stops matching takes its
targets with it; a file that cannot be read or parsed keeps the targets it listed last time it was good
(Prometheus' rule), and its problems are logged once per change of the file and counted.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config.targets import TargetConfig
from ..errors import Problem
from .config import FileSdConfig
from .targetgroups import read_groups

log = logging.getLogger(__name__)
MAX_FILES = 256  # files one discovery reads; more matches are ignored (and logged)
RACY = 2.0  # seconds: a file modified this close to its read may change again unseen
LOGGED = 10  # problems of one refused file that are logged (all count in `problems`)


@dataclass(frozen=True)
class Refresh:
    """What one look at a discovery found: its targets (the last good ones of each bad source) and the
    problems of this look."""

    targets: tuple[TargetConfig, ...]
    problems: tuple[str, ...] = ()


@dataclass
class _File:
    """One file as last read."""

    identity: tuple[int, int, int, int]  # inode, size, mtime_ns, ctime_ns
    mtime: float
    racy: bool  # modified close to the read: read again next time
    good: tuple[TargetConfig, ...] = ()  # the targets of its last good version
    problems: list[Problem] = field(default_factory=list)  # of its current version


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FileDiscovery:
    """One `file_sd_configs` entry: its files as last read, their targets, and counts for own metrics."""

    def __init__(self, sd: FileSdConfig, clock: Callable[[], float]) -> None:
        self.sd = sd
        self.clock = clock
        self.files: dict[str, _File] = {}
        self.read_errors = 0  # files read and refused (Prometheus' prometheus_sd_file_read_errors_total)

    def paths(self) -> list[str]:
        """The files the patterns match now, each once, in order, at most MAX_FILES."""
        found: dict[str, None] = {}
        for pattern in self.sd.files:
            matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
            for path in matches:
                found.setdefault(path, None)
        paths = list(found)
        if len(paths) > MAX_FILES:
            log.error(
                "file_sd: too many files; the first ones are read",
                extra={"discovery": self.sd.name, "files": len(paths), "limit": MAX_FILES},
            )
        return paths[:MAX_FILES]

    def refresh(self) -> Refresh:
        """Look at every file: read those that changed, drop those gone (blocking: call it in a thread)."""
        seen: dict[str, _File] = {}
        problems: list[str] = []
        for path in self.paths():
            try:
                st = os.stat(path)
            except OSError:
                continue  # not there (any more): like a glob that matches nothing
            old = self.files.get(path)
            if old is not None and old.identity == _identity(st) and not old.racy:
                seen[path] = old
                continue
            seen[path] = self._read(path, st, old)
        for entry in seen.values():
            problems += [str(p) for p in entry.problems[:LOGGED]]
        self.files = seen
        targets = tuple(t for entry in seen.values() for t in entry.good)
        return Refresh(targets, tuple(problems))

    def _read(self, path: str, st: os.stat_result, old: _File | None) -> _File:
        now = self.clock()
        targets, problems = read_groups(path, self.sd)
        racy = now - st.st_mtime < RACY
        if problems:
            if old is None or old.identity != _identity(st) or old.problems != problems:
                self.read_errors += 1
                for problem in problems[:LOGGED]:
                    log.error(
                        "file_sd: file refused; its last good targets stay",
                        extra={"discovery": self.sd.name, "problem": str(problem), "problems": len(problems)},
                    )
            good = old.good if old is not None else ()
            return _File(_identity(st), st.st_mtime, racy, good, problems)
        if old is None or old.good != targets or old.problems:
            log.info(
                "file_sd: file read",
                extra={"discovery": self.sd.name, "file": path, "targets": len(targets)},
            )
        return _File(_identity(st), st.st_mtime, racy, targets)

    def mtimes(self) -> dict[str, float]:
        """Each file's mtime when last read (Prometheus' prometheus_sd_file_mtime_seconds)."""
        return {path: entry.mtime for path, entry in self.files.items()}


def check_files(sd: FileSdConfig) -> list[tuple[str, int, list[Problem]]]:
    """`vllm-watchdog check`: every file the patterns match now, with its target count or its problems."""
    out = []
    for path in FileDiscovery(sd, lambda: 0.0).paths():
        if not os.path.exists(path):
            continue
        targets, problems = read_groups(path, sd)
        out.append((path, len(targets), problems))
    return out
