from __future__ import annotations

import pytest

from vllm_watchdog.config.durations import format_duration, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0),
        ("1s", 1),
        ("500ms", 0.5),
        ("1m30s", 90),
        ("1h", 3600),
        ("2d", 172800),
        ("1w", 604800),
        ("1y", 31536000),
        ("1h2m3s4ms", 3723.004),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "1", "1.5s", "s", "1x", "-1s", "1s1m", " 1s"])
def test_parse_duration_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_parse_size() -> None:
    assert parse_size("16MiB") == 16 * 1024 * 1024
    assert parse_size("512KB") == 512 * 1024
    assert parse_size("100") == 100
    with pytest.raises(ValueError, match="size"):
        parse_size("1 parsec")
