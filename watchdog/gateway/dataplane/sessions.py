"""Who a request belongs to (session key, priority class) and the per-session limit state the gate keeps."""

from __future__ import annotations

import hashlib
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from ..config import PriorityConfig, SessionConfig

MAX_KEY_LENGTH = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:@/-]")


def _sanitise(value: str) -> str | None:
    """At most 64 safe characters (others become "_"); None when nothing is left."""
    value = value.strip()[:MAX_KEY_LENGTH]
    return _UNSAFE.sub("_", value) if value else None


def session_key(
    header_value: str | None, body: Mapping[str, object] | None, api_key: str | None
) -> str | None:
    """The session a request belongs to: the header, else the body's `user`, else a hash of the API key."""
    if header_value is not None:
        key = _sanitise(header_value)
        if key is not None:
            return key
    if body is not None:
        user = body.get("user")
        if isinstance(user, str):
            key = _sanitise(user)
            if key is not None:
                return key
    if api_key:
        # Never the key itself: session names end up in metrics, logs and the API.
        return "key-" + hashlib.sha256(api_key.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return None


def api_key_of(authorization: str | None) -> str | None:
    """The bearer token of an Authorization header value ("Bearer X" -> "X"), or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


def priority_of(header_value: str | None, api_key: str | None, config: PriorityConfig) -> str:
    """The request's class: the header if it names a class, else the API key's class, else the default."""
    if header_value is not None:
        wanted = header_value.strip()
        if wanted in config.classes:
            return wanted
        lowered = wanted.lower()
        for cls in config.classes:
            if cls.lower() == lowered:
                return cls
    if api_key is not None:
        mapped = config.api_keys.get(api_key)
        if mapped is not None and mapped in config.classes:
            return mapped
    return config.default


class TokenBucket:
    """A token bucket that starts full: `rate` tokens per second up to `burst`."""

    __slots__ = ("_last", "_monotonic", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: int, monotonic: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError(f"token bucket rate must be > 0, got {rate}")
        if burst < 1:
            raise ValueError(f"token bucket burst must be >= 1, got {burst}")
        self.rate = rate
        self.burst = burst
        self._monotonic = monotonic
        self._tokens = float(burst)
        self._last = monotonic()

    def _refill(self) -> None:
        now = self._monotonic()
        elapsed = now - self._last
        if elapsed > 0:
            self._tokens = min(float(self.burst), self._tokens + elapsed * self.rate)
        self._last = now

    def take(self) -> bool:
        """Take one token if there is one."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def wait_time(self) -> float:
        """Seconds until a token is available (0 if one is available now)."""
        self._refill()
        return 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / self.rate

    def reconfigure(self, rate: float, burst: int) -> None:
        """New rate and burst, keeping the tokens earned so far (capped at the new burst)."""
        if rate <= 0 or burst < 1:
            raise ValueError(f"invalid token bucket rate={rate} burst={burst}")
        self._refill()
        self.rate = rate
        self.burst = burst
        self._tokens = min(self._tokens, float(burst))


class _Entry:
    __slots__ = ("bucket", "in_flight")

    def __init__(self, bucket: TokenBucket | None) -> None:
        self.bucket = bucket
        self.in_flight = 0


class SessionLimits:
    """Per-session rate and concurrency state, least recently seen dropped first beyond `max_sessions`.

    A session with requests in flight is never dropped (its count must come back to zero), so the table can
    exceed `max_sessions` by at most the number of sessions in flight.
    """

    def __init__(self, config: SessionConfig, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._busy: dict[str, _Entry] = {}  # sessions with in_flight > 0
        self._rate = config.rate
        self._burst = config.burst
        self._max_in_flight = config.max_in_flight
        self._max_sessions = max(1, config.max_sessions)

    @property
    def max_in_flight(self) -> int | None:
        """The per-session concurrency cap (None: no cap)."""
        return self._max_in_flight

    def _entry(self, session: str) -> _Entry:
        entry = self._entries.get(session)
        if entry is not None:
            self._entries.move_to_end(session)
            return entry
        if len(self._entries) >= self._max_sessions:
            self._evict(self._max_sessions - 1)
        entry = _Entry(TokenBucket(self._rate, self._burst, self._monotonic) if self._rate else None)
        self._entries[session] = entry
        return entry

    def _evict(self, keep: int) -> None:
        while len(self._entries) > keep:
            victim = next((name for name, e in self._entries.items() if e.in_flight == 0), None)
            if victim is None:
                return  # every remembered session is busy
            del self._entries[victim]

    def take(self, session: str) -> float:
        """Spend one request of the session's rate: 0.0 if allowed, else seconds until the next token."""
        if not self._rate:
            return 0.0
        bucket = self._entry(session).bucket
        if bucket is None or bucket.take():
            return 0.0
        return max(bucket.wait_time(), 1e-3)

    def has_room(self, session: str) -> bool:
        """Whether the session is below its concurrency cap."""
        if self._max_in_flight is None:
            return True
        entry = self._busy.get(session)
        return entry is None or entry.in_flight < self._max_in_flight

    def in_flight(self, session: str) -> int:
        """The session's requests admitted and not yet released."""
        entry = self._busy.get(session)
        return 0 if entry is None else entry.in_flight

    def acquire(self, session: str) -> None:
        """Count one more request of the session in flight."""
        entry = self._entry(session)
        entry.in_flight += 1
        self._busy[session] = entry

    def release(self, session: str) -> None:
        """Count one request of the session finished."""
        entry = self._busy.get(session)
        if entry is None:
            return
        entry.in_flight -= 1
        if entry.in_flight <= 0:
            entry.in_flight = 0
            del self._busy[session]
            if entry.bucket is None:
                # Nothing left worth remembering; keeps the table small when there is no rate limit.
                self._entries.pop(session, None)

    def in_flight_by_session(self) -> dict[str, int]:
        """Sessions with requests in flight -> how many."""
        return {name: e.in_flight for name, e in self._busy.items()}

    def apply(self, config: SessionConfig) -> None:
        """Take new limits: buckets are reconfigured in place, in-flight counts kept."""
        self._max_in_flight = config.max_in_flight
        self._max_sessions = max(1, config.max_sessions)
        if config.rate != self._rate or config.burst != self._burst:
            self._rate = config.rate
            self._burst = config.burst
            for name, entry in list(self._entries.items()):
                if config.rate:
                    if entry.bucket is None:
                        entry.bucket = TokenBucket(config.rate, config.burst, self._monotonic)
                    else:
                        entry.bucket.reconfigure(config.rate, config.burst)
                else:
                    entry.bucket = None
                    if entry.in_flight == 0:
                        del self._entries[name]
        self._evict(self._max_sessions)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session: object) -> bool:
        return session in self._entries
