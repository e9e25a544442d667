"""The quarantine routes of the own HTTP API: which targets are quarantined (their answers stayed wrong after
a restart: kept drained, no restarts), and lifting a quarantine by hand once a person has looked. Lifting
changes state, so ControlGuard asks for the bearer token like on every other such route."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..actions.pipeline.control import RemediationControl
from ..jsontext import parse
from .inbound import BadRequest, string_field
from .jsonbodies import JSONAnswer

MAX_REASON = 500  # characters of an operator's reason kept in the audit row


class QuarantinesApi:
    """List quarantines; lift one."""

    def __init__(
        self,
        remediator: RemediationControl,
        clock: Callable[[], float],
        answer: Callable[[Any], JSONResponse],
        error: Callable[[int, str], JSONResponse],
    ) -> None:
        self.remediator = remediator
        self.clock = clock
        self.answer = answer
        self.error = error

    def routes(self) -> list[Route]:
        """Its routes."""
        return [
            Route("/api/v1/quarantines", self.quarantines),
            Route("/api/v1/quarantines/{target}/lift", self.lift, methods=["POST"]),
        ]

    async def quarantines(self, request: Request) -> Response:
        """GET /api/v1/quarantines: each quarantined target, since when, why, by which action."""
        found = self.remediator.quarantines()
        return self.answer({"status": "success", "data": [q.to_json() for _, q in sorted(found.items())]})

    async def lift(self, request: Request) -> Response:
        """POST /api/v1/quarantines/{target}/lift: end the quarantine and undrain; 404 if there is none."""
        raw = await request.body()  # bounded by ControlGuard
        try:
            body = parse(raw) if raw.strip() else {}
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        reason = string_field(body, "reason", default="lifted by an operator")[:MAX_REASON]
        target = request.path_params["target"]
        if not self.remediator.lift_quarantine(target, self.clock(), reason):
            return self.error(404, f"target {target!r} is not quarantined")
        return JSONAnswer({"status": "success", "target": target, "lifted": True})
