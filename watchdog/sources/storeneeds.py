"""What the sample store must keep: which metric names the rules read, and how far back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Kept whether or not a rule reads them: the engine_paused rail reads vllm:engine_sleep_state (SLEEP_STATE of
# enginestate.py, written out: `check` reads rule files through this module and must not load httpx), and a
# drain reads the engine's steps and running requests (STEPS and RUNNING of actions/pipeline/progress.py).
_SCRAPE_SERIES = ("up", "scrape_duration_seconds", "scrape_samples_scraped")
_DRAIN_SERIES = ("vllm:iteration_tokens_total_count", "vllm:num_requests_running")
ALWAYS_KEPT = frozenset({*_SCRAPE_SERIES, *_DRAIN_SERIES, "vllm:engine_sleep_state"})


@dataclass(frozen=True)
class StoreNeeds:
    """Which metric names rules read, and how far back; `names` None means every name.

    `lookback_by_name`: the history each named metric needs (the longest of its selectors: a rate over
    [30m] of one name must not keep every other name for 30 minutes). A name read only by a selector
    without a name (names None) or written by a recording rule and never read needs `lookback`.
    """

    names: frozenset[str] | None
    max_lookback: float
    lookback_by_name: Mapping[str, float] = field(default_factory=dict)

    def history(self, name: str, default: float) -> float:
        """Seconds of history to keep for `name`; `default` for a name no selector names."""
        return self.lookback_by_name.get(name, default)

    def kept_names(self, keep_all: bool) -> frozenset[str] | None:
        """The metric names worth storing; None keeps every name (also when no rule reads anything)."""
        if keep_all or self.names is None or not self.names:
            return None
        return self.names | ALWAYS_KEPT


# No rule reads anything: every family is kept, for the lookback (a command that only scrapes, a test).
NO_RULES = StoreNeeds(names=frozenset(), max_lookback=0.0)
