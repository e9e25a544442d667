"""When each request in flight last heard from the upstream: what tells a drain that vLLM is frozen.

A streamed response is a chunk per few tokens, so its silence says the engine stopped; a non-streamed response
sends nothing until it ends, so a request that has heard no body byte yet ("silent") proves nothing either way
and the daemon judges it by vLLM's own engine steps. Only requests the gate admitted are followed, at most
max_in_flight of them (plus those a replay holds), and each is forgotten when its response is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.types import Message, Send

from ..protocol.progress import UpstreamProgress


class _Heard:
    """One request: when it was sent upstream, and its last upstream body byte (monotonic; when it was sent,
    until its first)."""

    __slots__ = ("at", "body", "sent")

    def __init__(self, sent: float) -> None:
        self.sent = self.at = sent
        self.body = False


class ProgressTracker:
    """The requests in flight and when each last heard from the upstream; on the gateway's loop only."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._requests: dict[object, _Heard] = {}

    def follow(self, key: object, send: Send) -> Send:
        """Start following the request `key` (its ticket); returns `send`, noting each body chunk it passes on
        (forget(key) once the response is done)."""
        heard = self._requests[key] = _Heard(self._monotonic())

        async def noted(message: Message) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                heard.at, heard.body = self._monotonic(), True
            await send(message)

        return noted

    def forget(self, key: object) -> None:
        """The request's response is done (or failed): it no longer counts."""
        self._requests.pop(key, None)

    def report(self) -> UpstreamProgress:
        """How long since any request in flight last heard from the upstream, how many heard no body, and how
        long since the oldest was sent."""
        heard = list(self._requests.values())
        if not heard:
            return UpstreamProgress(0, None, 0, None)
        now = self._monotonic()
        newest, oldest = max(h.at for h in heard), min(h.sent for h in heard)
        silent = sum(1 for h in heard if not h.body)
        return UpstreamProgress(len(heard), max(0.0, now - newest), silent, max(0.0, now - oldest))
