"""What a drain asks the gateway besides its in-flight count: whether those requests still hear from vLLM.

The daemon sends `set_drain` with `"progress": true`; a gateway that knows this answers an object (the count
and an UpstreamProgress), one that does not ignores the flag and answers the bare count, which an older
daemon (that never sets the flag) still gets. Seconds cross, never clock readings: each side has its clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .codec import decode, encode


@dataclass(frozen=True)
class UpstreamProgress:
    """The gateway's requests in flight: how many, seconds since the newest upstream body byte to any of them
    (or since it was sent, for one that heard none yet; None when nothing is in flight), how many heard no
    body byte yet (a non-streamed response, a stream before its first chunk: only vLLM's steps tell), and
    seconds since the oldest was sent (vLLM has had work that long)."""

    in_flight: int
    idle: float | None
    silent: int = 0
    oldest: float | None = None


def drain_answer(in_flight: int, progress: UpstreamProgress | None) -> int | dict[str, Any]:
    """The gateway's answer to set_drain: the bare count unless the daemon asked for the progress too."""
    if progress is None:
        return in_flight
    return {"in_flight": in_flight, "progress": encode(progress)}


def read_drain_answer(answer: object) -> tuple[int, UpstreamProgress | None]:
    """The in-flight count and the progress (None from a gateway that does not tell it, or tells it in a form
    this daemon cannot read) of a set_drain answer; TypeError if it holds no count at all."""
    if isinstance(answer, Mapping):
        count = answer.get("in_flight")
        if not isinstance(count, int) or isinstance(count, bool):
            raise TypeError("set_drain: the answer holds no in-flight count")
        try:
            progress: UpstreamProgress | None = decode(UpstreamProgress, answer.get("progress"))
        except (TypeError, ValueError):
            progress = None
        if progress is not None and not all(_seconds(s) for s in (progress.idle, progress.oldest)):
            progress = None
        return count, progress
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        raise TypeError("set_drain: the answer holds no in-flight count")
    return int(answer), None


def _seconds(value: float | None) -> bool:
    return value is None or 0 <= value < math.inf
