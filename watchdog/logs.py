"""Logging: structured JSON lines, or plain text on a TTY; secrets masked and sizes bounded on the way out.

Every line is bounded (`RedactFilter`): the message and each field are cut at `MAX_FIELD_CHARS` with a
"…(N bytes)" marker, a traceback at `MAX_TRACEBACK_CHARS`, so a target that sends a 4 MiB label name cannot
write megabytes per line. A warning that would repeat at every scrape goes through `Recurring`: logged when
its condition starts or changes and once when it clears, with one summary of every condition that holds
every few minutes.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from .redact import Redactor

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName", "color_message"}
MAX_FIELD_CHARS = 512  # the message and every string field of a line
MAX_TRACEBACK_CHARS = 8192
MAX_ITEMS = 64  # of a list or mapping field
_MAX_DEPTH = 6  # of nested fields
_PRE_CUT = (
    16  # redaction sees at most this many times the kept length, so that a secret cut at the end is gone
)
_MARKER = re.compile(r"…\((\d+) bytes\)\Z")


def bound(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """`text` cut to `limit` characters with a "…(N bytes)" marker giving its whole size; short text as is."""
    if len(text) <= limit:
        return text
    m = _MARKER.search(text, len(text) - 32)  # already cut once: keep the first size
    size = int(m.group(1)) if m else len(text.encode("utf-8", "surrogatepass"))
    return f"{text[:limit]}…({size} bytes)"


def _trimmed(value: Any, limit: int, items: int = MAX_ITEMS, depth: int = 0) -> Any:
    """Strings bounded, lists and mappings cut to `items`, nesting to _MAX_DEPTH; other values as they are."""
    if isinstance(value, str):
        return bound(value, limit)
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    if depth >= _MAX_DEPTH:
        return "…"
    if isinstance(value, Mapping):
        out = {
            _trimmed(k, limit, items, depth + 1) if isinstance(k, str) else k: _trimmed(
                v, limit, items, depth + 1
            )
            for _, (k, v) in zip(range(items), value.items(), strict=False)
        }
        if len(value) > items:
            out["…"] = f"{len(value)} items"
        return out
    if isinstance(value, (list, tuple)):
        kept = [_trimmed(v, limit, items, depth + 1) for v in value[:items]]
        return [*kept, f"…({len(value)} items)"] if len(value) > items else kept
    return bound(str(value), limit)


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class RedactFilter(logging.Filter):
    """Masks secrets in a record's message, its `extra=` fields and its traceback, then bounds their sizes;
    drops nothing.

    It sits on the handler, so it sees every record that is written, whichever logger it came from. The
    shape rules (`--api-key X`, URL passwords, `Bearer X`) hold from the start; the config's known values
    arrive with `use_secrets`. Masking comes before cutting, so a cut never leaves half a secret behind.
    """

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor or Redactor()

    def _clean(self, value: Any, limit: int) -> Any:
        masked = self.redactor.value(_trimmed(value, limit * _PRE_CUT))
        return _trimmed(masked, limit, MAX_ITEMS + 1)  # lists and mappings are cut already, with their marker

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; always keep it."""
        record.msg, record.args = self._clean(record.getMessage(), MAX_FIELD_CHARS), None
        for key, value in _extras(record).items():
            setattr(record, key, self._clean(value, MAX_FIELD_CHARS))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._clean(record.exc_text, MAX_TRACEBACK_CHARS)
        return True


def use_secrets(values: Iterable[str]) -> None:
    """Mask these values (the config's secrets: `redact.config_secrets`) in every line from now on."""
    redactor = Redactor.of(values)
    for handler in logging.getLogger().handlers:
        for f in handler.filters:
            if isinstance(f, RedactFilter):
                f.redactor = redactor


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        """Render a record as JSON."""
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_extras(record))
        if record.exc_text:  # set (and redacted) by RedactFilter
            out["exc"] = record.exc_text
        elif record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """Human-readable lines with the extra fields appended as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        """Render a record as text."""
        base = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} {record.getMessage()}"
        extra = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        text = f"{base} {extra}" if extra else base
        if record.exc_text:
            text += "\n" + record.exc_text
        elif record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup(level: str = "info", stream: TextIO | None = None, fmt: str = "auto") -> None:
    """Configure the root logger once; fmt is auto, json or text."""
    stream = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    handler.addFilter(RedactFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


MAX_CHANGES = 4  # "changed" lines per episode: an error that flips between a few texts is not news each time


def span(seconds: float) -> str:
    """A duration as an operator reads it: 45s, 5m12s, 2h03m."""
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class Episode:
    """One key's condition while it holds: since when, what it is now, and what was already logged."""

    state: Hashable
    since: float
    message: str
    extra: dict[str, Any]  # the latest occurrence's fields (its error text, for the summary)
    seen: set[Hashable] = field(default_factory=set)  # states logged in this episode
    repeats: int = 0  # occurrences since the last summary


Summary = Callable[[Mapping[Hashable, Episode], float], str]


def default_summary(episodes: Mapping[Hashable, Episode], now: float) -> str:
    """`2 conditions hold: scrape failed (dead: connection refused, 5m12s); ...`."""
    parts = []
    for ep in episodes.values():
        who = ep.extra.get("target") or ep.extra.get("job") or ""
        error = ep.extra.get("error") or ep.state
        parts.append(f"{ep.message} ({who}: {error}, {span(now - ep.since)})")
    return f"{len(parts)} conditions hold: " + "; ".join(parts)


class Recurring:
    """Logs a condition that recurs at every scrape or probe on its transitions only: once when it starts
    (with the error), once when its state changes to one not seen in this episode (at most `MAX_CHANGES`),
    once when it clears (with how long it held); and while any condition holds, one summary line of all
    of them every `every` seconds, never a line per occurrence.

    `state` decides what counts as a change (an error's kind or text, not a sample count); `summary` words
    the periodic line; `clock` is injected, so tests play hours of failures in milliseconds.
    """

    def __init__(
        self,
        logger: logging.Logger,
        every: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        summary: Summary = default_summary,
    ) -> None:
        self.logger = logger
        self.every = every
        self.clock = clock
        self.summary = summary
        self._episodes: dict[Hashable, Episode] = {}
        self._summarised = 0.0  # when the last summary was logged, or the first condition of a spell began

    @property
    def episodes(self) -> Mapping[Hashable, Episode]:
        """The conditions that hold now."""
        return self._episodes

    def failed(self, key: Hashable, state: Hashable, message: str, extra: Mapping[str, Any]) -> None:
        """The condition holds for `key` once more."""
        now = self.clock()
        ep = self._episodes.get(key)
        if ep is None:
            if not self._episodes:
                self._summarised = now
            self._episodes[key] = Episode(state, now, message, dict(extra), {state})
            self.logger.warning(message, extra=dict(extra))
        else:
            ep.repeats += 1
            previous, ep.extra, ep.message = ep.extra, dict(extra), message
            if state != ep.state and state not in ep.seen and len(ep.seen) < MAX_CHANGES:
                ep.seen.add(state)
                was = {"was": previous.get("error", ep.state)}
                self.logger.warning(f"{message} (changed)", extra={**extra, **was})
            ep.state = state
        if now - self._summarised >= self.every:
            self._summarised = now
            self.logger.warning(self.summary(self._episodes, now), extra={"summary": _summary_fields(self)})

    def recovered(self, key: Hashable, message: str, extra: Mapping[str, Any]) -> None:
        """The condition no longer holds for `key`: one line if it held until now, else nothing."""
        ep = self._episodes.pop(key, None)
        if ep is not None:
            held = self.clock() - ep.since
            summary = {"failing_for_seconds": round(held, 1), "failing_for": span(held)}
            self.logger.info(message, extra={**extra, **summary})

    def forget(self, key: Hashable) -> None:
        """Drop `key` silently (its source is gone)."""
        self._episodes.pop(key, None)


def _summary_fields(rec: Recurring) -> list[dict[str, Any]]:
    now = rec.clock()
    return [
        {**ep.extra, "message": ep.message, "failing_for_seconds": round(now - ep.since, 1)}
        for ep in rec.episodes.values()
    ]
