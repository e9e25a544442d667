"""Comparing a probe's scores with a baseline: the divergence in nats and the greedy tokens, near ties apart.

divergence = max |Δ logprob| over every teacher-forced token of every prompt. A greedy token that differs
counts only where the baseline's margin between its best two candidates at the first differing token is
greater than 2 x tolerance; under that the two candidates nearly tie, and noise may pick either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .verdict import Verdict


@dataclass(frozen=True)
class PromptScore:
    """What one prompt's answer scored: the text's per-token logprobs and the greedy tokens."""

    name: str
    logprobs: tuple[float, ...]  # every token of prompt + reference after the first, teacher forced
    greedy: tuple[str, ...]  # the greedy continuation's tokens
    margins: tuple[float, ...]  # top-1 minus top-2 logprob at each greedy token (inf with one candidate)
    tokens: int  # what it cost: prompt + completion tokens


def divergence(base: PromptScore, now: PromptScore) -> float:
    """Max |Δ logprob| between two scores of one prompt; inf where the texts tokenized differently."""
    if len(base.logprobs) != len(now.logprobs):
        return math.inf
    return max((abs(a - b) for a, b in zip(base.logprobs, now.logprobs, strict=True)), default=0.0)


def greedy_mismatch(base: PromptScore, now: PromptScore, tolerance: float) -> bool:
    """Whether the greedy tokens differ where the baseline had no near tie (a margin over 2 x tolerance)."""
    for i, (a, b) in enumerate(zip(base.greedy, now.greedy, strict=False)):
        if a != b:
            return _margin(base, i) > 2 * tolerance
    if len(base.greedy) == len(now.greedy):
        return False
    return _margin(base, min(len(base.greedy), len(now.greedy))) > 2 * tolerance


def _margin(score: PromptScore, i: int) -> float:
    return score.margins[i] if i < len(score.margins) else math.inf


def compare(base: Sequence[PromptScore], now: Sequence[PromptScore], tolerance: float) -> Verdict:
    """The verdict of a probe against a baseline, prompt by prompt (matched by name)."""
    current = {s.name: s for s in now}
    worst, worst_name, mismatched = 0.0, "", []
    for b in base:
        n = current.get(b.name)
        if n is None:
            return Verdict(None, math.nan, tolerance, 0, f"prompt {b.name} was not probed")
        d = divergence(b, n)
        if d > worst or not worst_name:
            worst, worst_name = d, b.name
        if greedy_mismatch(b, n, tolerance):
            mismatched.append(b.name)
    ok = worst <= tolerance and not mismatched
    reason = f"divergence {worst:.4g} nats (tolerance {tolerance:.4g}) at prompt {worst_name or '-'}"
    if mismatched:
        reason += f"; greedy tokens differ at {', '.join(mismatched)}"
    return Verdict(ok, worst, tolerance, len(mismatched), reason)


def noise(passes: Sequence[Sequence[PromptScore]]) -> float:
    """The largest divergence of any pass from the first: what batching and load move the answers by."""
    if len(passes) < 2:
        return 0.0
    first = {s.name: s for s in passes[0]}
    worst = 0.0
    for scores in passes[1:]:
        for s in scores:
            base = first.get(s.name)
            worst = max(worst, math.inf if base is None else divergence(base, s))
    return worst
