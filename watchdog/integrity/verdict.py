"""The known-answer check's verdict: what one check of a target's answers concluded."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """One known-answer check: right, wrong, or cannot tell (None), with the numbers behind it."""

    ok: bool | None  # None: cannot tell (no baseline yet, paused/asleep, probe failed)
    divergence: float  # nats, max |Δ logprob| over the reference tokens; nan if unknown
    tolerance: float  # nats
    greedy_mismatches: int  # greedy tokens that differ where the baseline had no near-tie
    reason: str  # one line for audit and logs, never prompt text


def unknown(reason: str, tolerance: float = math.nan) -> Verdict:
    """A verdict that cannot tell (no baseline, paused, probe failed), with its reason."""
    return Verdict(ok=None, divergence=math.nan, tolerance=tolerance, greedy_mismatches=0, reason=reason)
