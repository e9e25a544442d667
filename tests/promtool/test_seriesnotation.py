"""Series notation: metric labels and expanding values, checked by hand and against promtool."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.promtool import promtool_eval
from vllm_watchdog.promtool.series import NotationError, go_number, parse_metric, parse_series, parse_values
from vllm_watchdog.store import is_stale


def test_expanding_notation_from_the_docs() -> None:
    assert parse_values("-2+4x3") == [-2, 2, 6, 10]
    assert parse_values(" 1-2x4") == [1, -1, -3, -5, -7]
    assert parse_values(" 1x4") == [1, 1, 1, 1, 1]
    values = parse_values(" 1 _x3 stale")
    assert values[:4] == [1, None, None, None]
    last = values[4]
    assert last is not None and is_stale(last)


def test_numbers_read_like_go() -> None:
    assert parse_values("1e3 .5 1. 2.5e-1 +3 -Inf +Inf NaN inf")[:7] == [
        1000,
        0.5,
        1,
        0.25,
        3,
        -math.inf,
        math.inf,
    ]
    assert go_number("010") == 8  # Go's ParseInt with base 0 reads a leading zero as octal
    assert go_number("09") == 9  # ... and falls back to ParseFloat when that fails
    assert math.isnan(go_number("NaN"))


def test_increments_accumulate_rounding_like_prometheus() -> None:
    values = parse_values("0.1+0.1x10")
    assert values[-1] == 1.0999999999999999
    assert values[2] == 0.30000000000000004


def test_blanks_and_repetition() -> None:
    assert parse_values("_ _x2 1x0 2") == [None, None, None, 1, 2]
    assert parse_values("") == []
    assert parse_values("  1   2  ") == [1, 2]
    assert parse_values("0x10") == [0] * 11  # not hex: zero, repeated ten more times


@pytest.mark.parametrize("bad", ["1+2", "1x", "foo", "1_", "1x3x4", "1 2x3.0", "Stale", "1e", "1,2"])
def test_invalid_values(bad: str) -> None:
    with pytest.raises(NotationError):
        parse_values(bad)


def test_metrics() -> None:
    assert parse_metric("up{job=\"a\", instance='b',}") == (
        ("__name__", "up"),
        ("instance", "b"),
        ("job", "a"),
    )
    assert parse_metric("") == ()
    assert parse_metric("{}") == ()
    assert parse_metric('{__name__="x:y", a="\\n\\"q\\u00e9"}') == (("__name__", "x:y"), ("a", '\n"qé'))
    assert parse_metric("a{b=`\\d`}") == (("__name__", "a"), ("b", "\\d"))
    assert parse_metric('a{b=""}') == (("__name__", "a"),)
    for bad in ['a{b="c"', 'a{b!="c"}', "a{b=c}", "a b", 'a{"b"="c"}']:
        with pytest.raises(NotationError):
            parse_metric(bad)


def test_series() -> None:
    labels, values = parse_series('m{a="1"}', "1+1x2")
    assert labels == (("__name__", "m"), ("a", "1")) and values == [1, 2, 3]
    with pytest.raises(NotationError):
        parse_series("", "1")


SEQUENCES = [
    "0+1x5",
    "1e3 .5 1. 2.5e-1 +3 -Inf +Inf 010 09",
    "0.1+0.1x10",
    "5-0.3x8",
    "1 _x3 2 _ 3x2",
    "-2+4x3 1-2x4",
    "1e-3+1e-3x6",
]


def test_expansion_matches_promtool() -> None:
    series = {f'seq{{i="{i}"}}': text for i, text in enumerate(SEQUENCES)}
    steps = max(len(parse_values(t)) for t in SEQUENCES)
    cases = [(f'seq{{i="{i}"}} @ {step * 60}', "0s") for i in range(len(SEQUENCES)) for step in range(steps)]
    results = iter(promtool_eval(series, "1m", cases))
    for text in SEQUENCES:
        ours = parse_values(text)
        for step in range(steps):
            want = next(results)
            expected = ours[step] if step < len(ours) else None
            if expected is None:
                # a missing sample: the lookback finds the previous one, or nothing at all
                continue
            assert len(want.samples) == 1, (text, step)
            got = want.samples[0][1]
            assert got == expected or (math.isnan(got) and math.isnan(expected)), (text, step, got, expected)


# The backtracking regex that read a decimal before: hypothesis checks the new one against it on short texts,
# and a 200 kB non-number (20 kB took the old one 52 s, growing with the square) must be refused; a quadratic
# regex would not finish it within the suite's timeout.
OLD_DECIMAL = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
NUMBERS = st.text(alphabet="0123456789.eE+-x_", max_size=10)
SIZE = 200_000


@settings(max_examples=600, deadline=None)
@given(NUMBERS)
def test_numbers_read_as_the_backtracking_regex_did(text: str) -> None:
    if text.isdigit():
        return  # read as an integer first, by no regex
    try:
        go_number(text)
    except ValueError:
        assert OLD_DECIMAL.fullmatch(text) is None
    else:
        assert OLD_DECIMAL.fullmatch(text) is not None


def test_a_200_kb_number_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid syntax"):
        go_number("1" * SIZE + "x")
    assert go_number("1" * 300 + "." + "5" * SIZE) == float("1" * 300 + ".5")
