"""Records the action state database hands out (audit rows, their steps, quarantines, silences) and silence
matchers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ...matchers import Matcher, check_matcher_regex, matches_all

MATCH_OPS = ("=", "!=", "=~", "!~")


@dataclass(frozen=True)
class StepRecord:
    """One step an action went through."""

    step: str
    at: float
    details: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ActionRecord:
    """One row of the audit log; `outcome` is "running" until the action finishes."""

    id: int
    action: str
    type: str
    target: str
    trigger: str
    labels: Mapping[str, str]
    dry_run: bool
    outcome: str
    reason: str
    step: str
    details: Mapping[str, Any]
    started_at: float
    finished_at: float | None
    needed_at: float | None = None  # when the trigger began, if the caller said
    steps: tuple[StepRecord, ...] = ()

    @property
    def need_time(self) -> float:
        """When the action was needed: `needed_at` if known, else when the row was written."""
        return self.started_at if self.needed_at is None else self.needed_at

    def to_json(self) -> dict[str, Any]:
        """The record as the API shows it."""
        doc = asdict(self)
        doc["steps"] = list(doc["steps"])
        return doc


@dataclass(frozen=True)
class Quarantine:
    """A target kept drained because its answers stayed wrong: since when, why, by which action, and how
    many passing known-answer checks in a row it has had since."""

    target: str
    since: float
    reason: str
    action_id: int | None
    passes: int = 0

    def to_json(self) -> dict[str, Any]:
        """The quarantine as the API shows it."""
        return asdict(self)


@dataclass(frozen=True)
class Silence:
    """Actions whose alert labels, plus `action` and `target`, satisfy every matcher do not run."""

    id: str
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float
    comment: str
    created_by: str
    created_at: float
    updated_at: float

    def state(self, now: float) -> str:
        """'pending', 'active' or 'expired', as Alertmanager says."""
        if now >= self.ends_at:
            return "expired"
        return "active" if now >= self.starts_at else "pending"

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether the labels satisfy every matcher."""
        return matches_all(self.matchers, labels)

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """The silence as the API shows it; with `now`, also its state then."""
        doc = asdict(self)
        doc["matchers"] = list(doc["matchers"])
        return doc if now is None else doc | {"state": self.state(now)}


def parse_silence_matchers(raw: Sequence[Mapping[str, Any]]) -> tuple[Matcher, ...]:
    """Matchers from `[{"name", "op", "value"}]` (op defaults to "="); ValueError names the bad one."""
    out = []
    for i, item in enumerate(raw):
        name, op, value = item.get("name"), item.get("op", "="), item.get("value")
        if not isinstance(name, str) or not name or not isinstance(value, str) or op not in MATCH_OPS:
            raise ValueError(f"matcher {i}: want name, op ({' '.join(MATCH_OPS)}) and value, got {item!r}")
        if op in ("=~", "!~"):
            try:
                check_matcher_regex(value)
            except ValueError as exc:
                raise ValueError(f"matcher {i}: {exc}") from None
        out.append(Matcher(name, op, value))
    return tuple(out)
