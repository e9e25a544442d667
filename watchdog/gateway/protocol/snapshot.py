"""Plain values the gateway hands to metrics and the API: read on the gateway loop, used anywhere."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Every kind of upstream_errors_total (gateway/replies.py and the proxy's client_disconnect); each is exported
# from 0, so that a panel or rule sees the first error as an increase.
UPSTREAM_ERROR_KINDS = ("connect", "timeout", "protocol", "client_disconnect", "client_stalled")
# The proxy's own refusals (refused_total), besides its listener's (listener.REFUSALS); each exported from 0.
PROXY_REFUSALS = ("bad_path", "admin_path", "upgrade_not_supported", "body_too_large", "body_too_complex")
# How each request held for a replay ended (dataplane/replay.py), each exported from 0: the first six once
# per held request; failed_again for a replay whose upstream failed too (also counted replayed).
REPLAY_OUTCOMES = (
    "replayed",
    "not_drained",
    "too_many",
    "too_large",
    "expired",
    "client_gone",
    "failed_again",
    "resumed",
    "not_resumable",
)

# Upper bounds (seconds) of the gateway's latency histograms; +Inf is implied.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)


@dataclass(frozen=True)
class HistogramSnapshot:
    """Cumulative bucket counts (same order as `bounds`, +Inf last), sum and count."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]  # len(bounds) + 1; the last is the +Inf bucket == count
    sum: float
    count: int


@dataclass(frozen=True)
class GateSnapshot:
    """Admission state at one instant."""

    limit: int  # the current cap on in-flight requests (throttled or not)
    ceiling: int  # the configured cap
    in_flight: int  # admitted and not yet released
    queued: Mapping[str, int]  # priority class -> waiting requests (drain holds included)
    oldest_in_flight_age: float  # seconds since the oldest in-flight request was admitted; 0 if none
    draining: bool
    admitted_total: Mapping[str, int]  # priority class -> admitted
    rejected_total: Mapping[str, int]  # reason -> rejected (queue_full, queue_timeout, session_rate, ...)
    queue_time: HistogramSnapshot  # time from arrival to admission, admitted requests only
    breakers_open: tuple[str, ...]  # sessions whose breaker is open now
    session_in_flight: Mapping[str, int]  # session -> in flight (sessions with at least one)


@dataclass(frozen=True)
class SessionStats:
    """What one session (or "other", the rest summed) did, for export."""

    session: str
    requests_total: int
    in_flight: int
    prompt_tokens_total: int
    completion_tokens_total: int
    cached_tokens_total: int
    prefix_cache_hit_ratio: float | None  # cached/prompt over the session's recent requests; None: no data
    context_growth_tokens: float | None  # mean prompt_tokens growth per step, recent steps; None: <2 steps
    tool_call_repeats: int  # most back-to-back repeats of one step's tool calls or a 2-3 step cycle (recent)
    breaker_open: bool = False


MAX_ACCEPTED = 16  # the most accepted draft tokens per step counted per request (acceptance_histogram's j)


@dataclass(frozen=True)
class SpecDecodeCounts:
    """vLLM's per-request speculative decoding metrics, summed over the requests of one batch-size range."""

    requests: int = 0
    steps: int = 0  # num_spec_steps
    draft_tokens: int = 0  # num_draft_tokens
    accepted_tokens: int = 0  # num_accepted_draft_tokens
    accepted_per_step: tuple[int, ...] = ()  # acceptance_histogram summed, by accepted j <= MAX_ACCEPTED


@dataclass(frozen=True)
class ProxySnapshot:
    """Forwarding outcomes."""

    responses_total: Mapping[str, int]  # status code ("200", "429", ...) -> responses sent to clients
    upstream_errors_total: Mapping[str, int]  # UPSTREAM_ERROR_KINDS
    ttfb: HistogramSnapshot  # admission to the first upstream response byte
    body_too_large_total: int = 0
    client_timeouts_total: int = 0
    refused_total: Mapping[str, int] = field(default_factory=dict)  # reason -> the gateway's own refusals
    connections: int = 0  # open client connections
    connections_evicted_total: int = 0  # idle connections closed to make room at max_connections
    upstream_backoffs_total: int = 0  # times the in-flight cap was lowered because vLLM answered 503
    replays_total: Mapping[str, int] = field(default_factory=dict)  # REPLAY_OUTCOMES
    replays_held: int = 0  # requests held for a replay now
    spec_decode: Mapping[str, SpecDecodeCounts] = field(default_factory=dict)  # batch-size range -> counts


@dataclass(frozen=True)
class GatewaySnapshot:
    """Everything the gateway exports, for one target."""

    target: str
    gate: GateSnapshot
    proxy: ProxySnapshot
    sessions: tuple[SessionStats, ...] = field(default_factory=tuple)  # top-K then "other"
    sessions_tracked: int = 0
