"""What the gateway reads from OpenAI bodies as they pass: the JSON request, the tool-call signatures of the
newest agent step, and vLLM's `usage` from a JSON or SSE response, without copying every chunk.

A parsed JSON value costs far more than its text (`{}` is 3 bytes of body and about 70 bytes of dict and list
slot), so a request body's elements are counted before it is parsed, at C speed and without building them,
and a body with more than `max_json_elements` is refused; of a parsed body only the few fields read after
admission are kept (`request_fields`), so the rest is freed before the request waits for a slot.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from json.decoder import scanstring  # type: ignore[attr-defined]  # the C scanner where there is one

from .keyscan import KeyScan
from .specrequests import SpecScan, spec_of

OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions")  # the bodies we parse for signals

_KEY = b'"usage"'
_MAX_BODY = 1024 * 1024  # non-streaming bodies kept for the usage parse; beyond it we scan like a stream
_MAX_TOOL_CALLS = 64  # tool calls hashed per request

_OFF, _JSON, _SCAN = 0, 1, 2  # RequestTrace modes: no signals, buffered JSON body, scanned stream


class TooManyElements(ValueError):
    """A JSON body with more elements than the gateway parses (`max_json_elements`)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the JSON body has more than {limit} elements")
        self.limit = limit


def is_json(content_type: str | None) -> bool:
    """Whether a body of this content type is read as JSON (no content type is taken for JSON)."""
    if not content_type:
        return True
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def parse_json_body(
    body: bytes, content_type: str | None, max_elements: int | None = None
) -> dict[str, object] | None:
    """The body as a JSON object; None for another content type, invalid JSON or another JSON value;
    TooManyElements if it has more than `max_elements` (None: no limit)."""
    if not is_json(content_type):
        return None
    if not body:
        return None
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")  # as json.loads decodes bytes
        if max_elements is not None and not _at_most(text, max_elements):
            raise TooManyElements(max_elements)
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, TooManyElements):
            raise
        return None
    return value if isinstance(value, dict) else None


def _at_most(text: str, limit: int) -> bool:
    """Whether `text` has at most `limit` JSON elements: opened arrays and objects, commas and strings, which
    bound the values and keys json.loads would build. Strings are skipped by the C scanner; the count stops
    at the limit, so its Python loop runs at most `limit` times."""
    count = pos = 0
    find, tally, end = text.find, text.count, len(text)
    while True:
        quote = find('"', pos)
        stop = end if quote < 0 else quote
        count += tally(",", pos, stop) + tally("[", pos, stop) + tally("{", pos, stop) + (quote >= 0)
        if count > limit:
            return False
        if quote < 0:
            return True
        try:
            pos = scanstring(text, quote + 1, True)[1]
        except ValueError:
            return True  # an unterminated or invalid string: json.loads refuses the body without building it


class ElementCounter:
    """Counts a UTF-8 JSON body's elements as its chunks arrive, as `_at_most` counts the whole text (opened
    arrays and objects, commas, strings; nothing inside a string), so that a body over the limit is refused
    after the bytes that took it there, not after reading, decoding and counting all of it. A body in
    another encoding (a NUL in its first bytes: UTF-16 or UTF-32) is left to the check after reading."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.in_string = False
        self.backslashes = 0  # the run of backslashes that ended the last chunk, inside a string
        self.off = False

    def feed(self, chunk: bytes) -> None:
        """Count `chunk`; TooManyElements once the body has more than `limit` elements."""
        if self.off or not chunk:
            return
        if self.count == 0 and not self.in_string and b"\0" in chunk[:4]:
            self.off = True
            return
        pos, end = 0, len(chunk)
        while pos < end:
            if self.in_string:
                pos = self._string_end(chunk, pos)
                continue
            quote = chunk.find(b'"', pos)
            stop = end if quote < 0 else quote
            count = chunk.count
            self.count += count(b",", pos, stop) + count(b"[", pos, stop) + count(b"{", pos, stop)
            if quote < 0:
                pos = end
            else:
                self.count += 1
                self.in_string, self.backslashes, pos = True, 0, quote + 1
        if self.count > self.limit:
            raise TooManyElements(self.limit)

    def _string_end(self, chunk: bytes, pos: int) -> int:
        """Where counting goes on after the string that `pos` is inside of: past its closing quote, or the
        chunk's end (remembering a trailing run of backslashes, which may escape the next chunk's quote)."""
        start = pos
        while (quote := chunk.find(b'"', pos)) >= 0:
            run = quote - start - len(chunk[start:quote].rstrip(b"\\"))
            if run == quote - start:
                run += self.backslashes
            if run % 2 == 0:
                self.in_string = False
                return quote + 1
            pos = quote + 1
            start, self.backslashes = pos, 0
        tail = len(chunk) - start - len(chunk[start:].rstrip(b"\\"))
        self.backslashes = tail + (self.backslashes if tail == len(chunk) - start else 0)
        return len(chunk)


def request_fields(body: bytes, content_type: str | None, max_elements: int) -> dict[str, object] | None:
    """What the gateway reads of a request body after admission (a string `user`, `stream`, and the newest
    assistant message for tool-call signatures); None if the body is not a JSON object; TooManyElements."""
    parsed = parse_json_body(body, content_type, max_elements)
    if parsed is None:
        return None
    fields: dict[str, object] = {"stream": parsed.get("stream") is True}
    user = parsed.get("user")
    if isinstance(user, str):
        fields["user"] = user
    messages = parsed.get("messages")
    if isinstance(messages, list):
        assistant = (m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "assistant")
        newest = next(assistant, None)
        fields["messages"] = [] if newest is None else [newest]
    return fields


def tool_call_signatures(body: Mapping[str, object]) -> list[str]:
    """Signatures (sha256 of name and canonical arguments, hex[:16]) of the last assistant tool calls."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            break
    else:
        return []
    out: list[str] = []
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls[:_MAX_TOOL_CALLS]:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                sig = _signature(function.get("name"), function.get("arguments"))
                if sig is not None:
                    out.append(sig)
    legacy = message.get("function_call")  # the deprecated single-call form
    if not out and isinstance(legacy, dict):
        sig = _signature(legacy.get("name"), legacy.get("arguments"))
        if sig is not None:
            out.append(sig)
    return out


def _signature(name: object, arguments: object) -> str | None:
    if not isinstance(name, str) or not name:
        return None
    if arguments is None:
        canonical = ""
    elif isinstance(arguments, str):
        try:
            canonical = _canonical(json.loads(arguments))
        except (ValueError, TypeError, RecursionError):
            canonical = arguments  # not JSON: the raw string is all we have
    else:
        try:
            canonical = _canonical(arguments)
        except (ValueError, TypeError, RecursionError):
            return None
    text = name + "\x00" + canonical
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


class RequestTrace:
    """One request's signals; the proxy feeds it the upstream response bytes as they pass. After finish(),
    `spec` is the response's metrics.speculative_decoding (specrequests.py), unchecked; None without one."""

    __slots__ = ("_done", "_finish", "_mode", "_parts", "_size", "_spec", "_usage", "spec")

    def __init__(
        self,
        finish: Callable[[Mapping[str, object] | None], None],
        streaming: bool,
        content_type: str | None = None,
        tracked: bool = True,
    ) -> None:
        self._finish = finish
        self._mode = _OFF if not tracked else _SCAN if streaming else _JSON
        self._parts: list[bytes] = []
        self._size = 0
        self._usage = KeyScan(_KEY)
        self._spec = SpecScan()
        self.spec: object = None
        self._done = False
        self.set_content_type(content_type)

    def set_content_type(self, content_type: str | None) -> None:
        """The response's Content-Type, once known: text/event-stream is scanned, anything else buffered."""
        if content_type is None or self._mode == _OFF or self._parts or self._usage.holds():
            return
        self._mode = _SCAN if "event-stream" in content_type.lower() else _JSON

    def feed(self, chunk: bytes) -> None:
        """Look at one chunk of the response body (cheap unless it carries usage)."""
        mode = self._mode
        if mode == _SCAN:
            self._usage.feed(chunk)
            self._spec.feed(chunk)
        elif mode == _JSON:
            size = self._size + len(chunk)
            if size <= _MAX_BODY:
                self._parts.append(chunk)
                self._size = size
            else:
                self._overflow(chunk)

    def _overflow(self, chunk: bytes) -> None:
        """The body is too big to keep: scan its last kept part and the rest like a stream."""
        parts = self._parts
        self._parts, self._size, self._mode = [], 0, _SCAN
        pieces = [parts[-2][-self._usage.tail_size :]] if len(parts) >= 2 else []
        pieces += [*parts[-1:], chunk]
        for piece in pieces:
            self.feed(piece)

    def finish(self, status: int) -> None:
        """Record the request's usage into its session, once; status >= 400 records no usage."""
        if self._done:
            return
        self._done = True
        usage: Mapping[str, object] | None = None
        if status < 400:
            if self._mode == _JSON:
                body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
                obj = parse_json_body(body, None)
                found = obj.get("usage") if obj is not None else None
                usage = found if isinstance(found, dict) else None
                self.spec = spec_of(obj) if obj is not None else None
            else:
                usage = self._usage.found
                self.spec = self._spec.found
        self._parts = []
        self._usage.clear()
        self._finish(usage)
