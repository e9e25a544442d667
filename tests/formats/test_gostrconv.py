"""strconv.ParseFloat: Go's spellings of infinity and NaN, hex floats, and its underscore rule as an option."""

from __future__ import annotations

import math

import pytest

from vllm_watchdog.formats.gostrconv import parse_float


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e3", 1000.0),
        (".5", 0.5),
        ("+Inf", math.inf),
        ("-infinity", -math.inf),
        ("0x1p-2", 0.25),
        ("0x_1p1", 2.0),
        ("1_000", 1000.0),
    ],
)
def test_what_go_reads(text: str, value: float) -> None:
    assert parse_float(text) == value


@pytest.mark.parametrize("text", ["", "abc", "+nan", "0x1", "1 ", "_1", "1__0", "1_", "\u0661"])
def test_what_go_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="invalid syntax"):
        parse_float(text)


def test_nan_and_out_of_range() -> None:
    assert math.isnan(parse_float("NaN"))
    with pytest.raises(ValueError, match="value out of range"):
        parse_float("1e400")


def test_underscores_refused_when_asked() -> None:
    with pytest.raises(ValueError, match="invalid syntax"):
        parse_float("1_000", underscores=False)
    assert parse_float("1000", underscores=False) == 1000.0
