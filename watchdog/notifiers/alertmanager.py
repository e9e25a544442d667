"""Alertmanager API v2: the `POST /api/v2/alerts` body, as Prometheus' notifier builds it.

The body is a JSON list of PostableAlerts: `labels`, `annotations`, `startsAt`, `endsAt`, `generatorURL`.
Times are formatted the way go-openapi's strfmt.DateTime marshals them (RFC 3339, UTC, always three
fractional digits). Alertmanager is state based: a firing alert carries its valid-until time as `endsAt`;
an alert whose `endsAt` is in the past is resolved.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

from .alert import OutgoingAlert

API_PATH = "/api/v2/alerts"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def api_url(url: str) -> str:
    """The alerts endpoint for a configured URL: the URL itself if it names the endpoint, else base + path."""
    if urlsplit(url).path.rstrip("/").endswith(API_PATH):
        return url
    return url.rstrip("/") + API_PATH


def am_time(seconds: float) -> str:
    """Unix seconds as strfmt.DateTime marshals them, e.g. `2024-05-01T12:00:00.250Z`."""
    if not math.isfinite(seconds):
        return "0001-01-01T00:00:00.000Z"
    ms = round(seconds * 1000)
    when = _EPOCH + timedelta(milliseconds=ms)
    return when.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


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
