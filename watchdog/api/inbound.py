"""Bodies of the control routes, checked field by field: an Alertmanager webhook's alerts and a silence's
matchers; a problem raises BadRequest naming the field (answered 400)."""

from __future__ import annotations

from typing import Any

from ..formats.rfc3339 import parse_rfc3339
from ..formats.stringmap import string_map
from ..matchers import make_matcher, parse_matcher
from ..notifiers.alert import OutgoingAlert


class BadRequest(ValueError):
    """A request body problem; the message names the field (400)."""


def string_field(data: dict[str, Any], key: str, where: str = "", default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise BadRequest(f"{where}{key}: must be a string")
    return value


def _labels(value: object, where: str) -> dict[str, str]:
    found = string_map(value)
    if found is None:
        raise BadRequest(f"{where}: must be an object of string values")
    return found


def time_field(value: object, where: str) -> float | None:
    """An RFC 3339 time as Alertmanager writes it; Go's zero time and absence are None."""
    if value is None or value == "" or (isinstance(value, str) and value.startswith("0001-01-01")):
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{where}: must be an RFC 3339 time string")
    try:
        return parse_rfc3339(value, no_zone="local")
    except ValueError:
        raise BadRequest(f"{where}: not an RFC 3339 time: {value!r}") from None


def inbound_alerts(data: dict[str, Any], now: float) -> list[OutgoingAlert]:
    """Alerts from an Alertmanager webhook body (version 4); BadRequest names the bad field."""
    alerts = data.get("alerts")
    if not isinstance(alerts, list):
        raise BadRequest("alerts: must be a list")
    out: list[OutgoingAlert] = []
    for i, a in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(a, dict):
            raise BadRequest(f"{where}: must be an object")
        status = a.get("status", data.get("status", "firing"))
        if status not in ("firing", "resolved"):
            raise BadRequest(f"{where}.status: must be 'firing' or 'resolved'")
        labels = _labels(a.get("labels"), f"{where}.labels")
        annotations = _labels(a.get("annotations", {}), f"{where}.annotations")
        starts = time_field(a.get("startsAt"), f"{where}.startsAt") or now
        ends = time_field(a.get("endsAt"), f"{where}.endsAt")
        url = a.get("generatorURL", "")
        out.append(
            OutgoingAlert(
                labels,
                annotations,
                str(status),
                starts,
                ends or 0.0,
                0.0,
                url if isinstance(url, str) else "",
            )
        )
    # One label set is one alert (Alertmanager's fingerprint): a repeat in one batch is routed once, the last.
    unique = {tuple(sorted(a.labels.items())): a for a in out}
    return list(unique.values())


def silence_matchers(value: object) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise BadRequest("matchers: must be a non-empty list")
    out: list[dict[str, str]] = []
    for i, m in enumerate(value):
        if isinstance(m, str):
            try:
                parsed = parse_matcher(m)
            except ValueError as exc:
                raise BadRequest(f"matchers[{i}]: {exc}") from None
            out.append({"name": parsed.name, "op": parsed.op, "value": parsed.value})
        elif isinstance(m, dict):  # Alertmanager's silence shape
            name = string_field(m, "name", f"matchers[{i}].")
            val = string_field(m, "value", f"matchers[{i}].")
            regex, equal = bool(m.get("isRegex", False)), bool(m.get("isEqual", True))
            op = ("=~" if equal else "!~") if regex else ("=" if equal else "!=")
            try:
                make_matcher(name, op, val)
            except ValueError as exc:
                raise BadRequest(f"matchers[{i}]: {exc}") from None
            out.append({"name": name, "op": op, "value": val})
        else:
            raise BadRequest(f'matchers[{i}]: must be a string like alertname="X" or an object')
    return out
