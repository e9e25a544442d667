"""A fast parser for the Prometheus text exposition format 0.0.4 (what vLLM serves).

`iter_samples` splits each sample line into the raw series text (everything before the value, e.g.
``vllm:num_requests_running{engine="0",model_name="m"}``), the value and the optional timestamp,
without looking inside the label block. The series text repeats on every scrape, so the scraper caches
what `parse_series(raw)` gives by the raw text and only parses labels on a cache miss: `scan` is that
hot path, the same split in one loop with the cache lookup (no generator, a third less CPU). `parse`
does both for every sample (tests and slow paths).

Deliberate differences from ``prometheus_client.parser`` (the format spec decides each one):

* Every ``#`` line is skipped, so malformed ``# HELP``/``# TYPE`` lines are not errors here, and
  counter samples are not renamed to ``*_total`` (the library does that for its data model).
* Only the 0.0.4 grammar: a metric name is required before ``{``, names are not quoted (no
  ``{"utf8.name"}``), label names are ``[a-zA-Z_][a-zA-Z0-9_]*`` (the library also takes colons)
  and may start with ``__`` (reserved for Prometheus' own use, but well-formed; the library
  rejects them), except ``__name__``, which is rejected.
* Only the escapes ``\\\\``, ``\\"`` and ``\\n`` are valid in label values; the library (and
  Prometheus' Go parser) keep any other backslash pair verbatim, but the spec says a backslash
  must itself be escaped. A leading comma (``x{,a="b"}``, ``x{,}``) is an error; a trailing one
  is allowed, as in the spec's grammar.
* Timestamps are int64 milliseconds; the library also takes floats and NaN. More than two tokens
  after the series is an error; the library silently uses the last one as the timestamp.
* Values are Python floats of ASCII text without ``_``, as Prometheus' ``parseFloat`` (the
  library takes non-ASCII digits such as ``\u0661``, and turns ``-0`` into int 0, losing the
  sign). Like the library, overflow such as ``1e999`` gives ±Inf (Go's ``ParseFloat`` reports a
  range error) and ``+NaN`` is accepted (Go rejects a signed NaN).
* Tokens after the series may be separated by any whitespace ``str.split`` knows, not only blanks
  and tabs; this only makes some malformed lines parse.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import NoReturn, TypeVar

__all__ = ["ExpositionError", "find_line", "iter_samples", "parse", "parse_series", "scan"]

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# One label pair and its separator; matched with endpos at the closing brace, so \Z is the brace.
_LABEL_RE = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\[\\"n][^"\\\n]*)*)"[ \t]*(?:,|\Z)'
)
_ESCAPE_RE = re.compile(r"\\[\\\"n]")
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1
T = TypeVar("T")


class ExpositionError(ValueError):
    """Malformed exposition text; carries the 1-based line number."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message

    def __reduce__(self) -> tuple[type[ExpositionError], tuple[int, str]]:
        """Pickle with the constructor's arguments."""
        return (type(self), (self.line, self.message))


def _clip(text: str, limit: int = 80) -> str:
    """Repr of text, shortened for error messages."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def iter_samples(text: str) -> Iterator[tuple[str, float, int | None]]:
    """Yield (raw_series, value, timestamp_ms) per sample line, skipping comments and blanks."""
    lines = text.split("\n")  # not splitlines(): a label value may hold \x85, \u2028, ...
    for full in lines:
        line = full.strip(" \t\r")
        if not line or line[0] == "#":
            continue
        # A label value may hold '}', but the value and timestamp cannot, so the last '}' on a
        # well-formed line closes the label block. Whatever is wrong inside the block is found
        # by parse_series, which the caller runs on a cache miss.
        brace = line.rfind("}") + 1
        if brace:
            series = line[:brace]
            tail = line[brace:]
        elif "{" in line:
            raise ExpositionError(lines.index(full) + 1, f"unterminated label block: {_clip(line)}")
        else:
            series, _, tail = line.replace("\t", " ").partition(" ")
        try:
            value = float(tail)  # the common case: only the value, maybe with blanks around it
        except ValueError:
            yield (series, *_value_and_timestamp(tail, lines, full))
            continue
        if "_" in tail or not tail.isascii():
            raise ExpositionError(lines.index(full) + 1, f"invalid value: {_clip(tail.strip())}")
        yield series, value, None


def scan(
    text: str, handles: dict[str, T], new: Callable[[str], T], skip: T, t_ms: int, lowest: int, highest: int
) -> tuple[list[tuple[T, float, int]], int, int]:
    """The scraper's hot path: what iter_samples yields, each raw series looked up in `handles` (`new(raw)`
    on a miss; its ExpositionError gets the line). Returns (handle, value, timestamp or t_ms) of the samples
    whose handle is not `skip` and whose timestamp, if any, lies in [lowest, highest], in body order; how
    many samples the body has; and how many of them carried a timestamp out of those bounds."""
    lines = text.split("\n")  # the same split and the same checks as iter_samples, line by line
    batch: list[tuple[T, float, int]] = []
    append = batch.append
    get = handles.get
    count = dropped = 0
    for full in lines:
        line = full.strip(" \t\r")
        if not line or line[0] == "#":
            continue
        # The key is the series up to its last '}' (left out: one string copy less per line); a series with no
        # label block cannot hold '{', so the two kinds of key never meet.
        key, brace, tail = line.rpartition("}")
        if not brace:
            if "{" in line:
                raise ExpositionError(lines.index(full) + 1, f"unterminated label block: {_clip(line)}")
            key, _, tail = line.replace("\t", " ").partition(" ")
        ts: int | None = None
        try:
            value = float(tail)
        except ValueError:
            value, ts = _value_and_timestamp(tail, lines, full)
        else:
            if "_" in tail or not tail.isascii():
                raise ExpositionError(lines.index(full) + 1, f"invalid value: {_clip(tail.strip())}")
        count += 1
        handle = get(key)
        if handle is None:
            raw = key + brace
            try:
                handle = handles[key] = new(raw)
            except ExpositionError as exc:
                raise ExpositionError(exc.line or find_line(text, raw), exc.message) from None
        if ts is None:
            if handle is not skip:
                append((handle, value, t_ms))
        elif not lowest <= ts <= highest:
            dropped += 1
        elif handle is not skip:
            append((handle, value, ts))
    return batch, count, dropped


def _value_and_timestamp(tail: str, lines: list[str], full: str) -> tuple[float, int | None]:
    """Parse the 'value [timestamp]' tail of the line full, or raise with its line number."""
    # The first line equal to full is the one being parsed: an earlier copy would have failed.
    tokens = tail.split()
    token = tokens[0] if tokens else ""
    try:
        value = float(token)
    except ValueError:
        value = None
    if value is None or "_" in token or not token.isascii():
        what = "invalid value" if token else "missing value"
        raise ExpositionError(lines.index(full) + 1, f"{what}: {_clip(full.strip())}")
    if len(tokens) == 1:
        return value, None
    if len(tokens) > 2:
        raise ExpositionError(lines.index(full) + 1, f"unexpected text: {_clip(full.strip())}")
    ts_token = tokens[1]
    try:
        ts = int(ts_token)
    except ValueError:
        ts = None
    if ts is None or "_" in ts_token or not ts_token.isascii() or not _I64_MIN <= ts <= _I64_MAX:
        raise ExpositionError(lines.index(full) + 1, f"invalid timestamp: {_clip(full.strip())}")
    return value, ts


def parse_series(raw: str) -> tuple[str, dict[str, str]]:
    """Parse raw series text into (metric_name, labels), undoing the escapes \\\\, \\" and \\n."""
    brace = raw.find("{")
    name = raw if brace < 0 else raw[:brace].rstrip(" \t")
    if _NAME_RE.fullmatch(name) is None:
        raise ExpositionError(0, f"invalid metric name: {_clip(name)}")
    labels: dict[str, str] = {}
    if brace < 0:
        return name, labels
    end = len(raw) - 1
    if end == brace or raw[end] != "}":
        raise ExpositionError(0, f"unterminated label block: {_clip(raw)}")
    pos = brace + 1
    match = _LABEL_RE.match
    while pos < end:
        m = match(raw, pos, end)
        if m is None:
            if raw[pos:end].strip(" \t"):  # only blanks may follow '{' or a trailing comma
                _diagnose(raw, pos, end)
            break
        label, value = m.groups()
        if label in labels or label == "__name__":
            what = "reserved" if label == "__name__" else "duplicate"
            raise ExpositionError(0, f"{what} label name {_clip(label)}: {_clip(raw)}")
        if "\\" in value:
            value = _ESCAPE_RE.sub(lambda e: _ESCAPES[e.group()], value)
        labels[label] = value
        pos = m.end()
    return name, labels


def _diagnose(raw: str, pos: int, end: int) -> NoReturn:
    """Raise an ExpositionError saying why the label pair at raw[pos:end] is malformed."""

    def fail(what: str) -> NoReturn:
        raise ExpositionError(0, f"{what} at character {pos + 1}: {_clip(raw)}")

    def skip_blanks(i: int) -> int:
        while i < end and raw[i] in " \t":
            i += 1
        return i

    pos = skip_blanks(pos)
    m = _LABEL_NAME_RE.match(raw, pos, end)
    if m is None:
        fail("invalid label name")
    pos = skip_blanks(m.end())
    if pos == end or raw[pos] != "=":
        fail("expected '=' after label name")
    pos = skip_blanks(pos + 1)
    if pos == end or raw[pos] != '"':
        fail("label value must start with '\"'")
    pos += 1
    while pos < end and raw[pos] != '"':
        if raw[pos] == "\n":
            fail("unescaped newline in label value")
        if raw[pos] == "\\":
            if pos + 1 >= end or raw[pos + 1] not in '\\"n':
                fail("invalid escape in label value")
            pos += 1
        pos += 1
    if pos >= end:
        fail("unterminated label value")
    pos = skip_blanks(pos + 1)
    fail("expected ',' or '}' after label value")


def find_line(text: str, raw_series: str) -> int:
    """Return the 1-based line of the first sample whose raw series text is raw_series, or 0."""
    for lineno, full in enumerate(text.split("\n"), 1):
        line = full.strip(" \t\r")
        if not line or line[0] == "#" or not line.startswith(raw_series):
            continue
        brace = line.rfind("}") + 1  # the same split as iter_samples
        if (line[:brace] if brace else line.replace("\t", " ").partition(" ")[0]) == raw_series:
            return lineno
    return 0


def parse(text: str) -> list[tuple[str, dict[str, str], float, int | None]]:
    """Fully parse every sample into (metric_name, labels, value, timestamp_ms)."""
    out: list[tuple[str, dict[str, str], float, int | None]] = []
    append = out.append
    for raw, value, ts in iter_samples(text):
        try:
            name, labels = parse_series(raw)
        except ExpositionError as exc:
            raise ExpositionError(find_line(text, raw), exc.message) from None
        append((name, labels, value, ts))
    return out
