"""Finds the last `"<key>": {...}` object in a response body fed chunk by chunk, without copying every chunk:
vLLM's `usage` (bodies.py) and its per-request `speculative_decoding` metrics (specrequests.py) both come this
way, in a JSON body too large to keep or in a stream's events.

A chunk without the key costs one substring check (plus the last few bytes kept, where a key may be cut by
the chunk border); an object split across chunks is kept up to MAX_PENDING bytes; at most MAX_KEYS keys are
looked at in one chunk (a stream may carry `"usage": null` in every event). `cut`, if given, ends the object
where it appears (what follows is never read: vLLM's "detailed" per-step arrays).
"""

from __future__ import annotations

import json

MAX_PENDING = 4096  # an object split across chunks is kept up to this size
MAX_KEYS = 64  # keys looked at in one chunk
_DECODER = json.JSONDecoder()


class KeyScan:
    """The last complete object after `key` in what was fed (`found`, else None)."""

    __slots__ = ("_cut", "_key", "_pending", "_tail", "found", "tail_size")

    def __init__(self, key: bytes, cut: bytes | None = None) -> None:
        self._key = key
        self._cut = cut
        self.tail_size = len(key) - 1  # bytes kept across a chunk border so that a split key is still seen
        self._tail = b""
        self._pending: bytes | None = None  # from the key on, while its object may be incomplete
        self.found: dict[str, object] | None = None

    def holds(self) -> bool:
        """Whether anything was kept or found yet."""
        return bool(self._pending or self.found)

    def clear(self) -> None:
        """Drop what is kept and found."""
        self._tail, self._pending, self.found = b"", None, None

    def feed(self, chunk: bytes) -> None:
        """Look at one chunk (a substring check unless the key is in it or was cut by the chunk border)."""
        if self._pending is None and not self._tail and self._key not in chunk:
            if not chunk.endswith(b"\n"):
                self._tail = chunk[-self.tail_size :]
            return
        self._scan(chunk)

    def _scan(self, chunk: bytes) -> None:
        tail, pending, key = self._tail, self._pending, self._key
        self._tail, self._pending = b"", None
        if pending is not None:
            data = pending + chunk
            if b"}" not in chunk and b"\n" not in chunk and len(data) <= MAX_PENDING:
                self._pending = data  # the object cannot have ended yet: spare the parse
                return
        elif tail and (len(chunk) < self.tail_size or key in tail + chunk[: self.tail_size]):
            data = tail + chunk
        else:
            data = chunk
        end = len(data)
        for _ in range(MAX_KEYS):
            k = data.rfind(key, 0, end)
            if k < 0:
                break
            value, complete = self._object_at(data, k)
            if value is not None:
                self.found = value  # the last complete one wins; a later cut-off one may replace it
                break
            if not complete and self._pending is None and len(data) - k <= MAX_PENDING:
                self._pending = data[k:]
            end = k
        if self._pending is None and not data.endswith(b"\n"):
            self._tail = data[-self.tail_size :]

    def _object_at(self, data: bytes, k: int) -> tuple[dict[str, object] | None, bool]:
        """The object after the key at k, and False when the data ends before it can be judged."""
        n = len(data)
        i = k + len(self._key)
        while i < n and data[i] in b" \t":
            i += 1
        if i >= n:
            return None, False
        if data[i] != 0x3A:  # not ':', so a string value equal to the key, not the key
            return None, True
        i += 1
        while i < n and data[i] in b" \t":
            i += 1
        if i >= n:
            return None, False
        if data[i] != 0x7B:  # not '{': null or garbage
            return None, True
        eol = data.find(b"\n", i)
        raw = data[i : eol if eol >= 0 else n]
        cut = raw.find(self._cut) if self._cut else -1
        if cut >= 0:
            raw = raw[:cut] + b"}"
        try:
            value, _ = _DECODER.raw_decode(raw.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            return None, cut >= 0 or eol >= 0 or n - k > MAX_PENDING
        return (value if isinstance(value, dict) else None), True
