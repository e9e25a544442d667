"""Delivering one batch: how queued items are stored, posted over HTTP, and how answers are judged.

A 2xx answer delivers the batch. A 4xx other than 408 and 429 means the receiver will never take it:
the batch is dropped and counted as failed. Anything else (5xx, 408, 429, redirects, timeouts, refused or
reset connections) is transient: the batch stays queued and the notifier backs off exponentially from
`backoff_initial` to `backoff_max`, honouring a longer Retry-After.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from .alert import OutgoingAlert

MAX_BATCH = 64  # alerts per request, as Prometheus' notifier sends them
_RETRYABLE_4XX = frozenset({408, 429})
_ERROR_BODY_CHARS = 200
_MAX_ANSWER = 64 * 1024


@dataclass(frozen=True)
class Outcome:
    """How one POST went: delivered, refused for good, or to be retried."""

    ok: bool
    permanent: bool = False
    error: str = ""
    retry_after: float | None = None


def encode_alert(alert: OutgoingAlert) -> str:
    """An alert as stored in the queue."""
    return json.dumps(
        {
            "labels": dict(alert.labels),
            "annotations": dict(alert.annotations),
            "state": alert.state,
            "startsAt": alert.starts_at,
            "endsAt": alert.ends_at,
            "value": alert.value,
            "generatorURL": alert.generator_url,
        },
        sort_keys=True,
    )


def decode_alert(text: str) -> OutgoingAlert:
    """Inverse of encode_alert; ValueError if the text is not a stored alert."""
    raw = json.loads(text)
    if not isinstance(raw, dict) or not isinstance(raw.get("labels"), dict):
        raise ValueError("not a stored alert")
    return OutgoingAlert(
        labels={str(k): str(v) for k, v in raw["labels"].items()},
        annotations={str(k): str(v) for k, v in (raw.get("annotations") or {}).items()},
        state="resolved" if raw.get("state") == "resolved" else "firing",
        starts_at=float(raw["startsAt"]),
        ends_at=float(raw["endsAt"]),
        value=float(raw.get("value", math.nan)),
        generator_url=str(raw.get("generatorURL") or ""),
    )


def decode_event(text: str) -> dict[str, Any]:
    """A stored action event; ValueError if the text is not one."""
    raw = json.loads(text)
    if not isinstance(raw, dict) or "action" not in raw:
        raise ValueError("not a stored action event")
    return raw


def backoff(attempts: int, initial: float, maximum: float) -> float:
    """Seconds to wait after `attempts` consecutive transient failures (attempts >= 1)."""
    return float(min(initial * 2.0 ** min(max(attempts - 1, 0), 62), maximum))


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds a Retry-After header asks for (delta seconds or an HTTP date), None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError, OverflowError):
        return None


async def _exchange(
    client: httpx.AsyncClient, url: str, content: bytes, headers: Mapping[str, str], timeout: float
) -> tuple[int, bytes, str | None]:
    async with client.stream("POST", url, content=content, headers=headers, timeout=timeout) as resp:
        body = bytearray()
        async for chunk in resp.aiter_bytes():
            body += chunk
            if len(body) > _MAX_ANSWER:  # a receiver may answer anything; only the start matters
                break
        return resp.status_code, bytes(body), resp.headers.get("retry-after")


async def post(
    client: httpx.AsyncClient,
    url: str,
    payload: Any,
    headers: Mapping[str, str],
    timeout: float,
    now: float,
) -> Outcome:
    """POST `payload` as JSON within `timeout` seconds overall and judge the answer; never raises."""
    content = json.dumps(payload).encode()
    sent_headers = {"Content-Type": "application/json", "User-Agent": "vllm-watchdog"} | dict(headers)
    try:
        status, body, wait = await asyncio.wait_for(
            _exchange(client, url, content, sent_headers, timeout), timeout
        )
    except (httpx.TimeoutException, asyncio.TimeoutError):
        return Outcome(ok=False, error=f"timed out after {timeout:g}s")
    except (httpx.HTTPError, httpx.InvalidURL) as exc:  # refused/reset connections, protocol errors, bad URL
        return Outcome(ok=False, error=f"{type(exc).__name__}: {exc}".rstrip(": "))
    if 200 <= status < 300:
        return Outcome(ok=True)
    text = body[:_ERROR_BODY_CHARS].decode(errors="replace").strip()
    error = f"HTTP {status}" + (f": {text}" if text else "")
    if 400 <= status < 500 and status not in _RETRYABLE_4XX:
        return Outcome(ok=False, permanent=True, error=error)
    return Outcome(ok=False, error=error, retry_after=retry_after(wait, now))
