"""Go's text renderings: strconv floats and quoting, label sets and durations (RFC 3339: tests/formats)."""

from __future__ import annotations

import math

import pytest

from vllm_watchdog.formats.gostrconv import format_float, go_quote
from vllm_watchdog.templates.gofmt import go_labels
from vllm_watchdog.templates.gotime import model_duration, time_duration


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1e+00"),
        (0.0, "0e+00"),
        (-0.0, "-0e+00"),
        (123.456, "1.23456e+02"),
        (1e100, "1e+100"),
        (1.5e-7, "1.5e-07"),
        (-42.0, "-4.2e+01"),
        (0.1, "1e-01"),
        (12345678901234567.0, "1.2345678901234568e+16"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
    ],
)
def test_format_float_e(value: float, text: str) -> None:
    assert format_float(value, "e") == text


def test_promtool_renderings() -> None:
    assert format_float(1.0, "E") == "1E+00"
    assert format_float(0.1 + 0.2, "E") == "3.0000000000000004E-01"
    assert format_float(-1234.5, "E") == "-1.2345E+03"
    assert format_float(math.inf, "E") == "+Inf" and format_float(math.nan, "E") == "NaN"
    assert format_float(1e-300, "E") == "1E-300"
    assert go_labels((("__name__", "x"), ("a", 'q"\n'))) == '{__name__="x", a="q\\"\\n"}'
    assert go_quote("tab\there\x01é") == '"tab\\there\\x01é"'
    assert [model_duration(s) for s in (0, 90, 3600, 86400 * 7, 86400 * 90, 0.25)] == [
        "0s",
        "1m30s",
        "1h",
        "1w",
        "90d",
        "250ms",
    ]
    assert [time_duration(s) for s in (0, 300, 3600, 90.5, 0.25)] == [
        "0s",
        "5m0s",
        "1h0m0s",
        "1m30.5s",
        "250ms",
    ]
