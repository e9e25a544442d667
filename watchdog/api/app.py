"""The own HTTP API on `listen`: /metrics, /healthz, targets, series, and token-guarded control.

Everything it shows passes through the live config's `Redactor` (secret values and shapes masked); everything
that changes state goes through `ControlGuard` (bearer token, bounded bodies).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..actions.remediator import Remediator
from ..gateway.channel import ChannelError
from ..gateway.handle import GatewayControl
from ..promql.selectors import parse_selector
from ..redact import ConfigRedactors, Redactor
from ..ruler.evaluation import RuleEvaluation
from ..sources.monitor import Monitor
from ..store import is_stale
from .control import (
    BadRequest,
    ControlGuard,
    bad_request,
    control_routes,
    error_response,
    gateway_unreachable,
)
from .jsonbodies import JSONAnswer

MAX_SERIES = 10_000
MAX_CONTROL_BODY = 64 * 1024


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


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


def build_app(options: ApiOptions) -> Starlette:
    """The Starlette app; the bearer token and the redaction follow the monitor's current config."""
    monitor, evaluation, registry = options.monitor, options.evaluation, options.registry
    redactors = ConfigRedactors()

    def redactor() -> Redactor:
        return redactors.get(monitor.config)

    def answer(data: Any) -> JSONResponse:
        return JSONAnswer(redactor().value(data))

    async def metrics(request: Request) -> Response:
        return Response(redactor().bytes(generate_latest(registry)), media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        if options.healthy():
            return JSONAnswer({"status": "ok"})
        return error_response(503, "scheduler is not running")

    async def targets(request: Request) -> Response:
        out: list[dict[str, Any]] = []
        for rt in monitor.targets.values():
            st, h = rt.scrape.status, rt.health.status
            canary = rt.canary.status if rt.canary is not None else None
            out.append(
                {
                    "name": rt.config.name,
                    "url": rt.config.url,
                    "metrics_url": rt.config.metrics_url,
                    "container": rt.config.container,
                    "labels": rt.labels,
                    "up": st.up,
                    "last_scrape": st.last_scrape,
                    "last_scrape_duration": st.last_duration,
                    "last_error": st.last_error,
                    "samples": st.samples,
                    "health": {"up": h.ok, "latency": h.latency, "last_error": h.last_error},
                    "canary": None
                    if canary is None
                    else {
                        "success": canary.ok,
                        "latency": canary.latency,
                        "last_error": canary.last_error,
                    },
                }
            )
        return answer({"status": "success", "data": out})

    async def series(request: Request) -> Response:
        match = request.query_params.get("match") or request.query_params.get("match[]")
        if not match:
            return error_response(
                400, "query parameter 'match' is required, e.g. match=vllm:num_requests_waiting"
            )
        try:
            selector = parse_selector(match)
        except ValueError as exc:
            return error_response(400, str(exc))
        found = selector.select(monitor.store)
        if len(found) > MAX_SERIES:
            return error_response(422, f"{len(found)} series match; narrow the selector (limit {MAX_SERIES})")
        red = redactor()
        data = [
            {
                "labels": red.value(dict(s.labels)),  # samples are numbers: no need to walk them
                "samples": [
                    [t / 1000, "stale" if is_stale(v) else _value(v)]
                    for t, v in zip(s.ts, s.vals, strict=True)
                ],
            }
            for s in found
        ]
        return JSONAnswer({"status": "success", "data": data})

    async def alerts(request: Request) -> Response:
        return answer(evaluation.manager.alerts_json())

    async def rules(request: Request) -> Response:
        return answer(evaluation.manager.rules_json())

    async def do_reload(request: Request) -> Response:
        await request.body()  # none is expected; reading it enforces the limit on a chunked one
        ok, problems = await options.reload()
        if ok:
            return JSONAnswer({"status": "success"})
        return JSONAnswer({"status": "error", "errors": redactor().value(problems)}, status_code=422)

    return Starlette(
        middleware=[
            Middleware(
                ControlGuard,
                get_token=lambda: monitor.config.api_token,
                limits={"/-/reload": MAX_CONTROL_BODY},
            ),
        ],
        exception_handlers={BadRequest: bad_request, ChannelError: gateway_unreachable},
        routes=[
            Route("/metrics", metrics),
            Route("/healthz", healthz),
            Route("/api/v1/targets", targets),
            Route("/api/v1/series", series),
            Route("/api/v1/alerts", alerts),
            Route("/api/v1/rules", rules),
            Route("/-/reload", do_reload, methods=["POST"]),
            *control_routes(options.remediator, options.gateway, options.clock, redactor),
        ],
    )
