"""Prometheus' HTTP API conventions: parameter parsing (times, durations, forms) and JSON results.

Mirrors Prometheus 2.42's `web/api/v1/api.go` (`parseTime`, `parseDuration`, `respondError`) and
`util/jsonutil` (how sample values and timestamps are written), so that Grafana and promtool read the
watchdog's answers as they read Prometheus'.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import JSONResponse

from ..config.durations import parse_duration
from ..formats.rfc3339 import parse_rfc3339
from ..promql.values import Matrix, Scalar, String, Value
from ..store import Labels
from .jsonbodies import JSONAnswer

# The HTTP status of each Prometheus errorType (respondError); "unavailable" is 503 here (Prometheus: 500).
ERROR_STATUS = {
    "bad_data": 400,
    "execution": 422,
    "timeout": 503,
    "canceled": 503,
    "unavailable": 503,
    "not_found": 404,
    "method_not_allowed": 405,
}
MAX_UNIX_SECONDS = 1e11  # year 5138: anything beyond is a typo, and would overflow a millisecond int64 sooner
MAX_FORM_FIELDS = 256


class ApiError(Exception):
    """A request Prometheus would refuse: its errorType (bad_data, execution, timeout...) and message."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def bad_param(name: str, message: str) -> ApiError:
    """Prometheus' invalidParamError: bad_data naming the parameter."""
    return ApiError("bad_data", f'invalid parameter "{name}": {message}')


def api_error(err: ApiError) -> JSONResponse:
    """The error body and status Prometheus answers for `err`."""
    body = {"status": "error", "errorType": err.kind, "error": err.message}
    return JSONAnswer(body, status_code=ERROR_STATUS.get(err.kind, 500))


def format_value(v: float) -> str:
    """A sample value as Prometheus writes it: Go's shortest 'f' form, 'e' below 1e-6 or from 1e21."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    text = repr(v)
    a = abs(v)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        mantissa, _, exp = text.partition("e")  # Python writes 1e-07 and 1e+21 as Go does
        return f"{mantissa.removesuffix('.0')}e{exp}" if exp else f"{v:e}"
    out = format(Decimal(text), "f")
    if "." in out:
        out = out.rstrip("0").rstrip(".")
    return out


def format_time(t_ms: int) -> int | float:
    """A timestamp as Prometheus writes it: unix seconds with at most 3 decimals."""
    return t_ms // 1000 if t_ms % 1000 == 0 else t_ms / 1000


def metric(labels: Labels) -> dict[str, str]:
    """A label set as a JSON object."""
    return dict(labels)


def point(t_ms: int, v: float) -> list[Any]:
    """One `[<seconds>, "<value>"]` pair."""
    return [format_time(t_ms), format_value(v)]


def result_json(value: Value) -> dict[str, Any]:
    """`data` of a query answer: resultType and result, as Prometheus shapes each value type."""
    if isinstance(value, Scalar):
        return {"resultType": "scalar", "result": point(value.t_ms, value.value)}
    if isinstance(value, String):
        return {"resultType": "string", "result": [format_time(value.t_ms), value.value]}
    if isinstance(value, Matrix):
        return {
            "resultType": "matrix",
            "result": [
                {
                    "metric": metric(s.labels),
                    "values": [point(t, v) for t, v in zip(s.ts, s.vals, strict=True)],
                }
                for s in value
            ],
        }
    return {
        "resultType": "vector",
        "result": [{"metric": metric(s.labels), "value": point(s.t_ms, s.value)} for s in value],
    }


def parse_time(text: str, name: str) -> float:
    """Unix seconds from a float or an RFC 3339 time, rounded to the millisecond as Prometheus does."""
    try:
        t = parse_rfc3339(text, require_t=True, unix_seconds=True)
    except ValueError:
        t = math.nan
    if not math.isfinite(t) or abs(t) > MAX_UNIX_SECONDS:
        raise bad_param(name, f"cannot parse {text[:64]!r} to a valid timestamp")
    return round(t, 3)


def parse_seconds(text: str, name: str) -> float:
    """A duration parameter: float seconds or a Prometheus duration (`5m`, `1h30m`)."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            return parse_duration(text)
        except ValueError:
            raise bad_param(name, f"cannot parse {text[:64]!r} to a valid duration") from None
    if not math.isfinite(seconds) or abs(seconds) > MAX_UNIX_SECONDS:
        raise bad_param(name, f"cannot parse {text[:64]!r} to a valid duration. It overflows int64")
    return seconds


class Form:
    """A request's parameters: the urlencoded POST body's, then the URL's, as Go's ParseForm merges them."""

    def __init__(self, pairs: list[tuple[str, str]], max_length: int) -> None:
        self.pairs = pairs
        for key, value in pairs:
            if len(value) > max_length:
                raise bad_param(key[:64], f"longer than {max_length} characters")

    @classmethod
    async def read(cls, request: Request, max_length: int) -> Form:
        """Parse the body (ControlGuard bounds its size) and the query string; bad_data on malformed input."""
        pairs: list[tuple[str, str]] = []
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if request.method == "POST" and kind == "application/x-www-form-urlencoded":
            body = await request.body()
            try:
                pairs += parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
            except (UnicodeDecodeError, ValueError) as exc:
                raise ApiError("bad_data", f"error parsing form values: {exc}") from None
        pairs += request.query_params.multi_items()
        if len(pairs) > MAX_FORM_FIELDS:
            raise ApiError("bad_data", f"error parsing form values: more than {MAX_FORM_FIELDS} fields")
        return cls(pairs, max_length)

    def get(self, key: str) -> str:
        """The first value of `key`, or "" (Go's FormValue)."""
        return next((v for k, v in self.pairs if k == key), "")

    def all(self, key: str) -> list[str]:
        """Every value of `key`, in order."""
        return [v for k, v in self.pairs if k == key]
