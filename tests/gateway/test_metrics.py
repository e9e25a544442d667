"""The gateway's families: rendered by prometheus_client, parsed back with exact values."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import vllm_watchdog
from vllm_watchdog.gateway.control.metrics import GatewayCollector, families
from vllm_watchdog.gateway.dataplane.histogram import Histogram
from vllm_watchdog.gateway.dataplane.replies import upstream_failure
from vllm_watchdog.gateway.dataplane.signals import SessionSignals
from vllm_watchdog.gateway.protocol.snapshot import (
    PROXY_REFUSALS,
    REPLAY_OUTCOMES,
    UPSTREAM_ERROR_KINDS,
    GateSnapshot,
    GatewaySnapshot,
    HistogramSnapshot,
    ProxySnapshot,
    SessionStats,
)
from vllm_watchdog.listener import REFUSALS
from vllm_watchdog.sources.exposition import parse

P = "vllm_watchdog_gateway_"
Series = tuple[str, frozenset[tuple[str, str]]]


def histogram(*values: float) -> HistogramSnapshot:
    h = Histogram()
    for v in values:
        h.observe(v)
    return h.snapshot()


def snapshot(target: str = "llama", sessions: tuple[SessionStats, ...] = ()) -> GatewaySnapshot:
    gate = GateSnapshot(
        limit=12,
        ceiling=64,
        in_flight=7,
        queued={"interactive": 2, "batch": 5},
        oldest_in_flight_age=3.25,
        draining=True,
        admitted_total={"interactive": 100, "batch": 40},
        rejected_total={"queue_full": 3, "session_breaker": 1},
        queue_time=histogram(0.0005, 0.02, 0.02, 45.0, 500.0),
        breakers_open=("agent-2",),
        session_in_flight={"agent-1": 4},
    )
    proxy = ProxySnapshot(
        responses_total={"200": 130, "429": 4, "502": 1},
        upstream_errors_total={"connect": 1, "client_disconnect": 2},
        ttfb=histogram(0.003, 0.3),
        body_too_large_total=2,
        client_timeouts_total=5,
        refused_total={"admin_path": 3, "header_too_large": 1},
        connections=9,
        connections_evicted_total=4,
        upstream_backoffs_total=6,
        replays_total={"replayed": 3, "too_many": 1},
        replays_held=2,
    )
    return GatewaySnapshot(target=target, gate=gate, proxy=proxy, sessions=sessions, sessions_tracked=37)


SESSIONS = (
    SessionStats("agent-1", 90, 4, 50_000, 3_000, 40_000, 0.8, 1500.0, 7, False),
    SessionStats("agent-2", 30, 0, 9_000, 700, 0, None, None, 0, True),
    SessionStats("other", 20, 3, 4_000, 100, 1_000, 0.25, -12.5, 2, False),
)


def render(snap: GatewaySnapshot | None) -> str:
    registry = CollectorRegistry()
    registry.register(GatewayCollector(lambda: snap))
    return generate_latest(registry).decode()


def samples(text: str) -> dict[Series, float]:
    out: dict[Series, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, key
            out[key] = s.value
    return out


def key(name: str, **labels: str) -> Series:
    return (P + name, frozenset(labels.items()))


ZERO_REFUSALS = set(REFUSALS + PROXY_REFUSALS) - {"admin_path", "header_too_large"}


def test_gate_and_proxy_series_exact() -> None:
    got = samples(render(snapshot()))
    t = {"target": "llama"}
    expected = {
        key("limit", **t): 12,
        key("limit_ceiling", **t): 64,
        key("in_flight", **t): 7,
        key("queue_length", priority="interactive", **t): 2,
        key("queue_length", priority="batch", **t): 5,
        key("oldest_in_flight_seconds", **t): 3.25,
        key("draining", **t): 1,
        key("admitted_total", priority="interactive", **t): 100,
        key("admitted_total", priority="batch", **t): 40,
        key("rejected_total", reason="queue_full", **t): 3,
        key("rejected_total", reason="session_breaker", **t): 1,
        key("responses_total", code="200", **t): 130,
        key("responses_total", code="429", **t): 4,
        key("responses_total", code="502", **t): 1,
        key("upstream_errors_total", kind="connect", **t): 1,
        key("upstream_errors_total", kind="client_disconnect", **t): 2,
        key("upstream_errors_total", kind="timeout", **t): 0,  # every kind from 0
        key("upstream_errors_total", kind="protocol", **t): 0,
        key("upstream_errors_total", kind="client_stalled", **t): 0,
        key("body_too_large_total", **t): 2,
        key("client_timeouts_total", **t): 5,
        key("refused_total", reason="admin_path", **t): 3,
        key("refused_total", reason="header_too_large", **t): 1,
        **{key("refused_total", reason=r, **t): 0 for r in ZERO_REFUSALS},  # every known reason from 0
        key("connections", **t): 9,
        key("connections_evicted_total", **t): 4,
        key("upstream_backoffs_total", **t): 6,
        key("sessions_tracked", **t): 37,
        key("replays_total", outcome="replayed", **t): 3,
        key("replays_total", outcome="too_many", **t): 1,
        **{key("replays_total", outcome=o, **t): 0 for o in REPLAY_OUTCOMES[1:] if o != "too_many"},
        key("replays_held", **t): 2,
    }
    for k, v in expected.items():
        assert got.pop(k) == v, k
    # what is left: the two histograms and nothing else (no sessions in this snapshot)
    assert {name for name, _ in got} == {
        P + f"{h}_{part}"
        for h in ("queue_time_seconds", "time_to_first_byte_seconds")
        for part in ("bucket", "count", "sum")
    }


def test_histograms_exact() -> None:
    got = samples(render(snapshot()))
    t = ("target", "llama")

    def bucket(name: str, le: str) -> float:
        return got[(P + name + "_bucket", frozenset({t, ("le", le)}))]

    q = "queue_time_seconds"
    assert [bucket(q, le) for le in ("0.001", "0.01", "0.025", "30.0", "60.0", "120.0", "+Inf")] == [
        1,
        1,
        3,
        3,
        4,
        4,
        5,
    ]
    assert got[(P + q + "_count", frozenset({t}))] == 5
    assert got[(P + q + "_sum", frozenset({t}))] == 0.0005 + 0.02 + 0.02 + 45.0 + 500.0
    assert len([k for k in got if k[0] == P + q + "_bucket"]) == 17  # 16 bounds and +Inf
    ttfb = "time_to_first_byte_seconds"
    assert [bucket(ttfb, le) for le in ("0.001", "0.005", "0.25", "0.5", "+Inf")] == [0, 1, 1, 2, 2]
    assert got[(P + ttfb + "_sum", frozenset({t}))] == 0.303


def test_session_series_exact_and_none_omitted() -> None:
    got = samples(render(snapshot(sessions=SESSIONS)))

    def s(name: str, session: str) -> float | None:
        return got.get(key("session_" + name, target="llama", session=session))

    assert [s("requests_total", x) for x in ("agent-1", "agent-2", "other")] == [90, 30, 20]
    assert [s("prompt_tokens_total", x) for x in ("agent-1", "agent-2", "other")] == [50_000, 9_000, 4_000]
    assert [s("completion_tokens_total", x) for x in ("agent-1", "agent-2", "other")] == [3_000, 700, 100]
    assert [s("cached_tokens_total", x) for x in ("agent-1", "agent-2", "other")] == [40_000, 0, 1_000]
    assert [s("in_flight", x) for x in ("agent-1", "agent-2", "other")] == [4, 0, 3]
    assert [s("prefix_cache_hit_ratio", x) for x in ("agent-1", "agent-2", "other")] == [0.8, None, 0.25]
    assert [s("context_growth_tokens", x) for x in ("agent-1", "agent-2", "other")] == [1500.0, None, -12.5]
    assert [s("tool_call_repeats", x) for x in ("agent-1", "agent-2", "other")] == [7, 0, 2]
    assert [s("breaker_open", x) for x in ("agent-1", "agent-2", "other")] == [0, 1, 0]
    assert got[key("sessions_tracked", target="llama")] == 37
    session_series = [k for k in got if k[0].startswith(P + "session_")]
    assert len(session_series) == 4 * 3 + 5 * 3 - 2  # two None values left out


def test_types_help_and_the_target_label_everywhere() -> None:
    text = render(snapshot(sessions=SESSIONS))
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    counters = {
        "admitted",
        "rejected",
        "responses",
        "upstream_errors",
        "body_too_large",
        "client_timeouts",
        "refused",
        "connections_evicted",
        "upstream_backoffs",
        "session_requests",
        "session_prompt_tokens",
        "session_completion_tokens",
        "session_cached_tokens",
        "replays",
        "spec_decode_requests",
        "spec_decode_steps",
        "spec_decode_draft_tokens",
        "spec_decode_accepted_tokens",
        "spec_decode_accepted_per_step",
    }
    histograms = {"queue_time_seconds", "time_to_first_byte_seconds"}
    gauges = {
        "limit",
        "limit_ceiling",
        "in_flight",
        "queue_length",
        "oldest_in_flight_seconds",
        "draining",
        "replays_held",
        "session_in_flight",
        "session_prefix_cache_hit_ratio",
        "session_context_growth_tokens",
        "session_tool_call_repeats",
        "session_breaker_open",
        "sessions_tracked",
        "connections",
    }
    assert {n.removeprefix(P) for n in fams} == counters | histograms | gauges
    for name, family in fams.items():
        short = name.removeprefix(P)
        assert family.type == (
            "counter" if short in counters else "histogram" if short in histograms else "gauge"
        )
        assert family.documentation and family.documentation != name
        assert all(s.labels["target"] == "llama" for s in family.samples)
        if short.startswith("session_"):
            assert all("session" in s.labels for s in family.samples)


def test_families_are_what_collect_yields() -> None:
    snap = snapshot(sessions=SESSIONS)
    direct = families(snap)
    collected = list(GatewayCollector(lambda: snap).collect())
    assert [(f.name, f.type, f.samples) for f in direct] == [(f.name, f.type, f.samples) for f in collected]
    assert len({f.name for f in direct}) == len(direct)


def test_no_snapshot_no_families() -> None:
    assert render(None) == ""
    assert list(GatewayCollector(lambda: None).collect()) == []


def test_snapshot_is_read_at_each_scrape() -> None:
    current: list[GatewaySnapshot | None] = [None]
    registry = CollectorRegistry()
    registry.register(GatewayCollector(lambda: current[0]))
    assert generate_latest(registry) == b""
    current[0] = snapshot(target="a")
    assert samples(generate_latest(registry).decode())[key("limit", target="a")] == 12
    current[0] = snapshot(target="b")
    assert key("limit", target="a") not in samples(generate_latest(registry).decode())


def test_label_values_are_escaped() -> None:
    odd = 'we"ird\\name\nx'
    rows = (SessionStats(odd, 1, 0, 0, 0, 0, None, None, 0),)
    got = samples(render(snapshot(target=odd, sessions=rows)))
    assert got[key("session_requests_total", target=odd, session=odd)] == 1
    assert got[key("limit", target=odd)] == 12


def test_our_exposition_parser_reads_it_too() -> None:
    text = render(snapshot(sessions=SESSIONS))
    ours = {(name, frozenset(labels.items())): value for name, labels, value, _ in parse(text)}
    assert ours == samples(text)


def test_from_live_signals() -> None:
    signals = SessionSignals(top_k=1)
    for name, n in (("a", 3), ("b", 1), ("c", 1)):
        for _ in range(n):
            trace = signals.start(name, "/v1/chat/completions", None, False)
            trace.feed(b'{"usage": {"prompt_tokens": 10, "completion_tokens": 2}}')
            trace.finish(200)
    rows, tracked = signals.stats()
    snap = snapshot(sessions=rows)
    got = samples(render(GatewaySnapshot(snap.target, snap.gate, snap.proxy, rows, tracked)))
    assert got[key("session_requests_total", target="llama", session="a")] == 3
    assert got[key("session_requests_total", target="llama", session="other")] == 2
    assert got[key("session_prompt_tokens_total", target="llama", session="other")] == 20
    assert key("session_prefix_cache_hit_ratio", target="llama", session="a") not in got  # no cached reported
    assert got[key("session_context_growth_tokens", target="llama", session="a")] == 0
    assert got[key("sessions_tracked", target="llama")] == 3


def test_every_upstream_failure_kind_is_exported_from_zero() -> None:
    failures = (aiohttp.ConnectionTimeoutError(), aiohttp.ServerTimeoutError(), aiohttp.ClientPayloadError())
    kinds = {upstream_failure(exc)[0] for exc in failures} | {"client_disconnect", "client_stalled"}
    assert kinds == set(UPSTREAM_ERROR_KINDS)
    empty = replace(snapshot(), proxy=replace(snapshot().proxy, upstream_errors_total={}))
    got = samples(render(empty))
    assert {
        kind: got[key("upstream_errors_total", kind=kind, target="llama")] for kind in kinds
    } == dict.fromkeys(kinds, 0)


def test_every_refusal_reason_in_the_source_is_exported_from_zero() -> None:
    root = Path(vllm_watchdog.__file__).parent
    source = (root / "listener.py").read_text() + (root / "gateway" / "dataplane" / "proxy.py").read_text()
    used = set(re.findall(r'(?:_refuse\(send, \d+|refusal\(\d+|count_refusal\()\s*,?\s*"(\w+)"', source))
    assert len(used) >= 8 and used <= set(REFUSALS + PROXY_REFUSALS), used - set(REFUSALS + PROXY_REFUSALS)
    got = samples(render(replace(snapshot(), proxy=replace(snapshot().proxy, refused_total={}))))
    assert {r: got[key("refused_total", reason=r, target="llama")] for r in used} == dict.fromkeys(used, 0)
