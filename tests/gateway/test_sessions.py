"""Session keys, priority classes, token buckets and the bounded per-session table, with injected time."""

from __future__ import annotations

import hashlib

import pytest

from tests.support.clock import Clock
from vllm_watchdog.gateway.config import PriorityConfig, SessionConfig
from vllm_watchdog.gateway.dataplane.sessions import (
    SessionLimits,
    TokenBucket,
    api_key_of,
    priority_of,
    session_key,
)

SECRET = "sk-live-abcdef0123456789"


def test_session_key_header_first_then_user_then_api_key() -> None:
    body = {"user": "alice", "messages": []}
    assert session_key("agent-7", body, SECRET) == "agent-7"
    assert session_key(None, body, SECRET) == "alice"
    assert session_key("   ", body, SECRET) == "alice"  # blank header falls through
    assert session_key(None, {"user": "  "}, None) is None
    assert session_key(None, None, None) is None
    assert session_key(None, {"user": 42}, None) is None  # not a str
    assert session_key(None, {"user": ""}, None) is None


def test_session_key_hashes_api_key_and_never_contains_it() -> None:
    key = session_key(None, {"user": ["x"]}, SECRET)
    assert key == "key-" + hashlib.sha256(SECRET.encode()).hexdigest()[:12]
    assert key is not None and SECRET not in key and "abcdef0123" not in key
    assert session_key(None, None, "other") != key
    assert session_key(None, None, "") is None


def test_session_key_sanitises() -> None:
    assert session_key("  a b\r\nc\x00d ", None, None) == "a_b__c_d"
    assert session_key("user@example.com/run:1-2_3.4", None, None) == "user@example.com/run:1-2_3.4"
    long = session_key("x" * 500, None, None)
    assert long == "x" * 64
    assert session_key("é☃\"'<>{}", None, None) == "________"
    weird = session_key(None, {"user": "bob\nSet-Cookie: a=b"}, None)
    assert weird == "bob_Set-Cookie:_a_b"  # ":" is allowed, CR/LF and spaces are not


def test_api_key_of() -> None:
    assert api_key_of("Bearer sk-1") == "sk-1"
    assert api_key_of("bearer   sk-2  ") == "sk-2"
    assert api_key_of("Basic dXNlcjpwYXNz") is None
    assert api_key_of("Bearer") is None
    assert api_key_of("Bearer   ") is None
    assert api_key_of("") is None
    assert api_key_of(None) is None


def test_priority_of() -> None:
    cfg = PriorityConfig(
        classes=("interactive", "batch"), default="interactive", api_keys={"k-batch": "batch"}
    )
    assert priority_of("batch", None, cfg) == "batch"
    assert priority_of(" Batch ", None, cfg) == "batch"  # case and whitespace forgiven
    assert priority_of("interactive", "k-batch", cfg) == "interactive"  # header wins
    assert priority_of("urgent", "k-batch", cfg) == "batch"  # unknown header -> api key mapping
    assert priority_of(None, "k-batch", cfg) == "batch"
    assert priority_of(None, "other", cfg) == "interactive"
    assert priority_of("nope", None, cfg) == "interactive"
    bad_map = PriorityConfig(classes=("a", "b"), default="b", api_keys={"k": "gone"})
    assert priority_of(None, "k", bad_map) == "b"


def test_token_bucket_starts_full_and_refills() -> None:
    clock = Clock()
    bucket = TokenBucket(2.0, 3, clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    assert bucket.wait_time() == pytest.approx(0.5)
    clock.advance(0.25)
    assert not bucket.take()
    assert bucket.wait_time() == pytest.approx(0.25)
    clock.advance(0.25)
    assert bucket.take()
    clock.advance(100.0)  # capped at burst
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    assert bucket.wait_time() > 0


def test_token_bucket_rejects_nonsense_and_reconfigures() -> None:
    with pytest.raises(ValueError):
        TokenBucket(0.0, 1)
    with pytest.raises(ValueError):
        TokenBucket(1.0, 0)
    clock = Clock()
    bucket = TokenBucket(1.0, 10, clock)
    bucket.reconfigure(1.0, 2)
    assert [bucket.take() for _ in range(3)] == [True, True, False]


def test_limits_rate_and_retry_time() -> None:
    clock = Clock()
    limits = SessionLimits(SessionConfig(rate=1.0, burst=2), monotonic=clock)
    assert limits.take("a") == 0.0
    assert limits.take("a") == 0.0
    wait = limits.take("a")
    assert wait == pytest.approx(1.0)
    assert limits.take("b") == 0.0  # independent
    clock.advance(1.0)
    assert limits.take("a") == 0.0


def test_limits_no_rate_remembers_nothing_idle() -> None:
    limits = SessionLimits(SessionConfig())
    assert limits.take("a") == 0.0
    assert len(limits) == 0
    limits.acquire("a")
    assert len(limits) == 1 and limits.in_flight("a") == 1
    limits.release("a")
    assert len(limits) == 0 and limits.in_flight("a") == 0
    limits.release("a")  # extra release is harmless
    assert limits.in_flight("a") == 0


def test_limits_concurrency_cap() -> None:
    limits = SessionLimits(SessionConfig(max_in_flight=2))
    assert limits.has_room("a")
    limits.acquire("a")
    limits.acquire("a")
    assert not limits.has_room("a") and limits.has_room("b")
    assert limits.in_flight_by_session() == {"a": 2}
    limits.release("a")
    assert limits.has_room("a")
    assert SessionLimits(SessionConfig()).max_in_flight is None


def test_lru_bound_never_evicts_sessions_in_flight() -> None:
    clock = Clock()
    limits = SessionLimits(SessionConfig(rate=1.0, burst=1, max_sessions=3), monotonic=clock)
    limits.acquire("busy")
    for name in ("s1", "s2", "s3", "s4", "s5"):
        limits.take(name)
    assert len(limits) == 3
    assert "busy" in limits and "s5" in limits and "s4" in limits
    assert "s1" not in limits
    # Everything busy: the table grows past the bound rather than forget a count.
    limits.acquire("s4")
    limits.acquire("s5")
    limits.acquire("s6")
    assert len(limits) == 4
    assert limits.in_flight_by_session() == {"busy": 1, "s4": 1, "s5": 1, "s6": 1}
    for name in ("busy", "s4", "s5", "s6"):
        limits.release(name)
    limits.take("s7")
    assert len(limits) == 3 and "s7" in limits


def test_lru_recency_is_refreshed_by_use() -> None:
    clock = Clock()
    limits = SessionLimits(SessionConfig(rate=1.0, burst=1, max_sessions=2), monotonic=clock)
    assert limits.take("a") == 0.0
    limits.take("b")
    assert limits.take("a") > 0  # bucket of "a" is empty and "a" is now the most recent
    limits.take("c")  # evicts "b"
    assert "a" in limits and "b" not in limits
    assert limits.take("a") > 0  # state kept: still empty


def test_limits_apply() -> None:
    clock = Clock()
    limits = SessionLimits(SessionConfig(rate=1.0, burst=5, max_sessions=10), monotonic=clock)
    for name in "abcdef":
        limits.take(name)
    limits.acquire("a")
    limits.apply(SessionConfig(rate=1.0, burst=1, max_sessions=2, max_in_flight=1))
    assert len(limits) == 2 and "a" in limits
    assert not limits.has_room("a")
    assert limits.take("a") == 0.0 and limits.take("a") > 0  # new burst of 1 (tokens capped)
    limits.apply(SessionConfig(rate=None, max_sessions=2))
    assert limits.take("a") == 0.0 and limits.take("a") == 0.0
    assert len(limits) == 1  # only the busy one is kept without buckets
    limits.apply(SessionConfig(rate=2.0, burst=1, max_sessions=2))
    assert limits.take("a") == 0.0 and limits.take("a") == pytest.approx(0.5)
