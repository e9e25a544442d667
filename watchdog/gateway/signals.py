"""Per-session signals from OpenAI bodies and vLLM `usage`: cache hits, context growth, tool-call loops."""

from __future__ import annotations

import hashlib
import heapq
import json
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping

from .snapshot import SessionStats

OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions")  # the bodies we parse for signals

ANONYMOUS = "anonymous"  # the session of requests without a key
OTHER = "other"  # the row that sums every session not exported by name
_RESERVED = (ANONYMOUS, OTHER)

_KEY = b'"usage"'
_TAIL = len(_KEY) - 1  # bytes kept across a chunk border so that a split key is still seen
_MAX_BODY = 1024 * 1024  # non-streaming bodies kept for the usage parse; beyond it we scan like a stream
_MAX_PENDING = 4096  # a usage object split across chunks is kept up to this size
_MAX_KEYS = 64  # usage keys looked at in one chunk (a stream may carry "usage": null in every event)
_MAX_TOKENS = 1 << 32  # larger token counts are garbage
_MAX_TOOL_CALLS = 64  # tool calls hashed per request
_RESCALE = 256.0  # half-lives after which the forward-decay weights are renormalised
_DECODER = json.JSONDecoder()

_OFF, _JSON, _SCAN = 0, 1, 2  # RequestTrace modes: no signals, buffered JSON body, scanned stream


def parse_json_body(body: bytes, content_type: str | None) -> dict[str, object] | None:
    """The body as a JSON object; None for another content type, invalid JSON or another JSON value."""
    if content_type:
        media = content_type.partition(";")[0].strip().lower()
        if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
            return None
    if not body:
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


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


def _label(session: str) -> str:
    """The session's label; sessions named like our own rows get a "~" (no sanitised key ends with one)."""
    return session + "~" if session in _RESERVED or session.endswith("~") else session


def _tokens(value: object) -> int | None:
    """A token count, or None for anything that is not a plausible one (bools, floats, negatives, huge)."""
    if type(value) is int and 0 <= value <= _MAX_TOKENS:
        return value
    return None


def _usage_at(data: bytes, k: int) -> tuple[dict[str, object] | None, bool]:
    """The usage object after the key at k, and False when the data ends before the object can be judged."""
    n = len(data)
    i = k + len(_KEY)
    while i < n and data[i] in b" \t":
        i += 1
    if i >= n:
        return None, False
    if data[i] != 0x3A:  # not ':', so a string value "usage", not the key
        return None, True
    i += 1
    while i < n and data[i] in b" \t":
        i += 1
    if i >= n:
        return None, False
    if data[i] != 0x7B:  # not '{': null or garbage
        return None, True
    eol = data.find(b"\n", i)
    text = data[i : eol if eol >= 0 else n].decode("utf-8", "replace")
    try:
        value, _ = _DECODER.raw_decode(text)
    except (ValueError, RecursionError):
        return None, eol >= 0 or n - k > _MAX_PENDING
    return (value if isinstance(value, dict) else None), True


class _Session:
    """Everything remembered about one session."""

    def __init__(self, name: str, window: int, signatures: int) -> None:
        self.name = name
        self.score = 0.0  # forward-decayed request count (see SessionSignals)
        self.last_seen = 0.0
        self.in_flight = 0
        self.evicted = False
        # [requests, prompt, completion, cached]: lifetime totals, totals at the last stats(), and the
        # increments attributed to this session's own series (the rest went to "other")
        self.totals = [0, 0, 0, 0]
        self.seen = [0, 0, 0, 0]
        self.exported = [0, 0, 0, 0]
        self.steps: deque[tuple[int, int]] = deque(maxlen=window)  # (prompt, cached or -1 if not reported)
        self.win_prompt = 0  # sums over the steps that reported cached tokens
        self.win_cached = 0
        self.sigs: deque[str] = deque()
        self.sig_limit = signatures
        self.sig_counts: dict[str, int] = {}
        self.freq: dict[int, int] = {}  # count -> signatures seen that many times, so the max is O(1)
        self.repeats = 0

    def add_step(self, prompt: int, cached: int) -> None:
        """Remember one request's prompt and cached tokens (cached -1: not reported)."""
        steps = self.steps
        if len(steps) == steps.maxlen:
            old_prompt, old_cached = steps[0]
            if old_cached >= 0:
                self.win_prompt -= old_prompt
                self.win_cached -= old_cached
        steps.append((prompt, cached))
        if cached >= 0:
            self.win_prompt += prompt
            self.win_cached += cached

    def add_signature(self, sig: str) -> None:
        """Count one tool-call signature in the recent window."""
        counts, freq = self.sig_counts, self.freq
        if len(self.sigs) >= self.sig_limit:
            old = self.sigs.popleft()
            c = counts[old]
            _bump(freq, c, -1)
            if c > 1:
                counts[old] = c - 1
                _bump(freq, c - 1, 1)
            else:
                del counts[old]
            if c == self.repeats and c not in freq:
                self.repeats = c - 1
        self.sigs.append(sig)
        c = counts.get(sig, 0) + 1
        counts[sig] = c
        if c > 1:
            _bump(freq, c - 1, -1)
        _bump(freq, c, 1)
        self.repeats = max(self.repeats, c)

    def ratio(self) -> float | None:
        """Cached over prompt tokens across the recent steps that reported cached tokens."""
        return self.win_cached / self.win_prompt if self.win_prompt > 0 else None

    def growth(self) -> float | None:
        """Mean prompt_tokens change per step over the recent steps (the differences telescope)."""
        steps = self.steps
        return (steps[-1][0] - steps[0][0]) / (len(steps) - 1) if len(steps) >= 2 else None


def _move(s: _Session, dest: list[int]) -> None:
    """Add the session's increments since the last move to `dest` (its own series or "other")."""
    dest[:] = [d + t - seen for d, t, seen in zip(dest, s.totals, s.seen, strict=True)]
    s.seen = s.totals.copy()


def _bump(freq: dict[int, int], count: int, delta: int) -> None:
    n = freq.get(count, 0) + delta
    if n:
        freq[count] = n
    else:
        freq.pop(count, None)


class RequestTrace:
    """One request's signals; the proxy feeds it the upstream response bytes as they pass."""

    __slots__ = ("_done", "_finish", "_mode", "_parts", "_pending", "_size", "_tail", "_usage")

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
        self._tail = b""
        self._pending: bytes | None = None
        self._usage: dict[str, object] | None = None
        self._done = False
        self.set_content_type(content_type)

    def set_content_type(self, content_type: str | None) -> None:
        """The response's Content-Type, once known: text/event-stream is scanned, anything else buffered."""
        if content_type is None or self._mode == _OFF or self._parts or self._pending or self._usage:
            return
        self._mode = _SCAN if "event-stream" in content_type.lower() else _JSON

    def feed(self, chunk: bytes) -> None:
        """Look at one chunk of the response body (cheap unless it carries usage)."""
        mode = self._mode
        if mode == _SCAN:
            if self._pending is None and not self._tail and _KEY not in chunk:
                if not chunk.endswith(b"\n"):
                    self._tail = chunk[-_TAIL:]
                return
            self._scan(chunk)
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
        pieces = [parts[-2][-_TAIL:]] if len(parts) >= 2 else []
        pieces += [*parts[-1:], chunk]
        for piece in pieces:
            self.feed(piece)

    def _scan(self, chunk: bytes) -> None:
        tail, pending = self._tail, self._pending
        self._tail, self._pending = b"", None
        if pending is not None:
            data = pending + chunk
            if b"}" not in chunk and b"\n" not in chunk and len(data) <= _MAX_PENDING:
                self._pending = data  # the object cannot have ended yet: spare the parse
                return
        elif tail and (len(chunk) < _TAIL or _KEY in tail + chunk[:_TAIL]):
            data = tail + chunk
        else:
            data = chunk
        end = len(data)
        for _ in range(_MAX_KEYS):
            k = data.rfind(_KEY, 0, end)
            if k < 0:
                break
            usage, complete = _usage_at(data, k)
            if usage is not None:
                self._usage = usage  # the last complete usage wins; a later cut-off one may replace it
                break
            if not complete and self._pending is None and len(data) - k <= _MAX_PENDING:
                self._pending = data[k:]
            end = k
        if self._pending is None and not data.endswith(b"\n"):
            self._tail = data[-_TAIL:]

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
            else:
                usage = self._usage
        self._parts, self._pending, self._usage = [], None, None
        self._finish(usage)


class SessionSignals:
    """Per-session counters and signals; the top-K sessions by recent traffic by name, the rest as "other"."""

    def __init__(
        self,
        *,
        top_k: int = 10,
        max_sessions: int = 10_000,
        window: int = 32,
        monotonic: Callable[[], float] = time.monotonic,
        signatures: int = 256,
        half_life: float = 60.0,
        active: float = 300.0,
    ) -> None:
        if top_k < 0 or max_sessions < 1 or window < 2 or signatures < 1 or half_life <= 0 or active < 0:
            raise ValueError(
                "need top_k >= 0, max_sessions >= 1, window >= 2, signatures >= 1, half_life > 0"
            )
        self.top_k = top_k
        self.max_sessions = max_sessions
        self.window = window
        self.signatures = signatures
        self.active = active  # "other" gauges summarise the sessions seen this recently
        self._monotonic = monotonic
        self._rate = 1.0 / half_life
        # Forward decay: a request at t weighs 2^((t - epoch)/half_life), so stored scores rank sessions by
        # decayed traffic without touching the idle ones; the epoch moves before the weights overflow.
        self._epoch = monotonic()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently started first
        self._busy: set[_Session] = set()  # sessions with requests in flight
        self._dirty: set[_Session] = set()  # counters changed since the last stats()
        self._top: set[_Session] = set()  # exported by name at the last stats()
        self._top_lost = False  # one of them was evicted: rank every session next time
        self._other = [0, 0, 0, 0]  # increments of sessions not exported by name when they were counted

    def start(
        self,
        session: str | None,
        path: str,
        body: Mapping[str, object] | None,
        streaming: bool,
        content_type: str | None = None,
    ) -> RequestTrace:
        """Count a request of the session (None: "anonymous") and return its trace; finish() must follow."""
        name = ANONYMOUS if session is None else _label(session)
        now = self._monotonic()
        s = self._sessions.get(name)
        if s is None:
            if len(self._sessions) >= self.max_sessions:
                self._evict()
            s = self._sessions[name] = _Session(name, self.window, self.signatures)
        else:
            self._sessions.move_to_end(name)
        e = (now - self._epoch) * self._rate
        if e > _RESCALE:
            self._rescale(now)
            e = 0.0
        s.score += 2.0**e
        s.last_seen = now
        s.totals[0] += 1
        s.in_flight += 1
        self._busy.add(s)
        self._dirty.add(s)
        tracked = path in OPENAI_PATHS
        if tracked and body is not None:
            for sig in tool_call_signatures(body):
                s.add_signature(sig)

        def finish(usage: Mapping[str, object] | None) -> None:
            self._record(s, usage)

        return RequestTrace(finish, streaming, content_type, tracked)

    def _record(self, s: _Session, usage: Mapping[str, object] | None) -> None:
        if s.in_flight > 0:
            s.in_flight -= 1
        if s.in_flight == 0:
            self._busy.discard(s)
        if usage is None:
            return
        prompt = _tokens(usage.get("prompt_tokens"))
        completion = _tokens(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        cached = _tokens(details.get("cached_tokens")) if isinstance(details, dict) else None
        if completion is not None:
            s.totals[2] += completion
        if prompt is not None:
            s.totals[1] += prompt
            if cached is not None and cached <= prompt:
                s.totals[3] += cached
            else:
                cached = -1
            s.add_step(prompt, cached)
        if s.evicted:
            _move(s, self._other)
        else:
            self._dirty.add(s)

    def _evict(self) -> None:
        """Forget the least recently started session, preferring one with nothing in flight."""
        victim = None
        for i, s in enumerate(self._sessions.values()):
            if s.in_flight == 0:
                victim = s
                break
            if i >= 8:
                break
        if victim is None:
            victim = next(iter(self._sessions.values()))
        del self._sessions[victim.name]
        victim.evicted = True
        _move(victim, self._other)
        self._dirty.discard(victim)
        if victim in self._top:
            self._top.discard(victim)
            self._top_lost = True

    def _rescale(self, now: float) -> None:
        factor = 2.0 ** (-(now - self._epoch) * self._rate)
        for s in self._sessions.values():
            s.score *= factor
        self._epoch = now

    def stats(
        self, in_flight: Mapping[str, int] | None = None, breakers: Iterable[str] = ()
    ) -> tuple[tuple[SessionStats, ...], int]:
        """Rows for the top-K sessions by decayed traffic, then "other" if any; and the sessions tracked.

        `in_flight` (session -> count, e.g. the gate's) overrides our own count for the sessions it names;
        `breakers` names the sessions whose breaker is open.
        """
        now = self._monotonic()
        if self._top_lost:
            candidates: Iterable[_Session] = self._sessions.values()
            self._top_lost = False
        else:
            # idle sessions keep their stored score, so only the last top and the active ones can rank
            candidates = self._top | self._dirty
        top = heapq.nlargest(self.top_k, candidates, key=lambda s: (s.score, s.name))
        top_set = set(top)
        other = self._other
        for s in self._dirty:
            _move(s, s.exported if s in top_set else other)
        self._dirty.clear()
        self._top = top_set
        flights = {_label(k): v for k, v in in_flight.items()} if in_flight is not None else {}
        broken = {_label(b) for b in breakers}
        names = {s.name for s in top}
        rows = [
            SessionStats(
                session=s.name,
                requests_total=s.exported[0],
                in_flight=flights.get(s.name, s.in_flight),
                prompt_tokens_total=s.exported[1],
                completion_tokens_total=s.exported[2],
                cached_tokens_total=s.exported[3],
                prefix_cache_hit_ratio=s.ratio(),
                context_growth_tokens=s.growth(),
                tool_call_repeats=s.repeats,
                breaker_open=s.name in broken,
            )
            for s in top
        ]
        rest_in_flight = sum(v for k, v in flights.items() if k not in names)
        rest_in_flight += sum(s.in_flight for s in self._busy if s not in top_set and s.name not in flights)
        rest_broken = any(b not in names for b in broken)
        if len(self._sessions) > len(top) or any(other) or rest_in_flight or rest_broken:
            rows.append(self._other_row(now, top_set, rest_in_flight, rest_broken))
        return tuple(rows), len(self._sessions)

    def _other_row(self, now: float, top: set[_Session], in_flight: int, broken: bool) -> SessionStats:
        """The "other" row: summed counters; gauges over the sessions not in `top` seen within `active`."""
        prompt = cached = repeats = 0
        growth: float | None = None
        since = now - self.active
        for s in reversed(self._sessions.values()):
            if s.last_seen < since:
                break
            if s in top:
                continue
            prompt += s.win_prompt
            cached += s.win_cached
            repeats = max(repeats, s.repeats)
            if len(s.steps) >= 2:
                g = s.growth()
                if growth is None or (g is not None and g > growth):
                    growth = g
        o = self._other
        return SessionStats(
            session=OTHER,
            requests_total=o[0],
            in_flight=in_flight,
            prompt_tokens_total=o[1],
            completion_tokens_total=o[2],
            cached_tokens_total=o[3],
            prefix_cache_hit_ratio=cached / prompt if prompt > 0 else None,
            context_growth_tokens=growth,
            tool_call_repeats=repeats,
            breaker_open=broken,
        )
