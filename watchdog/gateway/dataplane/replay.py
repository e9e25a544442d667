"""Replay: a request whose upstream failed before its client got a byte, while the watchdog restarts the
engine, is held and sent once more to the new engine instead of answered 502.

Which requests: admitted ones (inference POSTs) on their first try, whose response has sent the client
nothing (the response head is held back until the first body byte, see HeldStart), whose upstream failed
while the gateway was drained, or when a drain began soon after the failure: within `replay.dead_window`
(30 s) for a failure that says the engine is gone (vLLM's EngineDeadError answer, a refused, reset or closed
connection, a response cut off: the watchdog's respawn or restart drains within seconds of that), within
`replay.drain_window` (1 s) for any other (a timeout). A failure with no drain is not the watchdog's doing:
the client gets today's error. The held request waits in the admission queue as a drain hold (at the head of
its class, up to `drain_max_wait`) and is sent again when the drain lifts, with `X-Vllm-Watchdog-Replayed: 1`
on its response. At most once: a replay that fails too gets today's error. Bounded: `replay.max_held`
requests and `replay.max_bytes` of their bodies at once (the bodies the proxy already keeps for the request),
counted from the failure; beyond either, today's error. A client that leaves while held (its own deadline)
ends the hold: nothing is sent again for it. Only in `drain_mode: hold`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
from starlette.types import Message, Send

from ...config.gatewayreplay import ReplayConfig
from .admission import Gate, Ticket
from .bodies import OPENAI_PATHS, RequestTrace
from .resume import Continuation, StreamText, continued

REPLAYED_HEADER = (b"x-vllm-watchdog-replayed", b"1")  # outcomes: protocol.snapshot.REPLAY_OUTCOMES
SSE_ERROR = b'data: {"error"'  # vLLM's error event (create_streaming_error_response), e.g. EngineDeadError
ENGINE_DEAD = b"EngineCore encountered an issue"  # vLLM 0.32's EngineDeadError message, in a 500 or an event
DRAIN_POLL = 0.05  # seconds between looks at the drain flag within drain_window
# One try at forwarding: (body, send, ticket, trace) -> the status the client got, or Lost.
Attempt = Callable[[bytes, Send, Ticket | None, RequestTrace | None], Awaitable[int]]
Fail = Callable[[aiohttp.ClientError, bool, Send], Awaitable[int]]  # today's error: (cause, started, send)


class EngineStopped(aiohttp.ClientError):
    """While drained, the engine answered an error of its own (5xx, or an SSE error event first): vLLM's
    answer to the requests it held when it was stopped or found its engine dead."""


class EngineDead(aiohttp.ClientError):
    """Not drained, the engine answered that it died (EngineDeadError: a 500, or an error event)."""


def engine_gone(cause: aiohttp.ClientError) -> bool:
    """Whether a failure says the server or its engine is gone, not merely slow: anything but a timeout."""
    return not isinstance(cause, aiohttp.ServerTimeoutError | aiohttp.ConnectionTimeoutError | EngineStopped)


class Lost(aiohttp.ClientError):
    """The upstream failed and the client has received nothing: the request may be held and replayed."""

    def __init__(self, cause: aiohttp.ClientError) -> None:
        self.cause: aiohttp.ClientError = cause.cause if isinstance(cause, Lost) else cause
        super().__init__(str(self.cause))


class HeldStart:
    """A request's `send` that holds the response head back until the first body byte (or the body's end),
    so that a stream whose upstream fails before its first chunk has told the client nothing; a replay's
    head says it was replayed."""

    __slots__ = ("_drained", "_replayed", "_send", "_start", "sent", "stream")

    def __init__(
        self, send: Send, drained: Callable[[], bool], replayed: bool = False, resumable: bool = False
    ) -> None:
        self._send = send
        self._drained = drained  # whether the watchdog is restarting the engine now
        self._replayed = replayed
        self._start: Message | None = None
        self.sent = False  # something reached the client
        # What an SSE response sent, for a resume (resume.py); None: not a stream, or not resumable.
        self.stream: StreamText | None = StreamText() if resumable else None

    def replayable(self) -> bool:
        """Whether the request may be sent again after its upstream failed: nothing reached the client, or
        whole events of a stream that can go on (resume.py)."""
        return not self.sent or (self.stream is not None and self.stream.resumable())

    async def __call__(self, message: Message) -> None:
        """Hold a response head; send it with the first body byte. Lost for the engine's own error while
        drained (a 5xx, or an SSE stream whose first event is an error), or for its EngineDeadError answer
        whenever it comes before the client got a byte or between a resumable stream's events."""
        if not self.sent:
            if message["type"] == "http.response.start":
                if message["status"] >= 500 and self._drained():
                    raise Lost(EngineStopped(f"the model server answered {message['status']} while drained"))
                if self._replayed:
                    message = {**message, "headers": [*message.get("headers", ()), REPLAYED_HEADER]}
                headers = message.get("headers", ())
                if not any(k == b"content-type" and b"event-stream" in v for k, v in headers):
                    self.stream = None
                self._start = message
                return
            body = message.get("body", b"")
            if not body and message.get("more_body", False):
                return  # an empty chunk says nothing
            self._check(body, self._start is not None and self._start["status"] >= 500)
            self.sent = True
            if self._start is not None:
                await self._send(self._start)
        elif self.stream is not None and self.stream.resumable():
            self._check(message.get("body", b""), False)
        if self.stream is not None and message["type"] == "http.response.body":
            self.stream.feed(message.get("body", b""))
        await self._send(message)

    def _check(self, body: bytes, failed: bool) -> None:
        """Lost if these bytes, the first the client would get or an event between a resumable stream's
        events, are the engine's own error: vLLM's EngineDeadError (in an event, or in the body of a 5xx:
        `failed`) at any time, any error event while drained."""
        event = body.startswith(SSE_ERROR)
        if (event or failed) and ENGINE_DEAD in body[:4096]:
            raise Lost(EngineDead("the model server answered that its engine died"))
        if event and self._drained():
            raise Lost(EngineStopped("the model server's stream sent an error while drained"))


class Replays:
    """The replay policy of one gateway and its counters; on the gateway's loop."""

    def __init__(
        self, config: ReplayConfig, gate: Gate, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.hold_mode = True
        self._gate = gate
        self._monotonic = monotonic
        self.held = 0  # requests held now
        self.held_bytes = 0  # their bodies
        self.awaiting_drain = 0  # failed while not drained, waiting up to a window for a drain
        # A gone engine's failure waited its whole dead_window and no drain came: nothing restarts this engine
        # (or not yet), so the next ones wait drain_window only, until a response or a drain says otherwise.
        self.unrestarted = False
        self.outcomes: dict[str, int] = {}

    def apply(self, config: ReplayConfig, drain_mode: str) -> None:
        """Take a reloaded config (caps apply to holds that begin from now)."""
        self.config = config
        self.hold_mode = drain_mode == "hold"

    async def forward(
        self,
        attempt: Attempt,
        send: Send,
        ticket: Ticket | None,
        trace: RequestTrace | None,
        body: bytes,
        path: str,
        fail: Fail,
    ) -> int:
        """Forward `body` with `attempt`; if its upstream fails with nothing sent, hold the request and try
        once more (a stream that sent text goes on instead, see resume.py), or answer today's error with
        `fail`; the status the client got."""
        if ticket is None or not self.config.enabled or not self.hold_mode:
            return await attempt(body, send, ticket, trace)
        first = HeldStart(send, self._is_drained, resumable=path in OPENAI_PATHS)
        try:
            status = await attempt(body, first, ticket, trace)
        except Lost as lost:
            cause = lost.cause
        else:
            self.unrestarted = self.unrestarted and status >= 500
            return status
        if first.sent and first.stream is not None:
            return await self._resume(attempt, send, ticket, trace, body, path, first.stream, cause, fail)
        again = await self.hold(ticket, len(body), cause)
        if again is None:
            return await fail(cause, False, send)
        replay = HeldStart(send, self._is_drained, replayed=True)
        try:
            return await attempt(body, replay, again, trace)
        except Lost as lost:
            self.count("failed_again")
            return await fail(lost.cause, False, HeldStart(send, lambda: False, replayed=True))
        finally:
            again.release()

    async def _resume(
        self,
        attempt: Attempt,
        send: Send,
        ticket: Ticket,
        trace: RequestTrace | None,
        body: bytes,
        path: str,
        stream: StreamText,
        cause: aiohttp.ClientError,
        fail: Fail,
    ) -> int:
        """Go on with a stream that sent text: hold it, then send the request with the text so far appended
        and pass the new events on; cut off as today (`fail` with the response started) if it cannot."""
        rest = continued(body, path, stream.text, stream.events)
        if rest is None:
            self.count("not_resumable")
            return await fail(cause, True, send)
        again = await self.hold(ticket, len(body) + len(rest), cause, "resumed")
        if again is None:
            return await fail(cause, True, send)
        try:
            return await attempt(rest, Continuation(send, EngineStopped), again, trace)
        except aiohttp.ClientError as exc:
            self.count("failed_again")
            return await fail(exc, True, send)
        finally:
            again.release()

    def count(self, outcome: str) -> None:
        """One more of `outcome`."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    async def hold(
        self, ticket: Ticket, size: int, cause: aiohttp.ClientError, outcome: str = "replayed"
    ) -> Ticket | None:
        """After a Lost: wait for the engine to serve again and return the ticket to send the request with;
        None if it is not replayed (the caller answers today's error). `ticket` is released either way: a
        request whose upstream failed is not in flight, and a drain waiting for in-flight requests must not
        wait for it."""
        if self.held >= self.config.max_held:
            self.count("too_many")
            return None
        if self.held_bytes + size > self.config.max_bytes:
            self.count("too_large")
            return None
        self.held += 1
        self.held_bytes += size
        ticket.release()
        try:
            dead = engine_gone(cause) and not self.unrestarted
            if not await self._drained(self.config.dead_window if dead else self.config.drain_window):
                self.unrestarted = self.unrestarted or dead
                self.count("not_drained")
                return None
            admitted = await self._gate.readmit(ticket.session, ticket.priority)
        except asyncio.CancelledError:
            self.count("client_gone")
            raise
        finally:
            self.held -= 1
            self.held_bytes -= size
        if not isinstance(admitted, Ticket):
            self.count("expired")
            return None
        self.count(outcome)
        return admitted

    def _is_drained(self) -> bool:
        return self._gate.draining

    async def _drained(self, window: float) -> bool:
        """Whether the gateway is drained now or a drain begins within `window` seconds."""
        deadline = self._monotonic() + window
        self.awaiting_drain += 1
        try:
            while not self._gate.draining:
                if self._monotonic() >= deadline:
                    return False
                await asyncio.sleep(DRAIN_POLL)
            self.unrestarted = False
            return True
        finally:
            self.awaiting_drain -= 1

    def snapshot(self) -> dict[str, int]:
        """replays_total by outcome."""
        return dict(self.outcomes)
