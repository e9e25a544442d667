"""The persisted delivery queue: one SQLite table of items per notifier, bounded, oldest dropped first.

Items stay in the table until the receiver has taken them (or refused them for good), so a watchdog
restart loses nothing. Used from the asyncio loop thread only; every call is a short local transaction.

A file that cannot be opened or written (read-only, full disk) does not stop delivery: the queue moves to
memory, with a warning, and back to the file once it can be written (statehealth.FallbackDB). Items then
queued only in memory are lost if the watchdog stops before that.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..statehealth import FallbackDB, FileOrMemory, StateHealth, private_file

log = logging.getLogger(__name__)

T = TypeVar("T")
SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    id INTEGER PRIMARY KEY AUTOINCREMENT,   -- AUTOINCREMENT: ids never go back, so they order items
    notifier TEXT NOT NULL,
    kind TEXT NOT NULL,                     -- "alert" | "event"
    key TEXT,                               -- alert identity where newer states supersede older ones
    body TEXT NOT NULL,
    enqueued_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS items_by_notifier ON items (notifier, id);
CREATE INDEX IF NOT EXISTS items_by_key ON items (notifier, key);
"""
# Ids of a queue begun in memory start here, above any id of its file, so that moving its items into the file
# keeps their ids (and their order after the file's) even while a delivery holds them.
MEMORY_ID_BASE = 1 << 40


@dataclass(frozen=True)
class Item:
    """One queued notification: an alert or an action event, as JSON."""

    id: int
    kind: str
    key: str | None
    body: str
    enqueued_at: float


@dataclass(frozen=True)
class NewItem:
    """An item to enqueue; `key` set means a queued item with the same key is replaced."""

    kind: str
    body: str
    key: str | None = None


class DeliveryQueue(FileOrMemory):
    """Queued items per notifier in a SQLite file (WAL), or in memory when `path` is None. `health` is told
    when the file cannot be written and moves the queue back to it (see statehealth)."""

    def __init__(self, path: str | None, *, health: StateHealth | None = None) -> None:
        self.path = path
        self._file: FallbackDB | None = None
        if path is None:
            self._memory = self._prepare(sqlite3.connect(":memory:"))
        else:
            self._file = FallbackDB(path, self._open, _memory, self._prepare, _merge, health=health)

    def _open(self, path: str) -> sqlite3.Connection:
        private_file(path)  # 0600, and so its -wal and -shm
        try:
            return self._prepare(sqlite3.connect(path))
        except sqlite3.OperationalError:
            raise  # locked, unreadable directory...: not corruption, nothing to move aside
        except sqlite3.DatabaseError as exc:
            aside = self._move_aside(path)
            log.error(
                "notification queue unreadable; moved aside, starting empty",
                extra={"path": path, "moved_to": aside, "error": str(exc)},
            )
            private_file(path)
            return self._prepare(sqlite3.connect(path))

    @staticmethod
    def _prepare(db: sqlite3.Connection) -> sqlite3.Connection:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"schema version {version} is newer than {SCHEMA_VERSION}")
            with db:
                db.executescript(_SCHEMA)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    @staticmethod
    def _move_aside(path: str) -> str:
        n = 1
        while os.path.exists(f"{path}.corrupt-{n}"):
            n += 1
        aside = f"{path}.corrupt-{n}"
        os.replace(path, aside)
        for suffix in ("-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.replace(path + suffix, aside + suffix)
        return aside

    def push(self, notifier: str, items: Sequence[NewItem], now: float, max_queue: int) -> int:
        """Append items (replacing queued ones with the same key), then drop the oldest beyond max_queue.

        Returns how many were dropped for room."""
        return self._write(lambda: self._push(notifier, items, now, max_queue))

    def _push(self, notifier: str, items: Sequence[NewItem], now: float, max_queue: int) -> int:
        with self._db:
            for item in items:
                if item.key is not None:
                    self._db.execute("DELETE FROM items WHERE notifier = ? AND key = ?", (notifier, item.key))
                self._db.execute(
                    "INSERT INTO items (notifier, kind, key, body, enqueued_at) VALUES (?, ?, ?, ?, ?)",
                    (notifier, item.kind, item.key, item.body, now),
                )
            return self._trim(notifier, max_queue)

    def trim(self, notifier: str, max_queue: int) -> int:
        """Drop a notifier's oldest items beyond max_queue; returns how many."""

        def trim() -> int:
            with self._db:
                return self._trim(notifier, max_queue)

        return self._write(trim)

    def _trim(self, notifier: str, max_queue: int) -> int:
        excess = self.count(notifier) - max_queue
        if excess <= 0:
            return 0
        cur = self._db.execute(
            "DELETE FROM items WHERE id IN (SELECT id FROM items WHERE notifier = ? ORDER BY id LIMIT ?)",
            (notifier, excess),
        )
        return cur.rowcount

    def head(self, notifier: str, limit: int, after: int = 0, up_to: int | None = None) -> list[Item]:
        """The oldest items of a notifier with after < id <= up_to, at most `limit`."""
        rows = self._db.execute(
            "SELECT id, kind, key, body, enqueued_at FROM items"
            " WHERE notifier = ? AND id > ? AND id <= ? ORDER BY id LIMIT ?",
            (notifier, after, up_to if up_to is not None else 2**63 - 1, limit),
        ).fetchall()
        return [Item(*row) for row in rows]

    def remove(self, ids: Iterable[int]) -> int:
        """Delete items by id; returns how many were still there."""
        ids = list(ids)
        if not ids:
            return 0

        def remove() -> int:
            with self._db:
                marks = ",".join("?" * len(ids))
                return self._db.execute(f"DELETE FROM items WHERE id IN ({marks})", ids).rowcount

        return self._write(remove)

    def count(self, notifier: str) -> int:
        """How many items a notifier has queued."""
        row = self._db.execute("SELECT count(*) FROM items WHERE notifier = ?", (notifier,)).fetchone()
        return int(row[0])

    def last_id(self) -> int:
        """The highest id handed out so far (0 if none)."""
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'items'").fetchone()
        return int(row[0]) if row else 0

    def notifiers(self) -> set[str]:
        """Names of the notifiers that have items queued."""
        return {r[0] for r in self._db.execute("SELECT DISTINCT notifier FROM items")}

    def purge(self, notifier: str) -> int:
        """Delete every item of a notifier; returns how many."""

        def purge() -> int:
            with self._db:
                return self._db.execute("DELETE FROM items WHERE notifier = ?", (notifier,)).rowcount

        return self._write(purge)

    def close(self) -> None:
        """Close the database (items stay in the file)."""
        self._db.close()


def _memory() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    with db:
        db.executescript(_SCHEMA)
        db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('items', ?)", (MEMORY_ID_BASE,))
    return db


def _merge(memory: sqlite3.Connection, disk: sqlite3.Connection) -> bool:
    """Move the items of a queue begun in memory (its file was unreadable) into the file, after its items;
    an item with a key replaces the file's item with that key, as push does."""
    rows = memory.execute(
        "SELECT id, notifier, kind, key, body, enqueued_at FROM items ORDER BY id"
    ).fetchall()
    with disk:
        for row in rows:
            if row[3] is not None:
                disk.execute("DELETE FROM items WHERE notifier = ? AND key = ?", (row[1], row[3]))
            disk.execute(
                "INSERT INTO items (id, notifier, kind, key, body, enqueued_at) VALUES (?, ?, ?, ?, ?, ?)",
                row,
            )
    return True
