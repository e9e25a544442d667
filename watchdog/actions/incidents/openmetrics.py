"""A target's recent series from the sample store as OpenMetrics text, the input of
`promtool tsdb create-blocks-from openmetrics`: the minutes before an incident, loadable into any Prometheus.

The windows are copied on the event loop (array slices, in C) and the text is written from the copies in a
worker thread, so a large store holds the loop only for the copy. Series and samples are bounded; staleness
markers are left out (OpenMetrics has none), every other value is kept, each series in time order, one metric
family after another.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Collection
from dataclasses import dataclass

from ...store import SampleStore, is_stale

MAX_SERIES = 5_000
MAX_SAMPLES = 2_000_000
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:")
_NAME_REST = _NAME_START | frozenset("0123456789")


@dataclass(frozen=True)
class SeriesCopy:
    """One series' samples in the window: its name, its other labels, times (ms) and values."""

    name: str
    labels: tuple[tuple[str, str], ...]
    ts: array[int]
    vals: array[float]


def target_series(
    store: SampleStore, target: str, gpus: Collection[int], start_ms: int, end_ms: int
) -> tuple[list[SeriesCopy], bool]:
    """The series of `target` (its `target` label) and of its GPUs (their `gpu` label) with samples in
    (start_ms, end_ms]; and whether the bounds left some out."""
    gpu_labels = {str(g) for g in gpus}

    def ours(labels: tuple[tuple[str, str], ...]) -> bool:
        found = dict(labels)
        return found.get("target") == target or (bool(gpu_labels) and found.get("gpu") in gpu_labels)

    out: list[SeriesCopy] = []
    samples, cut = 0, False
    for series in store.select(None, ours):
        if len(out) >= MAX_SERIES or samples >= MAX_SAMPLES:
            cut = True
            break
        ts, vals = series.window(start_ms, end_ms)
        if not ts or not _valid(series.name):
            continue
        if samples + len(ts) > MAX_SAMPLES:
            keep = MAX_SAMPLES - samples
            ts, vals, cut = ts[-keep:], vals[-keep:], True
        samples += len(ts)
        out.append(SeriesCopy(series.name, series.unnamed, ts, vals))
    return out, cut


def _valid(name: str) -> bool:
    return bool(name) and name[0] in _NAME_START and all(c in _NAME_REST for c in name)


def openmetrics(series: list[SeriesCopy], redact: Callable[[str], str]) -> bytes:
    """The series as OpenMetrics text ending in `# EOF`; label values pass through `redact`."""
    lines: list[str] = []
    for s in sorted(series, key=lambda s: (s.name, s.labels)):
        pairs = [(k, v) for k, v in s.labels if _valid(k) and ":" not in k]
        text = ",".join(f'{k}="{_escape(redact(v))}"' for k, v in pairs)
        head = f"{s.name}{{{text}}}" if text else s.name
        for t, v in zip(s.ts, s.vals, strict=True):
            if not is_stale(v):
                lines.append(f"{head} {_value(v)} {t // 1000}.{t % 1000:03d}")
    lines.append("# EOF")
    return ("\n".join(lines) + "\n").encode()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(v: float) -> str:
    if v != v:  # noqa: PLR0124 (NaN)
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)
