"""Prometheus' read API: query, query_range, series, labels, label values, buildinfo, /-/healthy, /-/ready.

Answers come from the embedded sample store through the same PromQL engine the rules use, in Prometheus 2.42's
JSON, so Grafana can use the watchdog as a Prometheus data source for the window the store keeps. The event
loop only reads each request's parameters: everything after (parsing the expression, evaluating, sorting,
redacting, encoding) runs in a child process of the query runner (queryrunner.py), one query at a time, its
clients in turn, within a deadline and a byte cap, so that scrapes, rules and actions keep their schedule.
"""

from __future__ import annotations

import platform
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .. import __version__
from ..config.model import Config
from ..goregex import RegexError
from ..promql.compile import compile_expr, compile_plan
from ..promql.engine import Engine
from ..promql.positions import parse_error_text
from ..promql.selectors import Selector, parse_selector
from ..promql.values import Matrix, PromQLError, QueryError, QueryTimeout, Value, Vector
from ..redact import Redactor
from ..store import Labels, SampleStore
from .fairqueue import Busy
from .jsonbodies import JSONAnswer
from .promjson import ApiError, Form, api_error, bad_param, parse_seconds, parse_time, result_json
from .querychild import Answer, ChildFailed
from .queryrunner import Delivery, QueryRunner, error_kind

MAX_POINTS = 11_000  # per series of a range query, as Prometheus
MAX_SAMPLES = 500_000  # in one answer (Prometheus' --query.max-samples is 50 M; this process also scrapes)
MAX_PARAM = 16 * 1024  # characters of one parameter (a query, a match[])
MAX_BODY = 64 * 1024  # bytes of a POSTed form
MAX_MATCH = 64  # match[] parameters of one /series request
MAX_SERIES = 10_000  # series in one /series answer
QUERY_TIMEOUT = 2.0  # seconds; also the most a `timeout` parameter can ask for
Handler = Callable[["Form", Request], Awaitable[Response]]
READ_POSTS = frozenset(
    {"/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels"}
)  # POSTs that only read


@dataclass(frozen=True)
class QueryOptions:
    """What the query API reads: live config and store, redaction, wall and monotonic clocks, readiness, and
    the runner its queries take turns at (the app shares it with /api/v1/samples)."""

    config: Callable[[], Config]
    store: Callable[[], SampleStore]
    redactor: Callable[[], Redactor]
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    ready: Callable[[], bool]
    runner: QueryRunner = field(default_factory=QueryRunner)


def encoded(produce: Callable[[], Any]) -> Answer:
    """In the child: Prometheus' success JSON around what `produce` returns, or its error for an ApiError."""
    response: JSONResponse
    try:
        response = JSONAnswer({"status": "success", "data": produce()})
    except ApiError as err:
        response = api_error(err)
    return Answer(response.status_code, bytes(response.body))


class DeliveredAnswer(Response):
    """A child's answer; the runner counts its bytes as held until they are sent (uvicorn's `send` returns
    once the connection's buffer has drained below its high-water mark)."""

    def __init__(self, delivery: Delivery) -> None:
        super().__init__(delivery.answer.body, delivery.answer.status, media_type="application/json")
        self.sent = delivery.sent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the answer, then release its bytes."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.sent()


async def answered(
    runner: QueryRunner, request: Request, work: Callable[[], Answer], seconds: float
) -> Response:
    """The runner's answer to `work` as a response; ApiError if it could not give one."""
    try:
        delivery = await runner.run(request.scope, work, seconds)
    except (Busy, ChildFailed) as exc:
        raise ApiError(error_kind(exc), str(exc)) from None
    return DeliveredAnswer(delivery)


def _deadline(monotonic: Callable[[], float], seconds: float) -> Callable[[], None]:
    # Made when the query starts to run: the time it waited for its turn does not count.
    end = monotonic() + seconds

    def tick() -> None:
        if monotonic() > end:
            raise QueryTimeout("query timed out in expression evaluation")

    return tick


def _count(value: Value) -> int:
    if isinstance(value, Matrix):
        return sum(len(s.ts) for s in value)
    return len(value) if isinstance(value, Vector) else 1


def _timeout(form: Form) -> float:
    text = form.get("timeout")
    return QUERY_TIMEOUT if not text else min(parse_seconds(text, "timeout"), QUERY_TIMEOUT)


def _label_name(name: str) -> bool:
    """Prometheus' label name syntax, [a-zA-Z_][a-zA-Z0-9_]*, without a regex."""
    return bool(name) and name.isascii() and not name[0].isdigit() and name.replace("_", "a").isalnum()


def _selectors(texts: list[str]) -> list[Selector]:
    if not texts:
        raise ApiError("bad_data", "no match[] parameter provided")
    if len(texts) > MAX_MATCH:
        raise bad_param("match[]", f"more than {MAX_MATCH} match[] parameters")
    out = []
    for text in texts:
        try:
            out.append(parse_selector(text))
        except (ValueError, RegexError) as exc:
            raise bad_param("match[]", str(exc)) from None
    if all(all(m.matches_value("") for m in s.matchers) and s.name is None for s in out):
        raise bad_param("match[]", "match[] must contain at least one non-empty matcher")
    return out


def _compiled(text: str, prefix: bool) -> str:
    """`text` once it compiles; its parse error as Prometheus words it (`prefix`: a bad `query` param)."""
    try:
        compile_expr(text)
    except PromQLError as exc:
        message = parse_error_text(text, exc.message, exc.position)
        raise (bad_param("query", message) if prefix else ApiError("bad_data", message)) from None
    return text


def _range(form: Form) -> tuple[float, float, float]:
    """A range query's start, end and step, checked as Prometheus checks them."""
    start = parse_time(form.get("start"), "start")
    end = parse_time(form.get("end"), "end")
    if end < start:
        raise bad_param("end", "end timestamp must not be before start time")
    step = parse_seconds(form.get("step"), "step")
    if step <= 0:
        raise bad_param(
            "step",
            "zero or negative query resolution step widths are not accepted. Try a positive integer",
        )
    if (end - start) // step > MAX_POINTS:
        raise ApiError(
            "bad_data",
            "exceeded maximum resolution of 11,000 points per timeseries. "
            "Try decreasing the query resolution (?step=XX)",
        )
    return start, end, step


def _instant_kind(expr: str) -> None:
    """ApiError unless a range query's expression is a scalar or an instant vector."""
    kind = compile_plan(expr).kind
    if kind not in ("vector", "scalar"):
        name = "range vector" if kind == "matrix" else kind
        message = f'invalid expression type "{name}" for range query, must be Scalar or instant Vector'
        raise ApiError("bad_data", message)


def _api(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint that reads the form, calls `handler` and answers its ApiError as Prometheus does."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(await Form.read(request, MAX_PARAM), request)
        except ApiError as err:
            return api_error(err)

    return endpoint


async def buildinfo(request: Request) -> Response:
    """/api/v1/status/buildinfo, with the Python implementation in goVersion."""
    data = {
        "version": __version__,
        "revision": "",
        "branch": "",
        "buildUser": "",
        "buildDate": "",
        "goVersion": f"{platform.python_implementation().lower()}{platform.python_version()}",
    }
    return JSONAnswer({"status": "success", "data": data})


async def healthy(request: Request) -> Response:
    """/-/healthy: always."""
    return PlainTextResponse("vllm-watchdog is Healthy.\n")


class QueryApi:
    """The query API's handlers, one method per route, over what its options give them."""

    def __init__(self, options: QueryOptions) -> None:
        self.options = options
        self.runner = options.runner

    def routes(self) -> list[Route]:
        """The routes; each answers Prometheus' JSON, and its errors Prometheus' errorType and status."""
        both = ["GET", "POST"]
        return [
            Route("/api/v1/query", _api(self.query), methods=both),
            Route("/api/v1/query_range", _api(self.query_range), methods=both),
            Route("/api/v1/series", _api(self.series), methods=both),
            Route("/api/v1/labels", _api(self.label_names), methods=both),
            Route("/api/v1/label/{name}/values", _api(self.label_values)),
            Route("/api/v1/status/buildinfo", buildinfo),
            Route("/-/healthy", healthy),
            Route("/-/ready", self.ready),
        ]

    def _engine(self) -> Engine:
        g = self.options.config().global_
        return Engine(self.options.store(), lookback=g.lookback_delta, default_step=g.evaluation_interval)

    def _result(self, value: Value) -> dict[str, Any]:
        if _count(value) > MAX_SAMPLES:
            raise ApiError(
                "execution",
                "query processing would load too many samples into memory in query execution",
            )
        data = result_json(value)
        if isinstance(value, Vector | Matrix):
            red = self.options.redactor()
            for item in data["result"]:
                item["metric"] = red.value(item["metric"])
        return data

    def _evaluated(self, evaluate: Callable[[Callable[[], None]], Value], seconds: float) -> dict[str, Any]:
        try:
            return self._result(evaluate(_deadline(self.options.monotonic, seconds)))
        except QueryTimeout as exc:
            raise ApiError("timeout", str(exc)) from None
        except QueryError as exc:
            raise ApiError("execution", str(exc)) from None

    async def query(self, form: Form, request: Request) -> Response:
        """/api/v1/query."""
        at = parse_time(form.get("time"), "time") if form.get("time") else self.options.clock()
        seconds, text = _timeout(form), form.get("query")

        return await answered(
            self.runner, request, lambda: encoded(lambda: self.instant(text, at, seconds)), seconds
        )

    def instant(self, text: str, at: float, seconds: float) -> dict[str, Any]:
        """In the child: an instant query's `data` (ApiError for a bad query or a failed evaluation)."""
        expr = _compiled(text, prefix=True)
        return self._evaluated(lambda tick: self._engine().query(expr, at, tick=tick), seconds)

    async def query_range(self, form: Form, request: Request) -> Response:
        """/api/v1/query_range."""
        start, end, step = _range(form)
        seconds, text = _timeout(form), form.get("query")

        def work() -> dict[str, Any]:
            expr = _compiled(text, prefix=False)
            _instant_kind(expr)
            return self._evaluated(
                lambda tick: self._engine().query_range(expr, start, end, step, tick=tick), seconds
            )

        return await answered(self.runner, request, lambda: encoded(work), seconds)

    def _matcher(self, form: Form, limit: int | None) -> Callable[[], list[Labels]]:
        """What finds the label sets of the stored series that a match[] selector picks (every series if
        there is none and no `limit`), with a sample between `start` and `end`; ApiError past `limit`."""
        texts = form.all("match[]")
        selectors = _selectors(texts) if texts or limit is not None else [Selector(None, ())]
        start = parse_time(form.get("start"), "start") if form.get("start") else None
        end = parse_time(form.get("end"), "end") if form.get("end") else None
        lo = -(2**62) if start is None else round(start * 1000)
        hi = 2**62 if end is None else round(end * 1000)
        store = self.options.store

        def find() -> list[Labels]:
            found: set[Labels] = set()
            for sel in selectors:
                for s in store().select(sel.name, sel.predicate()):
                    if s.ts and s.ts[0] <= hi and s.ts[-1] >= lo:
                        found.add(s.labels)
                        if limit is not None and len(found) > limit:
                            raise ApiError("execution", f"more than {limit} series match")
            return sorted(found)

        return find

    async def series(self, form: Form, request: Request) -> Response:
        """/api/v1/series."""
        find = self._matcher(form, MAX_SERIES)

        def work() -> list[Any]:
            red = self.options.redactor()
            return [red.value(dict(ls)) for ls in find()]

        return await answered(self.runner, request, lambda: encoded(work), QUERY_TIMEOUT)

    async def label_names(self, form: Form, request: Request) -> Response:
        """/api/v1/labels."""
        find = self._matcher(form, None)
        work = lambda: sorted({k for ls in find() for k, _ in ls})  # noqa: E731
        return await answered(self.runner, request, lambda: encoded(work), QUERY_TIMEOUT)

    async def label_values(self, form: Form, request: Request) -> Response:
        """/api/v1/label/{name}/values."""
        name = request.path_params["name"]
        if not _label_name(name):
            raise ApiError("bad_data", f"invalid label name: {name[:64]!r}")
        find = self._matcher(form, None)

        def work() -> Any:
            return self.options.redactor().value(sorted({v for ls in find() for k, v in ls if k == name}))

        return await answered(self.runner, request, lambda: encoded(work), QUERY_TIMEOUT)

    async def ready(self, request: Request) -> Response:
        """/-/ready: 503 until the daemon is ready."""
        if self.options.ready():
            return PlainTextResponse("vllm-watchdog is Ready.\n")
        return PlainTextResponse("Service Unavailable", status_code=503)


def query_routes(options: QueryOptions) -> list[Route]:
    """The routes; each answers Prometheus' JSON, and its errors Prometheus' errorType and status."""
    return QueryApi(options).routes()
