"""Logging: structured JSON lines, or plain text on a TTY; secrets masked on the way out (`RedactFilter`)."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable
from typing import Any, TextIO

from .redact import Redactor

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName", "color_message"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class RedactFilter(logging.Filter):
    """Masks secrets in a record's message, its `extra=` fields and its traceback; drops nothing.

    It sits on the handler, so it sees every record that is written, whichever logger it came from. The
    shape rules (`--api-key X`, URL passwords, `Bearer X`) hold from the start; the config's known values
    arrive with `use_secrets`.
    """

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor or Redactor()

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; always keep it."""
        red = self.redactor
        record.msg, record.args = red.text(record.getMessage()), None
        for key, value in _extras(record).items():
            setattr(record, key, red.value(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = red.text(record.exc_text)
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
    for noisy in ("httpx", "httpcore", "apscheduler", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
