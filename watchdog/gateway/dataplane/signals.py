"""Per-session signals from OpenAI bodies and vLLM `usage`: cache hits, context growth, tool-call loops."""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping

from ..protocol.snapshot import SessionStats
from .bodies import OPENAI_PATHS, RequestTrace, tool_call_signatures

ANONYMOUS = "anonymous"  # the session of requests without a key
OTHER = "other"  # the row that sums every session not exported by name
_RESERVED = (ANONYMOUS, OTHER)

_MAX_TOKENS = 1 << 32  # larger token counts are garbage
MAX_CYCLE = 3  # a loop may cycle through up to this many different steps
_RESCALE = 256.0  # half-lives after which the forward-decay weights are renormalised


def _label(session: str) -> str:
    """The session's label; sessions named like our own rows get a "~" (no sanitised key ends with one)."""
    return session + "~" if session in _RESERVED or session.endswith("~") else session


def _tokens(value: object) -> int | None:
    """A token count, or None for anything that is not a plausible one (bools, floats, negatives, huge)."""
    if type(value) is int and 0 <= value <= _MAX_TOKENS:
        return value
    return None


class _Session:
    """Everything remembered about one session."""

    def __init__(self, name: str, window: int, loop_window: int) -> None:
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
        # (when, prompt, cached or -1 if not reported), when on the monotonic clock
        self.steps: deque[tuple[float, int, int]] = deque(maxlen=window)
        self.win_prompt = 0  # sums over the steps that reported cached tokens
        self.win_cached = 0
        self.calls: deque[tuple[float, tuple[str, ...]]] = deque(maxlen=loop_window)  # (when, tool calls)
        self.repeats = 0

    def add_step(self, now: float, prompt: int, cached: int) -> None:
        """Remember one request's prompt and cached tokens (cached -1: not reported)."""
        if len(self.steps) == self.steps.maxlen:
            self._drop_step()
        self.steps.append((now, prompt, cached))
        if cached >= 0:
            self.win_prompt += prompt
            self.win_cached += cached

    def _drop_step(self) -> None:
        _, old_prompt, old_cached = self.steps.popleft()
        if old_cached >= 0:
            self.win_prompt -= old_prompt
            self.win_cached -= old_cached

    def add_calls(self, now: float, sigs: tuple[str, ...]) -> None:
        """Remember the tool calls of one agent step (the newest assistant message of a request; none: ())."""
        self.calls.append((now, sigs))
        self.repeats = _current_repeats([c for _, c in self.calls])

    def age(self, since: float) -> None:
        """Forget the steps taken before `since`: a session that went quiet stops matching."""
        while self.steps and self.steps[0][0] < since:
            self._drop_step()
        if self.calls and self.calls[0][0] < since:
            while self.calls and self.calls[0][0] < since:
                self.calls.popleft()
            self.repeats = _current_repeats([c for _, c in self.calls])

    def forget(self) -> None:
        """Start the step windows over (lifetime counters stay)."""
        self.steps.clear()
        self.calls.clear()
        self.win_prompt = self.win_cached = self.repeats = 0

    def ratio(self) -> float | None:
        """Cached over prompt tokens across the recent steps that reported cached tokens."""
        return self.win_cached / self.win_prompt if self.win_prompt > 0 else None

    def growth(self) -> float | None:
        """Mean prompt_tokens change per step over the recent steps (the differences telescope)."""
        steps = self.steps
        return (steps[-1][1] - steps[0][1]) / (len(steps) - 1) if len(steps) >= 2 else None


def _move(s: _Session, dest: list[int]) -> None:
    """Add the session's increments since the last move to `dest` (its own series or "other")."""
    dest[:] = [d + t - seen for d, t, seen in zip(dest, s.totals, s.seen, strict=True)]
    s.seen = s.totals.copy()


def _current_repeats(calls: list[tuple[str, ...]]) -> int:
    """How many times the newest step's tool calls, or the newest cycle of up to MAX_CYCLE steps, came back to
    back, counting back from the newest step: a loop repeats itself, and a different step ends it. An agent
    that re-runs its tests between different edits does not loop; steps without tool calls are no loop of
    their own (0 if every step lacks them)."""
    n = len(calls)
    best = 0
    for period in range(1, min(MAX_CYCLE, n) + 1):
        if not any(calls[n - period :]):
            continue
        run = 0  # steps equal to the one `period` before, in a row, ending at the newest
        while run + period < n and calls[n - 1 - run] == calls[n - 1 - run - period]:
            run += 1
        best = max(best, run // period + 1)
    return best


class SessionSignals:
    """Per-session counters and signals; the top-K sessions by recent traffic by name, the rest as "other"."""

    def __init__(
        self,
        *,
        top_k: int = 10,
        max_sessions: int = 10_000,
        window: int = 32,
        monotonic: Callable[[], float] = time.monotonic,
        loop_window: int = 32,
        half_life: float = 60.0,
        active: float = 300.0,
        max_age: float = 300.0,
    ) -> None:
        if (
            top_k < 0
            or max_sessions < 1
            or window < 2
            or loop_window < 2
            or half_life <= 0
            or active < 0
            or not max_age > 0
        ):
            raise ValueError(
                "need top_k >= 0, max_sessions >= 1, window >= 2, loop_window >= 2, half_life > 0, "
                "max_age > 0"
            )
        self.top_k = top_k
        self.max_sessions = max_sessions
        self.window = window
        self.loop_window = loop_window
        self.active = active  # "other" gauges summarise the sessions seen this recently
        # Signals age with time as well as with the session's own steps: a step older than this no longer
        # counts, so a session that went quiet (or was refused by its breaker) stops matching.
        self.max_age = max_age
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
            s = self._sessions[name] = _Session(name, self.window, self.loop_window)
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
            s.add_calls(now, tuple(tool_call_signatures(body)))  # a step without tool calls ends a loop too

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
            s.add_step(self._monotonic(), prompt, cached)
        if s.evicted:
            _move(s, self._other)
        else:
            self._dirty.add(s)

    def settle(self, session: str) -> None:
        """A breaker opened for the session: its step windows start over, so its alerts resolve while the
        breaker is open and only what it does afterwards counts toward its next offence."""
        s = self._sessions.get(_label(session))
        if s is not None:
            s.forget()

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
        for s in top:
            s.age(now - self.max_age)
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
            s.age(now - self.max_age)
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
