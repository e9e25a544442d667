"""The action part of the own HTTP API: history, the fleet, maintenance mode, silences, manual runs, inbound
alerts.

`ControlGuard` fronts the whole API: every method but GET and HEAD needs the bearer token (`api_token`), on
every path but the named POSTs that only read (Prometheus' query API), so that no state-changing route can be
added without it; and every request body is bounded. Reads need no token; what they show passes through the
config's `Redactor` first.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..actions.pipeline.control import RemediationControl
from ..config.durations import parse_duration
from ..fleet.etcd import EtcdError
from ..gateway.control.handle import GatewayControl
from ..jsontext import parse
from ..redact import Redactor
from .inbound import BadRequest, inbound_alerts, silence_matchers, string_field, time_field
from .jsonbodies import JSONAnswer
from .promjson import ERROR_STATUS
from .quarantines import QuarantinesApi

MAX_BODY = 1024 * 1024  # an Alertmanager webhook batch can be large; anything bigger is refused
MANUAL_WAIT_LIMIT = 3600.0
# Each alert of a webhook is routed at once, in the event loop: beyond this the webhook is refused (413).
MAX_INBOUND_ALERTS = 1000
MAX_HISTORY = 10_000  # rows of GET /api/v1/actions?limit=
READ_METHODS = frozenset({"GET", "HEAD"})  # the only methods that need no token
DRAIN_BYTES = 2 * MAX_BODY  # read and dropped before a refusal, so that the client reads it (then: close)
DRAIN_SECONDS = 2.0


class BodyTooLarge(ValueError):
    """A request body over the limit of its path; raised while reading, and answered 413 by ControlGuard."""


# Prometheus' errorType of a status (503: "unavailable"); other statuses answer errorType "error".
_ERROR_TYPES = {status: kind for kind, status in ERROR_STATUS.items()}


def error_response(status: int, message: str, **headers: str) -> JSONResponse:
    """The JSON error body every endpoint of the own API answers with, in Prometheus' shape."""
    body = {"status": "error", "errorType": _ERROR_TYPES.get(status, "error"), "error": message}
    return JSONAnswer(body, status_code=status, headers=headers)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def check_bearer(headers: Headers, token: str | None) -> JSONResponse | None:
    """None if the headers carry the configured bearer token, else the 401/403 to send."""
    if not token:
        return error_response(403, "control API disabled: set api_token in the config")
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return error_response(
            401, "missing bearer token", **{"WWW-Authenticate": 'Bearer realm="vllm-watchdog"'}
        )
    # Constant time, and on digests so that not even the token's length shows in the timing.
    if not hmac.compare_digest(_digest(given.strip()), _digest(token)):
        return error_response(403, "invalid bearer token")
    return None


class ControlGuard:
    """ASGI middleware: the bearer token for all but GET/HEAD and read-only POSTs; a body limit per path.

    A declared Content-Length over the limit is refused without reading the body; a chunked (or understated)
    body is counted as it arrives and refused at the first byte over. Before a refusal, at most DRAIN_BYTES
    more are read and dropped for at most DRAIN_SECONDS, so that a client still sending reads the answer
    rather than a reset; then the connection closes, and the rest of the body is never read.
    """

    def __init__(
        self,
        app: ASGIApp,
        get_token: Callable[[], str | None],
        limits: Mapping[str, int] | None = None,
        default_limit: int = MAX_BODY,
        read_posts: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.get_token = get_token
        self.read_posts = read_posts  # paths whose POST only reads (Prometheus' query API): no token
        self.limits = dict(limits or {})
        self.default_limit = default_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse, or pass the request on with a counting `receive`."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        limit = self.limits.get(scope["path"], self.default_limit)
        method = scope["method"]
        reads = method in READ_METHODS or (method == "POST" and scope["path"] in self.read_posts)
        refusal = None if reads else check_bearer(headers, self.get_token())
        if refusal is None:
            refusal = _declared_length_refusal(headers.get("content-length"), limit)
        if refusal is not None:
            await _refuse(refusal, scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(f"request body over {limit} bytes")
            return message

        try:
            await self.app(scope, counted, send)
        except BodyTooLarge as exc:  # raised while the handler read the body: nothing was sent yet
            await _refuse(error_response(413, str(exc)), scope, receive, send)


async def _refuse(response: JSONResponse, scope: Scope, receive: Receive, send: Send) -> None:
    response.headers["Connection"] = "close"
    loop = asyncio.get_running_loop()
    deadline, left = loop.time() + DRAIN_SECONDS, DRAIN_BYTES
    while left > 0:
        try:
            message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
        except TimeoutError:
            break
        left -= len(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    await response(scope, receive, send)


def _declared_length_refusal(declared: str | None, limit: int) -> JSONResponse | None:
    if declared is None:
        return None
    if not declared.isdigit():
        return error_response(400, f"Content-Length: not a byte count: {declared[:40]!r}")
    if int(declared) > limit:
        return error_response(413, f"request body over {limit} bytes")
    return None


async def bad_request(request: Request, exc: Exception) -> Response:
    """The app's handler for BadRequest: 400 naming the field."""
    return error_response(400, str(exc))


async def gateway_unreachable(request: Request, exc: Exception) -> Response:
    """The app's handler for a gateway process that does not answer its control channel: 503."""
    return error_response(503, f"the gateway does not answer: {exc}")


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()  # bounded by ControlGuard
    if not raw.strip():
        return {}
    try:
        data = parse(raw)  # bounded depth, valid Unicode in every string
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    return data


def query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter within [low, high]; BadRequest (400) naming it otherwise."""
    given = request.query_params.get(name)
    if given is None:
        return default
    try:
        value = int(given, 10)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise BadRequest(f"{name}: must be an integer from {low} to {high}, not {given[:40]!r}")
    return value


@dataclass(frozen=True)
class ControlOptions:
    """What the action routes work on: the remediation, the gateway's control (None without a gateway), the
    wall clock, and the config's redactor for what they show."""

    remediator: RemediationControl
    gateway: GatewayControl | None
    clock: Callable[[], float]
    redactor: Callable[[], Redactor] = Redactor

    def answer(self, data: Any, status_code: int = 200) -> JSONResponse:
        """`data` as JSON, redacted."""
        return JSONAnswer(self.redactor().value(data), status_code=status_code)


class RemediationApi:
    """History, the fleet, maintenance mode, manual runs and inbound alerts: one method per route."""

    def __init__(self, options: ControlOptions) -> None:
        self.options = options
        self.remediator = options.remediator

    def routes(self) -> list[Route]:
        """Its routes."""
        return [
            Route("/api/v1/actions", self.actions),
            Route("/api/v1/fleet", self.fleet),
            Route("/api/v1/pause", self.pause, methods=["POST"]),
            Route("/api/v1/resume", self.resume, methods=["POST"]),
            Route("/api/v1/actions/{name}/run", self.run, methods=["POST"]),
            Route("/api/v1/alertmanager", self.inbound, methods=["POST"]),
        ]

    async def actions(self, request: Request) -> Response:
        """GET /api/v1/actions: the remediation's state and its last `limit` actions."""
        limit = query_int(request, "limit", 100, 1, MAX_HISTORY)
        return self.options.answer(self.remediator.status_json(self.options.clock(), limit=limit))

    async def fleet(self, request: Request) -> Response:
        """GET /api/v1/fleet: the fleet group, as etcd has it; 503 when etcd cannot be read."""
        try:
            data = await self.remediator.fleet_group()
        except EtcdError as exc:
            return error_response(503, f"etcd cannot be read: {exc}")
        return self.options.answer({"status": "success", "data": data})  # {"enabled": false} outside a fleet

    async def pause(self, request: Request) -> Response:
        """POST /api/v1/pause: maintenance mode on."""
        body = await _body(request)
        reason = string_field(body, "reason", default="maintenance")
        self.remediator.set_paused(True, reason, self.options.clock())
        return JSONAnswer({"status": "success", "paused": True, "reason": reason})

    async def resume(self, request: Request) -> Response:
        """POST /api/v1/resume: maintenance mode off."""
        self.remediator.set_paused(False, "", self.options.clock())
        return JSONAnswer({"status": "success", "paused": False})

    async def run(self, request: Request) -> Response:
        """POST /api/v1/actions/{name}/run: queue an action by hand, and with `wait` wait for its result."""
        body = await _body(request)
        target = body.get("target")
        if target is not None and not isinstance(target, str):
            raise BadRequest("target: must be a string")
        try:
            job = self.remediator.run_manual(request.path_params["name"], target)
        except ValueError as exc:
            return error_response(404, str(exc))
        if not body.get("wait", False) or job.done is None:
            return JSONAnswer({"status": "success", "queued": True}, status_code=202)
        result = await asyncio.wait_for(asyncio.shield(job.done), MANUAL_WAIT_LIMIT)
        return self.options.answer({"status": "success", "result": result})

    async def inbound(self, request: Request) -> Response:
        """POST /api/v1/alertmanager: an Alertmanager webhook's alerts, routed as the rules' are."""
        body = await _body(request)
        given = body.get("alerts")
        if isinstance(given, list) and len(given) > MAX_INBOUND_ALERTS:
            message = (
                f"alerts: {len(given)} alerts in one webhook, at most {MAX_INBOUND_ALERTS}"
                " (set max_alerts in the Alertmanager's webhook_config)"
            )
            return error_response(413, message)
        clock = self.options.clock
        alerts = inbound_alerts(body, clock())
        queued = self.remediator.handle(alerts, clock(), trigger="inbound")
        return JSONAnswer({"status": "success", "alerts": len(alerts), "queued": queued})


class SilencesApi:
    """Silences: add, list, expire."""

    def __init__(self, options: ControlOptions) -> None:
        self.options = options

    def routes(self) -> list[Route]:
        """Its routes."""
        return [
            Route("/api/v1/silences", self.add_silence, methods=["POST"]),
            Route("/api/v1/silences", self.silences, methods=["GET"]),
            Route("/api/v1/silences/{sid}", self.expire_silence, methods=["DELETE"]),
        ]

    async def add_silence(self, request: Request) -> Response:
        """POST /api/v1/silences: matchers until endsAt (or for a duration), from startsAt (or now)."""
        body = await _body(request)
        now = self.options.clock()
        matchers = silence_matchers(body.get("matchers"))
        ends = time_field(body.get("endsAt"), "endsAt")
        if ends is None:
            try:
                ends = now + parse_duration(string_field(body, "duration", default=""))
            except ValueError as exc:
                raise BadRequest(f"set endsAt (RFC 3339) or duration (e.g. 2h): {exc}") from None
        if ends <= now:
            raise BadRequest("endsAt: must be in the future")
        starts = time_field(body.get("startsAt"), "startsAt") or now
        sid = self.options.remediator.add_silence(
            matchers,
            starts,
            ends,
            string_field(body, "comment", default=""),
            string_field(body, "createdBy", default="api"),
            now,
        )
        return JSONAnswer({"status": "success", "silenceID": sid})

    async def silences(self, request: Request) -> Response:
        """GET /api/v1/silences: every silence, expired ones too."""
        silences = self.options.remediator.silences(self.options.clock(), active_only=False)
        return self.options.answer({"status": "success", "data": [s.to_json() for s in silences]})

    async def expire_silence(self, request: Request) -> Response:
        """DELETE /api/v1/silences/{sid}: 404 unless it is active."""
        if not self.options.remediator.expire_silence(request.path_params["sid"], self.options.clock()):
            return error_response(404, "no such active silence")
        return JSONAnswer({"status": "success"})


class GatewayApi:
    """The gateway's status and its session breakers; 404 on each route without a gateway."""

    def __init__(self, options: ControlOptions) -> None:
        self.options = options

    def routes(self) -> list[Route]:
        """Its routes."""
        return [
            Route("/api/v1/gateway", self.status),
            Route("/api/v1/gateway/breakers", self.open_breaker, methods=["POST"]),
            Route("/api/v1/gateway/breakers/{session}", self.close_breaker, methods=["DELETE"]),
        ]

    async def status(self, request: Request) -> Response:
        """GET /api/v1/gateway."""
        gateway = self.options.gateway
        if gateway is None:
            return error_response(404, "no gateway configured")
        return self.options.answer({"status": "success", "data": await gateway.status_json()})

    async def open_breaker(self, request: Request) -> Response:
        """POST /api/v1/gateway/breakers: open a session's breaker for a duration."""
        gateway = self.options.gateway
        if gateway is None:
            return error_response(404, "no gateway configured")
        body = await _body(request)
        session = string_field(body, "session")
        if not session:
            raise BadRequest("session: must not be empty")
        try:
            given = string_field(body, "duration", default="")
            duration = parse_duration(given) if given else gateway.breaker_default
        except ValueError as exc:
            raise BadRequest(f"duration: {exc}") from None
        if duration <= 0:
            raise BadRequest("duration: must be greater than 0")
        reason = string_field(body, "reason", default="opened by an operator")
        await gateway.open_breaker(session, duration, reason)
        return JSONAnswer({"status": "success", "session": session, "seconds": duration})

    async def close_breaker(self, request: Request) -> Response:
        """DELETE /api/v1/gateway/breakers/{session}."""
        gateway = self.options.gateway
        if gateway is None:
            return error_response(404, "no gateway configured")
        await gateway.close_breaker(request.path_params["session"])
        return JSONAnswer({"status": "success"})


def control_routes(
    remediator: RemediationControl,
    gateway: GatewayControl | None,
    clock: Callable[[], float],
    get_redactor: Callable[[], Redactor] = Redactor,
) -> list[Route]:
    """The routes; ControlGuard in front of the app checks the token; `get_redactor` masks what they show."""
    options = ControlOptions(remediator, gateway, clock, get_redactor)
    quarantines = QuarantinesApi(remediator, clock, options.answer, error_response)
    return [
        *GatewayApi(options).routes(),
        *RemediationApi(options).routes(),
        *SilencesApi(options).routes(),
        *quarantines.routes(),
    ]
