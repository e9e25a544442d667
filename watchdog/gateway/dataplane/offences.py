"""Repeat offences of sessions: each breaker a session earns is longer than the last, until it stays clean.

The history lives in the gateway process, next to the breakers it lengthens: that process outlives a restart
of the daemon, it sees the breaker end on its own clock, and a daemon that dies between two offences cannot
forget the first. The daemon saves it with the breakers in its action store (as seconds left, like the
breakers) and gives it back to a gateway started afresh, so neither restart resets a session's record.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

MAX_OFFENCES = 64  # doubling more often than this cannot lengthen a capped breaker


@dataclass(frozen=True)
class Escalation:
    """How breakers grow: `base` doubled per repeat offence up to `cap`; forgotten `reset_after` clean."""

    base: float  # seconds, the first offence's breaker
    cap: float  # seconds, the longest breaker (never shorter than base)
    reset_after: float  # seconds after a breaker ends with no new one before the record is forgotten

    def duration(self, offence: int) -> float:
        """The breaker of the n-th offence (1: the first) within a clean period."""
        return min(max(self.base, self.cap), self.base * 2.0 ** min(offence - 1, MAX_OFFENCES))


class Offences:
    """Per session: how many breakers it earned since it was last clean, and when it will be clean again."""

    def __init__(self, max_sessions: int = 10_000) -> None:
        self.max_sessions = max_sessions
        self._records: OrderedDict[str, tuple[int, float]] = OrderedDict()  # session -> (offences, clean at)

    def offend(
        self, session: str, escalation: Escalation, now: float, *, ongoing: bool = False
    ) -> tuple[int, float]:
        """One more offence of `session` at `now` (monotonic): (its number, the breaker's seconds). While its
        breaker is still open (`ongoing`: a second alert about the same behaviour) it is the same offence."""
        count, clean_at = self._records.pop(session, (0, -math.inf))
        if now >= clean_at:
            count = 0
        if not (ongoing and count):
            count = min(count + 1, MAX_OFFENCES)
        seconds = escalation.duration(count)
        self._records[session] = (count, max(clean_at, now + seconds + escalation.reset_after))
        while len(self._records) > self.max_sessions:
            self._records.popitem(last=False)  # the session whose last offence is oldest
        return count, seconds

    def records(self, now: float) -> dict[str, tuple[int, float]]:
        """session -> (offences, seconds until clean) of the sessions not yet clean."""
        for session in [s for s, (_, clean_at) in self._records.items() if clean_at <= now]:
            del self._records[session]
        return {s: (n, clean_at - now) for s, (n, clean_at) in self._records.items()}

    def restore(self, saved: Mapping[str, object], now: float) -> None:
        """Take back records() as JSON (session -> [offences, seconds until clean]); bad ones are ignored."""
        for session, value in saved.items():
            if not (isinstance(value, list) and len(value) == 2):
                continue
            count, left = value
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                continue
            if isinstance(left, bool) or not isinstance(left, (int, float)) or not 0 < left < math.inf:
                continue
            self._records[str(session)] = (min(count, MAX_OFFENCES), now + float(left))
