"""/api/v1/samples: the store's raw samples of the series a selector picks, with their own timestamps.

The selection, the redaction of the label sets and the encoding run in a child of the query runner, as the
read API's queries do: at its clients' turn, within the query deadline and the byte cap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..goregex import RegexError
from ..promql.selectors import parse_selector
from ..redact import Redactor
from ..store import SampleStore, is_stale
from .prometheus import QUERY_TIMEOUT, answered, encoded
from .promjson import ApiError, api_error
from .queryrunner import QueryRunner

MAX_SERIES = 10_000


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def samples_json(store: SampleStore, match: str, redactor: Redactor) -> list[dict[str, Any]]:
    """Each series `match` selects: its redacted labels and its `[seconds, "value"]` samples."""
    try:
        selector = parse_selector(match)
    except (ValueError, RegexError) as exc:
        raise ApiError("bad_data", str(exc)) from None
    found = selector.select(store)
    if len(found) > MAX_SERIES:
        raise ApiError("execution", f"{len(found)} series match; narrow the selector (limit {MAX_SERIES})")
    return [
        {
            "labels": redactor.value(dict(s.labels)),  # samples are numbers: no need to walk them
            "samples": [
                [t / 1000, "stale" if is_stale(v) else _value(v)] for t, v in zip(s.ts, s.vals, strict=True)
            ],
        }
        for s in found
    ]


def samples_route(
    store: Callable[[], SampleStore], redactor: Callable[[], Redactor], runner: QueryRunner
) -> Route:
    """The route; errors in Prometheus' JSON shape (400 for a bad selector, 422 past MAX_SERIES)."""

    async def samples(request: Request) -> Response:
        match = request.query_params.get("match") or request.query_params.get("match[]")
        try:
            if not match:
                raise ApiError(
                    "bad_data", "query parameter 'match' is required, e.g. match=vllm:num_requests_waiting"
                )
            work = lambda: encoded(lambda: samples_json(store(), match, redactor()))  # noqa: E731
            return await answered(runner, request, work, QUERY_TIMEOUT)
        except ApiError as err:
            return api_error(err)

    return Route("/api/v1/samples", samples)
