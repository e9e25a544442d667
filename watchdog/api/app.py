"""The own HTTP API on `listen`: /metrics, /healthz, Prometheus' read API (targets, series, query,
query_range, buildinfo, /-/healthy, /-/ready), the store's raw samples (samples.py), the incident bundles, and
token-guarded control.

Everything it shows passes through the live config's `Redactor` (secret values and shapes masked); everything
that changes state goes through `ControlGuard` (bearer token, bounded bodies).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..actions.pipeline.remediator import Remediator
from ..gateway.control.handle import GatewayControl
from ..gateway.protocol.channel import ChannelError
from ..redact import ConfigRedactors, Redactor
from ..ruler.evaluation import RuleEvaluation
from ..sources.monitor import Monitor
from .control import (
    ControlGuard,
    bad_request,
    control_routes,
    error_response,
    gateway_unreachable,
)
from .graph import graph_handler
from .inbound import BadRequest
from .incidents import incident_routes
from .jsonbodies import JSONAnswer
from .prometheus import MAX_BODY as MAX_QUERY_BODY
from .prometheus import READ_POSTS, QueryApi, QueryOptions, query_routes
from .queryrunner import QueryRunner
from .runbooks import runbooks_handler
from .samples import samples_route
from .targets import targets_json

MAX_CONTROL_BODY = 64 * 1024


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such path: 404, wrong method: 405) as the API's JSON errors."""
    assert isinstance(exc, HTTPException)
    message = "not found" if exc.status_code == 404 else str(exc.detail).lower()
    return error_response(exc.status_code, message, **(exc.headers or {}))


async def client_gone(request: Request, exc: Exception) -> Response:
    """A client that closed before its body arrived: nobody reads the answer, and no traceback is logged (a
    flood of dropped uploads would otherwise write one per connection)."""
    return error_response(400, "client closed the connection before its request body arrived")


@dataclass(frozen=True)
class ApiOptions:
    """What the own API serves: the live monitor, rules and actions (each reads its current config, so a
    reload takes effect at once), the own metrics, and the daemon's reload and health check."""

    monitor: Monitor
    evaluation: RuleEvaluation
    remediator: Remediator
    registry: CollectorRegistry
    reload: Callable[[], Awaitable[tuple[bool, list[str]]]]
    healthy: Callable[[], bool]
    gateway: GatewayControl | None = None
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.perf_counter
    ready: Callable[[], bool] = lambda: True  # /-/ready: 503 until the daemon has started


class DaemonApi:
    """The daemon's own routes: /metrics, /healthz, targets, alerts, rules and reload, one method each."""

    def __init__(self, options: ApiOptions, redactor: Callable[[], Redactor]) -> None:
        self.options = options
        self.redactor = redactor

    def answer(self, data: Any) -> JSONResponse:
        """`data` as JSON, redacted."""
        return JSONAnswer(self.redactor().value(data))

    async def metrics(self, request: Request) -> Response:
        """GET /metrics: the own metrics, redacted."""
        text = generate_latest(self.options.registry)
        return Response(self.redactor().bytes(text), media_type=CONTENT_TYPE_LATEST)

    async def healthz(self, request: Request) -> Response:
        """GET /healthz: 503 when the scheduler is not running."""
        if self.options.healthy():
            return JSONAnswer({"status": "ok"})
        return error_response(503, "scheduler is not running")

    async def targets(self, request: Request) -> Response:
        """GET /api/v1/targets, as Prometheus answers it."""
        q, monitor = request.query_params, self.options.monitor
        data = targets_json(monitor, q.get("scrapePool", ""), q.get("state", ""))
        return self.answer({"status": "success", "data": data})

    async def alerts(self, request: Request) -> Response:
        """GET /api/v1/alerts."""
        return self.answer(self.options.evaluation.manager.alerts_json())

    async def rules(self, request: Request) -> Response:
        """GET /api/v1/rules."""
        return self.answer(self.options.evaluation.manager.rules_json())

    async def reload(self, request: Request) -> Response:
        """POST /-/reload: 422 with the problems when the new config is rejected."""
        await request.body()  # none is expected; reading it enforces the limit on a chunked one
        ok, problems = await self.options.reload()
        if ok:
            return JSONAnswer({"status": "success"})
        return JSONAnswer({"status": "error", "errors": self.redactor().value(problems)}, status_code=422)


EXCEPTION_HANDLERS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    BadRequest: bad_request,
    ClientDisconnect: client_gone,
    ChannelError: gateway_unreachable,
    HTTPException: http_error,
}


def build_app(options: ApiOptions) -> Starlette:
    """The Starlette app; the bearer token and the redaction follow the monitor's current config."""
    monitor = options.monitor
    redactors = ConfigRedactors()

    def redactor() -> Redactor:
        return redactors.get(monitor.config)

    runner = QueryRunner(options.monotonic)  # the queries and /api/v1/samples take turns at it
    query = QueryOptions(
        lambda: monitor.config,
        lambda: monitor.store,
        redactor,
        options.clock,
        options.monotonic,
        options.ready,
        runner,
    )
    own = DaemonApi(options, redactor)
    guard = Middleware(
        ControlGuard,
        get_token=lambda: monitor.config.api_token,
        limits={"/-/reload": MAX_CONTROL_BODY} | dict.fromkeys(READ_POSTS, MAX_QUERY_BODY),
        read_posts=READ_POSTS,
    )
    routes = [
        Route("/metrics", own.metrics),
        Route("/healthz", own.healthz),
        Route("/api/v1/targets", own.targets),
        samples_route(lambda: monitor.store, redactor, runner),
        *query_routes(query),
        Route("/graph", graph_handler(QueryApi(query), options.clock)),
        Route("/runbooks", runbooks_handler()),
        Route("/docs/runbooks.md", runbooks_handler()),  # the bundled rules' runbook_url, made absolute
        Route("/api/v1/alerts", own.alerts),
        Route("/api/v1/rules", own.rules),
        Route("/-/reload", own.reload, methods=["POST"]),
        *control_routes(options.remediator, options.gateway, options.clock, redactor),
        *incident_routes(options.remediator, own.answer),
    ]
    return Starlette(middleware=[guard], exception_handlers=EXCEPTION_HANDLERS, routes=routes)
