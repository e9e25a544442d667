"""What the known-answer check knows of one target: its baseline's state, the last verdict, the tokens it
spent (the budget's window) and its counters."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from .baseline import Baseline
from .identity import ModelIdentity
from .scoring import PromptScore
from .verdict import Verdict

LEARNING, LEARNT, PINNED = "learning", "learnt", "pinned"
OUTCOMES = ("ok", "diverged", "skipped", "error")
BUDGET_WINDOW = 60.0  # seconds: max_tokens_per_minute is over the last minute


@dataclass
class TargetIntegrity:
    """One target's known-answer state (for the checker, the metrics and top/targets/API)."""

    state: str = LEARNING  # learning | learnt | pinned
    identity: ModelIdentity | None = None
    baseline: Baseline | None = None
    last: Verdict | None = None  # the last periodic check's verdict
    known: Verdict | None = None  # the last verdict that could tell (ok not None) against this baseline
    last_check: float | None = None  # wall-clock time of the last check that probed
    tokens_total: int = 0
    checks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    passes: list[tuple[PromptScore, ...]] = field(default_factory=list)  # while learning
    spent: deque[tuple[float, int]] = field(default_factory=deque)  # (when, tokens) in the budget window
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    def forget_baseline(self) -> None:
        """Learn again: the model changed, or the prompts the baseline was learnt from did."""
        self.baseline, self.state, self.passes, self.known = None, LEARNING, [], None

    def spent_in_window(self, now: float) -> int:
        """Tokens spent in the last BUDGET_WINDOW seconds."""
        while self.spent and self.spent[0][0] <= now - BUDGET_WINDOW:
            self.spent.popleft()
        return sum(n for _, n in self.spent)

    def spend(self, now: float, scores: tuple[PromptScore, ...]) -> None:
        """Count what a probe cost."""
        tokens = sum(s.tokens for s in scores)
        self.tokens_total += tokens
        self.spent.append((now, tokens))

    def count(self, outcome: str) -> None:
        """Count one check by its outcome (ok, diverged, skipped, error); learning probes are not checks."""
        self.checks[outcome] += 1
