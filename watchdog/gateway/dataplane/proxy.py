"""The gateway's raw ASGI app: admission for inference requests, then a transparent streaming pass-through."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from functools import partial

import aiohttp
from starlette.types import Receive, Scope, Send
from yarl import URL

from ..config import GatewayConfig
from ..protocol.snapshot import ProxySnapshot
from ..routes import BadPath, Route, normalise_path, route_of
from .admission import Gate, Ticket
from .backoff import UpstreamBackoff
from .bodies import OPENAI_PATHS, ElementCounter, RequestTrace, TooManyElements, is_json, request_fields
from .clients import ClientStalled, ClientTransports, ClientWriter
from .headers import Incoming, response_headers
from .histogram import Histogram
from .interrupt import Interrupt
from .progress import ProgressTracker
from .rejections import Rejection
from .replay import HeldStart, Lost, Replays
from .replies import error_body, send_error, upstream_failure
from .sessions import api_key_of, priority_of, session_key
from .signals import SessionSignals
from .specrequests import SpecRequests
from .uploads import BodyTooLarge, discard_body, read_body

_OPTIONS_ALLOW = [(b"allow", b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"), (b"content-length", b"0")]
log = logging.getLogger("vllm_watchdog.gateway.proxy")  # the name its logs had before the sub-packages
# Close a keep-alive upstream connection before vLLM's uvicorn does (5 s), so a request never races its close.
UPSTREAM_KEEPALIVE = 4.0


class Proxy:
    """Forwards every request to the upstream; POST /v1/* passes the admission gate first."""

    def __init__(
        self,
        config: GatewayConfig,
        gate: Gate,
        signals: SessionSignals,
        *,
        backoff: UpstreamBackoff | None = None,
        transports: ClientTransports | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.gate = gate
        self.signals = signals
        self.backoff = backoff
        self.transports = transports  # None: no connection to abort for a client that stops reading
        self._monotonic = monotonic
        self._base = config.upstream.rstrip("/")
        self._host = URL(self._base).raw_authority
        self._session_header = self._priority_header = b""
        self.replays = Replays(config.replay, gate, monotonic=monotonic)
        self.progress = ProgressTracker(monotonic)  # when each request in flight last heard from vLLM
        self.apply(config)
        self._client: aiohttp.ClientSession | None = None
        self._responses: dict[int, int] = {}
        self._errors: dict[str, int] = {}
        self._ttfb = Histogram()
        self._too_large = 0
        self._client_timeouts = 0
        self._refused: dict[str, int] = {}
        self.spec_requests = SpecRequests()  # vLLM's per-request speculative decoding metrics, by batch size

    def apply(self, config: GatewayConfig) -> None:
        """Take a reloaded config; the upstream and its timeouts stay as they were (they need a restart)."""
        self.config = config
        self._session_header = config.sessions.header.lower().encode("latin-1")
        self._priority_header = config.priority.header.lower().encode("latin-1")
        self.replays.apply(config.replay, config.drain_mode)

    def _upstream(self) -> aiohttp.ClientSession:
        if self._client is None:  # made on the loop that serves requests
            self._client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=self.config.connect_timeout, sock_read=self.config.read_timeout
                ),
                cookie_jar=aiohttp.DummyCookieJar(),  # never share one client's cookies with another
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            )
        return self._client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI 3 entry point."""
        if scope["type"] == "http":
            transport = None if self.transports is None else self.transports.of(scope)
            try:
                await self._http(scope, receive, ClientWriter(send, transport, self.config.write_timeout))
            except ClientStalled:
                self._stalled(scope)
                await asyncio.sleep(0)  # uvicorn sees the connection lost, not an unfinished response
        elif scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Incoming(scope["headers"], self._session_header, self._priority_header)
        request.headers.append(("host", self._host))
        screened = await self._screen(scope, request, send)
        if screened is not None:
            await self._serve(scope, receive, send, request, *screened)

    async def _screen(self, scope: Scope, request: Incoming, send: Send) -> tuple[Route, bytes] | None:
        """The request's route and normalised path; None if it was answered before its body is read
        (OPTIONS *, a bad or admin path, a body too large by its length, an upgrade)."""
        method: str = scope["method"]
        raw_path: bytes = scope["raw_path"]
        if raw_path == b"*" and method == "OPTIONS":  # about the server itself: nothing to forward
            self._count(204)
            await send({"type": "http.response.start", "status": 204, "headers": _OPTIONS_ALLOW})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return None
        try:
            path_bytes = normalise_path(raw_path)
        except BadPath as exc:
            await self._refuse(send, 400, "bad_path", f"The request path is refused: {exc}.")
            return None
        path = path_bytes.decode("latin-1")
        route = route_of(method, path, self.config.allow_admin_paths)
        if route is Route.ADMIN:
            why = f"{path} is a model server admin endpoint; the gateway does not forward it."
            await self._refuse(send, 403, "admin_path", why)
        elif request.length > self.config.max_body:
            await self._too_large_response(send)
        elif request.body_lost:
            why = "The gateway does not support protocol upgrades; a request body sent with one is lost."
            await self._refuse(send, 400, "upgrade_not_supported", why)
        else:
            return route, path_bytes
        return None

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, request: Incoming, route: Route, path_bytes: bytes
    ) -> None:
        """Read the body (within client_timeout), pass the gate if the route admits, forward; the ticket is
        released and the trace finished whatever happens."""
        interrupt = Interrupt()
        ticket: Ticket | None = None
        trace: RequestTrace | None = None
        status = 499  # nginx's "client closed request", for the trace if nothing better is known
        try:
            interrupt.deadline(self.config.client_timeout)
            path = path_bytes.decode("latin-1")
            counted = route is Route.ADMIT and path in OPENAI_PATHS and is_json(request.content_type)
            try:  # a body with too many JSON elements is refused as soon as it has them, not once read
                counter = ElementCounter(self.config.max_json_elements) if counted else None
                body = await read_body(receive, self.config.max_body, counter)
            except BodyTooLarge:
                return await self._too_large_response(send)
            except TooManyElements as exc:  # the rest is read and dropped, so that the client hears the 413
                if await discard_body(receive, self.config.max_body):
                    await self._too_complex_response(send, exc)
                return
            if body is None:
                return
            interrupt.clear_deadline()
            interrupt.watch(receive)

            if route is Route.ADMIT:
                admitted = await self._admit(request, path_bytes.decode("latin-1"), body, send)
                if admitted is None:
                    return
                ticket, trace = admitted
                send = self.progress.follow(ticket, send)
            forward = partial(self._forward, scope, path_bytes, request.headers)  # one try (replay.py)
            status = await self.replays.forward(
                forward, send, ticket, trace, body, path, self._upstream_failed
            )
        except asyncio.CancelledError:
            if not interrupt.absorb():
                raise
            if interrupt.reason == "timeout":
                await self._body_timeout(send)
            else:
                self._errors["client_disconnect"] = self._errors.get("client_disconnect", 0) + 1
        finally:
            interrupt.close()
            if ticket is not None:
                ticket.release()
                self.progress.forget(ticket)
            if trace is not None:
                trace.finish(status)
                if trace.spec is not None and ticket is not None:
                    self.spec_requests.observe(ticket.batch, trace.spec)

    async def _admit(
        self, request: Incoming, path: str, body: bytes, send: Send
    ) -> tuple[Ticket, RequestTrace] | None:
        """Read what admission needs from the body and wait for a slot; None if the request was refused (and
        answered)."""
        fields: dict[str, object] | None = None
        if path in OPENAI_PATHS:
            try:  # only the few fields read below are kept: the parsed body is freed before the wait
                fields = request_fields(body, request.content_type, self.config.max_json_elements)
            except TooManyElements as exc:
                await self._too_complex_response(send, exc)
                return None
        api_key = api_key_of(request.authorization)
        session = session_key(request.session, fields, api_key)
        outcome = await self.gate.admit(session, priority_of(request.priority, api_key, self.config.priority))
        if isinstance(outcome, Rejection):
            await self._rejection(send, outcome)
            return None
        streaming = fields is not None and fields["stream"] is True
        return outcome, self.signals.start(session, path, fields, streaming)

    async def _body_timeout(self, send: Send) -> None:
        self.count_refusal("body_timeout", 408)
        message = "The request body did not arrive in time."
        await send_error(send, 408, error_body(message, "invalid_request_error", "timeout"), close=True)

    def _stalled(self, scope: Scope) -> None:
        """Count and log a client cut off for taking none of its response (never its body)."""
        self._errors["client_stalled"] = self._errors.get("client_stalled", 0) + 1
        client = scope.get("client") or ("?", 0)
        log.warning(
            "client %s:%s took none of its response to %s %s for %gs: connection aborted, upstream request "
            "closed, slot freed",
            client[0],
            client[1],
            scope["method"],
            scope["path"][:200],
            self.config.write_timeout,
        )

    async def _forward(
        self,
        scope: Scope,
        path: bytes,
        headers: list[tuple[str, str]],
        body: bytes,
        send: Send,
        ticket: Ticket | None,
        trace: RequestTrace | None,
    ) -> int:
        """Send the request (to the normalised `path`) upstream and stream the response back; the status the
        client got; Lost if it failed and `send` is a HeldStart that sent nothing (replay.py)."""
        target = self._base + path.decode("latin-1")
        if scope["query_string"]:
            target += "?" + scope["query_string"].decode("latin-1")
        response: aiohttp.ClientResponse | None = None
        started = finished = False
        try:
            response = await self._upstream().request(
                scope["method"],
                URL(target, encoded=True),
                headers=headers,
                data=body or None,
                allow_redirects=False,
            )
            if ticket is not None:
                self._observe(response.status, ticket)
            out = response_headers(response.raw_headers, None if trace is None else trace.set_content_type)
            status = response.status
            await send({"type": "http.response.start", "status": status, "headers": out})
            started = True
            self._count(status)
            await self._stream(response.content, send, trace)
            finished = True
            return status
        except aiohttp.ClientError as exc:  # the timeout errors are ClientErrors too
            if isinstance(send, HeldStart) and send.replayable():
                if started and not send.sent:  # counted at its head, which never reached the client
                    self._responses[status] -= 1
                    if not self._responses[status]:
                        del self._responses[status]
                raise Lost(exc) from exc
            return await self._upstream_failed(exc, started, send)
        finally:
            if response is not None:
                if finished:
                    response.release()
                else:
                    response.close()

    def _observe(self, status: int, ticket: Ticket) -> None:
        """An admitted request's time to first byte, and its status for the reflex to vLLM's 503s."""
        self._ttfb.observe(self._monotonic() - ticket.admitted_at)
        if self.backoff is not None:
            self.backoff.observe(status, ticket.admitted_at)

    @staticmethod
    async def _stream(content: aiohttp.StreamReader, send: Send, trace: RequestTrace | None) -> None:
        """Pass the upstream body on as it arrives, each chunk to the trace too."""
        while True:
            chunk = await content.readany()
            if trace is not None and chunk:
                trace.feed(chunk)
            last = content.at_eof()
            await send({"type": "http.response.body", "body": chunk, "more_body": not last})
            if last:
                return

    async def _upstream_failed(self, exc: aiohttp.ClientError, started: bool, send: Send) -> int:
        """Count an upstream failure and answer it (502, 504) unless the response had started; its status."""
        kind, status, message = upstream_failure(exc)
        self._errors[kind] = self._errors.get(kind, 0) + 1
        if started:
            # The status is gone: end the connection without the final chunk, so that the client sees a
            # truncated response rather than a complete-looking one (uvicorn logs it as incomplete).
            log.warning("upstream %s failed mid-response (%s); cutting the client off", self._base, kind)
            return status
        self._count(status)
        code = "upstream_timeout" if status == 504 else f"upstream_{kind}"
        kind_name = "gateway_timeout" if status == 504 else "bad_gateway"
        await send_error(send, status, error_body(message, kind_name, code))
        return status

    async def _rejection(self, send: Send, rejection: Rejection) -> None:
        kind = "rate_limit_exceeded" if rejection.status == 429 else "service_unavailable"
        retry = b"%d" % max(1, math.ceil(rejection.retry_after))
        self._count(rejection.status)
        body = error_body(rejection.message, kind, rejection.reason)
        await send_error(send, rejection.status, body, [(b"retry-after", retry)])

    async def _too_large_response(self, send: Send) -> None:
        self._too_large += 1
        message = f"The request body is larger than the gateway's limit of {self.config.max_body} bytes."
        await self._refuse(send, 413, "body_too_large", message)

    async def _too_complex_response(self, send: Send, exc: TooManyElements) -> None:
        why = f"The request body has more JSON elements than the gateway's limit of {exc.limit}."
        await self._refuse(send, 413, "body_too_complex", why)

    async def _refuse(self, send: Send, status: int, reason: str, message: str) -> None:
        """The gateway's own refusal, before the request body is read (so the connection closes)."""
        self.count_refusal(reason, status)
        await send_error(send, status, self.refusal_body(status, reason, message), close=True)

    def _count(self, status: int) -> None:
        self._responses[status] = self._responses.get(status, 0) + 1

    @staticmethod
    def refusal_body(status: int, reason: str, message: str) -> bytes:
        """The OpenAI-shaped body of a refusal by the gateway itself (here or below the HTTP server)."""
        kind = "service_unavailable" if status == 503 else "invalid_request_error"
        return error_body(message, "permission_error" if status == 403 else kind, reason)

    def count_refusal(self, reason: str, status: int) -> None:
        """A request or connection the gateway refused itself, here or in its listener."""
        self._refused[reason] = self._refused.get(reason, 0) + 1
        self._count(status)
        if status == 408:
            self._client_timeouts += 1

    def snapshot(self, connections: int = 0, evicted: int = 0) -> ProxySnapshot:
        """Counters and the time-to-first-byte histogram; `connections` and `evicted` are the listener's."""
        return ProxySnapshot(
            responses_total={str(code): n for code, n in sorted(self._responses.items())},
            upstream_errors_total=dict(self._errors),
            ttfb=self._ttfb.snapshot(),
            body_too_large_total=self._too_large,
            client_timeouts_total=self._client_timeouts,
            refused_total=dict(self._refused),
            connections=connections,
            connections_evicted_total=evicted,
            upstream_backoffs_total=0 if self.backoff is None else self.backoff.decreases,
            replays_total=self.replays.snapshot(),
            replays_held=self.replays.held,
            spec_decode=self.spec_requests.snapshot(),
        )

    async def aclose(self) -> None:
        """Close the upstream connections."""
        if self._client is not None:
            await self._client.close()
            self._client = None
