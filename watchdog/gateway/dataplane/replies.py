"""The gateway's own answers: OpenAI-shaped JSON errors, and what an upstream failure becomes."""

from __future__ import annotations

import json
from collections.abc import Iterable

import aiohttp
from starlette.types import Send

_JSON = [(b"content-type", b"application/json")]


def error_body(message: str, kind: str, code: str) -> bytes:
    """An OpenAI-shaped JSON error."""
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


async def send_error(
    send: Send, status: int, body: bytes, extra: Iterable[tuple[bytes, bytes]] = (), close: bool = False
) -> None:
    """A complete JSON error response; `close` ends the connection (the request body was not read)."""
    headers = [*_JSON, (b"content-length", b"%d" % len(body)), *extra]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def upstream_failure(exc: aiohttp.ClientError) -> tuple[str, int, str]:
    """(upstream_errors kind, status for the client, message) for an upstream failure."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        return "connect", 502, "The gateway could not connect to the model server."
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return "timeout", 504, "The model server did not answer in time."
    return "protocol", 502, "The model server's response was broken off or malformed."
