"""Webhook payloads in the shape of Alertmanager's webhook receiver (version "4"), plus action events.

Alerts (one POST per batch of up to 64, in the order they were queued)::

    {"version": "4", "type": "alert", "groupKey": "{}:{}", "truncatedAlerts": 0,
     "status": "firing" | "resolved",          # firing if any alert in the batch fires
     "receiver": "<notifier name>", "groupLabels": {},
     "commonLabels": {...}, "commonAnnotations": {...},   # pairs every alert of the batch shares
     "externalURL": "<watchdog external URL>",
     "alerts": [{"status": "firing" | "resolved", "labels": {...}, "annotations": {...},
                 "startsAt": RFC3339, "endsAt": RFC3339,  # zero time "0001-01-01T00:00:00Z" while firing
                 "generatorURL": "...", "fingerprint": "<16 hex digits, Alertmanager's label-set hash>"}]}

Action events (one POST per event, in order with the alerts)::

    {"version": "4", "type": "action", "groupKey": "{}:{action=\\"...\\", target=\\"...\\"}",
     "truncatedAlerts": 0, "status": "<outcome>", "receiver": "<notifier name>",
     "groupLabels": {"action": "...", "target": "..."},
     "commonLabels": {...the labels of the alert that triggered the action...},
     "commonAnnotations": {}, "externalURL": "...", "alerts": [],
     "event": {"action": "<action name>", "type": "restart" | ..., "target": "<target>",
               "outcome": "started" | "succeeded" | "failed" | "rolled_back" | "skipped" | "would_do",
               "reason": "...", "at": RFC3339, "labels": {...}, "dryRun": bool, "actionId": int | null}}

`type` tells the two apart; a receiver written for Alertmanager sees an action event as an empty group.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..formats.rfc3339 import format_rfc3339, millis
from .alert import OutgoingAlert
from .notifier import Receiver

VERSION = "4"
_OFFSET64 = 14695981039346656037
_PRIME64 = 1099511628211
_SEPARATOR = 0xFF


def fingerprint(labels: Mapping[str, str]) -> str:
    """Alertmanager's fingerprint of a label set: FNV-1a 64 over sorted names and values, as 16 hex digits."""
    h = _OFFSET64
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode():
                h = ((h ^ byte) * _PRIME64) & 0xFFFFFFFFFFFFFFFF
            h = ((h ^ _SEPARATOR) * _PRIME64) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def webhook_alert(alert: OutgoingAlert) -> dict[str, Any]:
    """One entry of `alerts`, as Alertmanager's template data shows it."""
    resolved = alert.state == "resolved"
    return {
        "status": "resolved" if resolved else "firing",
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "startsAt": format_rfc3339(millis(alert.starts_at)),
        # Alertmanager hides the end of an alert that has not ended yet.
        "endsAt": format_rfc3339(millis(alert.ends_at) if resolved else None),
        "generatorURL": alert.generator_url,
        "fingerprint": fingerprint(alert.labels),
    }


def _common(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = maps[0]
    return {k: v for k, v in sorted(first.items()) if all(m.get(k) == v for m in maps[1:])}


def _group_key(group_labels: Mapping[str, str]) -> str:
    pairs = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(group_labels.items()))
    return "{}:{" + pairs + "}"


def alerts_payload(alerts: Sequence[OutgoingAlert], receiver: str, external_url: str) -> dict[str, Any]:
    """The payload for one batch of alerts."""
    return {
        "version": VERSION,
        "type": "alert",
        "groupKey": _group_key({}),
        "truncatedAlerts": 0,
        "status": "firing" if any(a.state != "resolved" for a in alerts) else "resolved",
        "receiver": receiver,
        "groupLabels": {},
        "commonLabels": _common([a.labels for a in alerts]),
        "commonAnnotations": _common([a.annotations for a in alerts]),
        "externalURL": external_url,
        "alerts": [webhook_alert(a) for a in alerts],
    }


def event_payload(event: Mapping[str, Any], receiver: str, external_url: str) -> dict[str, Any]:
    """The payload for one action event, given as ActionEvent.to_json() makes it."""
    group = {"action": str(event.get("action", "")), "target": str(event.get("target", ""))}
    body = dict(event)
    if isinstance(body.get("at"), (int, float)):
        body["at"] = format_rfc3339(millis(float(body["at"])))
    return {
        "version": VERSION,
        "type": "action",
        "groupKey": _group_key(group),
        "truncatedAlerts": 0,
        "status": str(event.get("outcome", "")),
        "receiver": receiver,
        "groupLabels": group,
        "commonLabels": dict(event.get("labels") or {}),
        "commonAnnotations": dict(event.get("annotations") or {}),
        "externalURL": external_url,
        "alerts": [],
        "event": body,
    }


class Webhook:
    """The `webhook` kind: every alert and action event, in the order they were queued."""

    type = "webhook"
    takes_events = True

    def identity(self, alert: OutgoingAlert) -> None:
        """Every alert is kept."""
        return None

    def url(self, receiver: Receiver) -> str:
        """The configured URL."""
        return receiver.url

    def headers(self, receiver: Receiver) -> Mapping[str, str]:
        """The configured headers."""
        return receiver.headers

    def alerts_body(self, alerts: Sequence[OutgoingAlert], receiver: Receiver) -> Any:
        """The Alertmanager-webhook payload of one batch."""
        return alerts_payload(alerts, receiver.name, receiver.external_url)

    def event_body(self, event: Mapping[str, Any], receiver: Receiver) -> Any:
        """The payload of one action event."""
        return event_payload(event, receiver.name, receiver.external_url)


WEBHOOK = Webhook()
