"""Tests for vllm_watchdog.sources.exposition, including differential tests against prometheus_client."""

from __future__ import annotations

import math
import pickle
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Timestamp

from vllm_watchdog.sources.exposition import ExpositionError, find_line, iter_samples, parse, parse_series

pytestmark = pytest.mark.spread  # pure functions over generated text: any worker may run any of them

FIXTURE = Path(__file__).parent.parent / "fixtures" / "vllm-0.32.0-metrics.txt"

Key = tuple[str, tuple[tuple[str, str], ...], object, object]


def _value_key(value: float) -> object:
    """NaN never equals itself; compare it as a marker instead."""
    return "NaN" if math.isnan(value) else float(value)


def _ours(text: str) -> list[Key]:
    """Our samples, with timestamps in the library's unit (float seconds)."""
    return [
        (name, tuple(sorted(labels.items())), _value_key(v), None if ts is None else ts / 1000)
        for name, labels, v, ts in parse(text)
    ]


def _library_ts(ts: object) -> float | None:
    """The library gives seconds as a float (int / 1000) or, in some versions, a Timestamp."""
    if ts is None:
        return None
    if isinstance(ts, Timestamp):
        return ts.sec + ts.nsec / 1e9
    assert isinstance(ts, float | int)
    return float(ts)


def _library(text: str) -> list[Key]:
    """The reference parser's samples, in the same shape as _ours."""
    return [
        (s.name, tuple(sorted(s.labels.items())), _value_key(s.value), _library_ts(s.timestamp))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


# --- unit tests -----------------------------------------------------------------------------


def test_simple_payload() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        "\n"
        "up 1\n"
    )
    assert parse(text) == [
        ("vllm:num_requests_running", {"engine": "0", "model_name": "m"}, 3.0, None),
        ("up", {}, 1.0, None),
    ]
    assert list(iter_samples(text)) == [
        ('vllm:num_requests_running{engine="0",model_name="m"}', 3.0, None),
        ("up", 1.0, None),
    ]


@pytest.mark.parametrize(
    ("rendered", "value"),
    [
        (r"a\\b", "a\\b"),
        (r"say \"hi\"", 'say "hi"'),
        (r"two\nlines", "two\nlines"),
        (r"\\n", "\\n"),
        (r"\\\"", '\\"'),
        (r"x}y", "x}y"),
        (r"a,b=c d", "a,b=c d"),
        (r"{}", "{}"),
        ("", ""),
        ("ünïcödé 模型 \u2028\x85\r", "ünïcödé 模型 \u2028\x85\r"),
    ],
)
def test_label_value_escapes(rendered: str, value: str) -> None:
    text = f'm{{a="{rendered}",b="z"}} 1\n'
    assert parse(text) == [("m", {"a": value, "b": "z"}, 1.0, None)]
    assert _ours(text) == _library(text)


def test_brace_and_comma_inside_value_keep_raw_series_exact() -> None:
    text = 'x{a="}, 1 2 3",b="}"} 7 1700000000123\n'
    assert list(iter_samples(text)) == [('x{a="}, 1 2 3",b="}"}', 7.0, 1700000000123)]
    assert parse_series('x{a="}, 1 2 3",b="}"}') == ("x", {"a": "}, 1 2 3", "b": "}"})


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("NaN", math.nan),
        ("nan", math.nan),
        ("+Inf", math.inf),
        ("Inf", math.inf),
        ("-Inf", -math.inf),
        ("-1.5e-3", -0.0015),
        ("1E+10", 1e10),
        ("+7", 7.0),
        ("-0", -0.0),
        (".5", 0.5),
        ("12345678901234567890", 12345678901234567890.0),
    ],
)
def test_values(token: str, expected: float) -> None:
    [(name, labels, value, ts)] = parse(f"x {token}\n")
    assert (name, labels, ts) == ("x", {}, None)
    if math.isnan(expected):
        assert math.isnan(value)
    else:
        assert value == expected
        assert math.copysign(1, value) == math.copysign(1, expected)


def test_timestamps_are_integer_milliseconds() -> None:
    text = 'a 1 1700000000123\nb{x="y"} 2 -5\nc 3\t0\n'
    assert [s[3] for s in parse(text)] == [1700000000123, -5, 0]
    lib = [s.timestamp for f in text_string_to_metric_families(text) for s in f.samples]
    assert [round((_library_ts(t) or 0.0) * 1000) for t in lib] == [1700000000123, -5, 0]


def test_whitespace_crlf_and_comments() -> None:
    text = (
        "# a comment\r\n"
        "#\r\n"
        "   # indented comment\r\n"
        "\t\r\n"
        '  x \t{ a = "1" ,\tb="2" , }\t 4.5 \t 99 \r\n'
        "y\t5\r\n"
        "z{} 6\r\n"
        "w{ } 7"
    )
    assert parse(text) == [
        ("x", {"a": "1", "b": "2"}, 4.5, 99),
        ("y", {}, 5.0, None),
        ("z", {}, 6.0, None),
        ("w", {}, 7.0, None),
    ]
    assert next(iter_samples(text))[0] == 'x \t{ a = "1" ,\tb="2" , }'
    assert _ours(text) == _library(text)


def test_trailing_comma_and_names() -> None:
    assert parse_series('x{a="b",}') == ("x", {"a": "b"})
    assert parse_series("_:a:b_0") == ("_:a:b_0", {})
    assert parse_series('vllm:x_total{_a="",B9="1"}') == ("vllm:x_total", {"_a": "", "B9": "1"})
    # '__' label names are reserved for Prometheus but well-formed; only __name__ is refused.
    assert parse_series('x{__meta="1"}') == ("x", {"__meta": "1"})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("9x", "invalid metric name"),
        ("x-y", "invalid metric name"),
        ('{a="b"}', "invalid metric name"),
        ('x{a="b"', "unterminated label block"),
        ("x{", "unterminated label block"),
        ('x{9a="b"}', "invalid label name"),
        ('x{a:b="c"}', "expected '='"),
        ("x{a}", "expected '='"),
        ("x{a=b}", "must start with"),
        ('x{a="b}', "unterminated label value"),
        ('x{a="\\t"}', "invalid escape"),
        ('x{a="\\"}', "unterminated label value"),
        ('x{a="b\nc"}', "unescaped newline"),
        ('x{a="b" c="d"}', "expected ','"),
        ('x{a="b"x}', "expected ','"),
        ('x{a="b",,}', "invalid label name"),
        ('x{,a="b"}', "invalid label name"),
        ("x{,}", "invalid label name"),
        ('x{a="b",a="c"}', "duplicate label name"),
        ('x{__name__="c"}', "reserved label name"),
    ],
)
def test_parse_series_errors(raw: str, message: str) -> None:
    with pytest.raises(ExpositionError, match=message) as info:
        parse_series(raw)
    assert info.value.line == 0


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("up", "missing value"),
        ('x{a="b"}', "missing value"),
        ("up one", "invalid value"),
        ("up 1_000", "invalid value"),
        ("up \u0661", "invalid value"),
        ("up 0x10", "invalid value"),
        ("up 1 2.5", "invalid timestamp"),
        ("up 1 NaN", "invalid timestamp"),
        ("up 1 99999999999999999999", "invalid timestamp"),
        ("up 1 2 3", "unexpected text"),
        ('x{a="b" 1', "unterminated label block"),
        ("x{ 1", "unterminated label block"),
        ('x{a="b"}} 1', "expected ','"),
        ('x{a="\\q"} 1', "invalid escape"),
        ("9up 1", "invalid metric name"),
        ("up{} 1 2 #", "unexpected text"),
    ],
)
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_errors_carry_line_number(bad_line: str, message: str, newline: str) -> None:
    lines = ["# HELP up Up.", "# TYPE up gauge", "up 1", "", 'ok{a="b"} 2', bad_line, "up 3"]
    text = newline.join(lines) + newline
    with pytest.raises(ExpositionError, match=message) as info:
        parse(text)
    assert info.value.line == 6
    assert str(info.value).startswith("line 6: ")


def test_same_bad_line_twice_reports_first() -> None:
    text = 'a 1\nx{a="\\t"} 1\nb 2\nx{a="\\t"} 1\n'
    with pytest.raises(ExpositionError) as info:
        parse(text)
    assert info.value.line == 2
    assert find_line(text, 'x{a="\\t"}') == 2
    assert find_line(text, "b") == 3
    assert find_line(text, "nope") == 0


def test_error_is_a_picklable_value_error() -> None:
    assert issubclass(ExpositionError, ValueError)
    exc = ExpositionError(12, "invalid label value: 'x'")
    assert str(exc) == "line 12: invalid label value: 'x'"
    again = pickle.loads(pickle.dumps(exc))
    assert (again.line, again.message, str(again)) == (12, exc.message, str(exc))


def test_registry_rendering_with_hostile_label_values() -> None:
    reg = CollectorRegistry()
    hostile = ['a"b', "c\\d", "e\nf", "}", ",", "=", " ", "", "模型", 'x="y",z="w"}']
    gauge = Gauge("vllm:hostile", "Hostile labels.", ["v", "model_name"], registry=reg)
    for i, v in enumerate(hostile):
        gauge.labels(v=v, model_name=f"m{i}").set(i - 3.5)
    hist = Histogram("vllm:lat_seconds", "Latency.", ["model_name"], registry=reg)
    hist.labels(model_name='q"}').observe(0.3)
    text = generate_latest(reg).decode()
    assert _ours(text) == _library(text)
    got = {labels["v"] for name, labels, _, _ in parse(text) if name == "vllm:hostile"}
    assert got == set(hostile)


@pytest.mark.parametrize("fixture", [FIXTURE, FIXTURE.with_name("vllm-0.32.0-specdecode-metrics.txt")])
def test_real_vllm_fixture_matches_library_exactly(fixture: Path) -> None:
    text = fixture.read_text(encoding="utf-8")
    ours = _ours(text)
    assert len(ours) > 400
    assert ours == _library(text)
    names = {key[0] for key in ours}
    assert "vllm:num_requests_running" in names
    # The hot path sees each series once per scrape: the raw text is a unique cache key.
    raws = [raw for raw, _, _ in iter_samples(text)]
    assert len(set(raws)) == len(raws) == len(ours)


# --- differential property test against prometheus_client -----------------------------------

_METRIC_NAMES = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True)
# The library refuses '__'-prefixed label names (reserved), so do not generate them.
_LABEL_NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda s: not s.startswith("__")
)
_LABEL_VALUES = st.text(
    st.one_of(
        st.characters(exclude_categories=["Cs"]),
        st.sampled_from('\\"\n}{,= \t#\r'),
    ),
    max_size=12,
)
_BLANKS = st.sampled_from([" ", "\t", "  ", " \t"])
_OPT_BLANKS = st.sampled_from(["", "", "", " ", "\t "])


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def _value_tokens(draw: st.DrawFn) -> str:
    """A value as some exporter could write it."""
    kind = draw(st.sampled_from(["repr", "e", "int", "special"]))
    if kind == "int":
        return str(draw(st.integers(-(10**20), 10**20)))
    if kind == "special":
        return draw(st.sampled_from(["NaN", "+Inf", "-Inf", "Inf", "nan", "-0", "+0.5", "1e-3"]))
    f = draw(st.floats(allow_nan=True, allow_infinity=True))
    return repr(f) if kind == "repr" else f"{f:.6E}"


@st.composite
def _sample_lines(draw: st.DrawFn, name: str) -> str:
    labels = draw(st.dictionaries(_LABEL_NAMES, _LABEL_VALUES, max_size=4))
    empty_block, trailing_comma = draw(st.booleans()), draw(st.booleans())

    def sep() -> str:
        return draw(_OPT_BLANKS)

    series = name
    if labels or empty_block:
        pairs = [f'{sep()}{k}{sep()}={sep()}"{_escape(v)}"{sep()}' for k, v in labels.items()]
        trailing = "," + sep() if labels and trailing_comma else ""
        series += f"{sep()}{{{','.join(pairs)}{trailing}}}"
    line = series + draw(_BLANKS) + draw(_value_tokens())
    if draw(st.booleans()):
        line += draw(_BLANKS) + str(draw(st.integers(-(2**63), 2**63 - 1)))
    return draw(_OPT_BLANKS) + line + draw(_OPT_BLANKS)


@st.composite
def _payloads(draw: st.DrawFn) -> str:
    lines: list[str] = []
    for _ in range(draw(st.integers(0, 5))):
        family = draw(_METRIC_NAMES)
        if draw(st.booleans()):
            help_text = draw(st.text(max_size=20)).replace("\\", "\\\\").replace("\n", "\\n")
            lines.append(f"# HELP {family} {help_text}")
        if draw(st.booleans()):
            # The library renames the samples of a counter whose name lacks _total (its data
            # model), so declare counters only for *_total families.
            types = ["gauge", "untyped", "summary", "histogram"]
            types += ["counter"] if family.endswith("_total") else []
            lines.append(f"# TYPE {family} {draw(st.sampled_from(types))}")
        suffixes = st.sampled_from(["", "", "_bucket", "_count", "_sum", "_created"])
        for _ in range(draw(st.integers(0, 4))):
            name = family + draw(suffixes) if draw(st.booleans()) else draw(_METRIC_NAMES)
            lines.append(draw(_sample_lines(name)))
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(["", "# a comment", "#", "  ", "# x\ty"])))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    return newline.join(lines) + draw(st.sampled_from(["", newline]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_payloads())
def test_differential_against_prometheus_client(text: str) -> None:
    ours = _ours(text)
    assert Counter(ours) == Counter(_library(text))
    assert len(ours) == sum(1 for _ in iter_samples(text))


# --- garbage fuzz: return or raise ExpositionError, nothing else ------------------------------


def _check_garbage(text: str) -> None:
    try:
        parse(text)
    except ExpositionError as exc:
        assert 1 <= exc.line <= text.count("\n") + 1
        assert str(exc).startswith(f"line {exc.line}: ")


_ALPHABET = st.sampled_from([*'x{}=",\\ \t\n\r#1.eE+-_aINf:', "\u0661", "\xa0", "\x0b"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(_ALPHABET, max_size=60)))
def test_garbage_text(text: str) -> None:
    _check_garbage(text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_bytes(data: bytes) -> None:
    _check_garbage(data.decode("utf-8", errors="replace"))
    _check_garbage(data.decode("latin-1"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_payloads(), st.data())
def test_mutated_valid_payloads(text: str, data: st.DataObject) -> None:
    chars = list(text)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(chars)))
        delete = data.draw(st.booleans())
        if chars and delete:
            del chars[min(pos, len(chars) - 1)]
        else:
            chars.insert(pos, data.draw(_ALPHABET))
    _check_garbage("".join(chars))


# --- documented differences from prometheus_client (see the module docstring) ---------------


@pytest.mark.parametrize(
    "text",
    [
        'x{a:b="c"} 1',  # label names have no colons in the spec; the library takes them
        'x{a="\\t"} 1',  # a lone backslash must be escaped; the library keeps \t verbatim
        'x{,a="b"} 1',  # the grammar has no leading comma; the library skips it
        "x{,} 1",
        "up 1 2.5",  # timestamps are int64 ms; the library takes floats...
        "up 1 NaN",  # ... and NaN
        "up 1 2 3",  # the library silently takes the last token as the timestamp
        "up 1 9223372036854775808",  # out of int64
        "up \u0661",  # Go's ParseFloat takes ASCII only; Python's float() takes any digit
        '{__name__="x"} 1',  # 0.0.4 requires the name before '{' (no UTF-8 names)
        '{"my.metric"} 1',
    ],
)
def test_stricter_than_library(text: str) -> None:
    with pytest.raises(ExpositionError) as info:
        parse(text)
    assert info.value.line == 1


def test_laxer_than_library() -> None:
    # Comments are skipped whatever they hold (the library validates HELP/TYPE lines), and
    # '__'-prefixed label names are well-formed (reserved for Prometheus, refused by the library).
    assert parse("# TYPE\n# HELP 9bad x\nup 1\n") == [("up", {}, 1.0, None)]
    assert parse('x{__meta="1"} 2') == [("x", {"__meta": "1"}, 2.0, None)]
    # The library renames a counter's samples to *_total (its data model); we keep the text.
    assert parse("# TYPE foo counter\nfoo 1\n") == [("foo", {}, 1.0, None)]
