"""`vllm-watchdog top --fleet`: every member of a watchdog's fleet group, read through that watchdog's API
(`GET /api/v1/fleet`, which reads the member keys from etcd), so that it needs no etcd credentials.

As in top.py, fetching and rendering are apart: `fetch_fleet` reads the API once, `render_fleet` is a pure
function of that JSON and the time. What a member published is shown bounded and printable, never trusted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from ..fleet.members import cell
from .screen import TopError, age_text, api_data, api_get, clock_text, paint, table


@dataclass(frozen=True)
class FleetSnapshot:
    """What one refresh read: the watchdog's URL and its /api/v1/fleet data."""

    url: str
    fleet: dict[str, Any]


def fetch_fleet(client: httpx.Client, url: str, *, token: str | None = None) -> FleetSnapshot:
    """Read /api/v1/fleet once; TopError if the API or etcd behind it cannot be read."""
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = api_get(client, base + "/api/v1/fleet", headers)
    if resp.status_code == 503:
        try:
            why = str(resp.json().get("error", ""))
        except ValueError:
            why = ""
        raise TopError(f"{base}/api/v1/fleet: {why or 'HTTP 503'}")
    data = api_data(resp)
    if not isinstance(data, dict):
        raise TopError(f"{base}/api/v1/fleet: not the watchdog's API")
    return FleetSnapshot(base, data)


def _summary(doc: Mapping[str, Any], color: bool) -> list[str]:
    members = doc.get("members") or []
    share = doc.get("correlated_share")
    shown_share = "off" if share is None else f"{float(share) * 100:g}%"
    refusal = str(doc.get("refusal") or "")
    etcd = paint(f"etcd: {refusal}", "red", color) if refusal else paint("etcd ok", "green", color)
    head = (
        f"{paint('GROUP', 'bold', color)}  {cell(doc.get('group', '?'))}  {len(members)} live member"
        f"{'s' if len(members) != 1 else ''}  max_disrupted {cell(doc.get('max_disrupted', '?'))}  "
        f"correlated_share {shown_share}  {etcd} (read by {cell(doc.get('member', '?'))})"
    )
    lines = [head]
    for h in doc.get("holds") or []:
        if not isinstance(h, Mapping):
            continue
        fired = h.get("members") or []
        text = (
            f"HOLD  {cell(h.get('alertname', '?'))} fired by {len(fired)} of {cell(h.get('live', '?'))} live "
            f"members ({cell(fired)}): no disruptive action starts in the group"
        )
        lines.append(paint(text, "red", color))
    return lines


def _member_rows(members: Sequence[Any], now: float) -> list[list[tuple[str, str | None]]]:
    head = ("MEMBER", "TARGETS", "FIRING ALERTS", "RUNNING", "WAITING FOR A SLOT", "UPDATED")
    rows: list[list[tuple[str, str | None]]] = [[(h, "bold") for h in head]]
    for m in members:
        if not isinstance(m, Mapping):
            continue
        since = m.get("since")  # when the member last wrote its key
        age = age_text(now - float(since)) + " ago" if isinstance(since, int | float) else "-"
        running, waiting = m.get("running") or {}, m.get("waiting") or {}
        alerts = m.get("alerts") or []
        rows.append(
            [
                (cell(m.get("member", "?")), None),
                (cell(m.get("targets") or "-"), None),
                (cell(alerts or "-"), "red" if alerts else None),
                (cell(running or "-"), "yellow" if running else None),
                (cell(waiting or "-"), "yellow" if waiting else None),
                (age, "dim"),
            ]
        )
    return rows


def render_fleet(snap: FleetSnapshot, now: float, *, color: bool = False) -> str:
    """One frame: the group, its holds, and a row per live member (no I/O)."""
    head = f"vllm-watchdog top --fleet  {snap.url}  {clock_text(now)}Z"
    parts = [paint(head, "bold", color), ""]
    doc = snap.fleet
    if not doc.get("enabled"):
        return "\n".join([*parts, "this watchdog is in no fleet (no fleet: section in its config)"]) + "\n"
    parts += _summary(doc, color)
    parts.append("")
    members = doc.get("members") or []
    parts += table(_member_rows(members, now), color) if members else ["no live member in etcd"]
    return "\n".join(parts) + "\n"
