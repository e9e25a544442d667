"""vLLM's per-request speculative decoding metrics, counted by the batch-size range each request ran in.

With `--per-request-spec-decode-metrics summary|detailed`, a speculating vLLM puts
`metrics.speculative_decoding` in each single-sequence completion or chat response: in the JSON body, or in
a stream's final usage event (only when the client asked `stream_options.include_usage`, or vLLM forces
usage). The gateway sums those objects per batch-size range, the gateway's in-flight count when the request
was admitted, in the ranges of the goodput estimate (sources/specranges.py). A JSON body is read from the
parse the usage already takes; a stream (or a JSON body too large to keep) is scanned for the key as its
chunks pass (keyscan.py, as the usage is): a substring check per chunk, and at most 4 KiB kept once the key
is seen. An object with a value that is not a non-negative integer below 2**32 is not counted; histogram
entries past `MAX_ACCEPTED` are not read.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...sources.specranges import range_label, range_of
from ..protocol.snapshot import MAX_ACCEPTED, SpecDecodeCounts
from .keyscan import KeyScan

KEY = b'"speculative_decoding"'
_DETAILED = b',"per_step_accepted"'  # "detailed" adds per-step arrays after the counts: cut, never read
_MAX_COUNT = 1 << 32  # larger counts are garbage
_FIELDS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")


def spec_of(body: Mapping[str, object]) -> object:
    """`metrics.speculative_decoding` of a parsed response body; None if it has none."""
    metrics = body.get("metrics")
    return metrics.get("speculative_decoding") if isinstance(metrics, dict) else None


class SpecScan(KeyScan):
    """Finds the last `"speculative_decoding": {...}` in a body fed chunk by chunk (`found`, else None); a
    "detailed" object is cut before its per-step arrays."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(KEY, _DETAILED)


def _count(value: object) -> int | None:
    """A count from the body: a non-negative int below 2**32 (not a bool, float or string), else None."""
    if type(value) is int and 0 <= value < _MAX_COUNT:
        return value
    return None


def sample_of(spec: object) -> tuple[int, int, int, tuple[int, ...]] | None:
    """(steps, draft tokens, accepted tokens, histogram by accepted j <= MAX_ACCEPTED) of one object; None if
    any value read is malformed."""
    if not isinstance(spec, dict):
        return None
    counts = [_count(spec.get(name)) for name in _FIELDS]
    histogram = spec.get("acceptance_histogram")
    if not isinstance(histogram, list):
        return None
    bins = [_count(v) for v in histogram[: MAX_ACCEPTED + 1]]
    steps, drafts, accepted = counts
    if steps is None or drafts is None or accepted is None or None in bins:
        return None
    return steps, drafts, accepted, tuple(n for n in bins if n is not None)


class SpecRequests:
    """The per-request speculative decoding counts, by batch-size range label."""

    def __init__(self) -> None:
        self._ranges: dict[str, list[int]] = {}  # label -> [requests, steps, drafts, accepted]
        self._bins: dict[str, list[int]] = {}  # label -> accepted-per-step counts by j

    def observe(self, batch: int, spec: object) -> bool:
        """Count one response's object, of a request admitted with `batch` in flight; False if not counted."""
        sample = sample_of(spec)
        where = range_of(batch)
        if sample is None or where is None:
            return False
        label = range_label(where)
        totals = self._ranges.setdefault(label, [0, 0, 0, 0])
        steps, drafts, accepted, histogram = sample
        for i, n in enumerate((1, steps, drafts, accepted)):
            totals[i] += n
        bins = self._bins.setdefault(label, [])
        bins.extend([0] * (len(histogram) - len(bins)))
        for j, n in enumerate(histogram):
            bins[j] += n
        return True

    def snapshot(self) -> dict[str, SpecDecodeCounts]:
        """The counts of every range that had a request with the metrics."""
        return {
            label: SpecDecodeCounts(requests, steps, drafts, accepted, tuple(self._bins[label]))
            for label, (requests, steps, drafts, accepted) in self._ranges.items()
        }
