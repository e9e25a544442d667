"""Why the gate turns a request away: the reasons, the answer the proxy sends for each (status, one human
sentence, Retry-After), and how many of each there were."""

from __future__ import annotations

from dataclasses import dataclass

REASONS = (
    "queue_full",
    "queue_timeout",
    "session_rate",
    "session_concurrency",
    "anonymous_concurrency",
    "session_breaker",
    "draining",
    "drain_timeout",
)
DRAIN_RETRY_AFTER = 5.0  # a drain is a restart or maintenance: retrying within seconds is pointless


@dataclass(frozen=True)
class Rejection:
    """A request the gate turned away; the proxy answers it with `status` and Retry-After."""

    status: int  # 429 for limits, 503 for draining
    reason: str  # one of REASONS
    message: str  # one human sentence for the JSON error body
    retry_after: float  # seconds (> 0); the proxy sends ceil() in Retry-After


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.3g} s"


class Rejections:
    """Makes the gate's rejections, each counted by its reason."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(REASONS, 0)

    def _reject(self, status: int, reason: str, message: str, retry_after: float) -> Rejection:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        return Rejection(status, reason, message, max(retry_after, 1e-3))

    def session_rate(self, rate: float | None, wait: float) -> Rejection:
        """The session is over its request rate; it may send again after `wait` seconds."""
        shown = "?" if rate is None else f"{rate:g}"
        msg = f"This session is over its rate of {shown} requests/s; retry after {_seconds(wait)}."
        return self._reject(429, "session_rate", msg, wait)

    def queue_full(self, waiting: int, retry: float) -> Rejection:
        """The queue holds max_queue requests and none of a lower class to make room."""
        msg = f"The gateway is at capacity with {waiting} requests already waiting; retry shortly."
        return self._reject(429, "queue_full", msg, retry)

    def shed(self, retry: float) -> Rejection:
        """A waiter of a lower class makes room in a full queue for a higher-class request."""
        msg = "The gateway queue is full and higher-priority requests arrived; retry shortly."
        return self._reject(429, "queue_full", msg, retry)

    def session_concurrency(self, cap: int | None, max_queue_time: float, retry: float) -> Rejection:
        """A waiter whose session kept `cap` requests in flight for all of max_queue_time."""
        msg = (
            f"This session already has {cap} requests in flight and none finished within "
            f"{_seconds(max_queue_time)}; wait for one to finish."
        )
        return self._reject(429, "session_concurrency", msg, retry)

    def anonymous_concurrency(self, cap: int, max_queue_time: float, retry: float) -> Rejection:
        """A waiter without a session while requests without one kept their share (`cap`) of the slots."""
        msg = (
            f"Requests without a session already hold {cap} of the gateway's slots "
            f"(sessions.anonymous_share) and none finished within {_seconds(max_queue_time)}; send a session "
            "header or an API key, or retry shortly."
        )
        return self._reject(429, "anonymous_concurrency", msg, retry)

    def queue_timeout(self, max_queue_time: float, retry: float) -> Rejection:
        """A waiter that found no free slot within max_queue_time."""
        msg = f"No capacity freed up within {_seconds(max_queue_time)}; retry shortly."
        return self._reject(429, "queue_timeout", msg, retry)

    def draining(self) -> Rejection:
        """Admission is stopped for a drain (drain_mode reject)."""
        msg = "The model server is drained for a restart or maintenance; retry in a few seconds."
        return self._reject(503, "draining", msg, DRAIN_RETRY_AFTER)

    def drain_timeout(self, drain_max_wait: float) -> Rejection:
        """A request held by a drain for longer than drain_max_wait."""
        msg = (
            f"The model server stayed drained for more than {_seconds(drain_max_wait)}; "
            "retry in a few seconds."
        )
        return self._reject(503, "drain_timeout", msg, DRAIN_RETRY_AFTER)

    def breaker(self, left: float, why: str) -> Rejection:
        """The session's breaker is open for another `left` seconds."""
        msg = f"Requests of this session are paused for another {_seconds(left)} ({why}); retry after that."
        return self._reject(429, "session_breaker", msg, left)
