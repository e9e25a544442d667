"""What `top` and `top --fleet` share: reading the watchdog's API (TopError when it cannot be read) and
drawing a table on a terminal with plain ANSI escapes (no curses: it works over ssh, in tmux and piped)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import httpx

CLEAR = "\x1b[H\x1b[2J"
_COLORS = {"red": "31", "green": "32", "yellow": "33", "bold": "1", "dim": "2"}


class TopError(Exception):
    """The API could not be read (connection refused, timeout, an answer that is not the API's JSON)."""


def api_get(
    client: httpx.Client, url: str, headers: Mapping[str, str], params: Mapping[str, str] | None = None
) -> httpx.Response:
    """GET one API path; TopError if it cannot be reached."""
    try:
        return client.get(url, headers=dict(headers), params=dict(params or {}))
    except httpx.HTTPError as exc:
        raise TopError(f"{url}: {exc}") from exc


def api_data(resp: httpx.Response) -> Any:
    """The `data` of an API answer; TopError if it is not one."""
    try:
        return resp.json()["data"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TopError(f"{resp.url}: HTTP {resp.status_code}, not the watchdog's API") from exc


def paint(text: str, color: str | None, enabled: bool) -> str:
    """`text` in a colour (a key of _COLORS) when `enabled`."""
    if not enabled or color is None:
        return text
    return f"\x1b[{_COLORS[color]}m{text}\x1b[0m"


def age_text(seconds: float) -> str:
    """A duration as "40s", "12m" or "3.5h"."""
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def clock_text(t: float) -> str:
    """A Unix time as HH:MM:SS in UTC."""
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%H:%M:%S")


def table(rows: Sequence[Sequence[tuple[str, str | None]]], color: bool) -> list[str]:
    """Left-aligned columns; each cell is (text, colour), padded by its plain text's width."""
    widths = [max(len(r[i][0]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [paint(text.ljust(w), c, color) for (text, c), w in zip(row, widths, strict=True)]
        out.append("  ".join(cells).rstrip())
    return out


def _nats(value: Any) -> str:
    return "?" if value is None else f"{float(value):.3g}"


def answers_cell(own: Mapping[str, Any]) -> tuple[str, str | None]:
    """A target's known-answer state from the API's `watchdog` object: QUARANTINED, DIVERGED with the
    divergence over the tolerance (nats), ok with the divergence under it, learning, off (not checked), or "-"
    (an API without the field)."""
    if own.get("quarantined"):
        return ("QUARANTINED", "red")
    if "knownAnswers" not in own:
        return ("-", None)
    doc = own["knownAnswers"]
    if not doc:
        return ("off", "dim")
    state = doc.get("state")
    gap = f"{_nats(doc.get('divergence'))}/{_nats(doc.get('tolerance'))}"
    if state == "diverged":
        return (f"DIVERGED {gap}", "red")
    if state == "ok":
        return (f"ok {gap}", "green")
    return (str(state or "unknown"), "dim" if state == "learning" else "yellow")
