"""What the remediation side remembers across restarts: the action audit log, saved launch specs, drain
flags, silences, the pause switch and small keyed values, in one SQLite file.

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
`degraded` says which it uses. Every public write goes through `_write`, which does the move.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import sqlite3
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from ..statehealth import FallbackDB, FileOrMemory, StateHealth, merge_rows
from .records import MATCH_OPS, ActionRecord, Silence, StepRecord, parse_silence_matchers

__all__ = [
    "BUSY_TIMEOUT_MS",
    "MATCH_OPS",
    "MIGRATIONS",
    "OUTCOMES",
    "SCHEMA_VERSION",
    "ActionRecord",
    "ActionStore",
    "Migration",
    "NewerSchemaError",
    "Silence",
    "StepRecord",
    "migrate",
    "parse_silence_matchers",
]

log = logging.getLogger(__name__)

OUTCOMES = ("succeeded", "failed", "rolled_back", "skipped", "would_do", "refused")
"""How an action ends; a begun, unfinished action's outcome is "running"."""
_HEADER = b"SQLite format 3\x00"
ACTIONS_DB = "actions.sqlite"  # the store's file in state_dir (the audit log `replay --audit` reads)
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
MIGRATIONS: Mapping[int, Migration] = {1: _V1}
"""The migration hook: version -> its migration; each runs in one transaction with its version bump."""
SCHEMA_VERSION = max(MIGRATIONS)
_TABLES = ("actions", "steps", "specs", "drains", "silences", "pause", "kv")
_AUTOINCREMENTED = {  # the columns that hold an id of an AUTOINCREMENT table, by table
    "actions": {"id": "actions"},
    "steps": {"id": "steps", "action_id": "actions"},
    "drains": {"action_id": "actions"},
}


_COLUMNS = ", ".join(f.name for f in fields(ActionRecord) if f.name != "steps")
_SILENCE_COLUMNS = ", ".join(f.name for f in fields(Silence))


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
        with _transaction(db):
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
def _transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
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


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _check_outcome(outcome: str) -> None:
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r} (known: {', '.join(OUTCOMES)})")


def _memory() -> sqlite3.Connection:
    return sqlite3.connect(":memory:", isolation_level=None)


def _merge(memory: sqlite3.Connection, disk: sqlite3.Connection) -> bool:
    """Write a memory store begun empty (its file was unreadable) into the file's database: audit rows after
    the file's, other rows over the file's. Not while an action runs: its flow holds its row's id."""
    if memory.execute("SELECT 1 FROM actions WHERE outcome = 'running' LIMIT 1").fetchone():
        return False
    with _transaction(disk):
        merge_rows(memory, disk, _TABLES, _AUTOINCREMENTED)
    return True


P = ParamSpec("P")
R = TypeVar("R")


def _write(method: Callable[Concatenate[ActionStore, P], R]) -> Callable[Concatenate[ActionStore, P], R]:
    """A write: on a file that refuses it, the store moves to memory and the write is done there."""

    def write(self: ActionStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._write(lambda: method(self, *args, **kwargs))

    functools.update_wrapper(write, method)  # the name and docstring; its return type would lose `self`
    return write


class ActionStore(FileOrMemory):
    """The remediation state database; `path` None keeps it in memory. Use it from one thread. `health`
    is told when the file cannot be written and moves the store back to it (see statehealth)."""

    def __init__(
        self,
        path: str | None,
        *,
        health: StateHealth | None = None,
        on_drain: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.path = path
        self.moved_aside: Path | None = None  # where an unusable file went, if one did
        self.on_drain = on_drain  # told of every drain change (the gateway)
        self._file: FallbackDB | None = None
        if path is None:
            self._memory = _connect(":memory:")
            return
        with contextlib.suppress(OSError):  # an unwritable parent: the store starts in memory
            Path(path).parent.mkdir(parents=True, exist_ok=True)
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

    # --- the audit log ---

    @_write
    def begin(
        self,
        action: str,
        type: str,
        target: str,
        trigger: str,
        labels: Mapping[str, str],
        dry_run: bool,
        now: float,
        *,
        needed_at: float | None = None,
    ) -> int:
        """Start an audit row with outcome "running"; its id. `needed_at`: when the trigger began (the
        alert's startsAt), which tells a new need from an old alert still firing (see rails: crash loop)."""
        labels_json = _json(dict(labels))
        return self._insert(
            (action, type, target, trigger, labels_json, dry_run, "running", "", now, None, needed_at)
        )

    @_write
    def record(
        self,
        action: str,
        type: str,
        target: str,
        trigger: str,
        labels: Mapping[str, str],
        outcome: str,
        reason: str,
        dry_run: bool,
        now: float,
        *,
        needed_at: float | None = None,
    ) -> int:
        """A finished one-shot row (an action skipped by a rail, a dry run's "would_do"); its id."""
        _check_outcome(outcome)
        labels_json = _json(dict(labels))
        return self._insert(
            (action, type, target, trigger, labels_json, dry_run, outcome, reason, now, now, needed_at)
        )

    def _insert(self, row: tuple[object, ...]) -> int:
        cur = self._db.execute(
            "INSERT INTO actions (action, type, target, trigger, labels, dry_run, outcome, reason,"
            " started_at, finished_at, needed_at, step, details)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '', '{}')",
            row,
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    @_write
    def step(self, action_id: int, step: str, now: float, details: Mapping[str, Any] | None = None) -> None:
        """Set a running action's current step and append it to its step log."""
        with _transaction(self._db) as db:
            self._running(action_id)
            db.execute("UPDATE actions SET step = ? WHERE id = ?", (step, action_id))
            db.execute(
                "INSERT INTO steps (action_id, step, at, details) VALUES (?, ?, ?, ?)",
                (action_id, step, now, _json(dict(details)) if details else None),
            )

    @_write
    def finish(
        self,
        action_id: int,
        outcome: str,
        now: float,
        reason: str = "",
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """End a running action; `details` are merged into the row's details. ValueError if not running."""
        _check_outcome(outcome)
        with _transaction(self._db) as db:
            merged = json.loads(self._running(action_id)) | dict(details or {})
            db.execute(
                "UPDATE actions SET outcome = ?, reason = ?, details = ?, finished_at = ? WHERE id = ?",
                (outcome, reason, _json(merged), now, action_id),
            )

    def _running(self, action_id: int) -> str:
        row = self._db.execute("SELECT outcome, details FROM actions WHERE id = ?", (action_id,)).fetchone()
        if row is None:
            raise ValueError(f"no action with id {action_id}")
        if row[0] != "running":
            raise ValueError(f"action {action_id} has already finished ({row[0]})")
        return str(row[1])

    def unfinished(self) -> list[ActionRecord]:
        """Actions begun and never finished (still running, or the watchdog died), oldest first."""
        return self._select("outcome = 'running'", [], "id ASC", None, True)

    def history(
        self,
        limit: int | None = 100,
        target: str | None = None,
        action: str | None = None,
        *,
        dry_run: bool | None = None,
        outcomes: Collection[str] | None = None,
        started_after: float | None = None,
        after_id: int | None = None,
        steps: bool = True,
    ) -> list[ActionRecord]:
        """Audit rows, newest first, filtered by every argument given (`limit` None: all)."""
        flag = None if dry_run is None else int(dry_run)
        conditions = (
            ("target = ?", target),
            ("action = ?", action),
            ("dry_run = ?", flag),
            ("started_at > ?", started_after),
            ("id > ?", after_id),
        )
        where = [clause for clause, value in conditions if value is not None]
        params: list[object] = [value for _, value in conditions if value is not None]
        if outcomes is not None:
            where.append(f"outcome IN ({', '.join('?' for _ in outcomes) or 'NULL'})")
            params.extend(outcomes)
        return self._select(" AND ".join(where) or "1", params, "id DESC", limit, steps)

    def _select(
        self, where: str, params: list[object], order: str, limit: int | None, steps: bool
    ) -> list[ActionRecord]:
        sql = f"SELECT {_COLUMNS} FROM actions WHERE {where} ORDER BY {order}"
        sql += "" if limit is None else f" LIMIT {int(limit)}"
        logs: dict[int, list[StepRecord]] = {}
        if steps:
            ids = sql.replace(_COLUMNS, "id", 1)
            query = f"SELECT action_id, step, at, details FROM steps WHERE action_id IN ({ids}) ORDER BY id"
            for action_id, step, at, details in self._db.execute(query, params):
                logs.setdefault(action_id, []).append(
                    StepRecord(step, at, json.loads(details) if details else None)
                )
        out = []
        for row in self._db.execute(sql, params):
            doc = dict(zip(_COLUMNS.split(", "), row, strict=True))
            doc.update(
                labels=json.loads(doc["labels"]),
                details=json.loads(doc["details"]),
                dry_run=bool(doc["dry_run"]),
            )
            out.append(ActionRecord(**doc, steps=tuple(logs.get(doc["id"], ()))))
        return out

    @_write
    def prune(self, before: float) -> int:
        """Forget rows that never ran (skipped, would_do, refused, dry runs) and silences that ended before
        `before`; how many rows. Real runs are kept: backoff and crash loops look back across them."""
        with _transaction(self._db) as db:
            gone = db.execute(
                "DELETE FROM actions WHERE started_at < ? AND outcome != 'running'"
                " AND (dry_run = 1 OR outcome IN ('skipped', 'would_do', 'refused'))",
                (before,),
            ).rowcount
            db.execute("DELETE FROM steps WHERE action_id NOT IN (SELECT id FROM actions)")
            db.execute("DELETE FROM silences WHERE ends_at < ?", (before,))
        return gone

    # --- saved launch specs ---

    @_write
    def save_spec(self, target: str, key: str, text: str, now: float) -> None:
        """Keep a launch spec (a Launch's JSON) under `key`, replacing an older one."""
        self._db.execute(
            "INSERT INTO specs (target, key, text, saved_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (target, key) DO UPDATE SET text = excluded.text, saved_at = excluded.saved_at",
            (target, key, text, now),
        )

    def load_spec(self, target: str, key: str) -> str | None:
        """The spec saved under `key`, None if there is none."""
        row = self._db.execute(
            "SELECT text FROM specs WHERE target = ? AND key = ?", (target, key)
        ).fetchone()
        return None if row is None else str(row[0])

    @_write
    def drop_spec(self, target: str, key: str) -> None:
        """Forget a saved spec (none: no error)."""
        self._db.execute("DELETE FROM specs WHERE target = ? AND key = ?", (target, key))

    # --- drain flags ---

    @_write
    def set_drain(self, target: str, drained: bool, now: float, action_id: int | None = None) -> None:
        """Mark a target drained (admit no new requests) or admitting again; a second drain keeps the time."""
        if not drained:
            self._db.execute("DELETE FROM drains WHERE target = ?", (target,))
        else:
            self._db.execute(
                "INSERT INTO drains (target, since, action_id) VALUES (?, ?, ?)"
                " ON CONFLICT (target) DO UPDATE SET action_id = excluded.action_id",
                (target, now, action_id),
            )
        if self.on_drain is not None:
            self.on_drain(target, drained)

    def drains(self) -> dict[str, float]:
        """Drained targets and since when."""
        return {str(t): float(s) for t, s in self._db.execute("SELECT target, since FROM drains")}

    # --- silences ---

    @_write
    def add_silence(
        self,
        matchers: Sequence[Mapping[str, Any]],
        starts_at: float,
        ends_at: float,
        comment: str,
        created_by: str,
        now: float,
    ) -> str:
        """Store a silence; its id. ValueError if a matcher is malformed, there is none, or it ends first."""
        parsed = parse_silence_matchers(matchers)
        if not parsed:
            raise ValueError("a silence needs at least one matcher (to stop every action, pause)")
        if ends_at <= starts_at:
            raise ValueError("a silence must end after it starts")
        sid = str(uuid.uuid4())
        doc = _json([{"name": m.name, "op": m.op, "value": m.value} for m in parsed])
        self._db.execute(
            f"INSERT INTO silences ({_SILENCE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (sid, doc, starts_at, ends_at, comment, created_by, now, now),
        )
        return sid

    def silences(self, now: float, active_only: bool = True) -> list[Silence]:
        """Silences, newest first: those in effect at `now`, or every one kept."""
        where = "starts_at <= :now AND ends_at > :now" if active_only else "1"
        rows = self._db.execute(
            f"SELECT {_SILENCE_COLUMNS} FROM silences WHERE {where} ORDER BY created_at DESC, rowid DESC",
            {"now": now},
        )
        return [Silence(r[0], parse_silence_matchers(json.loads(r[1])), *r[2:]) for r in rows]

    @_write
    def expire_silence(self, silence_id: str, now: float) -> bool:
        """End a silence now; False if there is no such silence or it has ended already."""
        cur = self._db.execute(
            "UPDATE silences SET starts_at = MIN(starts_at, :now), ends_at = :now, updated_at = :now"
            " WHERE id = :id AND ends_at > :now",
            {"now": now, "id": silence_id},
        )
        return cur.rowcount > 0

    # --- pause ---

    @_write
    def set_paused(self, paused: bool, reason: str, now: float) -> None:
        """Pause or resume every action. Resuming also ends crash-loop refusals (see rails)."""
        self._db.execute(
            "INSERT INTO pause (id, paused, reason, since) VALUES (1, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
            " paused = excluded.paused, reason = excluded.reason, since = excluded.since",
            (paused, reason, now),
        )

    def paused(self) -> tuple[bool, str, float | None]:
        """Whether actions are paused, the reason given, and since when (None: never paused or resumed)."""
        row = self._db.execute("SELECT paused, reason, since FROM pause WHERE id = 1").fetchone()
        return (False, "", None) if row is None else (bool(row[0]), str(row[1]), float(row[2]))

    # --- small keyed values ---

    def get(self, key: str) -> Any:
        """The value put under `key`, None if none."""
        row = self._db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    @_write
    def put(self, key: str, value: Any) -> None:
        """Keep a JSON-serialisable value under `key` (TypeError if it is not); None removes the key."""
        if value is None:
            self._db.execute("DELETE FROM kv WHERE key = ?", (key,))
            return
        self._db.execute(
            "INSERT INTO kv VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, json.dumps(value, sort_keys=True, separators=(",", ":"))),
        )
