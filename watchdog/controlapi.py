"""The action part of the own HTTP API: history, maintenance mode, silences, manual runs, inbound alerts.

Everything that changes state needs the bearer token (`api_token`); reading the history does not.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .actionconfig import parse_matcher
from .alerting import OutgoingAlert
from .durations import parse_duration
from .gateway.control import GatewayControl
from .remediation import Remediator

MAX_BODY = 1024 * 1024  # an Alertmanager webhook batch can be large; anything bigger is refused
MANUAL_WAIT_LIMIT = 3600.0


class BadRequest(ValueError):
    """A request body problem; the message names the field."""


def error_response(status: int, message: str, **headers: str) -> JSONResponse:
    """The JSON error body every endpoint of the own API answers with."""
    return JSONResponse({"status": "error", "error": message}, status_code=status, headers=headers)


def check_bearer(request: Request, token: str | None) -> JSONResponse | None:
    """None if the request carries the configured bearer token, else the 401/403 to send."""
    if not token:
        return error_response(403, "control API disabled: set api_token in the config")
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return error_response(
            401, "missing bearer token", **{"WWW-Authenticate": 'Bearer realm="vllm-watchdog"'}
        )
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return error_response(403, "invalid bearer token")
    return None


async def _body(request: Request) -> dict[str, Any]:
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise BadRequest(f"request body over {MAX_BODY} bytes")
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("body must be a JSON object")
    return data


def _string(data: dict[str, Any], key: str, where: str = "", default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise BadRequest(f"{where}{key}: must be a string")
    return value


def _labels(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadRequest(f"{where}: must be an object of string values")
    return dict(value)


def _time(value: object, where: str) -> float | None:
    """An RFC 3339 time as Alertmanager writes it; Go's zero time and absence are None."""
    if value is None or value == "" or (isinstance(value, str) and value.startswith("0001-01-01")):
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{where}: must be an RFC 3339 time string")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise BadRequest(f"{where}: not an RFC 3339 time: {value!r}") from None


def inbound_alerts(data: dict[str, Any], now: float) -> list[OutgoingAlert]:
    """Alerts from an Alertmanager webhook body (version 4); BadRequest names the bad field."""
    alerts = data.get("alerts")
    if not isinstance(alerts, list):
        raise BadRequest("alerts: must be a list")
    out: list[OutgoingAlert] = []
    for i, a in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(a, dict):
            raise BadRequest(f"{where}: must be an object")
        status = a.get("status", data.get("status", "firing"))
        if status not in ("firing", "resolved"):
            raise BadRequest(f"{where}.status: must be 'firing' or 'resolved'")
        labels = _labels(a.get("labels"), f"{where}.labels")
        annotations = _labels(a.get("annotations", {}), f"{where}.annotations")
        starts = _time(a.get("startsAt"), f"{where}.startsAt") or now
        ends = _time(a.get("endsAt"), f"{where}.endsAt")
        url = a.get("generatorURL", "")
        out.append(
            OutgoingAlert(
                labels,
                annotations,
                str(status),
                starts,
                ends or 0.0,
                0.0,
                url if isinstance(url, str) else "",
            )
        )
    return out


def _silence_matchers(value: object) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise BadRequest("matchers: must be a non-empty list")
    out: list[dict[str, str]] = []
    for i, m in enumerate(value):
        if isinstance(m, str):
            try:
                parsed = parse_matcher(m)
            except ValueError as exc:
                raise BadRequest(f"matchers[{i}]: {exc}") from None
            out.append({"name": parsed.name, "op": parsed.op, "value": parsed.value})
        elif isinstance(m, dict):  # Alertmanager's silence shape
            name = _string(m, "name", f"matchers[{i}].")
            val = _string(m, "value", f"matchers[{i}].")
            regex, equal = bool(m.get("isRegex", False)), bool(m.get("isEqual", True))
            op = ("=~" if equal else "!~") if regex else ("=" if equal else "!=")
            try:
                parse_matcher(f'{name}{op}"{val}"')
            except ValueError as exc:
                raise BadRequest(f"matchers[{i}]: {exc}") from None
            out.append({"name": name, "op": op, "value": val})
        else:
            raise BadRequest(f'matchers[{i}]: must be a string like alertname="X" or an object')
    return out


def control_routes(
    get_remediator: Callable[[], Remediator],
    get_token: Callable[[], str | None],
    clock: Callable[[], float],
    get_gateway: Callable[[], GatewayControl | None] = lambda: None,
) -> list[Route]:
    """The routes; `get_token` reads the live api_token, so a reload changes it at once."""

    def guarded(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def wrapper(request: Request) -> Response:
            denied = check_bearer(request, get_token())
            if denied is not None:
                return denied
            try:
                result: Response = await handler(request)
            except BadRequest as exc:
                return error_response(400, str(exc))
            return result

        return wrapper

    async def actions(request: Request) -> Response:
        try:
            limit = min(int(request.query_params.get("limit", "100")), 10_000)
        except ValueError:
            return error_response(400, "limit: must be an integer")
        return JSONResponse(get_remediator().status_json(clock(), limit=limit))

    async def pause(request: Request) -> Response:
        body = await _body(request)
        reason = _string(body, "reason", default="maintenance")
        get_remediator().store.set_paused(True, reason, clock())
        return JSONResponse({"status": "success", "paused": True, "reason": reason})

    async def resume(request: Request) -> Response:
        get_remediator().store.set_paused(False, "", clock())
        return JSONResponse({"status": "success", "paused": False})

    async def add_silence(request: Request) -> Response:
        body = await _body(request)
        now = clock()
        matchers = _silence_matchers(body.get("matchers"))
        ends = _time(body.get("endsAt"), "endsAt")
        if ends is None:
            try:
                ends = now + parse_duration(_string(body, "duration", default=""))
            except ValueError as exc:
                raise BadRequest(f"set endsAt (RFC 3339) or duration (e.g. 2h): {exc}") from None
        if ends <= now:
            raise BadRequest("endsAt: must be in the future")
        starts = _time(body.get("startsAt"), "startsAt") or now
        store = get_remediator().store
        sid = store.add_silence(
            matchers,
            starts,
            ends,
            _string(body, "comment", default=""),
            _string(body, "createdBy", default="api"),
            now,
        )
        return JSONResponse({"status": "success", "silenceID": sid})

    async def list_silences(request: Request) -> Response:
        silences = get_remediator().store.silences(clock(), active_only=False)
        return JSONResponse({"status": "success", "data": [s.to_json() for s in silences]})

    async def expire_silence(request: Request) -> Response:
        if not get_remediator().store.expire_silence(request.path_params["sid"], clock()):
            return error_response(404, "no such active silence")
        return JSONResponse({"status": "success"})

    async def run(request: Request) -> Response:
        body = await _body(request)
        target = body.get("target")
        if target is not None and not isinstance(target, str):
            raise BadRequest("target: must be a string")
        try:
            job = get_remediator().run_manual(request.path_params["name"], target)
        except ValueError as exc:
            return error_response(404, str(exc))
        if not body.get("wait", False) or job.done is None:
            return JSONResponse({"status": "success", "queued": True}, status_code=202)
        result = await asyncio.wait_for(asyncio.shield(job.done), MANUAL_WAIT_LIMIT)
        return JSONResponse({"status": "success", "result": result})

    async def inbound(request: Request) -> Response:
        alerts = inbound_alerts(await _body(request), clock())
        queued = get_remediator().handle(alerts, clock(), trigger="inbound")
        return JSONResponse({"status": "success", "alerts": len(alerts), "queued": queued})

    async def gateway_status(request: Request) -> Response:
        gw = get_gateway()
        if gw is None:
            return error_response(404, "no gateway configured")
        return JSONResponse({"status": "success", "data": await gw.status_json()})

    async def open_breaker(request: Request) -> Response:
        gw = get_gateway()
        if gw is None:
            return error_response(404, "no gateway configured")
        body = await _body(request)
        session = _string(body, "session")
        if not session:
            raise BadRequest("session: must not be empty")
        try:
            given = _string(body, "duration", default="")
            duration = parse_duration(given) if given else gw.server.config.sessions.breaker_duration
        except ValueError as exc:
            raise BadRequest(f"duration: {exc}") from None
        if duration <= 0:
            raise BadRequest("duration: must be greater than 0")
        reason = _string(body, "reason", default="opened by an operator")
        await gw.open_breaker(session, duration, reason)
        return JSONResponse({"status": "success", "session": session, "seconds": duration})

    async def close_breaker(request: Request) -> Response:
        gw = get_gateway()
        if gw is None:
            return error_response(404, "no gateway configured")
        await gw.close_breaker(request.path_params["session"])
        return JSONResponse({"status": "success"})

    return [
        Route("/api/v1/gateway", gateway_status),
        Route("/api/v1/gateway/breakers", guarded(open_breaker), methods=["POST"]),
        Route("/api/v1/gateway/breakers/{session}", guarded(close_breaker), methods=["DELETE"]),
        Route("/api/v1/actions", actions),
        Route("/api/v1/pause", guarded(pause), methods=["POST"]),
        Route("/api/v1/resume", guarded(resume), methods=["POST"]),
        Route("/api/v1/silences", guarded(add_silence), methods=["POST"]),
        Route("/api/v1/silences", list_silences, methods=["GET"]),
        Route("/api/v1/silences/{sid}", guarded(expire_silence), methods=["DELETE"]),
        Route("/api/v1/actions/{name}/run", guarded(run), methods=["POST"]),
        Route("/api/v1/alertmanager", guarded(inbound), methods=["POST"]),
    ]
