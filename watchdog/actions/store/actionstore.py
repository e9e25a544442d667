"""What the remediation side remembers across restarts: the action audit log (auditlog.py), saved launch
specs, drain flags, quarantines, silences, the pause switch and small keyed values, in one SQLite file
(statedb.py: its schema, crash safety and what becomes of a file that cannot be used).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from ...statehealth import StateHealth
from .auditlog import AuditLog
from .records import MATCH_OPS, ActionRecord, Quarantine, Silence, StepRecord, parse_silence_matchers
from .statedb import json_text, transaction, writes

__all__ = [
    "MATCH_OPS",
    "ActionRecord",
    "ActionStore",
    "Quarantine",
    "Silence",
    "StepRecord",
    "parse_silence_matchers",
]

ACTIONS_DB = "actions.sqlite"  # the store's file in state_dir (the audit log `replay --audit` reads)
_SILENCE_COLUMNS = ", ".join(f.name for f in fields(Silence))


class ActionStore(AuditLog):
    """The remediation state database; `path` None keeps it in memory. Use it from one thread. `health`
    is told when the file cannot be written and moves the store back to it (see statehealth)."""

    def __init__(
        self,
        path: str | None,
        *,
        health: StateHealth | None = None,
        on_drain: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.on_drain = on_drain  # told of every drain change (the gateway)
        super().__init__(path, health=health)

    @writes
    def prune(self, before: float) -> int:
        """Forget rows that never ran (skipped, would_do, refused, dry runs) and silences that ended before
        `before`; how many rows. Real runs are kept: backoff and crash loops look back across them."""
        with transaction(self._db) as db:
            gone = db.execute(
                "DELETE FROM actions WHERE started_at < ? AND outcome != 'running'"
                " AND (dry_run = 1 OR outcome IN ('skipped', 'would_do', 'refused'))",
                (before,),
            ).rowcount
            db.execute("DELETE FROM steps WHERE action_id NOT IN (SELECT id FROM actions)")
            db.execute("DELETE FROM silences WHERE ends_at < ?", (before,))
        return gone

    # --- saved launch specs ---

    @writes
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

    @writes
    def drop_spec(self, target: str, key: str) -> None:
        """Forget a saved spec (none: no error)."""
        self._db.execute("DELETE FROM specs WHERE target = ? AND key = ?", (target, key))

    # --- drain flags ---

    @writes
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

    # --- quarantines ---

    @writes
    def quarantine(self, target: str, reason: str, now: float, action_id: int | None = None) -> None:
        """Quarantine a target: drained (its drain flag set) and no action that stops its server, until the
        quarantine is lifted; a second quarantine keeps the first one's time and starts its count again."""
        with transaction(self._db) as db:
            db.execute(
                "INSERT INTO quarantines (target, since, reason, action_id, passes) VALUES (?, ?, ?, ?, 0)"
                " ON CONFLICT (target) DO UPDATE SET reason = excluded.reason,"
                " action_id = excluded.action_id, passes = 0",
                (target, now, reason, action_id),
            )
            db.execute(
                "INSERT INTO drains (target, since, action_id) VALUES (?, ?, ?)"
                " ON CONFLICT (target) DO UPDATE SET action_id = excluded.action_id",
                (target, now, action_id),
            )
        if self.on_drain is not None:
            self.on_drain(target, True)

    def quarantines(self) -> dict[str, Quarantine]:
        """Quarantined targets."""
        rows = self._db.execute("SELECT target, since, reason, action_id, passes FROM quarantines")
        return {str(r[0]): Quarantine(str(r[0]), float(r[1]), str(r[2]), r[3], int(r[4])) for r in rows}

    @writes
    def count_pass(self, target: str, passed: bool) -> int:
        """Count a passing known-answer check of a quarantined target (a failing one starts again at 0);
        the passes in a row, 0 for a target that is not quarantined."""
        with transaction(self._db) as db:
            db.execute(
                "UPDATE quarantines SET passes = CASE WHEN ? THEN passes + 1 ELSE 0 END WHERE target = ?",
                (passed, target),
            )
            row = db.execute("SELECT passes FROM quarantines WHERE target = ?", (target,)).fetchone()
        return 0 if row is None else int(row[0])

    @writes
    def lift_quarantine(self, target: str, now: float) -> bool:
        """End a target's quarantine and undrain it; False if it was not quarantined."""
        with transaction(self._db) as db:
            gone = db.execute("DELETE FROM quarantines WHERE target = ?", (target,)).rowcount
            if gone:
                db.execute("DELETE FROM drains WHERE target = ?", (target,))
        if gone and self.on_drain is not None:
            self.on_drain(target, False)
        return bool(gone)

    # --- silences ---

    @writes
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
        doc = json_text([{"name": m.name, "op": m.op, "value": m.value} for m in parsed])
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

    @writes
    def expire_silence(self, silence_id: str, now: float) -> bool:
        """End a silence now; False if there is no such silence or it has ended already."""
        cur = self._db.execute(
            "UPDATE silences SET starts_at = MIN(starts_at, :now), ends_at = :now, updated_at = :now"
            " WHERE id = :id AND ends_at > :now",
            {"now": now, "id": silence_id},
        )
        return cur.rowcount > 0

    # --- pause ---

    @writes
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

    @writes
    def put(self, key: str, value: Any) -> None:
        """Keep a JSON-serialisable value under `key` (TypeError if it is not); None removes the key."""
        if value is None:
            self._db.execute("DELETE FROM kv WHERE key = ?", (key,))
            return
        self._db.execute(
            "INSERT INTO kv VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, json.dumps(value, sort_keys=True, separators=(",", ":"))),
        )
