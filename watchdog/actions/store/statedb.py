"""The SQLite file under the action store: its schema and migrations, how it is opened, and what becomes of a
file that cannot be used.

Crash safety: every change is one SQLite transaction, so a `kill -9` at any moment leaves the whole change or
none of it. The journal is WAL with `synchronous=FULL`: each commit is fsynced, so a committed step also
survives a power loss or kernel panic (NORMAL would survive a kill -9 but could lose the last commits then),
and that is when a GPU host tends to go down and when the next watchdog must know that an action was halfway
(a container renamed aside, a power limit lowered). Writes are a handful per action; the fsyncs cost nothing.

A file that is not a database or fails SQLite's quick check is moved aside to `<path>.corrupt-<n>` (with its
WAL, which must not be replayed into the new file) and a fresh database is created, with an error logged; a
database from a newer watchdog goes to `<path>.newer-<n>` the same way. Nothing is deleted.

A file that cannot be opened or written (read-only, permission denied, disk full) does not stop the
watchdog: the store moves to a copy in memory and back once the file can be written (statehealth.FallbackDB);
`degraded` says which it uses. Every public write is decorated with `writes`, which does the move.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from ...statehealth import FallbackDB, FileOrMemory, StateHealth, merge_rows, private_dir, private_file

log = logging.getLogger("vllm_watchdog.actions.state")  # the whole action store logs under one name

_HEADER = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 2000  # another ActionStore on the same file (a reconcile) may hold the write lock briefly

_V1 = (
    "CREATE TABLE actions (id INTEGER PRIMARY KEY AUTOINCREMENT, action TEXT NOT NULL, type TEXT NOT NULL,"
    " target TEXT NOT NULL, trigger TEXT NOT NULL, labels TEXT NOT NULL, dry_run INTEGER NOT NULL,"
    " outcome TEXT NOT NULL, reason TEXT NOT NULL, step TEXT NOT NULL, details TEXT NOT NULL,"
    " started_at REAL NOT NULL, finished_at REAL, needed_at REAL)",
    "CREATE INDEX actions_by_action ON actions (target, action, id)",
    "CREATE INDEX actions_running ON actions (outcome) WHERE outcome = 'running'",
    "CREATE TABLE steps (id INTEGER PRIMARY KEY AUTOINCREMENT, action_id INTEGER NOT NULL"
    " REFERENCES actions (id), step TEXT NOT NULL, at REAL NOT NULL, details TEXT)",
    "CREATE INDEX steps_by_action ON steps (action_id, id)",
    "CREATE TABLE specs (target TEXT NOT NULL, key TEXT NOT NULL, text TEXT NOT NULL,"
    " saved_at REAL NOT NULL, PRIMARY KEY (target, key))",
    "CREATE TABLE drains (target TEXT PRIMARY KEY, since REAL NOT NULL, action_id INTEGER)",
    "CREATE TABLE silences (id TEXT PRIMARY KEY, matchers TEXT NOT NULL, starts_at REAL NOT NULL,"
    " ends_at REAL NOT NULL, comment TEXT NOT NULL, created_by TEXT NOT NULL, created_at REAL NOT NULL,"
    " updated_at REAL NOT NULL)",
    "CREATE TABLE pause (id INTEGER PRIMARY KEY CHECK (id = 1), paused INTEGER NOT NULL,"
    " reason TEXT NOT NULL, since REAL NOT NULL)",
    "CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)
Migration = Sequence[str] | Callable[[sqlite3.Connection], None]
"""SQL statements, or a function given the connection, that bring the schema from version n-1 to n."""
_V2 = (  # a target whose answers stayed wrong: kept drained, no restarts, until its answers pass again
    "CREATE TABLE quarantines (target TEXT PRIMARY KEY, since REAL NOT NULL, reason TEXT NOT NULL,"
    " action_id INTEGER, passes INTEGER NOT NULL DEFAULT 0)",
)
MIGRATIONS: Mapping[int, Migration] = {1: _V1, 2: _V2}
"""The migration hook: version -> its migration; each runs in one transaction with its version bump."""
SCHEMA_VERSION = max(MIGRATIONS)
_TABLES = ("actions", "steps", "specs", "drains", "silences", "pause", "kv", "quarantines")
_AUTOINCREMENTED = {  # the columns that hold an id of an AUTOINCREMENT table, by table
    "actions": {"id": "actions"},
    "steps": {"id": "steps", "action_id": "actions"},
    "drains": {"action_id": "actions"},
    "quarantines": {"action_id": "actions"},
}


class NewerSchemaError(Exception):
    """The database was written by a newer watchdog: its schema version is unknown here."""


def migrate(db: sqlite3.Connection, where: str, migrations: Mapping[int, Migration] = MIGRATIONS) -> int:
    """Bring the schema to the newest version in `migrations`, one transaction per version; that version."""
    newest = max(migrations)
    version = first = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > newest:
        raise NewerSchemaError(
            f"action state database {where} has schema version {version}, newer than {newest}"
        )
    while version < newest:
        with transaction(db):
            version = int(db.execute("PRAGMA user_version").fetchone()[0])  # another opener may have done it
            if version < newest:
                step = migrations[version + 1]
                if callable(step):
                    step(db)
                else:
                    for statement in step:
                        db.execute(statement)
                version += 1
                db.execute(f"PRAGMA user_version = {version}")
    if 0 < first < version:
        log.info("migrated action state database %s from schema version %d to %d", where, first, version)
    return version


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        if db.in_transaction:  # SQLite has rolled back by itself after a full disk or an I/O error
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _connect(where: str) -> sqlite3.Connection:
    if where != ":memory:" and Path(where).is_file():
        with open(where, "rb") as f:
            head = f.read(len(_HEADER))
        if head not in (b"", _HEADER):  # SQLite would delete the WAL beside a file it cannot read
            raise sqlite3.DatabaseError("file is not a database")
    if where != ":memory:":
        private_file(where)
    db = sqlite3.connect(where, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed: {check}")
        migrate(db, where)
    except BaseException:
        db.close()
        raise
    return db


def _is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    text = str(exc).lower()
    name = getattr(exc, "sqlite_errorname", "")
    return name in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or "malformed" in text or "not a database" in text


def _move_aside(path: Path, suffix: str) -> Path:
    n = 1
    while any(Path(f"{path}.{suffix}-{n}{x}").exists() for x in ("", "-wal", "-shm")):
        n += 1
    dest = Path(f"{path}.{suffix}-{n}")
    for extra in ("-wal", "-shm"):
        if Path(f"{path}{extra}").exists():
            Path(f"{path}{extra}").replace(f"{dest}{extra}")
    path.replace(dest)
    return dest


def json_text(value: object) -> str:
    """A value as the database keeps it: compact JSON, keys sorted, the unencodable as text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _memory() -> sqlite3.Connection:
    return sqlite3.connect(":memory:", isolation_level=None)


def _merge(memory: sqlite3.Connection, disk: sqlite3.Connection) -> bool:
    """Write a memory store begun empty (its file was unreadable) into the file's database: audit rows after
    the file's, other rows over the file's. Not while an action runs: its flow holds its row's id."""
    if memory.execute("SELECT 1 FROM actions WHERE outcome = 'running' LIMIT 1").fetchone():
        return False
    with transaction(disk):
        merge_rows(memory, disk, _TABLES, _AUTOINCREMENTED)
    return True


P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S", bound=FileOrMemory)


def writes(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """A write: on a file that refuses it, the store moves to memory and the write is done there."""

    def write(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._write(lambda: method(self, *args, **kwargs))

    functools.update_wrapper(write, method)  # the name and docstring; its return type would lose `self`
    return write


class StateDB(FileOrMemory):
    """The action state database on its file, or in memory (`path` None); an unusable file is moved aside."""

    def __init__(self, path: str | None, *, health: StateHealth | None = None) -> None:
        self.path = path
        self.moved_aside: Path | None = None  # where an unusable file went, if one did
        self._file: FallbackDB | None = None
        if path is None:
            self._memory = _connect(":memory:")
            return
        with contextlib.suppress(OSError):  # an unwritable parent: the store starts in memory
            private_dir(str(Path(path).parent))
        prepare = functools.partial(migrate, where=path)
        self._file = FallbackDB(path, self._open, _memory, prepare, _merge, health=health)

    def _open(self, path: str) -> sqlite3.Connection:
        """The file's database; an unusable file is moved aside and a new one made."""
        try:
            return _connect(path)
        except NewerSchemaError as exc:
            self.moved_aside = _move_aside(Path(path), "newer")
            log.error("%s: moved it to %s and started a new one", exc, self.moved_aside)
        except sqlite3.DatabaseError as exc:
            if not _is_corrupt(exc):
                raise
            self.moved_aside = _move_aside(Path(path), "corrupt")
            log.error(
                "action state database %s is corrupt (%s): moved it to %s and started a new one; the audit "
                "log, silences and saved launch specs in it are not used",
                *(path, exc, self.moved_aside),
            )
        return _connect(path)

    def close(self) -> None:
        """Close the database; the store is unusable afterwards."""
        self._db.close()
