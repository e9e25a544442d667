"""The watchdog's own metrics in its own store: in-process rules read them as a Prometheus would."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tests.service.test_daemon import PAYLOAD, daemon_config, wait_for
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from vllm_watchdog.service.daemon import Daemon, DaemonOptions
from vllm_watchdog.sources.selffeed import OwnCollector, SelfFeed, Want
from vllm_watchdog.store import SampleStore, labels_dict


class Families(Collector):
    """Whatever families the test sets."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def own_families(notifiers: list[str]) -> list[Metric]:
    scrapes = CounterMetricFamily("vllm_watchdog_scrapes", "s", labels=["job", "instance"])
    scrapes.add_metric(["vllm", "vllm-0"], 7)
    health = GaugeMetricFamily("vllm_watchdog_health_up", "h", labels=["job", "instance"])
    health.add_metric(["vllm", "vllm-0"], 1)
    queued = GaugeMetricFamily("vllm_watchdog_notifications_queued", "q", labels=["notifier"])
    for name in notifiers:
        queued.add_metric([name], 2)
    other = GaugeMetricFamily("process_open_fds", "not ours")
    other.add_metric([], 9)
    return [scrapes, health, queued, other]


def stored(store: SampleStore, name: str) -> dict[tuple[tuple[str, str], ...], list[float]]:
    return {
        tuple(sorted(labels_dict(s.labels).items())): list(s.vals) for s in store.select(name) if s.registered
    }


def test_own_samples_get_the_watchdog_job_unless_they_name_their_own() -> None:
    store, families = SampleStore(retention=600), Families()
    families.families = own_families(["am-0"])
    feed = SelfFeed(store, [families], "127.0.0.1:9460", lambda: None)
    assert feed.commit(1_000) == 2
    assert stored(store, "vllm_watchdog_scrapes_total") == {
        (("__name__", "vllm_watchdog_scrapes_total"), ("instance", "vllm-0"), ("job", "vllm")): [7.0]
    }
    assert stored(store, "vllm_watchdog_notifications_queued") == {
        (
            ("__name__", "vllm_watchdog_notifications_queued"),
            ("instance", "127.0.0.1:9460"),
            ("job", "vllm-watchdog"),
            ("notifier", "am-0"),
        ): [2.0]
    }
    # the probe series are the monitor's; other families are not the watchdog's
    assert stored(store, "vllm_watchdog_health_up") == {} and stored(store, "process_open_fds") == {}


def test_only_what_rules_read_is_written_and_vanished_series_go_stale() -> None:
    store, families = SampleStore(retention=600), Families()
    families.families = own_families(["am-0", "hook-1"])
    wanted: frozenset[str] | None = frozenset({"vllm_watchdog_notifications_queued", "up"})
    feed = SelfFeed(store, [families], "h:1", lambda: wanted)
    assert feed.commit(1_000) == 2
    assert stored(store, "vllm_watchdog_scrapes_total") == {}
    families.families = own_families(["am-0"])  # hook-1 was removed by a reload
    assert feed.commit(2_000) == 1
    rows = stored(store, "vllm_watchdog_notifications_queued")
    hook = next(v for k, v in rows.items() if ("notifier", "hook-1") in k)
    assert hook[0] == 2.0 and hook[1] != hook[1]  # a stale marker (NaN) at 2 s
    wanted = frozenset({"up", "vllm:num_requests_waiting"})
    families.families = []  # nothing would be read: not even collected
    assert feed.commit(3_000) == 0


class Asked(OwnCollector):
    """Builds only the families it is asked for, and notes which those were."""

    def __init__(self) -> None:
        self.built: list[str] = []

    def collect(self, want: Want = lambda name: True) -> Iterator[Metric]:
        for family in own_families(["am-0"]):
            if want(family.name):
                self.built.append(family.name)
                yield family


def test_own_collectors_are_asked_only_for_the_families_rules_read() -> None:
    store, asked = SampleStore(retention=600), Asked()
    wanted = frozenset({"vllm_watchdog_scrapes_total", "up"})  # a counter's samples end in _total
    feed = SelfFeed(store, [asked], "h:1", lambda: wanted)
    assert feed.commit(1_000) == 1
    assert asked.built == ["vllm_watchdog_scrapes"]
    assert list(stored(store, "vllm_watchdog_scrapes_total").values()) == [[7.0]]


pytestmark = pytest.mark.anyio

RULES = """
groups:
  - name: self
    rules:
      - alert: ReloadedFine
        expr: vllm_watchdog_config_last_reload_successful == 1
      - alert: ScrapedVllm
        expr: vllm_watchdog_scrapes_total{job="vllm"} > 2
"""


async def test_in_process_rules_see_the_watchdogs_own_metrics(tmp_path: Path, fault: FaultServer) -> None:
    fault.vllm_like(PAYLOAD)
    (tmp_path / "self.rules.yml").write_text(RULES)
    port = free_port()
    cfg = daemon_config(tmp_path, fault.url, port, "rule_files: [self.rules.yml]\n")
    d = Daemon.load(DaemonOptions(str(cfg), env={}))
    ready = asyncio.Event()
    task = asyncio.create_task(d.run(ready))
    await asyncio.wait_for(ready.wait(), 20)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as client:
            alerts = await wait_for(
                client,
                base + "/api/v1/alerts",
                lambda j: (
                    {a["labels"]["alertname"] for a in j["data"]["alerts"]} == {"ReloadedFine", "ScrapedVllm"}
                ),
            )
            by_name = {a["labels"]["alertname"]: a["labels"] for a in alerts["data"]["alerts"]}  # type: ignore[index]
            assert by_name["ReloadedFine"]["job"] == "vllm-watchdog"
            assert by_name["ReloadedFine"]["instance"] == f"127.0.0.1:{port}"
            scraped = by_name["ScrapedVllm"]
            hostport = fault.url.removeprefix("http://")  # Prometheus' instance of the scrape, and the name
            assert (scraped["job"], scraped["instance"], scraped["target"]) == ("vllm", hostport, "vllm-0")
            # only the families the rules read are built and stored
            want = {"vllm_watchdog_config_last_reload_successful", "vllm_watchdog_scrapes"}.__contains__
            built = {family.name for c in d.self_feed.collectors for family in c.collect(want)}
            assert built == {"vllm_watchdog_config_last_reload_successful", "vllm_watchdog_scrapes"}
            series = await client.get(
                base + "/api/v1/samples", params={"match": "vllm_watchdog_store_series"}
            )
            assert series.json()["data"] == []
    finally:
        d.stop()
        await asyncio.wait_for(task, 10)
