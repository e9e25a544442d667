"""`/graph`: where an alert's generatorURL points (`/graph?g0.expr=...&g0.tab=1`, Prometheus' link format).

The watchdog has no query UI; this page shows the expression, its value now (a table, as Prometheus' table
tab does) and links to the same query as JSON, so the link in every notification opens something useful.
Evaluated like `/api/v1/query`, in a forked child within the query timeout; every text is HTML-escaped and the
page loads nothing (Content-Security-Policy: default-src 'none').
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote_plus

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ..formats.rfc3339 import format_rfc3339, millis
from .prometheus import QUERY_TIMEOUT, QueryApi, answered
from .promjson import ApiError, parse_time
from .querychild import Answer

MAX_ROWS = 1_000  # a page for people: the JSON link has the rest
HEADERS = {"Content-Security-Policy": "default-src 'none'", "X-Content-Type-Options": "nosniff"}
_STYLE = (
    "body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}"
)


def _labels(metric: Mapping[str, str]) -> str:
    name = metric.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{name}{{{rest}}}" if rest or not name else name


def _rows(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    kind, result = data.get("resultType"), data.get("result")
    if kind in ("scalar", "string") and isinstance(result, list):
        return [("", str(result[1]))]
    rows = []
    for item in result if isinstance(result, list) else []:
        values = [item["value"]] if "value" in item else item.get("values", [])
        rows.append((_labels(item.get("metric", {})), " ".join(str(v[1]) for v in values)))
    return rows


def render(expr: str, at: float, data: Mapping[str, Any] | None, error: str | None) -> bytes:
    """The page: the expression, when, and the result's rows (or the error)."""

    def e(text: str) -> str:
        return html.escape(text, quote=False)

    link = f"/api/v1/query?query={quote_plus(expr, safe='')}&time={at:.3f}"
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>vllm-watchdog: {e(expr[:80])}</title>",
        f"<style>{_STYLE}</style></head><body><h1>Expression</h1><pre>{e(expr)}</pre>",
        f"<p>Evaluated at {e(format_rfc3339(millis(at)))} by the watchdog. ",
        f"<a href='{html.escape(link)}'>The same as JSON</a>.</p>",
    ]
    if error is not None:
        parts.append(f"<p><strong>Error:</strong> {e(error)}</p>")
    else:
        rows = _rows(data or {})
        cut = f" (the first {MAX_ROWS})" if len(rows) > MAX_ROWS else ""
        parts.append(f"<p>{len(rows)} result(s){cut}</p>")
        parts.append("<table><tr><th>Series</th><th>Value</th></tr>")
        parts += [f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in rows[:MAX_ROWS]]
        parts.append("</table>")
    parts.append("</body></html>")
    return "".join(parts).encode()


def graph_handler(api: QueryApi, clock: Callable[[], float]) -> Callable[[Request], Any]:
    """GET /graph?g0.expr=EXPR[&g0.time=T]: the page for EXPR, evaluated now (or at T)."""

    async def graph(request: Request) -> Response:
        expr = request.query_params.get("g0.expr", "")
        try:
            text = request.query_params.get("g0.time")
            at = parse_time(text, "g0.time") if text else clock()
        except ApiError as err:
            return HTMLResponse(render(expr, clock(), None, err.message), 400, headers=HEADERS)

        def work() -> Answer:
            try:
                return Answer(200, render(expr, at, api.instant(expr, at, QUERY_TIMEOUT), None))
            except ApiError as err:
                return Answer(400, render(expr, at, None, err.message))

        try:
            delivered = await answered(api.runner, request, work, QUERY_TIMEOUT)
        except ApiError as err:
            return HTMLResponse(render(expr, at, None, err.message), 503, headers=HEADERS)
        delivered.media_type = "text/html"
        delivered.init_headers(HEADERS)
        return delivered

    return graph
