"""Alert state that survives a restart: a JSON file under state_dir, written atomically.

Prometheus rebuilds `for` countdowns after a restart from its ALERTS_FOR_STATE series (`RestoreForState`); our
store is in memory, so the state of every alert is saved to a file instead and restored the same way when the
group is first evaluated again:

- state saved longer ago than the outage tolerance (1h) is dropped, as Prometheus finds no series then;
- a firing alert stays firing and a resolved alert keeps being re-sent until its retention ends
  (Prometheus can only restore ActiveAt; we keep the whole alert, so a restart neither re-pends a firing
  alert nor loses its resolved notice);
- a pending alert of a rule whose `for` is shorter than the grace period (10m) is dropped and starts over, as
  in Prometheus; otherwise the time the watchdog was down does not count towards `for`, and at least the grace
  period remains before it fires.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..formats.stringmap import string_map
from ..statehealth import PRIVATE_FILE, private_dir
from .alerting import Alert, AlertingRule, AlertState, rule_identity
from .files import history_needed

log = logging.getLogger(__name__)

VERSION = 1
OUTAGE_TOLERANCE = 3600.0
"""Saved state older than this (seconds) is not restored (Prometheus' rules.alert.for-outage-tolerance)."""
FOR_GRACE_PERIOD = 600.0
"""Least time (seconds) a restored pending alert still waits (Prometheus' rules.alert.for-grace-period)."""


@dataclass(frozen=True)
class SavedRule:
    """The alerts of one alerting rule, identified as reloads match rules: name, labels, and occurrence."""

    name: str
    labels: tuple[tuple[str, str], ...]
    occurrence: int  # 0 for the first rule with this name and labels in the group, 1 for the second, ...
    alerts: tuple[Alert, ...]


@dataclass(frozen=True)
class SavedGroup:
    """The saved alerts of one rule group and when it was last evaluated (ms; None if never)."""

    file: str
    name: str
    evaluated_at: int | None
    rules: tuple[SavedRule, ...]


def _alert_doc(a: Alert) -> dict[str, Any]:
    return {
        "labels": dict(a.labels),
        "annotations": a.annotations,
        "state": str(a.state),
        "value": a.value,
        "active_at": a.active_at,
        "fired_at": a.fired_at,
        "resolved_at": a.resolved_at,
        "last_sent_at": a.last_sent_at,
        "valid_until": a.valid_until,
        "keep_firing_since": a.keep_firing_since,
    }


def _opt_int(doc: dict[str, Any], key: str) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} is not an integer")
    return value


def _str_map(value: Any, what: str) -> dict[str, str]:
    found = string_map(value)
    if found is None:
        raise ValueError(f"{what} is not a map of strings")
    return found


def _alert(doc: Any) -> Alert:
    if not isinstance(doc, dict):
        raise ValueError("alert is not an object")
    active_at = _opt_int(doc, "active_at")
    if active_at is None:
        raise ValueError("alert has no active_at")
    value = doc.get("value")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError("alert value is not a number")
    return Alert(
        labels=tuple(sorted(_str_map(doc.get("labels"), "alert labels").items())),
        annotations=_str_map(doc.get("annotations", {}), "annotations"),
        state=AlertState[str(doc.get("state", "")).upper()],
        value=float(value),
        active_at=active_at,
        fired_at=_opt_int(doc, "fired_at"),
        resolved_at=_opt_int(doc, "resolved_at"),
        last_sent_at=_opt_int(doc, "last_sent_at"),
        valid_until=_opt_int(doc, "valid_until"),
        keep_firing_since=_opt_int(doc, "keep_firing_since"),
    )


def encode(groups: Iterable[SavedGroup]) -> dict[str, Any]:
    """The JSON document of saved groups."""
    return {
        "version": VERSION,
        "groups": [
            {
                "file": g.file,
                "name": g.name,
                "evaluated_at": g.evaluated_at,
                "rules": [
                    {
                        "name": r.name,
                        "labels": dict(r.labels),
                        "occurrence": r.occurrence,
                        "alerts": [_alert_doc(a) for a in r.alerts],
                    }
                    for r in g.rules
                ],
            }
            for g in groups
        ],
    }


def decode(doc: Any) -> dict[tuple[str, str], SavedGroup]:
    """Saved groups by (file, name) from a JSON document; raises ValueError (or KeyError) if malformed."""
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("groups"), list):
        raise ValueError(f"not a version {VERSION} alert state document")
    out: dict[tuple[str, str], SavedGroup] = {}
    for g in doc["groups"]:
        rules = tuple(
            SavedRule(
                name=str(r["name"]),
                labels=tuple(sorted(_str_map(r.get("labels", {}), "rule labels").items())),
                occurrence=int(r.get("occurrence", 0)),
                alerts=tuple(_alert(a) for a in r["alerts"]),
            )
            for r in g["rules"]
        )
        key = (str(g["file"]), str(g["name"]))
        out[key] = SavedGroup(key[0], key[1], _opt_int(g, "evaluated_at"), rules)
    return out


def load_state(path: Path) -> dict[tuple[str, str], SavedGroup]:
    """Saved groups from the state file; an unreadable or corrupt one logs a warning, gives none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:  # the first start: nothing to restore, nothing wrong
        log.info("no saved alert state at %s: starting with no active alerts", path)
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("cannot read alert state file %s (%s): starting with no active alerts", path, exc)
        return {}
    try:
        return decode(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("alert state file %s is corrupt (%s): starting with no active alerts", path, exc)
        return {}


def save_state(path: Path, groups: Iterable[SavedGroup]) -> None:
    """Write the state file atomically (a temporary file, then os.replace); raises OSError on failure."""
    private_dir(str(path.parent))
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps(encode(groups), separators=(",", ":"), sort_keys=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def restore_alert(alert: Alert, hold_ms: int, now_ms: int, down_ms: int, grace_ms: int) -> Alert | None:
    """The alert as it resumes at now_ms after the watchdog went down at down_ms; None if it starts over."""
    if alert.state != AlertState.PENDING:
        return alert
    if hold_ms < grace_ms:
        return None
    remaining = hold_ms - (down_ms - alert.active_at)
    if remaining <= 0:
        return alert  # due to fire: the next evaluation fires it if its expression still returns it
    if remaining < grace_ms:
        alert.active_at = now_ms + grace_ms - hold_ms
    else:
        alert.active_at += now_ms - down_ms
    return alert


def _fingerprint(groups: Iterable[SavedGroup]) -> tuple[object, ...]:
    """What must reach the file: alert identities, states and times, not values or send bookkeeping."""
    return tuple(
        (
            g.file,
            g.name,
            tuple(
                (
                    r.name,
                    r.labels,
                    r.occurrence,
                    tuple(
                        (a.labels, a.state, a.active_at, a.fired_at, a.resolved_at, a.keep_firing_since)
                        for a in r.alerts
                    ),
                )
                for r in g.rules
            ),
        )
        for g in groups
    )


def _occurrences(rules: Sequence[AlertingRule]) -> list[tuple[AlertingRule, tuple[str, Any, int]]]:
    """Each rule with its identity: name, labels, and how many rules before it share them."""
    seen: dict[object, int] = {}
    out = []
    for rule in rules:
        name, labels = rule_identity(rule.rule)
        n = seen.get((name, labels), 0)
        seen[(name, labels)] = n + 1
        out.append((rule, (name, labels, n)))
    return out


def saved_group(key: tuple[str, str], evaluated_at: int | None, rules: Sequence[AlertingRule]) -> SavedGroup:
    """The alerts of a group's alerting rules as the state file keeps them."""
    saved = tuple(
        SavedRule(name, labels, n, tuple(a for _, a in sorted(rule.active.items())))
        for rule, (name, labels, n) in _occurrences(rules)
        if rule.active
    )
    return SavedGroup(key[0], key[1], evaluated_at, saved)


GroupAlerts = tuple[int | None, Sequence[AlertingRule]]
"""A group's last evaluation time (ms) and its alerting rules."""


class StateFile:
    """The alert state file: restored per group at its first evaluation, rewritten when alerts change.

    It is rewritten when an alert appears, changes state or goes away, and at least every `heartbeat` seconds
    while an alert is pending, so the outage length that restoring `for` relies on is known to that accuracy
    (a stale time only delays firing, never hastens it). Values, annotations and send times alone do not
    cause a write.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        outage_tolerance: float = OUTAGE_TOLERANCE,
        for_grace_period: float = FOR_GRACE_PERIOD,
        heartbeat: float = 60.0,
    ) -> None:
        self.path = path
        self.outage_ms = round(outage_tolerance * 1000)
        self.grace_ms = round(for_grace_period * 1000)
        self.heartbeat_ms = round(heartbeat * 1000)
        self.errors = 0
        self.unrestored = load_state(path) if path is not None else {}
        self._written = _fingerprint(self.unrestored.values())
        self._written_at: int | None = None
        self._failing = False

    def keep_only(self, keys: set[tuple[str, str]]) -> None:
        """Forget saved state of groups no longer configured."""
        self.unrestored = {k: v for k, v in self.unrestored.items() if k in keys}

    def restore(self, key: tuple[str, str], rules: Sequence[AlertingRule], now_ms: int) -> int:
        """Before a group's first evaluation: put its saved alerts back into matching rules; how many."""
        saved = self.unrestored.pop(key, None)
        if saved is None:
            return 0
        down = saved.evaluated_at if saved.evaluated_at is not None else now_ms
        if now_ms - down > self.outage_ms:
            log.info("saved alert state of %s;%s is older than the outage tolerance: not restored", *key)
            return 0
        by_ident = {(r.name, r.labels, r.occurrence): r for r in saved.rules}
        restored = 0
        for rule, ident in _occurrences(rules):
            found = by_ident.get(ident)
            for alert in found.alerts if found else ():
                back = restore_alert(alert, rule.hold_ms, now_ms, down, self.grace_ms)
                if back is not None:
                    rule.active[back.labels] = back
                    rule.warm_until = now_ms + round(history_needed(rule.rule.expr) * 1000)
                    restored += 1
        if restored:
            log.info("restored %d alerts of %s;%s", restored, *key)
        return restored

    def save(self, groups: Mapping[tuple[str, str], GroupAlerts], now_ms: int) -> None:
        """After an evaluation: write the file if alerts changed or the heartbeat is due; never raises."""
        if self.path is None:
            return
        live = [saved_group(k, at, rules) for k, (at, rules) in groups.items() if k not in self.unrestored]
        docs = live + list(self.unrestored.values())
        mark = _fingerprint(docs)
        pending = any(a.state == AlertState.PENDING for g in docs for r in g.rules for a in r.alerts)
        due = pending and (self._written_at is None or now_ms - self._written_at >= self.heartbeat_ms)
        if mark == self._written and not due:
            return
        try:
            save_state(self.path, docs)
        except OSError as exc:
            self.errors += 1
            if not self._failing:
                log.error("cannot write alert state file %s: %s", self.path, exc)
            self._failing = True
            return
        if self._failing:
            log.info("alert state file %s written again", self.path)
        self._failing = False
        self._written, self._written_at = mark, now_ms
