"""The audit log: a row per action (begun, stepped and finished, or recorded at once) with its step log,
in the action state database (statedb.py), read back newest first."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import fields
from typing import Any

from .records import ActionRecord, StepRecord
from .statedb import StateDB, json_text, transaction, writes

OUTCOMES = ("succeeded", "failed", "rolled_back", "skipped", "would_do", "refused")
"""How an action ends; a begun, unfinished action's outcome is "running"."""
_COLUMNS = ", ".join(f.name for f in fields(ActionRecord) if f.name != "steps")


def _check_outcome(outcome: str) -> None:
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r} (known: {', '.join(OUTCOMES)})")


class AuditLog(StateDB):
    """The actions and their steps: what the rails, retries and `replay --audit` read back."""

    @writes
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
        labels_json = json_text(dict(labels))
        return self._insert(
            (action, type, target, trigger, labels_json, dry_run, "running", "", now, None, needed_at)
        )

    @writes
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
        labels_json = json_text(dict(labels))
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

    @writes
    def step(self, action_id: int, step: str, now: float, details: Mapping[str, Any] | None = None) -> None:
        """Set a running action's current step and append it to its step log."""
        with transaction(self._db) as db:
            self._running(action_id)
            db.execute("UPDATE actions SET step = ? WHERE id = ?", (step, action_id))
            db.execute(
                "INSERT INTO steps (action_id, step, at, details) VALUES (?, ?, ?, ?)",
                (action_id, step, now, json_text(dict(details)) if details else None),
            )

    @writes
    def annotate(self, action_id: int, details: Mapping[str, Any]) -> None:
        """Merge `details` into a running action's details now (finish merges its own later)."""
        with transaction(self._db) as db:
            merged = json.loads(self._running(action_id)) | dict(details)
            db.execute("UPDATE actions SET details = ? WHERE id = ?", (json_text(merged), action_id))

    @writes
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
        with transaction(self._db) as db:
            merged = json.loads(self._running(action_id)) | dict(details or {})
            db.execute(
                "UPDATE actions SET outcome = ?, reason = ?, details = ?, finished_at = ? WHERE id = ?",
                (outcome, reason, json_text(merged), now, action_id),
            )

    def _running(self, action_id: int) -> str:
        row = self._db.execute("SELECT outcome, details FROM actions WHERE id = ?", (action_id,)).fetchone()
        if row is None:
            raise ValueError(f"no action with id {action_id}")
        if row[0] != "running":
            raise ValueError(f"action {action_id} has already finished ({row[0]})")
        return str(row[1])

    def by_id(self, action_id: int) -> ActionRecord | None:
        """One row with its steps; None if there is none."""
        found = self._select("id = ?", [action_id], "id DESC", 1, True)
        return found[0] if found else None

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
