"""Prometheus' read API: query, query_range, series, labels, label values, buildinfo, /-/healthy, /-/ready.

Answers come from the embedded sample store through the same PromQL engine the rules use, in Prometheus 2.42's
JSON, so Grafana can use the watchdog as a Prometheus data source for the window the store keeps. Queries run
on the daemon's event loop (the store is not thread-safe), so every one is bounded: its length, its points, a
deadline checked at each step, and a duty cycle that leaves the loop to scrapes and rules between queries.
"""

from __future__ import annotations

import asyncio
import platform
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from .. import __version__
from ..config.model import Config
from ..goregex import RegexError
from ..promql.compile import compile_expr, compile_plan
from ..promql.engine import Engine
from ..promql.selectors import Selector, parse_selector
from ..promql.values import Matrix, PromQLError, QueryError, QueryTimeout, Value, Vector
from ..redact import Redactor
from ..store import Labels, SampleStore
from .jsonbodies import JSONAnswer
from .promjson import ApiError, Form, api_error, bad_param, parse_seconds, parse_time, result_json

MAX_POINTS = 11_000  # per series of a range query, as Prometheus
MAX_SAMPLES = 500_000  # in one answer (Prometheus' --query.max-samples is 50 M; this process also scrapes)
MAX_PARAM = 16 * 1024  # characters of one parameter (a query, a match[])
MAX_BODY = 64 * 1024  # bytes of a POSTed form
MAX_MATCH = 64  # match[] parameters of one /series request
MAX_SERIES = 10_000  # series in one /series answer
QUERY_TIMEOUT = 2.0  # seconds; also the most a `timeout` parameter can ask for (the loop is shared)
MAX_WAITING = 32  # queries queued behind the one running; more are refused (503)
T = TypeVar("T")
Handler = Callable[["Form", dict[str, str]], Awaitable[Response]]
READ_POSTS = frozenset(
    {"/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels"}
)  # POSTs that only read


@dataclass(frozen=True)
class QueryOptions:
    """What the query API reads: live config and store, redaction, wall and monotonic clocks, readiness."""

    config: Callable[[], Config]
    store: Callable[[], SampleStore]
    redactor: Callable[[], Redactor]
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    ready: Callable[[], bool]
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep  # how the gate waits its turn


class QueryGate:
    """Runs one query at a time and, after a query that took d seconds, waits d before the next one, so that
    queries take at most about half of the event loop; refuses when MAX_WAITING are queued."""

    def __init__(self, monotonic: Callable[[], float], sleep: Callable[[float], Awaitable[None]]) -> None:
        self.monotonic = monotonic
        self.sleep = sleep
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.free_at = 0.0

    async def run(self, work: Callable[[], T]) -> T:
        """Run `work` when it is this query's turn; ApiError(unavailable) if too many wait."""
        if self.waiting >= MAX_WAITING:
            raise ApiError("unavailable", f"too many queries waiting ({MAX_WAITING}); try again later")
        self.waiting += 1
        try:
            async with self.lock:
                pause = self.free_at - self.monotonic()
                if pause > 0:
                    await self.sleep(pause)
                started = self.monotonic()
                try:
                    return work()
                finally:
                    ended = self.monotonic()
                    self.free_at = ended + (ended - started)
        finally:
            self.waiting -= 1


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
    if all(all(m.matches("") for m in s.matchers) and s.name is None for s in out):
        raise bad_param("match[]", "match[] must contain at least one non-empty matcher")
    return out


def query_routes(options: QueryOptions) -> list[Route]:
    """The routes; each answers Prometheus' JSON, and its errors Prometheus' errorType and status."""
    gate = QueryGate(options.monotonic, options.sleep)
    engines: dict[tuple[int, float, float], Engine] = {}

    def engine() -> Engine:
        g, store = options.config().global_, options.store()
        key = (id(store), g.lookback_delta, g.evaluation_interval)
        if key not in engines:
            engines.clear()  # a reload changed the lookback: queries from now on use the new one
            engines[key] = Engine(store, lookback=key[1], default_step=key[2])
        return engines[key]

    def answer(value: Value) -> Response:
        if _count(value) > MAX_SAMPLES:
            raise ApiError(
                "execution",
                "query processing would load too many samples into memory in query execution",
            )
        data = result_json(value)
        if isinstance(value, Vector | Matrix):
            red = options.redactor()
            for item in data["result"]:
                item["metric"] = red.value(item["metric"])
        return JSONAnswer({"status": "success", "data": data})

    async def evaluate(work: Callable[[], Value]) -> Response:
        try:
            value = await gate.run(work)
        except QueryTimeout as exc:
            raise ApiError("timeout", str(exc)) from None
        except QueryError as exc:
            raise ApiError("execution", str(exc)) from None
        return answer(value)

    def compiled(text: str, prefix: bool) -> str:
        try:
            compile_expr(text)
        except PromQLError as exc:
            message = f"1:{(exc.position or 0) + 1}: parse error: {exc.message}"
            raise (bad_param("query", message) if prefix else ApiError("bad_data", message)) from None
        return text

    async def query(form: Form, path: dict[str, str]) -> Response:
        at = parse_time(form.get("time"), "time") if form.get("time") else options.clock()
        seconds = _timeout(form)
        expr = compiled(form.get("query"), prefix=True)
        return await evaluate(lambda: engine().query(expr, at, tick=_deadline(options.monotonic, seconds)))

    async def query_range(form: Form, path: dict[str, str]) -> Response:
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
        seconds = _timeout(form)
        expr = compiled(form.get("query"), prefix=False)
        kind = compile_plan(expr).kind
        if kind not in ("vector", "scalar"):
            name = "range vector" if kind == "matrix" else kind
            message = f'invalid expression type "{name}" for range query, must be Scalar or instant Vector'
            raise ApiError("bad_data", message)
        return await evaluate(
            lambda: engine().query_range(expr, start, end, step, tick=_deadline(options.monotonic, seconds))
        )

    async def matching(form: Form, limit: int | None) -> list[Labels]:
        """The label sets of the stored series that a match[] selector picks (every series if there is none
        and no `limit`), with a sample between `start` and `end`; ApiError past `limit` series."""
        texts = form.all("match[]")
        selectors = _selectors(texts) if texts or limit is not None else [Selector(None, ())]
        start = parse_time(form.get("start"), "start") if form.get("start") else None
        end = parse_time(form.get("end"), "end") if form.get("end") else None
        lo = -(2**62) if start is None else round(start * 1000)
        hi = 2**62 if end is None else round(end * 1000)

        def find() -> list[Labels]:
            found: set[Labels] = set()
            for sel in selectors:
                for s in options.store().select(sel.name, sel.predicate()):
                    if s.ts and s.ts[0] <= hi and s.ts[-1] >= lo:
                        found.add(s.labels)
                        if limit is not None and len(found) > limit:
                            raise ApiError("execution", f"more than {limit} series match")
            return sorted(found)

        return await gate.run(find)

    async def series(form: Form, path: dict[str, str]) -> Response:
        red = options.redactor()
        found = await matching(form, MAX_SERIES)
        return JSONAnswer({"status": "success", "data": [red.value(dict(ls)) for ls in found]})

    async def label_names(form: Form, path: dict[str, str]) -> Response:
        names = sorted({k for ls in await matching(form, None) for k, _ in ls})
        return JSONAnswer({"status": "success", "data": names})

    async def label_values(form: Form, path: dict[str, str]) -> Response:
        name = path["name"]
        if not _label_name(name):
            raise ApiError("bad_data", f"invalid label name: {name[:64]!r}")
        values = sorted({v for ls in await matching(form, None) for k, v in ls if k == name})
        return JSONAnswer({"status": "success", "data": options.redactor().value(values)})

    def api(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(await Form.read(request, MAX_PARAM), dict(request.path_params))
            except ApiError as err:
                return api_error(err)

        return endpoint

    async def buildinfo(request: Request) -> Response:
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
        return PlainTextResponse("vllm-watchdog is Healthy.\n")

    async def ready(request: Request) -> Response:
        if options.ready():
            return PlainTextResponse("vllm-watchdog is Ready.\n")
        return PlainTextResponse("Service Unavailable", status_code=503)

    both = ["GET", "POST"]
    return [
        Route("/api/v1/query", api(query), methods=both),
        Route("/api/v1/query_range", api(query_range), methods=both),
        Route("/api/v1/series", api(series), methods=both),
        Route("/api/v1/labels", api(label_names), methods=both),
        Route("/api/v1/label/{name}/values", api(label_values)),
        Route("/api/v1/status/buildinfo", buildinfo),
        Route("/-/healthy", healthy),
        Route("/-/ready", ready),
    ]
