"""The monitor's warnings: once when a scrape or probe starts failing or changes, then a summary every few
minutes, never once per scrape; and the samples it drops for their timestamp are exported."""

from __future__ import annotations

import logging

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.support.clock import T0, Clock
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.ruler.files import parse_rule_file, store_needs
from vllm_watchdog.sources.metrics import MonitorCollector
from vllm_watchdog.sources.monitor import GC_SLACK, SUMMARY_EVERY, Monitor, MonitorOptions

pytestmark = pytest.mark.anyio


def monitor(url: str, clock: Clock) -> Monitor:
    # Bounds far above any loopback answer: on a loaded machine a 1 s scrape timeout turned one 503 into a
    # timeout, a failure of another kind, and the test saw a "changed" line it did not ask for.
    cfg = parse_config(
        "global: {scrape_interval: 30s, scrape_timeout: 30s}\n"
        f"targets: [{{name: t, url: '{url}', canary: false, health_timeout: 30s}}]\n",
        "c.yml",
        env={},
    )
    return Monitor(cfg, MonitorOptions(client_factory=httpx.AsyncClient, monotonic=clock))


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, object]]:
    return [
        (r.getMessage(), getattr(r, "repeated", None))
        for r in caplog.records
        if r.name == "vllm_watchdog.sources.monitor"
    ]


async def test_a_target_down_for_15_minutes_logs_one_warning_and_summaries(
    fault: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    """One down target logged 113 warnings in 52 s: one per scrape and one per probe."""
    caplog.set_level(logging.INFO, logger="vllm_watchdog.sources.monitor")
    fault.set("/metrics", "gone", status=503)
    fault.set("/health", "gone", status=503)
    clock = Clock()
    mon = monitor(fault.url, clock)
    scrapes = int(3 * SUMMARY_EVERY) + 1  # 1 s scrapes and probes for 15 minutes, on the injected clock
    for i in range(scrapes):
        await mon.scrape("t", T0 + i)
        await mon.probe_health("t", T0 + i)
        clock.advance(1.0)
    got = lines(caplog)
    summary = "1 of 1 targets down: t (scrape: server returned HTTP status 503, {})"
    assert got == [
        ("scrape failed", None),
        ("probe failed", None),
        *((summary.format(f"{m}m00s"), None) for m in (5, 10, 15)),  # one line for both, not one each
    ], got
    caplog.clear()
    fault.set("/metrics", "a 1\n")
    fault.set("/health", "")
    await mon.scrape("t", T0 + scrapes)
    await mon.probe_health("t", T0 + scrapes)
    await mon.scrape("t", T0 + scrapes + 1)
    assert lines(caplog) == [("scrape recovered", None), ("probe recovered", None)]
    assert [r.__dict__["failing_for"] for r in caplog.records] == ["15m01s", "15m01s"]
    await mon.aclose()


async def test_a_new_kind_of_failure_is_logged_at_once(
    fault: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vllm_watchdog.sources.monitor")
    clock = Clock()
    mon = monitor(fault.url, clock)
    fault.set("/metrics", "gone", status=503)
    for i in range(3):
        await mon.scrape("t", T0 + i)
    fault.set("/metrics", "this is { not valid\n")
    for i in range(3, 6):
        await mon.scrape("t", T0 + i)
    got = [(r.getMessage(), r.__dict__.get("kind")) for r in caplog.records]
    assert got == [("scrape failed", "status"), ("scrape failed (changed)", "parse")]
    assert caplog.records[1].__dict__["was"] == "server returned HTTP status 503"
    await mon.aclose()


async def test_60_refused_scrapes_log_one_warning_plus_the_summaries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="vllm_watchdog.sources.monitor")
    clock = Clock()
    mon = monitor(f"http://127.0.0.1:{free_port()}", clock)  # nothing listens there: connection refused
    for i in range(60):
        await mon.scrape("t", T0 + 10 * i)
        clock.advance(10.0)  # 60 scrapes over 10 minutes
    got = [r.getMessage() for r in caplog.records]
    assert got[0] == "scrape failed" and len(got) == 2, got
    assert got[1].startswith("1 of 1 targets down: t (scrape: ConnectError: ") and got[1].endswith(", 5m00s)")
    await mon.aclose()


async def test_an_error_that_flips_between_texts_is_not_news_each_time(
    fault: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vllm_watchdog.sources.monitor")
    clock = Clock()
    mon = monitor(fault.url, clock)
    for i in range(30):
        fault.set("/health", "x", status=(500, 502, 503)[i % 3])
        await mon.probe_health("t", T0 + i)
        clock.advance(1.0)
    got = [(r.getMessage(), r.__dict__.get("error")) for r in caplog.records]
    assert got == [
        ("probe failed", "HTTP status 500"),
        ("probe failed (changed)", "HTTP status 502"),
        ("probe failed (changed)", "HTTP status 503"),
    ]
    await mon.aclose()


async def test_out_of_bounds_samples_are_warned_once_and_exported(
    fault: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vllm_watchdog.sources.monitor")
    far = int(T0 * 1000) + 86_400_000
    fault.set("/metrics", f"a 1 {far}\nb 2\n")
    clock = Clock()
    mon = monitor(fault.url, clock)
    for i in range(10):
        await mon.scrape("t", T0 + i)
        clock.advance(1.0)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [(r.getMessage(), r.__dict__.get("num_dropped")) for r in warned] == [
        ("error on ingesting samples that are too old or are too far into the future", 1)
    ]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(mon))
    text = generate_latest(registry).decode()
    labels = f'instance="{fault.url.removeprefix("http://")}",job="vllm",target="t"'  # Prometheus' instance
    assert f"vllm_watchdog_scrape_samples_out_of_bounds_total{{{labels}}} 10.0" in text
    assert f"vllm_watchdog_target_up{{{labels}}} 1.0" in text
    await mon.aclose()


def test_each_name_the_rules_read_is_kept_as_long_as_its_longest_selector() -> None:
    rules = parse_rule_file(
        """
groups:
  - name: g
    rules:
      - alert: A
        expr: rate(long_total[30m]) > 0 and short > 1 and up == 0
""",
        "r.yml",
    )
    cfg = parse_config("global: {scrape_interval: 2s, evaluation_interval: 1s}\n", "c.yml", env={})
    m = Monitor(
        cfg, MonitorOptions(client_factory=httpx.AsyncClient), store_needs(rules, cfg.global_.lookback_delta)
    )
    margin = 2 + GC_SLACK  # the longer interval and the collection's slack
    assert m.store.retention == 1800 + margin  # the longest: the [30m] range
    assert m.store.retention_by_name == {
        "long_total": 1800 + margin,
        "short": 300 + margin,
        "up": 300 + margin,
    }
    # what no rule reads (the other always-kept names, ALERTS) keeps the lookback, not the longest range
    assert m.store.other_retention == 300 + margin


def test_with_keep_unreferenced_every_family_keeps_the_longest_range() -> None:
    rules = parse_rule_file(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: rate(long_total[30m]) > 0\n",
        "r.yml",
    )
    cfg = parse_config("global: {keep_unreferenced: true}\n", "c.yml", env={})
    m = Monitor(
        cfg, MonitorOptions(client_factory=httpx.AsyncClient), store_needs(rules, cfg.global_.lookback_delta)
    )
    assert m.store.other_retention is None  # the store's retention: the [30m] range and the margin


async def test_ready_since_needs_health_and_a_canary_token_sent_after_the_start(fault: FaultServer) -> None:
    """What ends a restart's start-up grace: both probes succeeded at or after the server's start."""
    fault.set("/health", "")
    fault.set("/v1/models", {"data": [{"id": "m"}]})
    fault.set("/v1/completions", {"usage": {"completion_tokens": 0}})
    cfg = parse_config(f"targets: [{{name: t, url: '{fault.url}'}}]\n", "c.yml", env={})
    mon = Monitor(cfg, MonitorOptions(client_factory=httpx.AsyncClient, monotonic=Clock()))
    started = T0 + 100
    await mon.probe_health("t", T0 + 50)
    await mon.probe_canary("t", T0 + 50)
    assert not mon.ready_since("t", started)  # nothing since the start
    await mon.probe_health("t", T0 + 110)
    await mon.probe_canary("t", T0 + 110)  # answered, but generated no token
    assert not mon.ready_since("t", started)
    fault.set("/v1/completions", {"usage": {"completion_tokens": 1}})
    await mon.probe_canary("t", T0 + 115)
    assert mon.ready_since("t", started)
    assert not mon.ready_since("t", T0 + 112)  # a later restart: /health has not answered since
    assert not mon.ready_since("other", 0.0)
    await mon.aclose()


async def test_without_a_canary_no_server_is_known_ready(fault: FaultServer) -> None:
    """Nothing proves the engine generates: the fixed start-up grace stays."""
    fault.set("/health", "")
    mon = monitor(fault.url, Clock())  # canary: false
    await mon.probe_health("t", T0 + 10)
    assert not mon.ready_since("t", T0)
    await mon.aclose()
