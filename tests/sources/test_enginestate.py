"""vLLM's deliberate states through the monitor, against a programmed HTTP server: /is_paused and /is_sleeping
asked once when the server has none (404) and again after it restarts; an answer that does not come is not
"paused", and a slow one never holds the /health probe back; the canary waits while the engine is paused or
asleep; vllm:engine_sleep_state without dev mode."""

from __future__ import annotations

import math

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.support.clock import T0
from tests.support.faultserver import FaultServer
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.sources.enginestate import SLEEP_STATE, STATE_SERIES, asleep_in_store
from vllm_watchdog.sources.metrics import MonitorCollector
from vllm_watchdog.sources.monitor import Monitor, MonitorOptions
from vllm_watchdog.sources.selffeed import SelfFeed
from vllm_watchdog.sources.storeneeds import ALWAYS_KEPT
from vllm_watchdog.store import SampleStore, make_labels

pytestmark = pytest.mark.anyio
PAUSED, SLEEPING = STATE_SERIES["paused"], STATE_SERIES["sleeping"]
ASLEEP_METRICS = """# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="awake"} 0.0
vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="weights_offloaded"} 1.0
vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="discard_all"} 0.0
"""


def monitor(url: str, canary: str = "false") -> Monitor:
    text = f"targets: [{{name: t, url: '{url}', health_timeout: 500ms, canary: {canary}}}]\n"
    return Monitor(parse_config(text, "c.yml", env={}), MonitorOptions(client_factory=httpx.AsyncClient))


async def probed(mon: Monitor, now: float) -> None:
    """The /health probe, then the engine state probe: two jobs of the schedule, at the same offset."""
    await mon.probe_health("t", now)
    await mon.probe_state("t", now)


def asked(fault: FaultServer, path: str) -> int:
    return sum(1 for _, p, _ in fault.requests if p == path)


def value(mon: Monitor, name: str, now: float) -> float | None:
    """The series' value at `now` as a query sees it (None: absent or stale)."""
    series = mon.store.get(make_labels(name, mon.targets["t"].config.series_labels))
    got = series.at(math.floor(now * 1000), 300_000) if series.registered else None
    return None if got is None else got[1]


async def test_without_dev_mode_each_endpoint_is_asked_once_and_again_after_a_restart(
    fault: FaultServer,
) -> None:
    fault.vllm_like("")  # no /is_paused, /is_sleeping: 404, as vLLM without VLLM_SERVER_DEV_MODE=1
    mon = monitor(fault.url)
    for i in range(5):
        await probed(mon, T0 + i)
    assert (asked(fault, "/is_paused"), asked(fault, "/is_sleeping")) == (1, 1)
    assert value(mon, PAUSED, T0 + 5) is None and value(mon, SLEEPING, T0 + 5) is None
    assert mon.engine_state("t", T0 + 5) == ""

    fault.set("/health", b"", status=503)  # the server goes away...
    await probed(mon, T0 + 6)
    assert asked(fault, "/is_paused") == 1  # (not asked while /health fails)
    fault.set("/health", b"")  # ...and comes back in dev mode
    fault.set("/is_paused", {"is_paused": False})
    fault.set("/is_sleeping", {"is_sleeping": False})
    for i in range(7, 10):
        await probed(mon, T0 + i)
    assert (asked(fault, "/is_paused"), asked(fault, "/is_sleeping")) == (4, 4)
    assert value(mon, PAUSED, T0 + 9) == 0.0 and value(mon, SLEEPING, T0 + 9) == 0.0
    await mon.aclose()


async def test_a_paused_engine_is_stored_and_named_and_a_resume_ends_it(fault: FaultServer) -> None:
    fault.vllm_like("")
    fault.set("/is_paused", {"is_paused": True})
    fault.set("/is_sleeping", {"is_sleeping": True})  # vLLM 0.32 is "sleeping" while paused too
    mon = monitor(fault.url)
    await probed(mon, T0)
    assert value(mon, PAUSED, T0) == 1.0 and value(mon, SLEEPING, T0) == 1.0
    assert mon.engine_state("t", T0 + 1).startswith("the engine is paused on purpose (GET /is_paused")
    fault.set("/is_paused", {"is_paused": False})
    fault.set("/is_sleeping", {"is_sleeping": False})
    await probed(mon, T0 + 1)
    assert value(mon, PAUSED, T0 + 1) == 0.0 and mon.engine_state("t", T0 + 1) == ""
    await mon.aclose()


@pytest.mark.parametrize(
    "reply",
    [
        {"body": {"is_paused": True}, "delay": 1.0},  # EngineCore SIGSTOPped: the answer never comes in time
        {"body": b"internal error", "status": 500},
        {"body": {"paused": "yes"}},  # not the answer vLLM gives
    ],
    ids=["timeout", "500", "other-json"],
)
async def test_an_endpoint_that_does_not_answer_is_not_paused(
    fault: FaultServer, reply: dict[str, object]
) -> None:
    fault.vllm_like("")
    fault.set("/is_paused", {"is_paused": True})
    mon = monitor(fault.url)
    await probed(mon, T0)
    assert mon.engine_state("t", T0) != ""
    fault.set("/is_paused", **reply)  # type: ignore[arg-type]
    await probed(mon, T0 + 1)
    assert mon.engine_state("t", T0 + 1) == ""
    assert value(mon, PAUSED, T0 + 1) == 0.0  # the series stays, at 0: the rules' `unless` lets go
    await probed(mon, T0 + 2)
    assert asked(fault, "/is_paused") == 3  # an endpoint that did not answer is asked again (no 404)
    await mon.aclose()


async def test_the_canary_waits_while_the_engine_is_paused(fault: FaultServer) -> None:
    fault.vllm_like("")
    fault.set("/is_paused", {"is_paused": True})
    mon = monitor(fault.url, canary="{interval: 1s, timeout: 500ms}")
    await probed(mon, T0)
    await mon.probe_canary("t", T0 + 0.5)
    assert asked(fault, "/v1/completions") == 0
    assert value(mon, "vllm_watchdog_canary_success", T0 + 1) is None
    fault.set("/is_paused", {"is_paused": False})  # POST /resume
    await probed(mon, T0 + 1)
    await mon.probe_canary("t", T0 + 1.5)
    assert asked(fault, "/v1/completions") == 1
    assert value(mon, "vllm_watchdog_canary_success", T0 + 2) == 1.0
    await mon.aclose()


async def test_a_canary_that_failed_because_the_engine_was_paused_meanwhile_is_not_recorded(
    fault: FaultServer,
) -> None:
    fault.vllm_like("")
    fault.set("/is_paused", {"is_paused": False})
    mon = monitor(fault.url, canary="{interval: 1s, timeout: 500ms}")
    await probed(mon, T0)
    await mon.probe_canary("t", T0 + 0.1)
    assert value(mon, "vllm_watchdog_canary_success", T0 + 0.2) == 1.0
    # POST /pause?mode=keep while the next canary is on its way: it is held until it times out.
    fault.set("/v1/completions", {"choices": [], "usage": {"completion_tokens": 1}}, delay=1.0)
    fault.set("/is_paused", {"is_paused": True})
    await mon.probe_canary("t", T0 + 1)
    assert asked(fault, "/v1/completions") == 2
    assert value(mon, "vllm_watchdog_canary_success", T0 + 2) == 1.0  # the held canary is not a failure
    rt = mon.targets["t"]
    assert rt.canary is not None and rt.canary.status.ok and rt.canary.status.runs == 1
    await mon.aclose()


async def test_a_canary_that_fails_on_an_engine_that_is_not_paused_is_recorded(fault: FaultServer) -> None:
    fault.vllm_like("")
    fault.set("/is_paused", {"is_paused": False})
    fault.set("/v1/completions", {"choices": [], "usage": {"completion_tokens": 1}}, delay=1.0)
    mon = monitor(fault.url, canary="{interval: 1s, timeout: 500ms}")
    await probed(mon, T0)
    await mon.probe_canary("t", T0 + 1)
    assert value(mon, "vllm_watchdog_canary_success", T0 + 2) == 0.0
    await mon.aclose()


async def test_an_engine_asleep_by_its_metrics_is_named_without_dev_mode(fault: FaultServer) -> None:
    fault.vllm_like(ASLEEP_METRICS)
    mon = monitor(fault.url, canary="{interval: 1s, timeout: 500ms}")
    await mon.scrape("t", T0)
    await probed(mon, T0)
    reason = mon.engine_state("t", T0 + 1)
    assert reason == (
        'the engine is asleep on purpose (vllm:engine_sleep_state{sleep_state="awake"} is 0, engine 0)'
    )
    await mon.probe_canary("t", T0 + 1)
    assert asked(fault, "/v1/completions") == 0  # the canary waits for /wake_up
    fault.set("/metrics", ASLEEP_METRICS.replace('"awake"} 0.0', '"awake"} 1.0'))
    await mon.scrape("t", T0 + 2)
    assert mon.engine_state("t", T0 + 2) == ""
    await mon.aclose()


async def test_the_state_series_are_exported_with_the_targets_labels_and_fed_back_once(
    fault: FaultServer,
) -> None:
    fault.vllm_like("")
    fault.set("/is_paused", {"is_paused": True})
    mon = monitor(fault.url)
    await probed(mon, T0)
    collector = MonitorCollector(mon)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    hostport = fault.url.removeprefix("http://")  # Prometheus' instance of the target's address
    assert f'vllm_watchdog_engine_paused{{instance="{hostport}",job="vllm",target="t"}} 1.0' in text
    assert "vllm_watchdog_engine_sleeping{" not in text  # 404: absent
    # The self feed writes the own families into the store; these the monitor wrote already.
    feed = SelfFeed(mon.store, [collector], "127.0.0.1:9460", lambda: None)
    feed.commit(math.floor((T0 + 1) * 1000))
    assert [s.labels for s in mon.store.select(PAUSED)] == [
        make_labels(PAUSED, {"job": "vllm", "instance": hostport, "target": "t"})
    ]
    await mon.aclose()


async def test_a_slow_is_paused_never_holds_the_health_probe_back(fault: FaultServer) -> None:
    fault.vllm_like("")
    fault.set("/is_paused", {"is_paused": True}, delay=1.0)  # a stopped engine core holds /is_paused
    fault.set("/is_sleeping", {"is_sleeping": False})
    mon = monitor(fault.url)  # health_timeout 500ms: the state probe gives up on /is_paused after it
    await mon.probe_state("t", T0)
    assert asked(fault, "/is_paused") == 0  # nothing before the first /health probe
    for i in range(3):
        await mon.probe_health("t", T0 + i)
    assert asked(fault, "/is_paused") == 0 and asked(fault, "/health") == 3  # was: each one waited for it
    health = mon.targets["t"].health.status
    assert (health.ok, health.runs, health.failures) == (True, 3, 0)
    await mon.probe_state("t", T0 + 3)  # its own job: both endpoints at once, each within the timeout
    assert (asked(fault, "/is_paused"), asked(fault, "/is_sleeping")) == (1, 1)
    assert mon.engine_state("t", T0 + 3) == "" and value(mon, SLEEPING, T0 + 3) == 0.0
    assert mon.targets["t"].state.endpoints["paused"].last_error == "timeout after 0.5s"
    await mon.aclose()


def test_the_store_always_keeps_the_sleep_state() -> None:
    assert SLEEP_STATE in ALWAYS_KEPT  # the engine_paused rail reads it, whatever the rules read


def sleep_states(values: dict[tuple[str, str], float]) -> SampleStore:
    """A store with vllm:engine_sleep_state of target t: (engine, sleep_state) -> value, scraped at T0."""
    store = SampleStore(retention=0.0)
    for (engine, state), v in values.items():
        labels = {"target": "t", "engine": engine, "sleep_state": state}
        store.append(make_labels(SLEEP_STATE, labels), int(T0 * 1000), v)
    return store


def test_an_unknown_sleep_state_is_read_as_not_awake() -> None:
    """A newer vLLM may add a sleep level: the engine in it is not taken for awake (nor restarted as hung)."""
    awake = {("0", "awake"): 1.0, ("0", "weights_offloaded"): 0.0, ("0", "discard_all"): 0.0}
    assert asleep_in_store(sleep_states(awake), "t", T0 + 1, 300.0) == ""
    newer = {**awake, ("0", "awake"): 1.0, ("0", "kv_offloaded"): 1.0}  # even where "awake" still says 1
    assert asleep_in_store(sleep_states(newer), "t", T0 + 1, 300.0) == (
        "the engine is asleep on purpose (vllm:engine_sleep_state"
        '{sleep_state="kv_offloaded"} is 1, a state not known to be awake, engine 0)'
    )
    assert asleep_in_store(sleep_states({("0", "kv_offloaded"): 0.0}), "t", T0 + 1, 300.0) == ""
    two = {("0", "awake"): 0.0, ("1", "awake"): 1.0, ("1", "level_3"): 1.0}
    assert asleep_in_store(sleep_states(two), "t", T0 + 1, 300.0) == (
        'the engine is asleep on purpose (vllm:engine_sleep_state{sleep_state="awake"} is 0, engine 0; '
        'vllm:engine_sleep_state{sleep_state="level_3"} is 1, a state not known to be awake, engine 1)'
    )
    assert asleep_in_store(sleep_states(two), "other", T0 + 1, 300.0) == ""


UNHEALTHY = STATE_SERIES["unhealthy"]


async def test_engines_waiting_for_a_fault_tolerance_retry_are_counted(fault: FaultServer) -> None:
    """vLLM 0.32 with --enable-fault-tolerance: an engine whose loop raised says `unhealthy` and waits for
    an orchestrator; without fault tolerance the route is absent (404), asked once per server start."""
    fault.vllm_like("")
    mon = monitor(fault.url)
    await probed(mon, T0)
    assert value(mon, UNHEALTHY, T0) is None and asked(fault, "/fault_tolerance/status") == 1
    await probed(mon, T0 + 1)
    assert asked(fault, "/fault_tolerance/status") == 1  # the 404 is remembered
    fault.set("/health", "", status=503)  # the server restarts, now with fault tolerance
    await probed(mon, T0 + 2)
    fault.set("/health", "")
    engines = [{"id": 0, "status": "unhealthy", "fault_info": "RuntimeError"}, {"id": 1, "status": "healthy"}]
    fault.set("/fault_tolerance/status", {"schema_version": 1, "total_engines": 2, "engines": engines})
    await probed(mon, T0 + 3)
    assert value(mon, UNHEALTHY, T0 + 3) == 1.0
    assert mon.engine_state("t", T0 + 3) == ""  # not paused on purpose: a fault, for the recover action
    engines[0] = {"id": 0, "status": "healthy"}
    fault.set("/fault_tolerance/status", {"schema_version": 1, "total_engines": 2, "engines": engines})
    await probed(mon, T0 + 4)
    assert value(mon, UNHEALTHY, T0 + 4) == 0.0
    await mon.aclose()
