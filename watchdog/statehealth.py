"""Whether the watchdog can write its state_dir, and SQLite files there that fall back to memory when not.

A read-only remount, a missing parent directory, lost permissions or a full disk must not stop the watchdog
from monitoring. `StateHealth` probes the directory (a small write, fsynced and removed) every
`PROBE_INTERVAL` seconds and just before each disruptive action, and collects the write errors the files
there report. While it is unwritable:

- each `FallbackDB` (the action database, the notification queue) works on a copy in memory, taken from the
  file when the file can still be read, so rails and `/api/v1/actions` keep their history;
- disruptive actions are refused (the remediator asks `refusal()` before it writes the audit row);
- the gauge `vllm_watchdog_state_writable` is 0.

When a probe succeeds again, every fallen-back file is written from its copy in memory (nothing decided
meanwhile is lost) and used again, with no restart.

What the watchdog keeps there (the audit log, silences, saved launch specs, queued notifications, alert
state, incident bundles, vLLM's log in process mode) is for its user only: the directory is created 0700 and
each file 0600 (`private_dir`, `private_file`), whatever the umask. A directory or file that already exists
is left as it is (it may be the operator's, shared on purpose), with one warning per path naming its mode.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

PROBE_FILE = ".write-probe"
PROBE_BYTES = 4096  # one page: a full tmpfs or filesystem refuses it, where an empty file would still fit
PROBE_INTERVAL = 10.0
RETRY_INTERVAL = 10.0  # a FallbackDB without a StateHealth tries its file again this often
_WRITE_ERRORS = ("SQLITE_FULL", "SQLITE_READONLY", "SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_PERM")
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
T = TypeVar("T")
_warned: set[tuple[str, int]] = set()  # (path, mode) already warned about: once per path and mode


def private_dir(directory: str) -> None:
    """Create `directory` 0700 (its missing parents as the umask says); warn once if an existing one is open
    to other users. OSError if it cannot be created."""
    try:
        os.makedirs(directory, mode=PRIVATE_DIR)  # the umask can only take bits away from 0700
    except OSError:
        if not os.path.isdir(directory):  # a read-only mount may answer EROFS for a directory that exists
            raise
        warn_if_open(directory)


def private_file(path: str) -> None:
    """Create `path` empty and 0600 unless it exists, before SQLite opens it: SQLite gives its -wal, -shm and
    -journal files the database file's mode. Warn once if an existing one is open to other users. A file
    that cannot be created is left to the caller's own open to report."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    except FileExistsError:
        warn_if_open(path)
    except OSError:
        return
    else:
        os.close(fd)


def warn_if_open(path: str) -> None:
    """Log a warning, once per path and mode, if `path` can be read or written by users other than its
    owner (group or other bits set). It is not changed: it may be shared on purpose."""
    try:
        st = os.stat(path)
    except OSError:
        return
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o077 or (path, mode) in _warned:
        return
    _warned.add((path, mode))
    wanted = PRIVATE_DIR if stat.S_ISDIR(st.st_mode) else PRIVATE_FILE
    log.warning(
        "state_dir path open to other users: it may hold the audit log, launch specs and vLLM's output; "
        "chmod it to the expected mode unless that is meant",
        extra={"path": path, "mode": f"{mode:04o}", "expected": f"{wanted:04o}"},
    )


def probe_write(directory: str) -> None:
    """Create `directory` if needed (0700), write, fsync and remove a small file in it; OSError if any step
    fails."""
    private_dir(directory)
    path = os.path.join(directory, PROBE_FILE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def is_write_failure(exc: BaseException) -> bool:
    """Whether a SQLite error means the file cannot be written (full, read-only, I/O, permission), as
    opposed to a busy lock or a bug in a statement."""
    seen: BaseException | None = exc
    while seen is not None:  # a failed ROLLBACK after a failed write hides the write's error in __context__
        name = getattr(seen, "sqlite_errorname", "") or ""
        text = str(seen).lower()
        if name.startswith(_WRITE_ERRORS) or any(
            hint in text for hint in ("disk is full", "readonly database", "disk i/o error", "unable to open")
        ):
            return True
        seen = seen.__context__
    return False


class StateHealth:
    """The state_dir's writability: the last probe, and write errors reported by the files kept there."""

    def __init__(
        self,
        state_dir: str,
        *,
        probe: Callable[[str], None] = probe_write,
        interval: float = PROBE_INTERVAL,
    ) -> None:
        self.state_dir = state_dir
        self.probe = probe
        self.interval = interval
        self.errors: dict[str, int] = {}  # file name -> failed writes
        self.problem = ""  # why the state_dir cannot be written; "" when the last probe succeeded
        self.dbs: list[FallbackDB] = []
        self._next: float | None = None
        self._logged = False  # the error is logged once per outage, not at every failed probe

    @property
    def writable(self) -> bool:
        """The last probe succeeded and every database is back on its file."""
        return not self.problem and not any(db.degraded for db in self.dbs)

    def failed(self, file: str, exc: BaseException) -> None:
        """A write to `file` (a name in state_dir) failed."""
        self.errors[file] = self.errors.get(file, 0) + 1
        if not self._logged:
            self._logged = True
            log.error(
                "state_dir is not writable: monitoring goes on, disruptive actions are refused",
                extra={"state_dir": self.state_dir, "file": file, "error": str(exc)},
            )
        self.problem = f"{file}: {exc}"

    def tick(self, now: float) -> bool:
        """Probe if one is due (`now`: monotonic seconds); whether the state_dir is writable."""
        if self._next is None or now >= self._next:
            return self.check(now)
        return self.writable

    def check(self, now: float) -> bool:
        """Probe now; after a success, move fallen-back databases back to their files. Whether writable."""
        self._next = now + self.interval
        try:
            self.probe(self.state_dir)
        except OSError as exc:
            self.failed(PROBE_FILE, exc)
            return False
        self.problem = ""
        for db in self.dbs:
            if db.degraded:
                db.recover()
        if self.writable and self._logged:
            self._logged = False
            log.warning("state_dir is writable again: actions allowed", extra={"state_dir": self.state_dir})
        return self.writable

    def refusal(self, now: float) -> str:
        """Why an action that must be recorded cannot be now ("" if it can), after a fresh probe."""
        if self.check(now):
            return ""
        return f"state_unwritable: cannot record the action in {self.state_dir} ({self.problem})"


class FallbackDB:
    """A SQLite connection on a file in state_dir that moves to a copy in memory when the file cannot be
    opened or written, and back to the file when it can (`recover`).

    `connect_memory` opens an empty in-memory database with the owner's connection settings; `prepare` makes
    a connection ready (schema, migrations) or raises sqlite3.DatabaseError; `merge` writes the rows of a
    memory copy that was not taken from the file into the reopened file, returning False to try later.
    """

    def __init__(
        self,
        path: str,
        open_file: Callable[[str], sqlite3.Connection],
        connect_memory: Callable[[], sqlite3.Connection],
        prepare: Callable[[sqlite3.Connection], object],
        merge: Callable[[sqlite3.Connection, sqlite3.Connection], bool],
        *,
        health: StateHealth | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.name = os.path.basename(path)
        self._open_file, self._connect_memory, self._prepare, self._merge = (
            open_file,
            connect_memory,
            prepare,
            merge,
        )
        self.health = health
        self.monotonic = monotonic
        self.degraded = False
        self._seeded = False  # the memory copy holds everything the file held
        self._retry_at = 0.0
        if health is not None:
            health.dbs.append(self)
        try:
            self.db = open_file(path)
        except (sqlite3.OperationalError, OSError) as exc:
            self.db = self._fall_back(exc, None)

    def run(self, write: Callable[[], T]) -> T:
        """Run a write; if the file refuses it, move to memory and run it there."""
        if self.degraded and self.health is None and self.monotonic() >= self._retry_at:
            self.recover()
        try:
            return write()
        except sqlite3.OperationalError as exc:
            if self.degraded or not is_write_failure(exc):
                raise
            self.db = self._fall_back(exc, self.db)
        return write()

    def _fall_back(self, exc: BaseException, current: sqlite3.Connection | None) -> sqlite3.Connection:
        self._report(exc)
        memory, self._seeded = self._copy(current), True
        if memory is None:
            memory, self._seeded = self._connect_memory(), False
            self._prepare(memory)
        if current is not None:
            with contextlib.suppress(sqlite3.Error):
                current.close()
        self.degraded = True
        self._retry_at = self.monotonic() + RETRY_INTERVAL
        log.warning(
            "state file cannot be written: kept in memory until it can",
            extra={"file": self.path, "error": str(exc), "copied": self._seeded},
        )
        return memory

    def _copy(self, current: sqlite3.Connection | None) -> sqlite3.Connection | None:
        """A memory copy of the file's content: read through the open connection, else read-only."""
        sources: list[Callable[[], sqlite3.Connection]] = []
        if current is not None:
            sources.append(lambda: current)
        elif Path(self.path).is_file():
            uri = Path(self.path).absolute().as_uri()
            # mode=ro reads a WAL left by a killed watchdog; immutable=1 opens when no -shm can be made
            sources += [lambda: _connect_uri(uri + "?mode=ro"), lambda: _connect_uri(uri + "?immutable=1")]
        for source in sources:
            memory = self._connect_memory()
            try:
                src = source()
                try:
                    src.backup(memory)
                finally:
                    if src is not current:
                        src.close()
                self._prepare(memory)
                return memory
            except Exception as exc:  # unreadable, corrupt, a newer schema: start from an empty one
                memory.close()
                log.info("cannot copy %s into memory: %s", self.path, exc)
        return None

    def recover(self) -> bool:
        """Move back to the file, writing into it what the memory copy holds; whether it worked."""
        if not self.degraded:
            return True
        self._retry_at = self.monotonic() + RETRY_INTERVAL
        try:
            disk = self._open_file(self.path)
        except (sqlite3.OperationalError, OSError) as exc:
            self._report(exc)
            return False
        try:
            if self._seeded or _empty(disk):
                self.db.backup(disk)
            elif not self._merge(self.db, disk):
                disk.close()
                return False
        except sqlite3.Error as exc:
            disk.close()
            self._report(exc)
            return False
        memory, self.db = self.db, disk
        memory.close()
        self.degraded = self._seeded = False
        log.warning("state file written again", extra={"file": self.path})
        return True

    def _report(self, exc: BaseException) -> None:
        if self.health is not None:
            self.health.failed(self.name, exc)


def merge_rows(
    memory: sqlite3.Connection,
    disk: sqlite3.Connection,
    tables: Sequence[str],
    ids: Mapping[str, Mapping[str, str]],
) -> None:
    """Copy every row of `tables` from memory into disk (INSERT OR REPLACE), in the caller's transaction.
    `ids[table][column]` names the AUTOINCREMENT table whose ids the column holds: the disk's last id of that
    table is added to it, so rows numbered from 1 in memory follow the disk's own."""
    last = {str(name): int(seq) for name, seq in disk.execute("SELECT name, seq FROM sqlite_sequence")}
    for table in tables:
        shift = {col: last.get(seq, 0) for col, seq in ids.get(table, {}).items()}
        cols = [str(c[1]) for c in memory.execute(f"PRAGMA table_info({table})")]
        insert = f"INSERT OR REPLACE INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        for row in memory.execute(f"SELECT {', '.join(cols)} FROM {table}").fetchall():
            values = [
                v + shift[c] if c in shift and v is not None else v for c, v in zip(cols, row, strict=True)
            ]
            disk.execute(insert, values)


def _connect_uri(uri: str) -> sqlite3.Connection:
    return sqlite3.connect(uri, uri=True)


def _empty(db: sqlite3.Connection) -> bool:
    """Whether no table of the database holds a row (a file just created, or one moved aside and new)."""
    tables = [
        r[0]
        for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    return not any(db.execute(f'SELECT 1 FROM "{t}" LIMIT 1').fetchone() for t in tables)


class FileOrMemory:
    """What a store on a FallbackDB (`_file`) or, with no file, only in memory (`_memory`) shares: the
    connection in use, whether it is degraded, and running a write so that a refusing file falls back."""

    _file: FallbackDB | None
    _memory: sqlite3.Connection

    @property
    def _db(self) -> sqlite3.Connection:
        return self._memory if self._file is None else self._file.db

    @property
    def degraded(self) -> bool:
        """Whether it works on a copy in memory because its file cannot be written."""
        return self._file is not None and self._file.degraded

    def _write(self, write: Callable[[], T]) -> T:
        return write() if self._file is None else self._file.run(write)
