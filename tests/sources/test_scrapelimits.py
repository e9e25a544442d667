"""A hostile target against Prometheus' scrape limits (label_limit, label_name_length_limit,
label_value_length_limit) and the watchdog's series_limit: the scrape fails with `up` 0 and the limit's error,
nothing of it is stored, and a target churning series cannot grow the store without bound."""

from __future__ import annotations

import itertools
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.support.clock import T0
from tests.support.faultserver import FaultServer
from vllm_watchdog.api.targets import targets_json
from vllm_watchdog.config.limits import ScrapeLimits
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.sources.metrics import MonitorCollector
from vllm_watchdog.sources.monitor import Monitor, MonitorOptions
from vllm_watchdog.sources.scrape import ScrapeTarget
from vllm_watchdog.sources.serieslimits import label_bytes
from vllm_watchdog.store import SampleStore

pytestmark = pytest.mark.anyio
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def target(store: SampleStore, url: str = "http://127.0.0.1:1", **kw: object) -> ScrapeTarget:
    args: dict[str, object] = dict(
        url=url + "/metrics", job="vllm", instance="vllm-0", store=store, timeout=5.0
    ) | asdict(ScrapeLimits())
    args.update(kw)
    return ScrapeTarget(**args)  # type: ignore[arg-type]


def stored(store: SampleStore, *names: str) -> int:
    return sum(1 for name in names for _ in store.select(name))


MB = 1 << 20
HOSTILE = [
    (
        'x{junk="' + "v" * MB + '"} 1\n',
        "label_value_length_limit exceeded (metric: x, label name: junk, value: "
        f'"{"v" * 50}", length: {MB}, limit: 1024)',
    ),
    (
        "x{" + ",".join(f'l{i}="v"' for i in range(70)) + "} 1\n",
        "label_limit exceeded (metric: x, number of labels: 73, limit: 64)",  # with __name__, job, instance
    ),
    (
        "x{" + "n" * 200 + '="v"} 1\n',
        f"label_name_length_limit exceeded (metric: x, label name: {'n' * 50}, length: 200, limit: 128)",
    ),
]


@pytest.mark.parametrize(("body", "error"), HOSTILE, ids=["1MB-value", "70-labels", "200B-name"])
async def test_a_series_over_a_label_limit_fails_the_scrape_and_stores_nothing(
    fault: FaultServer, body: str, error: str
) -> None:
    store = SampleStore(600)
    t = target(store, fault.url)
    fault.set("/metrics", "y 1\n")
    assert (await t.scrape(T0)).up
    fault.set("/metrics", "y 2\nz 1\n" + body + "w 1\n")
    status = await t.scrape(T0 + 1)
    assert not status.up and status.last_error == error
    assert status.error_kind == "label_limits" and status.errors_by_kind == {"label_limits": 1}
    assert stored(store, "x", "z", "w") == 0  # nothing of the body, not even what came before the series
    (y,) = store.select("y")
    assert list(y.vals)[:1] == [1.0] and len(y) == 2  # 1, then the stale marker of the failed scrape
    (up,) = store.select("up")
    assert list(up.vals) == [1.0, 0.0]


def test_the_label_limits_count_bytes_and_the_targets_labels_as_prometheus_does() -> None:
    store = SampleStore(600)
    t = target(store, label_limit=5, label_value_length_limit=10, extra_labels={"target": "a"})
    # __name__, a, instance, job, target: 5 labels; a sixth is one too many.
    assert t.complete(T0, 'x{a="1"} 1\n', None, lambda: 0.0).up
    status = t.complete(T0 + 1, 'x{a="1",b="2"} 1\n', None, lambda: 0.0)
    assert status.last_error == "label_limit exceeded (metric: x, number of labels: 6, limit: 5)"
    # Six characters, twelve bytes: Go's len(). The value is shown as Go's %.50q.
    status = t.complete(T0 + 2, 'x{a="éééééé"} 1\n', None, lambda: 0.0)
    assert status.last_error == (
        'label_value_length_limit exceeded (metric: x, label name: a, value: "éééééé", length: 12, limit: 10)'
    )
    # The metric name is the value of __name__, and the check sees it too.
    status = t.complete(T0 + 3, "a_very_long_name 1\n", None, lambda: 0.0)
    assert status.last_error is not None and "label name: __name__" in status.last_error
    # A limit of 0 is none, as in Prometheus.
    free = target(SampleStore(600), label_limit=0, label_value_length_limit=0, label_name_length_limit=0)
    assert free.complete(T0, 'x{a="' + "v" * 5000 + '",' + "n" * 300 + '="1"} 1\n', None, lambda: 0.0).up


def test_families_no_rule_reads_are_checked_too() -> None:
    # The store keeps only what the rules read, but `up` is what a Prometheus with the same limits says.
    store = SampleStore(600)
    t = target(store, keep_name=lambda name: name == "kept")
    status = t.complete(T0, 'kept 1\nunread{a="' + "v" * 2000 + '"} 1\n', None, lambda: 0.0)
    assert not status.up and status.error_kind == "label_limits" and stored(store, "kept") == 0


async def test_a_target_churning_fresh_series_cannot_grow_the_store_past_series_limit(
    fault: FaultServer,
) -> None:
    # 15 new series a second, small values: before, every one stayed for the retention (the longest range a
    # rule reads), 54,000 of them an hour from one target.
    fresh = itertools.count()
    fault.set("/metrics", render=lambda: "".join(f'x{{n="{next(fresh)}"}} 1\n' for _ in range(15)).encode())
    store = SampleStore(3600)
    t = target(store, fault.url, series_limit=60)
    ups = []
    for i in range(20):
        ups.append((await t.scrape(T0 + i)).up)  # the status is the target's own, updated in place
        store.gc(T0 + i)
        assert stored(store, "x") <= 60 and t.status.series_held <= 60
    assert ups == [True] * 4 + [False] * 16
    assert t.status.last_error == "series_limit exceeded (metric: x, series held: 60, limit: 60)"
    assert t.status.errors_by_kind == {"series_limit": 16}
    # Once the store drops the old series (their retention over), the target gets room again.
    store.gc(T0 + 3600 + 10)
    assert stored(store, "x") == 0
    status = await t.scrape(T0 + 3600 + 11)
    assert status.up and stored(store, "x") == 15 and status.series_held == 15


def test_the_label_text_a_target_keeps_is_bounded_too() -> None:
    # Within the label limits, 64 labels of 1 kB make a 64 kB series: series_limit of them would be gigabytes.
    # The store holds at most 4 bodies' worth (body_size_limit) of a target's label text.
    store = SampleStore(3600)
    t = target(store, body_size_limit=16_384, series_limit=1000)
    held = []
    for i in range(20):
        body = "".join(f'x{{a="{i}-{j}-' + "v" * 1000 + '"} 1\n' for j in range(10))
        status = t.complete(T0 + i, body, None, lambda: 0.0)
        held.append(sum(label_bytes(s.labels) for s in store.select("x")))
    assert max(held) <= 4 * 16_384 < held[0] * 7
    assert not status.up and status.error_kind == "series_limit"
    assert "label text held:" in (status.last_error or "")


def test_the_series_cache_holds_at_most_a_body_of_keys() -> None:
    # Fresh series of families no rule reads are never stored, but their text was cached, up to 4 x sample_limit
    # keys of any length.
    t = target(SampleStore(600), body_size_limit=65_536, sample_limit=1000, keep_name=lambda name: False)
    for i in range(60):
        body = "".join(f'x{{a="{i}-{j}-' + "v" * 1000 + '"} 1\n' for j in range(20))
        assert t.complete(T0 + i, body, None, lambda: 0.0).up
        assert sum(len(key) for key in t._cache) <= 2 * 65_536


@pytest.mark.parametrize("fixture", ["vllm-0.32.0-metrics.txt", "vllm-0.32.0-specdecode-metrics.txt"])
def test_a_real_vllm_passes_the_default_limits(fixture: str) -> None:
    body = (FIXTURES / fixture).read_text()
    store = SampleStore(600)
    t = target(store, instance="127.0.0.1:8000", extra_labels={"target": "vllm-0", "zone": "eu-west-1a"})
    for i in range(3):
        status = t.complete(T0 + i, body, None, lambda: 0.0)
        assert status.up and status.last_error is None and status.samples in (430, 444)
    assert status.series_held == status.samples  # every family kept, as keep_unreferenced does


async def test_a_target_sets_its_own_limits_and_the_api_and_metrics_show_the_failure(
    fault: FaultServer,
) -> None:
    fault.set("/metrics", 'x{model_name="a-long-model-name"} 1\n')
    cfg = parse_config(
        "global: {scrape_interval: 30s, scrape_timeout: 30s, keep_unreferenced: true}\n"
        "targets:\n"
        f"  - {{name: strict, url: '{fault.url}', canary: false, label_value_length_limit: 16}}\n"
        f"  - {{name: lax, url: '{fault.url}/', canary: false, job: other}}\n",
        "c.yml",
        env={},
    )
    mon = Monitor(cfg, MonitorOptions(client_factory=httpx.AsyncClient))
    await mon.scrape("strict", T0)
    await mon.scrape("lax", T0)
    error = (
        "label_value_length_limit exceeded (metric: x, label name: model_name, "
        'value: "a-long-model-name", length: 17, limit: 16)'
    )
    got = {t["labels"]["target"]: t for t in targets_json(mon)["activeTargets"]}
    assert got["strict"]["health"] == "down" and got["strict"]["lastError"] == error
    assert got["lax"]["health"] == "up"
    registry = CollectorRegistry()
    registry.register(MonitorCollector(mon))
    text = generate_latest(registry).decode()
    address = fault.url.removeprefix("http://")
    for kind, n in (("label_limits", 1), ("series_limit", 0)):
        errors = f'instance="{address}",job="vllm",kind="{kind}",target="strict"'
        assert f"vllm_watchdog_scrape_errors_total{{{errors}}} {n}.0" in text
    assert f'vllm_watchdog_target_up{{instance="{address}",job="vllm",target="strict"}} 0.0' in text
    assert f'vllm_watchdog_scrape_series{{instance="{address}",job="other",target="lax"}} 1.0' in text
    await mon.aclose()
