"""The gateway's metrics (admission, forwarding, per-session signals), built from a snapshot when scraped."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ...listener import REFUSALS
from ..protocol.snapshot import (
    PROXY_REFUSALS,
    REPLAY_OUTCOMES,
    UPSTREAM_ERROR_KINDS,
    GateSnapshot,
    GatewaySnapshot,
    HistogramSnapshot,
    ProxySnapshot,
    SessionStats,
    SpecDecodeCounts,
)

_PREFIX = "vllm_watchdog_gateway_"


class GatewayCollector(Collector):
    """Families built from the gateway's snapshot at scrape time; nothing while there is no snapshot."""

    def __init__(self, snapshot: Callable[[], GatewaySnapshot | None]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        """Build every family."""
        snap = self.snapshot()
        if snap is not None:
            yield from families(snap)


def exposition(snap: GatewaySnapshot) -> str:
    """One snapshot's families in the text format: what `run --record` logs, so `replay` sees the gateway."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(lambda: snap))
    return generate_latest(registry).decode()


def families(snap: GatewaySnapshot) -> list[Metric]:
    """Every family of one snapshot; each series has the label target=<snap.target>."""
    t = snap.target
    return [
        *_gate_families(t, snap.gate),
        *_proxy_families(t, snap.proxy),
        *_replay_families(t, snap.proxy),
        *_spec_families(t, snap.proxy.spec_decode),
        _histogram(
            "queue_time_seconds",
            "Time from arrival to admission (admitted requests).",
            t,
            snap.gate.queue_time,
        ),
        _histogram(
            "time_to_first_byte_seconds",
            "Time from admission to the first upstream byte.",
            t,
            snap.proxy.ttfb,
        ),
        *_session_families(t, snap.sessions),
        _gauge("sessions_tracked", "Sessions the gateway remembers.", t, snap.sessions_tracked),
    ]


def _gate_families(t: str, g: GateSnapshot) -> list[Metric]:
    """Admission: the cap, what is in flight and waiting, drains, admissions and rejections."""
    return [
        _gauge("limit", "Current cap on in-flight requests (throttled or not).", t, g.limit),
        _gauge("limit_ceiling", "Configured cap on in-flight requests.", t, g.ceiling),
        _gauge("in_flight", "Requests admitted and not yet finished.", t, g.in_flight),
        _by("queue_length", "Requests waiting for a slot, by priority class.", t, "priority", g.queued),
        _gauge(
            "oldest_in_flight_seconds",
            "Age of the oldest in-flight request (0 if none).",
            t,
            g.oldest_in_flight_age,
        ),
        _gauge(
            "draining", "1 while the gateway holds or rejects new requests for a drain.", t, int(g.draining)
        ),
        _by(
            "admitted", "Requests admitted, by priority class.", t, "priority", g.admitted_total, counter=True
        ),
        _by("rejected", "Requests rejected, by reason.", t, "reason", g.rejected_total, counter=True),
    ]


def _proxy_families(t: str, p: ProxySnapshot) -> list[Metric]:
    """Forwarding: responses, upstream failures, refusals, connections and the reflex to vLLM's 503s."""
    return [
        _by(
            "responses",
            "Responses sent to clients, by status code.",
            t,
            "code",
            p.responses_total,
            counter=True,
        ),
        _by(
            "upstream_errors",
            "Forwarding failures (connect, timeout, protocol, client_disconnect, client_stalled).",
            t,
            "kind",
            dict.fromkeys(UPSTREAM_ERROR_KINDS, 0) | dict(p.upstream_errors_total),
            counter=True,
        ),
        _counter(
            "body_too_large", "Requests refused with 413 (body over max_body).", t, p.body_too_large_total
        ),
        _by(
            "refused",
            "Requests and connections the gateway refused itself (also counted in responses), by reason.",
            t,
            "reason",
            dict.fromkeys(REFUSALS + PROXY_REFUSALS, 0) | dict(p.refused_total),
            counter=True,
        ),
        _gauge("connections", "Open client connections.", t, p.connections),
        _counter(
            "connections_evicted",
            "Idle connections closed to make room for a new one at max_connections.",
            t,
            p.connections_evicted_total,
        ),
        _counter(
            "upstream_backoffs",
            "Times the gateway lowered its in-flight cap because vLLM answered 503 (its admission limits).",
            t,
            p.upstream_backoffs_total,
        ),
        _counter(
            "client_timeouts",
            "Clients cut off for not sending their request in time.",
            t,
            p.client_timeouts_total,
        ),
    ]


def _replay_families(t: str, p: ProxySnapshot) -> list[Metric]:
    """Requests held through a restart and sent again (gateway/dataplane/replay.py)."""
    return [
        _by(
            "replays",
            "Requests whose upstream failed during a restart before their client got a byte, by outcome.",
            t,
            "outcome",
            dict.fromkeys(REPLAY_OUTCOMES, 0) | dict(p.replays_total),
            counter=True,
        ),
        _gauge(
            "replays_held", "Requests held now to be sent again to the restarted engine.", t, p.replays_held
        ),
    ]


# vLLM's per-request speculative decoding metrics (dataplane/specrequests.py): (name, help, value).
_SPEC_COUNTERS: tuple[tuple[str, str, Callable[[SpecDecodeCounts], int]], ...] = (
    (
        "requests",
        "Responses that carried vLLM's per-request speculative decoding metrics.",
        lambda c: c.requests,
    ),
    ("steps", "Engine steps that verified drafts, summed over those responses.", lambda c: c.steps),
    ("draft_tokens", "Draft tokens proposed, summed over those responses.", lambda c: c.draft_tokens),
    ("accepted_tokens", "Draft tokens accepted, summed over those responses.", lambda c: c.accepted_tokens),
)


def _spec_families(t: str, ranges: Mapping[str, SpecDecodeCounts]) -> list[Metric]:
    """Per batch-size range (in flight at admission): the counts, and the steps by accepted draft tokens."""
    labels = ["target", "batch_size"]
    out: list[Metric] = []
    for name, doc, read in _SPEC_COUNTERS:
        c = CounterMetricFamily(f"{_PREFIX}spec_decode_{name}", doc, labels=labels)
        for where, counts in ranges.items():
            c.add_metric([t, where], read(counts))
        out.append(c)
    doc = "Draft-verifying steps that accepted `accepted` draft tokens, summed over those responses."
    steps = CounterMetricFamily(f"{_PREFIX}spec_decode_accepted_per_step", doc, labels=[*labels, "accepted"])
    for where, counts in ranges.items():
        for j, n in enumerate(counts.accepted_per_step):
            steps.add_metric([t, where, str(j)], n)
    out.append(steps)
    return out


# Per-session families: (name after session_, help, the value of one session's row).
_SESSION_COUNTERS: tuple[tuple[str, str, Callable[[SessionStats], int]], ...] = (
    (
        "requests",
        "Requests started, by session (the top sessions by traffic, the rest as other).",
        lambda r: r.requests_total,
    ),
    ("prompt_tokens", "Prompt tokens reported in usage, by session.", lambda r: r.prompt_tokens_total),
    (
        "completion_tokens",
        "Completion tokens reported in usage, by session.",
        lambda r: r.completion_tokens_total,
    ),
    (
        "cached_tokens",
        "Prompt tokens served from the prefix cache, by session.",
        lambda r: r.cached_tokens_total,
    ),
)
_SESSION_GAUGES: tuple[tuple[str, str, Callable[[SessionStats], float | None]], ...] = (
    ("in_flight", "Requests in flight, by session.", lambda r: r.in_flight),
    (
        "prefix_cache_hit_ratio",
        "Cached over prompt tokens across the session's recent requests.",
        lambda r: r.prefix_cache_hit_ratio,
    ),
    (
        "context_growth_tokens",
        "Mean growth of prompt_tokens per step across the session's recent requests.",
        lambda r: r.context_growth_tokens,
    ),
    (
        "tool_call_repeats",
        "Most back-to-back repeats of one step's tool calls (or a 2-3 step cycle) among recent steps.",
        lambda r: r.tool_call_repeats,
    ),
    ("breaker_open", "1 while the session's breaker rejects its requests.", lambda r: int(r.breaker_open)),
)


def _session_families(target: str, rows: tuple[SessionStats, ...]) -> list[Metric]:
    """The per-session counters, then gauges (a session without a value has no sample)."""
    labels = ["target", "session"]
    out: list[Metric] = []
    for name, doc, count in _SESSION_COUNTERS:
        c = CounterMetricFamily(_PREFIX + "session_" + name, doc, labels=labels)
        for row in rows:
            c.add_metric([target, row.session], count(row))
        out.append(c)
    for name, doc, read in _SESSION_GAUGES:
        g = GaugeMetricFamily(_PREFIX + "session_" + name, doc, labels=labels)
        for row in rows:
            value = read(row)
            if value is not None:
                g.add_metric([target, row.session], value)
        out.append(g)
    return out


def _gauge(name: str, doc: str, target: str, value: float) -> Metric:
    g = GaugeMetricFamily(_PREFIX + name, doc, labels=["target"])
    g.add_metric([target], value)
    return g


def _counter(name: str, doc: str, target: str, value: float) -> Metric:
    c = CounterMetricFamily(_PREFIX + name, doc, labels=["target"])
    c.add_metric([target], value)
    return c


def _by(
    name: str, doc: str, target: str, label: str, values: Mapping[str, int], *, counter: bool = False
) -> Metric:
    family: GaugeMetricFamily | CounterMetricFamily
    if counter:
        family = CounterMetricFamily(_PREFIX + name, doc, labels=["target", label])
    else:
        family = GaugeMetricFamily(_PREFIX + name, doc, labels=["target", label])
    for key, value in sorted(values.items(), key=lambda kv: str(kv[0])):
        family.add_metric([target, str(key)], value)
    return family


def _histogram(name: str, doc: str, target: str, h: HistogramSnapshot) -> Metric:
    family = HistogramMetricFamily(_PREFIX + name, doc, labels=["target"])
    buckets = [(repr(float(le)), float(n)) for le, n in zip(h.bounds, h.cumulative, strict=False)]
    buckets.append(("+Inf", float(h.count)))
    family.add_metric([target], buckets, h.sum)
    return family
