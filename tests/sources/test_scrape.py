from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.clock import T0
from tests.support.faultserver import FaultServer
from vllm_watchdog.errors import ScrapeError
from vllm_watchdog.sources.scrape import ScrapeTarget
from vllm_watchdog.store import SampleStore, Series, is_stale

pytestmark = pytest.mark.anyio


def target(store: SampleStore, url: str, **kw: object) -> ScrapeTarget:
    args: dict[str, object] = dict(
        url=url + "/metrics",
        job="vllm",
        instance="vllm-0",
        store=store,
        timeout=1.0,
        sample_limit=1000,
        body_size_limit=1 << 20,
    )
    args.update(kw)
    return ScrapeTarget(**args)  # type: ignore[arg-type]


def one(store: SampleStore, name: str) -> Series:
    (series,) = store.select(name)
    return series


async def test_real_payload_gets_job_instance_and_synthetic_series(
    fault: FaultServer, vllm_payload: str
) -> None:
    fault.set("/metrics", vllm_payload)
    store = SampleStore(600)
    status = await target(store, fault.url).scrape(T0)
    assert status.up and status.last_error is None and status.samples > 400
    waiting = one(store, "vllm:num_requests_waiting")
    labels = dict(waiting.labels)
    assert labels["job"] == "vllm" and labels["instance"] == "vllm-0" and "model_name" in labels
    assert one(store, "up").vals[-1] == 1.0
    assert one(store, "scrape_samples_scraped").vals[-1] == status.samples
    assert one(store, "scrape_duration_seconds").vals[-1] >= 0
    assert len(list(store.select("vllm:time_to_first_token_seconds_bucket"))) > 5


async def test_vanished_series_and_down_target_go_stale(fault: FaultServer) -> None:
    fault.set("/metrics", "a 1\nb 2\n")
    store = SampleStore(600)
    t = target(store, fault.url)
    await t.scrape(T0)
    fault.set("/metrics", "a 1\n")
    await t.scrape(T0 + 1)
    b = one(store, "b")
    assert is_stale(b.vals[-1]) and b.ts[-1] == int((T0 + 1) * 1000)
    fault.set("/metrics", "oops", status=500)
    status = await t.scrape(T0 + 2)
    assert not status.up and status.last_error == "server returned HTTP status 500"
    assert is_stale(one(store, "a").vals[-1])
    assert list(one(store, "up").vals) == [1.0, 1.0, 0.0]
    assert status.errors_by_kind == {"status": 1}


@pytest.mark.parametrize(
    ("reply", "kind", "message"),
    [
        ({"body": "a 1\n", "delay": 2.5}, "timeout", "timeout after 1s"),
        ({"body": "a 1\nthis is { not valid\n"}, "parse", "parse error"),
        ({"body": "a 1\n" * 10, "close_early": True}, "connection", "RemoteProtocolError"),
        ({"body": b"\xff\xfe garbage"}, "encoding", "not UTF-8"),
        ({"body": "x" * (2 << 20)}, "size", "body_size_limit"),
    ],
)
async def test_faults_give_up_zero_and_a_clear_error(
    fault: FaultServer, reply: dict[str, object], kind: str, message: str
) -> None:
    fault.set("/metrics", **reply)  # type: ignore[arg-type]
    store = SampleStore(600)
    status = await target(store, fault.url).scrape(T0)
    assert not status.up
    assert status.last_error is not None and message in status.last_error
    assert status.errors_by_kind == {kind: 1}
    assert one(store, "up").vals[-1] == 0.0


async def test_connection_refused(fault: FaultServer) -> None:
    url = fault.url
    fault.close()
    status = await target(SampleStore(600), url).scrape(T0)
    assert not status.up and status.errors_by_kind == {"connection": 1}


async def test_sample_limit_fails_the_whole_scrape_atomically(fault: FaultServer) -> None:
    fault.set("/metrics", "".join(f'x{{i="{i}"}} 1\n' for i in range(20)))
    store = SampleStore(600)
    status = await target(store, fault.url, sample_limit=10).scrape(T0)
    assert not status.up and "sample_limit exceeded: 20 samples > limit 10" in (status.last_error or "")
    assert list(store.select("x")) == []  # nothing half-committed


async def test_a_series_explosion_is_counted_off_the_event_loop_once(
    fault: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The count of an over-limit body is the one slow step of a scrape that never reaches the store: 0.4 s for
    # 300,000 series. It runs in a worker thread, so other targets' scrapes go on meanwhile, and only once.
    fault.set("/metrics", "".join(f'x{{i="{i}"}} 1\n' for i in range(20)))
    counted_on: list[int] = []
    original = ScrapeTarget._count_samples

    def counting(self: ScrapeTarget, text: str) -> None:
        counted_on.append(threading.get_ident())
        original(self, text)

    monkeypatch.setattr(ScrapeTarget, "_count_samples", counting)
    status = await target(SampleStore(600), fault.url, sample_limit=10).scrape(T0)
    assert not status.up and status.error_kind == "sample_limit"
    assert len(counted_on) == 1 and counted_on[0] != threading.get_ident()
    # Under the limit (but with as many lines as the limit: comments), it is counted once, off the loop, too.
    counted_on.clear()
    fault.set("/metrics", "# a comment\n" * 10 + "x 1\n")
    status = await target(SampleStore(600), fault.url, sample_limit=10).scrape(T0)
    assert (
        status.up and status.samples == 1 and len(counted_on) == 1 and counted_on[0] != threading.get_ident()
    )


async def test_a_malformed_line_in_an_exploding_body_is_a_parse_error_as_in_prometheus(
    fault: FaultServer,
) -> None:
    fault.set("/metrics", "".join(f"x_{i} 1\n" for i in range(20)) + "x_bad one\n")
    status = await target(SampleStore(600), fault.url, sample_limit=10).scrape(T0)
    assert not status.up and status.error_kind == "parse"
    assert status.last_error is not None and "parse error: line 21: invalid value" in status.last_error


async def test_slow_target_does_not_block_another(fault: FaultServer) -> None:
    fast = FaultServer()
    try:
        fault.set("/metrics", "a 1\n", delay=2.5)
        fast.set("/metrics", "a 1\n")
        store = SampleStore(600)
        slow_t = target(store, fault.url, instance="slow")
        fast_t = target(store, fast.url, instance="fast")
        slow_s, fast_s = await asyncio.gather(slow_t.scrape(T0), fast_t.scrape(T0))
        assert fast_s.up and not slow_s.up
    finally:
        fast.close()


async def test_legacy_names_are_aliased_and_current_names_win(fault: FaultServer) -> None:
    fault.set(
        "/metrics",
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        'vllm:time_per_output_token_seconds_bucket{le="0.1",model_name="m"} 3\n'
        'vllm:kv_cache_usage_perc{model_name="n"} 0.7\n',
    )
    store = SampleStore(600)
    await target(store, fault.url).scrape(T0)
    kv = {dict(s.labels)["model_name"]: s.vals[-1] for s in store.select("vllm:kv_cache_usage_perc")}
    assert kv == {"m": 0.5, "n": 0.7}
    assert list(store.select("vllm:gpu_cache_usage_perc")) == []
    assert one(store, "vllm:inter_token_latency_seconds_bucket").vals[-1] == 3.0


async def test_keep_filter_and_conflicting_target_labels(fault: FaultServer) -> None:
    fault.set("/metrics", 'keep{instance="inner"} 1\ndrop 2\n')
    store = SampleStore(600)
    await target(store, fault.url, keep_name={"keep", "up"}.__contains__).scrape(T0)
    assert store.names() == ["keep", "scrape_duration_seconds", "scrape_samples_scraped", "up"]
    labels = dict(one(store, "keep").labels)
    assert labels["instance"] == "vllm-0" and labels["exported_instance"] == "inner"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_garbage_never_escapes_as_anything_but_scrape_error(text: str) -> None:
    store = SampleStore(600)
    t = ScrapeTarget(
        url="http://127.0.0.1:1/metrics",
        job="j",
        instance="i",
        store=store,
        timeout=1,
        sample_limit=1000,
        body_size_limit=1 << 20,
    )
    with contextlib.suppress(ScrapeError):
        t.ingest(text, 1000)


async def test_samples_out_of_time_bounds_are_dropped_counted_and_shown(fault: FaultServer) -> None:
    """A far-future explicit timestamp froze its series (every later sample was out of order) while the target
    showed no error. Prometheus drops samples more than 10 min ahead or 1 h behind, counts them and scrapes on."""
    now_ms = int(T0 * 1000)
    future, past = now_ms + 10 * 365 * 86_400_000, now_ms - 2 * 3_600_000
    fault.set("/metrics", f"a 1 {future}\nb 2 {past}\nc 3\nd 4 {now_ms + 600_000}\n")
    store = SampleStore(600)
    t = target(store, fault.url)
    status = await t.scrape(T0)
    assert status.up and status.samples == 4
    assert status.out_of_bounds == 2 and status.out_of_bounds_total == 2
    assert status.last_error == (
        "error on ingesting samples that are too old or are too far into the future: 2 dropped"
    )
    assert list(store.select("a")) == [] and list(store.select("b")) == []
    assert list(one(store, "d").ts) == [now_ms + 600_000]  # 10 minutes ahead is still accepted
    for i in range(1, 4):  # the target goes on sending the bad sample, and good ones
        fault.set("/metrics", f"a 1 {future}\nc {i}\n")
        status = await t.scrape(T0 + i)
    assert status.up and status.out_of_bounds == 1 and status.out_of_bounds_total == 5
    assert list(store.select("a")) == []
    fault.set("/metrics", "a 7\nc 9\n")  # the far-future sample is gone: `a` takes samples at once
    status = await t.scrape(T0 + 4)
    assert status.up and status.out_of_bounds == 0 and status.last_error is None
    assert list(one(store, "a").vals) == [7.0]
    assert list(one(store, "c").vals) == [3.0, 1.0, 2.0, 3.0, 9.0]


async def test_a_4_mib_label_name_gives_a_bounded_error(fault: FaultServer) -> None:
    huge = "l" * (4 << 20)
    fault.set("/metrics", f'a{{{huge}="1",{huge}="2"}} 1\n')
    # 8 MiB to read and parse: a loaded machine once took more than the usual 1 s, so a generous timeout
    # (the point is the bounded error text, not the speed)
    status = await target(SampleStore(600), fault.url, body_size_limit=16 << 20, timeout=60.0).scrape(T0)
    assert not status.up and status.last_error is not None
    assert status.last_error.startswith("parse error: line 1: duplicate label name 'llll")
    assert len(status.last_error) < 1024
