from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.support.faultserver import FaultServer
from tests.support.prometheus_server import PrometheusServer, running_prometheus, scrape_config
from tests.support.vllm_server import VllmServer, free_port
from vllm_watchdog.promql.remote import PrometheusBackend, redact_url
from vllm_watchdog.promql.values import QueryError, Sample

T = 1_700_000_000.5


def ok(result_type: str, result: Any) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": result_type, "result": result}}


def test_vector_with_special_floats_and_sorted_labels(fault: FaultServer) -> None:
    fault.set(
        "/api/v1/query",
        ok(
            "vector",
            [
                {"metric": {"job": "vllm", "__name__": "up", "instance": "a"}, "value": [T, "1"]},
                {"metric": {"__name__": "x", "k": "nan"}, "value": [T, "NaN"]},
                {"metric": {"k": "inf"}, "value": [T, "+Inf"]},
                {"metric": {"k": "-inf"}, "value": [T, "-Inf"]},
            ],
        ),
    )
    got = PrometheusBackend(fault.url).query("up", T)
    assert got[0] == Sample((("__name__", "up"), ("instance", "a"), ("job", "vllm")), 1.0, 1_700_000_000_500)
    assert got[1].labels == (("__name__", "x"), ("k", "nan")) and math.isnan(got[1].value)
    assert [s.value for s in got[2:]] == [math.inf, -math.inf]


def test_scalar_is_one_sample_without_labels(fault: FaultServer) -> None:
    fault.set("/api/v1/query", ok("scalar", [T, "42.5"]))
    assert PrometheusBackend(fault.url).query("42.5", T) == [Sample((), 42.5, 1_700_000_000_500)]


@pytest.mark.parametrize(
    ("reply", "kw", "expected"),
    [
        (
            {"status": "error", "errorType": "bad_data", "error": 'parse error: unexpected "}"'},
            {"status": 400},
            'HTTP 400: bad_data: parse error: unexpected "}"',
        ),
        ({"status": "error", "errorType": "execution", "error": "boom"}, {}, "HTTP 200: execution: boom"),
        (b"<html>bad gateway</html>", {"status": 502}, "HTTP 502: <html>bad gateway</html>"),
        (b"{not json", {}, "response is not a JSON object"),
        (ok("matrix", []), {}, "returns a matrix; rules need an instant vector"),
        (ok("vector", [{"metric": {}, "value": [T, "x"]}]), {}, "malformed query result"),
        ({"status": "success"}, {}, "response has no data"),
    ],
)
def test_errors_name_the_backend(fault: FaultServer, reply: Any, kw: dict[str, Any], expected: str) -> None:
    fault.set("/api/v1/query", reply, **kw)
    with pytest.raises(QueryError) as info:
        PrometheusBackend(fault.url).query("up", T)
    assert str(info.value).startswith(fault.url + ": ")
    assert expected in str(info.value)


def test_connection_refused_and_timeout_are_bounded(fault: FaultServer) -> None:
    dead = f"http://user:secret@127.0.0.1:{free_port()}/prefix"
    with pytest.raises(QueryError) as info:
        PrometheusBackend(dead, headers={"Authorization": "Bearer secret"}).query("up", T)
    message = str(info.value)
    assert "Connection refused" in message and "secret" not in message
    assert message.startswith(f"http://127.0.0.1:{dead.rsplit(':', 1)[1]}: ")
    fault.set("/api/v1/query", ok("vector", []), delay=2.0)
    start = time.monotonic()
    with pytest.raises(QueryError, match=r"timed out after 0\.3s"):
        PrometheusBackend(fault.url, timeout=0.3).query("up", T)
    assert time.monotonic() - start < 1.5  # at most one retry of a dropped connection, never of a timeout


class _Capture(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, list[str]], dict[str, str]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        self.seen.append((parts.path, parse_qs(parts.query), dict(self.headers)))
        body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def capture() -> Iterator[str]:
    _Capture.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_mimir_prefix_headers_time_and_no_proxy(capture: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:1")  # would break the query if honoured
    monkeypatch.setenv("NO_PROXY", "")
    backend = PrometheusBackend(capture + "/prometheus/", headers={"X-Scope-OrgID": "tenant-1"}, timeout=5)
    assert backend.query('sum(rate(x[5m])) by (le) > 0 or vector(1) * {a="b c"}', T) == []
    ((path, params, headers),) = _Capture.seen
    assert path == "/prometheus/api/v1/query"
    assert params == {
        "query": ['sum(rate(x[5m])) by (le) > 0 or vector(1) * {a="b c"}'],
        "time": ["1700000000.500"],
        "timeout": ["5"],
    }
    assert headers["X-Scope-OrgID"] == "tenant-1"


def test_redact_url() -> None:
    assert redact_url("https://u:p@[::1]:9090/prom?x=1#f") == "https://[::1]:9090/prom"
    assert redact_url("http://mimir/prometheus") == "http://mimir/prometheus"


# -- a real Prometheus ----------------------------------------------------------------------------
def same(ours: list[Sample], api: dict[str, Any]) -> None:
    """Our samples equal what Prometheus' own API answered (values compared as text: NaN == NaN)."""
    rows = api["result"] if api["resultType"] == "vector" else [{"metric": {}, "value": api["result"]}]
    theirs = sorted(
        (tuple(sorted(r["metric"].items())), repr(float(r["value"][1])), round(r["value"][0] * 1000))
        for r in rows
    )
    assert sorted((s.labels, repr(s.value), s.t_ms) for s in ours) == theirs


def test_real_prometheus_scraping_the_fixture(tmp_path: Path, fault: FaultServer, vllm_payload: str) -> None:
    fault.set("/metrics", vllm_payload)
    config = scrape_config({"vllm": [f"127.0.0.1:{fault.port}"]})
    with running_prometheus(config, tmp_path / "prom") as prom:
        prom.wait_for('vllm:num_requests_running{job="vllm"}', timeout=20)
        backend = PrometheusBackend(prom.url, timeout=5)
        at = time.time() - 0.5
        for expr in (
            "vllm:num_requests_running",
            "histogram_quantile(0.9, sum by (le) (vllm:time_to_first_token_seconds_bucket))",
            "count(up)",
            "scalar(count(up))",
        ):
            ours = backend.query(expr, at)
            same(ours, prom.api_query(expr, at))
        assert backend.query("scalar(count(up))", at)[0].labels == ()
        with pytest.raises(QueryError, match="bad_data"):
            backend.query("sum(", at)
        with pytest.raises(QueryError, match="returns a matrix"):
            backend.query("up[1m]", at)


@pytest.mark.vllm
def test_real_prometheus_scraping_real_vllm(tmp_path: Path, vllm_server: VllmServer) -> None:
    target = vllm_server.url.removeprefix("http://")
    with running_prometheus(scrape_config({"vllm": [target]}), tmp_path / "prom") as prom:
        prom.wait_for("vllm:num_requests_running", timeout=30)
        model = httpx.get(vllm_server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        completion = {"model": model, "prompt": "hi", "max_tokens": 2}
        assert httpx.post(vllm_server.url + "/v1/completions", json=completion, timeout=60).status_code == 200
        time.sleep(2.5)  # two more scrapes see the finished request
        backend = PrometheusBackend(prom.url, timeout=10)
        at = time.time() - 0.5
        for expr in ("vllm:num_requests_running", "up", "sum(vllm:prompt_tokens_total)"):
            ours = backend.query(expr, at)
            assert ours, expr
            same(ours, prom.api_query(expr, at))
        running = backend.query("vllm:num_requests_running", at)[0]
        assert dict(running.labels)["job"] == "vllm" and running.value >= 0
        assert isinstance(prom, PrometheusServer)
