"""RFC 3339 times, both directions, one test per edge rule a caller names."""

from __future__ import annotations

import time

import pytest

from vllm_watchdog.formats.rfc3339 import (
    MICROSECONDS,
    ZERO,
    format_rfc3339,
    micros,
    millis,
    parse_rfc3339,
)

T = 1_700_000_000  # 2023-11-14T22:13:20Z


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (None, "0001-01-01T00:00:00Z"),
        (0, "1970-01-01T00:00:00Z"),
        (1_700_000_000_100, "2023-11-14T22:13:20.1Z"),
        (1_700_000_000_010, "2023-11-14T22:13:20.01Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
    ],
)
def test_milliseconds_lose_trailing_zeros_as_go_marshals_time(ms: int | None, text: str) -> None:
    assert format_rfc3339(ms) == text


def test_fixed_keeps_every_digit_as_strfmt_datetime() -> None:
    assert format_rfc3339(T * 1000 + 250, fixed=True) == "2023-11-14T22:13:20.250Z"
    assert format_rfc3339(T * 1000, fixed=True) == "2023-11-14T22:13:20.000Z"
    assert format_rfc3339(None, fixed=True) == "0001-01-01T00:00:00.000Z"


def test_microseconds_as_a_scrape_time() -> None:
    assert format_rfc3339(micros(T + 0.5), MICROSECONDS) == "2023-11-14T22:13:20.5Z"
    assert format_rfc3339(micros(T + 0.000001), MICROSECONDS) == "2023-11-14T22:13:20.000001Z"
    assert format_rfc3339(None, MICROSECONDS) == ZERO


def test_seconds_to_ticks() -> None:
    assert millis(T + 0.0005) == T * 1000 + 0  # round half to even, as round() does
    assert millis(T + 0.0016) == T * 1000 + 2
    assert micros(-0.5) == -500_000


def test_an_offset_or_z() -> None:
    assert parse_rfc3339("2023-11-14T22:13:20Z") == T
    assert parse_rfc3339("2023-11-14T23:13:20+01:00") == T
    assert parse_rfc3339("2023-11-14T22:13:20.25Z") == T + 0.25


def test_no_zone_is_refused_utc_or_local(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="no zone"):
        parse_rfc3339("2023-11-14T22:13:20")
    assert parse_rfc3339("2023-11-14T22:13:20", no_zone="utc") == T
    monkeypatch.setenv("TZ", "EST5")
    time.tzset()
    try:
        assert parse_rfc3339("2023-11-14T17:13:20", no_zone="local") == T
    finally:
        monkeypatch.undo()
        time.tzset()


def test_lowercase_z() -> None:
    with pytest.raises(ValueError):
        parse_rfc3339("2023-11-14T22:13:20z")
    assert parse_rfc3339("2023-11-14T22:13:20z", lowercase_z=True) == T


def test_require_t() -> None:
    assert parse_rfc3339("2023-11-14 22:13:20Z") == T
    with pytest.raises(ValueError, match="no 'T'"):
        parse_rfc3339("2023-11-14 22:13:20Z", require_t=True)


def test_unix_seconds() -> None:
    with pytest.raises(ValueError):
        parse_rfc3339("1700000000.5")
    assert parse_rfc3339("1700000000.5", unix_seconds=True) == T + 0.5
    assert parse_rfc3339("2023-11-14T22:13:20Z", unix_seconds=True) == T


def test_nanoseconds() -> None:
    text = "2023-11-14T22:13:20.123456789Z"
    assert parse_rfc3339(text) == T + 0.123456
    assert parse_rfc3339(text, nanoseconds=True) == T + 0.123456789
    assert parse_rfc3339("2023-11-14T22:13:20Z", nanoseconds=True) == T


def test_garbage_is_a_value_error() -> None:
    for text in ("", "yesterday", "2023-13-01T00:00:00Z"):
        with pytest.raises(ValueError):
            parse_rfc3339(text, no_zone="utc", unix_seconds=True)
