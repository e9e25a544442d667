"""Fuzz harness: the exposition parser (vllm_watchdog.sources.exposition) against prometheus_client's parser.

What it covers:

* Differential, structured text: whole families as exporters write them (``# HELP`` with escapes, ``# TYPE``
  counter/gauge/untyped/histogram/summary or none, histogram buckets with ``le`` up to ``+Inf`` plus ``_sum``
  and ``_count``, summary quantiles, ``_created`` samples), label values over all of Unicode with the three
  escapes, values as exporters print them (``repr``, ``%E``, integers beyond 2**64, ``NaN``/``+Inf``/``-Inf``
  in several spellings, exponents, signs, ``.5``, ``5.``), int64 millisecond timestamps, blanks and tabs
  around every token, empty label blocks, trailing commas, comments, blank lines, LF or CRLF. Both parsers
  must give the same multiset of samples (name, labels, value with NaN equal to NaN, timestamp).
* Differential, rendered text: random registries (Counter, Gauge, Histogram, Summary, Info, Enum with random
  label names, label values and buckets) rendered by ``prometheus_client.generate_latest``.
* Garbage: arbitrary bytes (decoded as UTF-8 with replacement and as Latin-1), random text over an alphabet of
  the format's own characters, and line- and character-level mutations of generated payloads and of the real
  vLLM fixture. The only exception allowed is ExpositionError; its line is the first bad line (every line
  before it parses, the text up to it fails at it), and the scraper's hot path (scan, parse_series on a cache
  miss) agrees with parse() on the samples or the error line.

What it excludes from the differential, each a documented difference (see vllm_watchdog.sources.exposition):

* Label names starting with ``__`` (the library refuses them; they are well-formed) and label names with
  colons (the library takes them; the 0.0.4 grammar does not). Neither is generated.
* Escapes other than ``\\\\``, ``\\"`` and ``\\n`` in label values, leading commas, float or NaN timestamps,
  more than two tokens after the series, non-ASCII digits and ``_`` in numbers: we reject these, the library
  takes them. Only valid text is generated for the differential.
* A counter declared without ``_total``: the library renames its samples to ``*_total`` (its data model).
  The comparison maps those names back; families are generated so that the mapping is unambiguous.
* HELP and TYPE text: we skip every comment line, so only the samples are compared.
* OpenMetrics and newer text (quoted UTF-8 names, exemplars, ``# EOF``): not the 0.0.4 format vLLM serves.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Enum, Gauge, Histogram, Info, Summary, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Timestamp

from tests.support.fuzzing import fuzz
from vllm_watchdog.sources.exposition import ExpositionError, iter_samples, parse, parse_series, scan

pytestmark = pytest.mark.spread  # pure functions over generated text: any worker may run any of them

FIXTURE = (Path(__file__).parent.parent / "fixtures" / "vllm-0.32.0-metrics.txt").read_text(encoding="utf-8")

Key = tuple[str, tuple[tuple[str, str], ...], object, object]

# --- comparison -------------------------------------------------------------------------------------------


def _value_key(value: float) -> object:
    return "NaN" if math.isnan(value) else float(value)


def ours(text: str) -> list[Key]:
    """Our samples, timestamps in the library's unit (seconds)."""
    return [
        (name, tuple(sorted(labels.items())), _value_key(v), None if ts is None else ts / 1000)
        for name, labels, v, ts in parse(text)
    ]


def _library_ts(ts: object) -> float | None:
    if ts is None:
        return None
    if isinstance(ts, Timestamp):
        return ts.sec + ts.nsec / 1e9
    assert isinstance(ts, float | int)
    return float(ts)


def library(text: str, plain_counters: frozenset[str] = frozenset()) -> list[Key]:
    """The library's samples; a counter declared as NAME (no _total) gets its NAME back."""
    out: list[Key] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name
            if family.type == "counter" and family.name in plain_counters and name == family.name + "_total":
                name = family.name
            out.append((name, tuple(sorted(s.labels.items())), _value_key(s.value), _library_ts(s.timestamp)))
    return out


# --- valid text ---------------------------------------------------------------------------------------------

_NAME = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,10}", fullmatch=True)
_LABEL_NAME = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda s: not s.startswith("__") and s not in ("le", "quantile")
)
_LABEL_VALUE = st.text(
    st.one_of(st.characters(exclude_categories=["Cs"]), st.sampled_from('\\"\n}{,= \t#\r\x85\u2028')),
    max_size=10,
)
_BLANKS = st.sampled_from([" ", "\t", "  ", " \t "])
_OPT = st.sampled_from(["", "", "", " ", "\t"])
_SPECIAL = ["NaN", "nan", "+Inf", "-Inf", "Inf", "inf", "+inf", "-inf", "Infinity", "-infinity"]
_SPECIAL += ["-0", "+0", "0.0", ".5", "5.", "+.5e3", "1e-3", "1E+10", "-1.5e-308", "1e999", "-1e999", "007"]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def value_token(draw: st.DrawFn) -> str:
    """A sample value as some exporter writes it."""
    kind = draw(st.sampled_from(["repr", "E", "g", "int", "special"]))
    if kind == "int":
        return str(draw(st.integers(-(10**25), 10**25)))
    if kind == "special":
        return draw(st.sampled_from(_SPECIAL))
    f = draw(st.floats(allow_nan=True, allow_infinity=True))
    if math.isnan(f) or math.isinf(f):
        return repr(f)  # 'nan', 'inf', '-inf': Go's ParseFloat takes them too
    return repr(f) if kind == "repr" else f"{f:.6E}" if kind == "E" else f"{f:g}"


@st.composite
def sample_line(draw: st.DrawFn, name: str, labels: dict[str, str]) -> str:
    """One sample line with optional blanks everywhere they are allowed and an optional timestamp."""
    series = name
    if labels or draw(st.booleans()):
        pairs = [
            f'{draw(_OPT)}{k}{draw(_OPT)}={draw(_OPT)}"{_escape(v)}"{draw(_OPT)}' for k, v in labels.items()
        ]
        trailing = "," + draw(_OPT) if labels and draw(st.booleans()) else ""
        series += f"{draw(_OPT)}{{{','.join(pairs)}{trailing}}}"
    line = series + draw(_BLANKS) + draw(value_token())
    if draw(st.integers(0, 3)) == 0:
        line += draw(_BLANKS) + str(draw(st.integers(-(2**63), 2**63 - 1)))
    return draw(_OPT) + line + draw(_OPT)


def _le(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(bound)


@st.composite
def family(draw: st.DrawFn, name: str) -> tuple[list[str], bool]:
    """The lines of one family, and whether it is a counter declared without _total."""
    kind = draw(st.sampled_from(["counter", "gauge", "untyped", "histogram", "summary", None]))
    lines: list[str] = []
    if draw(st.booleans()):
        help_text = draw(st.text(st.characters(exclude_categories=["Cs"]), max_size=20))
        lines.append(
            f"# HELP {name} {help_text.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}"
        )
    if kind is not None:
        lines.append(f"# TYPE {name} {kind}")
    label_sets = draw(
        st.lists(st.dictionaries(_LABEL_NAME, _LABEL_VALUE, max_size=3), min_size=1, max_size=3)
    )
    for labels in label_sets:
        if kind == "histogram":
            bounds = draw(st.lists(st.floats(-1e6, 1e6), max_size=5, unique=True))
            for bound in [*sorted(bounds), math.inf]:
                lines.append(draw(sample_line(f"{name}_bucket", {**labels, "le": _le(bound)})))
            lines.append(draw(sample_line(f"{name}_sum", labels)))
            lines.append(draw(sample_line(f"{name}_count", labels)))
        elif kind == "summary":
            for q in draw(
                st.lists(st.sampled_from(["0", "0.5", "0.9", "0.99", "1"]), max_size=3, unique=True)
            ):
                lines.append(draw(sample_line(name, {**labels, "quantile": q})))
            lines.append(draw(sample_line(f"{name}_sum", labels)))
            lines.append(draw(sample_line(f"{name}_count", labels)))
        else:
            lines.append(draw(sample_line(name, labels)))
        if draw(st.integers(0, 4)) == 0:
            lines.append(draw(sample_line(f"{name}_created", labels)))
    return lines, kind == "counter" and not name.endswith("_total")


@st.composite
def payload(draw: st.DrawFn) -> tuple[str, frozenset[str]]:
    """Valid exposition text and the names of its counters declared without _total."""
    # Unique after dropping _total and the suffixes a family adds, so that no two families share a sample
    # name the counter mapping could confuse.
    names = draw(
        st.lists(_NAME, max_size=5, unique_by=lambda n: n.removesuffix("_total").removesuffix("_created"))
    )
    lines: list[str] = []
    plain: set[str] = set()
    for name in names:
        family_lines, is_plain = draw(family(name))
        lines += family_lines
        if is_plain:
            plain.add(name)
        if draw(st.integers(0, 3)) == 0:
            lines.append(draw(st.sampled_from(["", "#", "# a comment", "   ", "# TYPEx y", "#\tHELP"])))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    return newline.join(lines) + draw(st.sampled_from(["", newline])), frozenset(plain)


@fuzz(2)
@given(payload())
@example(('# TYPE c counter\nc{a="1"} 1\n', frozenset({"c"})))
@example(('# TYPE h histogram\nh_bucket{le="+Inf"} 1e999\nh_sum -inf\nh_count 007 -12\n', frozenset()))
def test_structured_text_matches_library(case: tuple[str, frozenset[str]]) -> None:
    text, plain = case
    got = ours(text)
    assert Counter(got) == Counter(library(text, plain))
    assert len(got) == sum(1 for _ in iter_samples(text))


@fuzz(1)
@given(
    payload(), st.integers(-(2**40), 2**41), st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 3)
)
def test_scan_keeps_in_order_what_the_scraper_keeps(
    case: tuple[str, frozenset[str]], t_ms: int, behind: int, ahead: int, parity: int
) -> None:
    """scan against iter_samples and parse_series: the handles it skips, the timestamps out of bounds it
    counts (skipped series' too), body order (a series twice: the store takes them in that order)."""
    text = case[0]
    lowest, highest = t_ms - behind, t_ms + ahead
    skip = ("", {})

    def handle(raw: str) -> tuple[str, dict[str, str]]:
        name, labels = parse_series(raw)
        return skip if len(name) % 4 == parity else (name, labels)

    want, count, dropped = [], 0, 0
    for raw, value, ts in iter_samples(text):
        count += 1
        name_labels = handle(raw)
        if ts is not None and not lowest <= ts <= highest:
            dropped += 1
        elif name_labels is not skip:
            want.append((name_labels, _value_key(value), t_ms if ts is None else ts))
    batch, got_count, got_dropped = scan(text, {}, handle, skip, t_ms, lowest, highest)
    assert [(h, _value_key(v), ts) for h, v, ts in batch] == want
    assert (got_count, got_dropped) == (count, dropped)


# --- text rendered by prometheus_client -----------------------------------------------------------------------

_REG_LABELS = st.lists(_LABEL_NAME, max_size=3, unique=True)
_NUMBERS = st.floats(allow_nan=True, allow_infinity=True)


def _metric(draw: st.DrawFn, kind: str, name: str, labels: list[str], reg: CollectorRegistry) -> object:
    """One collector of the given kind, registered in reg."""
    if kind == "counter":
        return PromCounter(name, "c", labels, registry=reg)
    if kind == "gauge":
        return Gauge(name, "g\\x\ny", labels, registry=reg)
    if kind == "histogram":
        bounds = draw(st.lists(st.floats(-1e9, 1e9), min_size=1, max_size=4, unique=True))
        return Histogram(name, "h", labels, registry=reg, buckets=sorted(bounds))
    if kind == "summary":
        return Summary(name, "s", labels, registry=reg)
    if kind == "info":
        return Info(name, "i", labels, registry=reg)
    states = draw(st.lists(_LABEL_VALUE, min_size=1, max_size=3, unique=True))
    return Enum(name, "e", labels, registry=reg, states=states)


def _record(draw: st.DrawFn, metric: object, labels: list[str]) -> None:
    """Give one child of metric (a fresh label-value set) a value."""
    child = metric.labels(*(draw(_LABEL_VALUE) for _ in labels)) if labels else metric  # type: ignore[attr-defined]
    if isinstance(metric, PromCounter):
        child.inc(draw(st.floats(0, 1e300)))
    elif isinstance(metric, Gauge):
        child.set(draw(_NUMBERS))
    elif isinstance(metric, Histogram | Summary):
        child.observe(draw(st.floats(-1e9, 1e9)))
    elif isinstance(metric, Info):
        keys = draw(st.lists(_LABEL_NAME.filter(lambda k: k not in labels), max_size=2, unique=True))
        child.info({k: draw(_LABEL_VALUE) for k in keys})
    else:
        child.state(draw(st.sampled_from(child._states)))


@st.composite
def registry_text(draw: st.DrawFn) -> str:
    """A random registry rendered by generate_latest."""
    reg = CollectorRegistry()
    kinds = st.sampled_from(["counter", "gauge", "histogram", "summary", "info", "enum"])
    for i in range(draw(st.integers(0, 4))):
        labels = draw(_REG_LABELS)
        metric = _metric(draw, draw(kinds), f"m{i}:{draw(_LABEL_NAME)}", labels, reg)
        for _ in range(draw(st.integers(1, 3))):
            _record(draw, metric, labels)
    lines = generate_latest(reg).decode("utf-8").split("\n")
    return "\n".join(_fixed_created(line) for line in lines)


def _fixed_created(line: str) -> str:
    """A `*_created` sample with a fixed value: the real one is the wall clock, and an example's text must
    not change between runs (hypothesis replays and shrinks it)."""
    name = line.partition("{")[0].partition(" ")[0]
    return line[: line.rfind(" ")] + " 1700000000.25" if name.endswith("_created") else line


@fuzz(1)
@given(registry_text())
def test_rendered_registry_matches_library(text: str) -> None:
    assert Counter(ours(text)) == Counter(library(text))


# --- garbage: only ExpositionError, at the first bad line -------------------------------------------------------


def hot_path(text: str) -> list[tuple[str, dict[str, str], float, int | None]] | int:
    """What the scraper does: scan, with parse_series on a raw-text cache miss; the error's line."""
    none = -(2**63) - 1  # a timestamp no sample can carry: stands for "no timestamp"
    try:
        batch, count, dropped = scan(text, {}, parse_series, ("", {}), none, -(2**63), 2**63 - 1)
    except ExpositionError as exc:
        return exc.line
    assert count == len(batch) and dropped == 0
    return [(name, dict(labels), value, None if ts == none else ts) for (name, labels), value, ts in batch]


def _same_samples(a: list[tuple[str, dict[str, str], float, int | None]], b: object) -> bool:
    assert isinstance(b, list)
    if len(a) != len(b):
        return False
    return all(
        (x[0], x[1], x[3]) == (y[0], y[1], y[3]) and (x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2])))
        for x, y in zip(a, b, strict=True)
    )


def check_garbage(text: str) -> None:
    """parse() returns or raises ExpositionError at the first bad line; the hot path agrees."""
    lines = text.split("\n")
    try:
        got = parse(text)
    except ExpositionError as exc:
        assert 1 <= exc.line <= len(lines), (exc.line, len(lines))
        assert str(exc).startswith(f"line {exc.line}: ")
        parse("\n".join(lines[: exc.line - 1]))  # everything before the reported line is fine
        try:
            parse("\n".join(lines[: exc.line]))
        except ExpositionError as again:
            assert again.line == exc.line
        else:
            raise AssertionError(f"line {exc.line} alone does not fail") from None
        assert hot_path(text) == exc.line
        return
    assert _same_samples(got, hot_path(text))


_ALPHABET = [*'x{}=",\\ \t\r\n#1.eE+-_aINf:}', "\u0661", "\xa0", "\x0b", "\x85", "\u2028", "\x00", "\ufeff"]
_CHARS = st.one_of(st.sampled_from(_ALPHABET), st.characters(exclude_categories=["Cs"]))


@fuzz(1)
@given(st.one_of(st.text(), st.text(st.sampled_from(_ALPHABET), max_size=80)))
@example('a 1\nx{a="\\t"} 1\nb 2\n')
@example('x{a="b"}\u2028 1\n')
def test_garbage_text(text: str) -> None:
    check_garbage(text)


@fuzz(0.5)
@given(st.binary(max_size=300))
def test_garbage_bytes(data: bytes) -> None:
    check_garbage(data.decode("utf-8", errors="replace"))
    check_garbage(data.decode("latin-1"))


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[str]) -> str:
    """A text after 1-5 line or character edits: insert, delete, replace, duplicate/drop/swap a line, cut."""
    lines = draw(base).split("\n")
    for _ in range(draw(st.integers(1, 5))):
        op = draw(st.sampled_from(["insert", "delete", "replace", "dup", "drop", "swap", "cut"]))
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        j = draw(st.integers(0, len(line)))
        if op == "insert":
            lines[i] = line[:j] + draw(_CHARS) + line[j:]
        elif op == "delete" and line:
            j = min(j, len(line) - 1)
            lines[i] = line[:j] + line[j + 1 :]
        elif op == "replace" and line:
            j = min(j, len(line) - 1)
            lines[i] = line[:j] + draw(_CHARS) + line[j + 1 :]
        elif op == "dup":
            lines.insert(i, line)
        elif op == "drop" and len(lines) > 1:
            del lines[i]
        elif op == "swap":
            k = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[k] = lines[k], lines[i]
        elif op == "cut":
            lines[i] = line[:j]
            del lines[i + 1 :]
    return "\n".join(lines)


_FIXTURE_LINES = FIXTURE.split("\n")


@st.composite
def fixture_slice(draw: st.DrawFn) -> str:
    """A run of up to 40 consecutive lines of the real vLLM payload."""
    start = draw(st.integers(0, len(_FIXTURE_LINES) - 1))
    return "\n".join(_FIXTURE_LINES[start : start + draw(st.integers(1, 40))])


@fuzz(2)
@given(mutated(st.one_of(payload().map(lambda case: case[0]), registry_text(), fixture_slice())))
def test_mutated_valid_text(text: str) -> None:
    check_garbage(text)


def test_whole_fixture_mutated_once_per_line_kind() -> None:
    """Every line of the real payload, with its label block or value broken, fails at that line."""
    lines = FIXTURE.split("\n")
    for i, line in enumerate(lines):
        if not line or line.startswith("#"):
            continue
        broken = line.replace('="', "=", 1) if "{" in line else line + " x"
        text = "\n".join([*lines[:i], broken, *lines[i + 1 :]])
        try:
            parse(text)
        except ExpositionError as exc:
            assert exc.line == i + 1
        else:
            raise AssertionError(f"line {i + 1} broken but parsed: {broken!r}")
