"""Batch-size ranges and draft schedules as vLLM 0.32 takes them (`num_speculative_tokens_per_batch_size`: a
list of (first batch size, last batch size, k)), shared by the goodput estimate (specgoodput.py), the
gateway's per-request counters and the draft_schedule action."""

from __future__ import annotations

RANGES: tuple[tuple[int, int], ...] = (
    (1, 1),
    (2, 3),
    (4, 7),
    (8, 15),
    (16, 31),
    (32, 63),
    (64, 127),
    (128, 255),
    (256, 65536),
)
"""Batch-size ranges (inclusive), as vLLM's num_speculative_tokens_per_batch_size takes them."""


def range_label(index: int) -> str:
    """A range's label: "1", "4-7", "256+" (the last one is open)."""
    lo, hi = RANGES[index]
    if index == len(RANGES) - 1:
        return f"{lo}+"
    return str(lo) if lo == hi else f"{lo}-{hi}"


def range_of(running: float) -> int | None:
    """The range a running-request count falls in; None for an idle engine."""
    n = round(running)
    for index, (lo, hi) in enumerate(RANGES):
        if lo <= n <= hi:
            return index
    return None


def schedule_from_text(text: str) -> list[tuple[int, int, int]]:
    """Read a schedule label ("1-7:4,8-65536:0") back; ValueError naming what is wrong. The ranges must
    start at 1, not overlap and be in order, and k >= 0: what vLLM 0.32 checks at start."""
    out: list[tuple[int, int, int]] = []
    if len(text) > 512:
        raise ValueError("schedule too long")
    for part in text.split(","):
        span, sep, k_text = part.strip().partition(":")
        lo_text, dash, hi_text = span.partition("-")
        try:
            lo, k = int(lo_text), int(k_text)
            hi = int(hi_text) if dash else lo
        except ValueError:
            raise ValueError(f"schedule entry {part!r} is not FIRST-LAST:K") from None
        if not sep or lo < 1 or hi < lo or k < 0:
            raise ValueError(f"schedule entry {part!r}: needs 1 <= FIRST <= LAST and K >= 0")
        if out and lo <= out[-1][1]:
            raise ValueError(f"schedule entry {part!r} overlaps or is out of order")
        out.append((lo, hi, k))
    if not out or out[0][0] != 1:
        raise ValueError("a schedule's first range starts at batch size 1")
    return out
