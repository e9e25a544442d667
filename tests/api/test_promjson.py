"""Prometheus' conventions without a server: number and time formatting, parameters, deadlines and limits.

The expected strings are what Prometheus 2.42 writes (Go's strconv.AppendFloat with 'f' or, below 1e-6 and from
1e21, 'e'; timestamps in seconds with at most 3 decimals); tests/api/test_prometheus.py checks the same against
a real Prometheus for the values its dashboards produce.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from vllm_watchdog.api.prometheus import MAX_PARAM, QueryOptions, query_routes
from vllm_watchdog.api.promjson import ApiError, format_time, format_value, parse_seconds, parse_time
from vllm_watchdog.api.queryrunner import QueryRunner
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.redact import Redactor
from vllm_watchdog.store import SampleStore, make_labels

T0 = 1_700_000_000.0


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (0.1, "0.1"),
        (-0.0, "-0"),
        (0.0, "0"),
        (2.5e-6, "0.0000025"),
        (1e-6, "0.000001"),
        (9.99e-7, "9.99e-07"),
        (1e-7, "1e-07"),
        (-1.5e-300, "-1.5e-300"),
        (1e20, "100000000000000000000"),
        (123456789012345680000.0, "123456789012345680000"),
        (1e21, "1e+21"),
        (2.5e22, "2.5e+22"),
        (1 / 3, "0.3333333333333333"),
        (1e16, "10000000000000000"),
        (math.nan, "NaN"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
    ],
)
def test_values_are_written_as_prometheus_writes_them(value: float, text: str) -> None:
    assert format_value(value) == text


def test_timestamps_are_seconds_with_at_most_three_decimals() -> None:
    assert [format_time(ms) for ms in (1000, 1500, 1001, 0, -1500)] == [1, 1.5, 1.001, 0, -1.5]
    assert isinstance(format_time(1_700_000_000_000), int)


def test_times_and_durations_parse_as_prometheus_parses_them() -> None:
    assert parse_time("1435781451.781", "time") == 1435781451.781
    assert parse_time("2015-07-01T20:10:51.781Z", "time") == 1435781451.781
    assert parse_time("2015-07-01T22:10:51.781+02:00", "time") == 1435781451.781
    assert parse_time("1.2344", "time") == 1.234
    assert parse_seconds("5m", "step") == 300 and parse_seconds("1h30m", "step") == 5400
    assert parse_seconds("0.5", "step") == 0.5
    for bad in ("", "yesterday", "2015-07-01", "2015-07-01T20:10:51", "nan", "inf", "1e300"):
        with pytest.raises(ApiError) as err:
            parse_time(bad, "start")
        assert err.value.kind == "bad_data" and err.value.message.startswith('invalid parameter "start": ')
    for bad in ("", "5 minutes", "1.5m", "nan", "1e300"):
        with pytest.raises(ApiError):
            parse_seconds(bad, "step")


class Ticks:
    """A monotonic clock that moves `per_read` seconds each time it is read (a query that takes time)."""

    def __init__(self, per_read: float) -> None:
        self.now, self.per_read = 0.0, per_read

    def __call__(self) -> float:
        self.now += self.per_read
        return self.now


def _client(monotonic: Ticks, ready: bool = True, pauses: list[float] | None = None) -> httpx.AsyncClient:
    store = SampleStore(retention=3600)
    for i in range(600):
        store.append(make_labels("q", {"job": "vllm"}), round((T0 + i) * 1000), float(i))
    config = parse_config("targets: []\n", "test.yml")
    waits = [] if pauses is None else pauses

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    runner = QueryRunner(monotonic, sleep)
    options = QueryOptions(
        lambda: config, lambda: store, Redactor, lambda: T0 + 600, monotonic, lambda: ready, runner
    )
    app = Starlette(routes=query_routes(options))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")


async def _range(client: httpx.AsyncClient, **params: Any) -> httpx.Response:
    return await client.get("/api/v1/query_range", params=params)


@pytest.mark.anyio
async def test_a_query_past_its_deadline_is_abandoned_with_prometheus_timeout() -> None:
    pauses: list[float] = []
    slow = _client(
        Ticks(0.5), pauses=pauses
    )  # each step reads the clock once: 2 s (the most allowed) is 4 steps
    r = await _range(slow, query="q", start=T0, end=T0 + 100, step=1)
    assert r.status_code == 503, r.text
    assert pauses == []
    body = {"status": "error", "errorType": "timeout", "error": "query timed out in expression evaluation"}
    assert r.json() == body
    # A longer timeout than 2 s is not granted.
    assert (await _range(slow, query="q", start=T0, end=T0 + 100, step=1, timeout="100s")).status_code == 503
    # It waited what was left of four times as long as the fork before it held the loop (0.5 s: this clock
    # moves at each read): forking takes at most about a fifth of the event loop.
    assert len(pauses) == 1 and 0 < pauses[0] <= 2.0, pauses
    assert (await _range(slow, query="q", start=T0, end=T0 + 1, step=1)).status_code == 200
    sub = await slow.get("/api/v1/query", params={"query": "max_over_time(q[500s:1s])", "time": T0 + 599})
    assert sub.status_code == 503  # a subquery's steps are counted too
    fast = _client(Ticks(0.001))
    r = await _range(fast, query="q", start=T0, end=T0 + 100, step=1)
    assert r.status_code == 200 and len(r.json()["data"]["result"][0]["values"]) == 101
    assert (await _range(fast, query="q", start=T0, end=T0 + 100, step=1, timeout="0.01")).status_code == 503


@pytest.mark.anyio
async def test_inputs_are_bounded() -> None:
    client = _client(Ticks(0.0))
    long = "q" + " + q" * (MAX_PARAM // 4)
    r = await client.get("/api/v1/query", params={"query": long})
    assert r.status_code == 400
    assert r.json()["error"] == f'invalid parameter "query": longer than {MAX_PARAM} characters'
    r = await client.get("/api/v1/query", params=[("x", "1")] * 300)
    assert r.status_code == 400 and "more than 256 fields" in r.json()["error"]
    assert (await _range(client, query="q", start=0, end=11000, step=1)).status_code == 200  # 11,000: allowed
    r = await _range(client, query="q", start=0, end=11001, step=1)
    assert r.status_code == 400 and r.json()["error"].startswith(
        "exceeded maximum resolution of 11,000 points"
    )


@pytest.mark.anyio
async def test_ready_follows_the_daemon_and_healthy_is_always_200() -> None:
    starting = _client(Ticks(0.001), ready=False)
    assert (await starting.get("/-/ready")).status_code == 503
    assert (await starting.get("/-/healthy")).status_code == 200
    assert (await _client(Ticks(0.001)).get("/-/ready")).text == "vllm-watchdog is Ready.\n"
