"""The gateway's reflex to vLLM's own 503s: the rule with injected time, then a real gateway (no daemon) in front
of an upstream that refuses, as vLLM's --max-num-queued-reqs does, whatever is over its cap."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest

from tests.support.clock import Clock
from tests.support.gateway_upstream import Seen, Upstream, response_head
from tests.support.vllm_server import free_port
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.gateway.config import GatewayConfig, ThrottleSpec, UpstreamBackoffConfig
from vllm_watchdog.gateway.control.metrics import exposition
from vllm_watchdog.gateway.dataplane.admission import Gate
from vllm_watchdog.gateway.dataplane.backoff import HOLD_KEY, UpstreamBackoff
from vllm_watchdog.gateway.dataplane.server import GatewayServer
from vllm_watchdog.gateway.dataplane.throttle import Throttle

TARGET = 'targets:\n  - {name: vllm-0, url: "http://127.0.0.1:8000"}\n'
# What vLLM 0.32 answers when --max-num-queued-reqs is reached (vllm.exceptions.QueueOverflowError).
BUSY = json.dumps(
    {
        "error": {
            "message": "The engine is currently busy and cannot accept new requests. "
            "Please try again later or on a different instance.",
            "type": "Service Unavailable",
            "param": None,
            "code": 503,
        }
    }
).encode()


def setup(config: UpstreamBackoffConfig | None = None) -> tuple[Gate, Throttle, UpstreamBackoff, Clock]:
    clock = Clock()
    gate = Gate(GatewayConfig(target="t", upstream="http://127.0.0.1:1", max_in_flight=64), monotonic=clock)
    throttle = Throttle(gate, monotonic=clock)
    backoff = UpstreamBackoff(config or UpstreamBackoffConfig(), throttle, monotonic=clock)
    return gate, throttle, backoff, clock


def test_a_503_halves_the_cap_once_per_cap() -> None:
    gate, throttle, backoff, clock = setup()
    sent_before = clock.now - 1.0
    backoff.observe(503, sent_before)
    assert gate.limit == 32 and backoff.decreases == 1
    # The rest of the burst was sent under the old cap: it says nothing about the new one.
    clock.advance(0.01)
    for _ in range(20):
        backoff.observe(503, sent_before)
    assert gate.limit == 32 and backoff.decreases == 1
    # A request admitted under the new cap and refused too: the cap is still too high.
    backoff.observe(503, clock.now)
    assert gate.limit == 16 and backoff.decreases == 2
    assert HOLD_KEY in throttle.state()["holds"]  # type: ignore[operator]


def test_only_503_counts_and_it_can_be_switched_off() -> None:
    gate, _, backoff, clock = setup()
    for status in (200, 429, 500, 502, 504):
        backoff.observe(status, clock.now)
    assert gate.limit == 64 and backoff.decreases == 0
    gate, _, backoff, clock = setup(UpstreamBackoffConfig(enabled=False))
    backoff.observe(503, clock.now)
    assert gate.limit == 64 and backoff.decreases == 0


def test_the_floor_holds() -> None:
    gate, _, backoff, clock = setup(UpstreamBackoffConfig(floor=5))
    for _ in range(10):
        clock.advance(1.0)
        backoff.observe(503, clock.now)
    assert gate.limit == 5


def test_quiet_releases_then_the_cap_climbs_additively_to_the_ceiling() -> None:
    gate, throttle, backoff, clock = setup(UpstreamBackoffConfig(quiet=10.0, step=2, step_interval=5.0))
    backoff.observe(503, clock.now)
    clock.advance(1.0)
    backoff.observe(503, clock.now)
    assert gate.limit == 16
    clock.advance(9.0)  # 9 s since the last 503
    backoff.tick()
    assert gate.limit == 16 and HOLD_KEY in throttle.state()["holds"]  # type: ignore[operator]
    clock.advance(1.0)
    backoff.tick()
    assert throttle.state()["holds"] == {} and gate.limit == 16  # released: recovery starts from here
    limits = []
    for _ in range(6):
        clock.advance(5.0)
        backoff.tick()
        limits.append(gate.limit)
    assert limits == [18, 20, 22, 24, 26, 28]
    for _ in range(30):
        clock.advance(5.0)
        backoff.tick()
    assert gate.limit == 64 and throttle.state()["recovering"] is None


def test_a_503_during_the_climb_halves_again() -> None:
    gate, _, backoff, clock = setup(UpstreamBackoffConfig(quiet=2.0, step_interval=1.0))
    backoff.observe(503, clock.now)
    assert gate.limit == 32
    for _ in range(6):
        clock.advance(1.0)
        backoff.tick()
    climbed = gate.limit
    assert climbed == 36  # released at +2 s, then one slot a second
    backoff.observe(503, clock.now)
    assert gate.limit == 18


def test_an_alert_hold_outlives_the_reflex() -> None:
    """The daemon's hold (VLLMQueueSaturated) keeps the cap down after the reflex lets go."""
    gate, throttle, backoff, clock = setup(UpstreamBackoffConfig(quiet=1.0, step_interval=1.0))
    throttle.hold("alert-fp", ThrottleSpec(factor=0.5, floor=2))
    backoff.observe(503, clock.now)
    assert gate.limit == 16
    for _ in range(5):
        clock.advance(1.0)
        backoff.tick()
    assert list(throttle.state()["holds"]) == ["alert-fp"]  # type: ignore[call-overload]
    assert gate.limit == 16
    throttle.release("alert-fp")  # the last hold to go sets the pace: the alert's +1 per 10 s
    clock.advance(9.0)
    backoff.tick()
    assert gate.limit == 16
    clock.advance(1.0)
    backoff.tick()
    assert gate.limit == 17


def test_a_restored_hold_with_no_503_seen_is_released() -> None:
    """A hold of the reflex saved by the daemon and restored into a new gateway: nobody saw its 503s."""
    gate, throttle, backoff, _ = setup()
    throttle.restore({"limit": 8, "holds": {HOLD_KEY: ThrottleSpec(factor=0.5).to_json()}})
    assert gate.limit == 8
    backoff.tick()
    assert throttle.state()["holds"] == {}


# -- config ---------------------------------------------------------------------------------------


def test_upstream_backoff_parses_with_defaults_and_file_line_errors() -> None:
    cfg = parse_config(TARGET + "gateway: {}\n", "c.yml", env={})
    assert cfg.gateway is not None and cfg.gateway.upstream_backoff == UpstreamBackoffConfig()
    text = "gateway:\n  upstream_backoff: {factor: 0.75, floor: 4, quiet: 30s, step: 2, step_interval: 10s}\n"
    cfg = parse_config(TARGET + text, "c.yml", env={})
    assert cfg.gateway is not None
    assert cfg.gateway.upstream_backoff == UpstreamBackoffConfig(True, 0.75, 4, 30.0, 2, 10.0)
    cfg = parse_config(TARGET + "gateway: {upstream_backoff: {enabled: false}}\n", "c.yml", env={})
    assert cfg.gateway is not None and not cfg.gateway.upstream_backoff.enabled
    for bad, message in [
        ("{factor: 1}", "gateway.upstream_backoff.factor: must be between 0 and 1"),
        ("{floor: 0}", "gateway.upstream_backoff.floor: must be >= 1"),
        ("{quiet: 0s}", "gateway.upstream_backoff.quiet: must be greater than 0"),
        ("{step_interval: soon}", "gateway.upstream_backoff.step_interval:"),
        ("{bogus: 1}", "gateway.upstream_backoff.bogus: unknown key"),
    ]:
        with pytest.raises(ConfigError) as exc:
            parse_config(TARGET + f"gateway: {{upstream_backoff: {bad}}}\n", "c.yml", env={})
        problems = [str(p) for p in exc.value.problems]
        assert any(p.startswith("c.yml:3: ") and message in p for p in problems), problems


# -- a real gateway in front of an upstream with an admission limit -------------------------------


class Admission:
    """An upstream handler that admits `cap` requests at a time (each takes `seconds`), and answers the rest
    503 at once with vLLM's body, as vLLM's --max-num-queued-reqs does."""

    def __init__(self, cap: int, seconds: float) -> None:
        self.cap = cap
        self.seconds = seconds
        self.in_flight = 0
        self.refused = 0
        self.served = 0

    async def __call__(self, seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.in_flight >= self.cap:
            self.refused += 1
            head = [("Content-Type", "application/json"), ("Content-Length", str(len(BUSY)))]
            writer.write(response_head(503, head) + BUSY)
            await writer.drain()
            return
        self.in_flight += 1
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.in_flight -= 1
        self.served += 1
        body = b'{"choices": [{"text": "ok"}]}'
        head = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        writer.write(response_head(200, head) + body)
        await writer.drain()


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    yield up
    up.close()


async def clients(url: str, n: int, each: int) -> list[int]:
    """`n` clients sending `each` completions one after another; every status, in completion order."""
    statuses: list[int] = []

    async def client(http: httpx.AsyncClient) -> None:
        for _ in range(each):
            r = await http.post(url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 4})
            statuses.append(r.status_code)

    limits = httpx.Limits(max_connections=n + 2)
    async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as http:
        await asyncio.gather(*(client(http) for _ in range(n)))
    return statuses


def test_a_gateway_without_a_daemon_backs_off_below_the_upstreams_limit_and_climbs_back(
    upstream: Upstream,
) -> None:
    admission = Admission(cap=4, seconds=0.1)
    upstream.routes["/v1/completions"] = admission
    backoff = UpstreamBackoffConfig(quiet=60.0, step=1, step_interval=0.5)
    config = GatewayConfig(
        target="t", upstream=upstream.url, listen_port=free_port(), max_in_flight=16, upstream_backoff=backoff
    )
    gw = GatewayServer(config)
    gw.start()
    try:
        statuses = asyncio.run(clients(gw.url, n=16, each=12))
        snap = gw.call_sync(gw.snapshot, timeout=10)
        # 16 clients against a cap of 4: 16 -> 8 -> 4 in two decreases, after which nothing is refused.
        assert snap.gate.limit <= 4, snap.gate.limit
        assert 2 <= snap.proxy.upstream_backoffs_total <= 3, snap.proxy
        refused = statuses.count(503)
        assert refused == admission.refused and statuses.count(200) == admission.served
        assert refused < 16 + 8, statuses  # without the reflex most of the 192 would be refused
        assert 503 not in statuses[len(statuses) // 3 :], statuses
        assert "vllm_watchdog_gateway_upstream_backoffs_total" in exposition(snap)
        # A reload shortens `quiet` to 1 s: the hold goes, and the gateway's own tick adds a slot every 0.5 s.
        low = snap.gate.limit
        quick = replace(config, upstream_backoff=UpstreamBackoffConfig(quiet=1.0, step_interval=0.5))
        gw.call_sync(lambda: gw.apply(quick), timeout=10)
        deadline = time.monotonic() + 10
        while gw.call_sync(lambda: gw.gate.limit, timeout=10) < low + 2:
            assert time.monotonic() < deadline, "the cap never climbed back"
            time.sleep(0.2)
        assert HOLD_KEY not in gw.call_sync(gw.throttle.state, timeout=10)["holds"]  # type: ignore[operator]
    finally:
        gw.stop(grace=1.0)
