"""Alertmanager API v2: the `POST /api/v2/alerts` body, as Prometheus' notifier builds it.

The body is a JSON list of PostableAlerts: `labels`, `annotations`, `startsAt`, `endsAt`, `generatorURL`.
Times are formatted the way go-openapi's strfmt.DateTime marshals them (RFC 3339, UTC, always three
fractional digits). Alertmanager is state based: a firing alert carries its valid-until time as `endsAt`;
an alert whose `endsAt` is in the past is resolved.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from ..formats.rfc3339 import format_rfc3339, millis
from .alert import OutgoingAlert
from .notifier import Receiver

API_PATH = "/api/v2/alerts"


def api_url(url: str) -> str:
    """The alerts endpoint for a configured URL: the URL itself if it names the endpoint, else base + path."""
    if urlsplit(url).path.rstrip("/").endswith(API_PATH):
        return url
    return url.rstrip("/") + API_PATH


def am_time(seconds: float) -> str:
    """Unix seconds as strfmt.DateTime marshals them (`2024-05-01T12:00:00.250Z`); not finite: zero."""
    return format_rfc3339(millis(seconds) if math.isfinite(seconds) else None, fixed=True)


def postable_alert(alert: OutgoingAlert) -> dict[str, Any]:
    """One alert of the body."""
    out: dict[str, Any] = {
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "startsAt": am_time(alert.starts_at),
        "endsAt": am_time(alert.ends_at),
    }
    if alert.generator_url:
        out["generatorURL"] = alert.generator_url
    return out


def alerts_body(alerts: Iterable[OutgoingAlert]) -> list[dict[str, Any]]:
    """The JSON body of one `POST /api/v2/alerts`."""
    return [postable_alert(a) for a in alerts]


def alert_identity(labels: Mapping[str, str]) -> str:
    """The key Alertmanager identifies an alert by (its label set), as a stable string."""
    return "\x00".join(f"{k}\x01{v}" for k, v in sorted(labels.items()))


class Alertmanager:
    """The `alertmanager` kind: a queue that keeps the latest state of each alert, and no action events."""

    type = "alertmanager"
    takes_events = False

    def identity(self, alert: OutgoingAlert) -> str:
        """Alertmanager is state based: a newer state of an alert replaces a queued older one."""
        return alert_identity(alert.labels)

    def url(self, receiver: Receiver) -> str:
        """The alerts endpoint of the configured URL."""
        return api_url(receiver.url)

    def headers(self, receiver: Receiver) -> Mapping[str, str]:
        """The configured headers."""
        return receiver.headers

    def alerts_body(self, alerts: Sequence[OutgoingAlert], receiver: Receiver) -> Any:
        """A list of PostableAlerts."""
        return alerts_body(alerts)

    def event_body(self, event: Mapping[str, Any], receiver: Receiver) -> Any:
        """Never: an event queued for it is unusable."""
        raise ValueError("Alertmanager does not take action events")


ALERTMANAGER = Alertmanager()
