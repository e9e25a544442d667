"""What speculative decoding gives at each batch size, measured from vLLM's own counters (docs/rules.md,
"Speculative decoding by goodput" has the formula and its assumptions).

Each scrape of a target is a `Snapshot` of vLLM's counters and of its running requests. Two snapshots in a row
are one interval of the batch-size range (`RANGES`) their mean running requests fall in: its engine
steps, the tokens those steps carried, the tokens generated and the drafts, draft tokens and accepted tokens
(per draft position). From a window of intervals, for each range with enough steps:

- the acceptance, pooled over the ranges that drafted (it depends on the text, not on the batch size):
  f = drafts / request-steps (request-steps = generated - accepted), p_i = accepted at position i / the
  drafts that reached position i (drafts of ranges drafting more than i tokens a draft);
  E(k) = 1 + f * (p_0 + ... + p_{k-1}), the tokens a request gets per engine step with k draft tokens;
- the step time against the tokens a step carries, t(n), one point per range (seconds per step, tokens per
  step), read between the points (linear; past the ends along the end segment): the verify cost as this
  engine pays it, however it scales (flat while memory-bound, linear once compute-bound);
- the speedup of k: S(k) = E(k) * t(n0) / t(n0 + b * f * k), with n0 the tokens a step of the range carries
  without drafts and b the requests a step decodes (request-steps / steps). S(0) = 1.

The best k of a range changes only when another k beats the held one by `MARGIN` (hysteresis), and the
schedule (`schedule_text`) gives every range a k: one without measurements takes its lower neighbour's (else
its upper one's). `gain` is what the schedule would give over what runs now (the k measured per range).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .specranges import RANGES, range_label, range_of

MAX_K = 8  # the most draft positions read (vLLM's per-position counter has num_speculative_tokens of them)
WINDOW = 600.0  # seconds of intervals an estimate reads
MAX_INTERVALS = 1024  # per target, whatever the scrape interval
MAX_GAP = 120.0  # two snapshots further apart than this are no interval (a missed scrape, a restart)
MIN_STEPS = 50  # engine steps a range needs before it has a cost point
MIN_DRAFTS = 50  # drafts the window needs before acceptance is estimated
MARGIN = 0.05  # a new best k must beat the held one by this much
# Speculation that drafts for under this share of request-steps gains under 1% a draft token whatever is
# accepted (E(k) = 1 + f * ...), less than a proposer that runs every step costs: its schedule is k = 0.
IDLE_SHARE = 0.01


@dataclass(frozen=True)
class Snapshot:
    """vLLM's counters at one scrape, and its running requests then."""

    t: float
    running: float
    steps: float  # vllm:iteration_tokens_total_count
    step_tokens: float  # vllm:iteration_tokens_total_sum
    generated: float  # vllm:generation_tokens_total
    drafts: float = 0.0  # vllm:spec_decode_num_drafts_total
    draft_tokens: float = 0.0  # vllm:spec_decode_num_draft_tokens_total
    accepted: float = 0.0  # vllm:spec_decode_num_accepted_tokens_total
    per_pos: tuple[float, ...] = ()  # vllm:spec_decode_num_accepted_tokens_per_pos_total by position


@dataclass
class Totals:
    """Sums over intervals of one range (or of all)."""

    seconds: float = 0.0
    steps: float = 0.0
    step_tokens: float = 0.0
    generated: float = 0.0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: list[float] = field(default_factory=lambda: [0.0] * MAX_K)
    positions: int = 0  # draft positions vLLM counts (num_speculative_tokens; 0: it does not speculate)

    def add(self, other: Totals) -> None:
        """Add another interval's sums."""
        self.seconds += other.seconds
        self.steps += other.steps
        self.step_tokens += other.step_tokens
        self.generated += other.generated
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.accepted += other.accepted
        self.per_pos = [a + b for a, b in zip(self.per_pos, other.per_pos, strict=True)]
        self.positions = max(self.positions, other.positions)

    @property
    def request_steps(self) -> float:
        """Tokens generated that were not accepted drafts: one per request per step it took part in."""
        return max(self.generated - self.accepted, 0.0)


@dataclass(frozen=True)
class RangeEstimate:
    """What one batch-size range measured and what each k would give there."""

    index: int
    seconds: float  # time spent in the range within the window
    step_seconds: float
    tokens_per_second: float  # generated, measured
    current_k: float  # draft tokens per request-step / f: the k that ran, as the model reads it
    speedup: tuple[float, ...]  # by k = 0..K

    @property
    def label(self) -> str:
        """The range as a label value: "4-7", "256+"."""
        return range_label(self.index)


def interval(a: Snapshot, b: Snapshot) -> tuple[int, Totals] | None:
    """The interval between two snapshots, in the range of their mean running requests (a closed loop of 16
    clients runs 12 to 16 at a scrape), if both ran some, neither ran twice the other's (the load moved
    within the interval) and no counter went back."""
    low, high = sorted((a.running, b.running))
    where = range_of((low + high) / 2)
    if where is None or low < 1 or high > 2 * low or not 0 < b.t - a.t <= MAX_GAP:
        return None
    pos = [y - x for x, y in zip(_pad(a.per_pos), _pad(b.per_pos), strict=True)]
    sums = Totals(
        b.t - a.t,
        b.steps - a.steps,
        b.step_tokens - a.step_tokens,
        b.generated - a.generated,
        b.drafts - a.drafts,
        b.draft_tokens - a.draft_tokens,
        b.accepted - a.accepted,
        pos,
        len(b.per_pos),
    )
    counts = (sums.steps, sums.step_tokens, sums.generated, sums.drafts, sums.draft_tokens, sums.accepted)
    if min(*counts, *pos) < 0 or sums.steps <= 0:
        return None  # a restart (counters reset), or no step at all
    return where, sums


def _pad(values: Sequence[float]) -> list[float]:
    return [*values[:MAX_K], *[0.0] * (MAX_K - len(values[:MAX_K]))]


def step_time(points: Sequence[tuple[float, float]], n: float) -> float:
    """t(n) read off (tokens per step, seconds per step) points sorted by tokens: linear between two points,
    along the end segment past either end (never below zero)."""
    if len(points) == 1:
        return points[0][1]
    i = 1
    while i < len(points) - 1 and points[i][0] < n:
        i += 1
    (n0, t0), (n1, t1) = points[i - 1], points[i]
    slope = max((t1 - t0) / (n1 - n0), 0.0) if n1 > n0 else 0.0
    return max(t0 + slope * (n - n0), 0.0)


def expected_tokens(f: float, accept: Sequence[float], k: int) -> float:
    """E(k): tokens per request-step with k draft tokens (1, plus the drafted share times those accepted)."""
    return 1.0 + f * sum(accept[:k])


@dataclass(frozen=True)
class Estimate:
    """The measured ranges of one target, the schedule they call for and its gain over what runs now."""

    ranges: tuple[RangeEstimate, ...]
    k_max: int  # draft positions seen (the launch's num_speculative_tokens)
    best: tuple[int, ...]  # by range index, every range (held, with hysteresis)
    gain: float

    @property
    def schedule(self) -> list[tuple[int, int, int]]:
        """(first batch size, last batch size, k), adjacent ranges of one k merged."""
        out: list[tuple[int, int, int]] = []
        for (lo, hi), k in zip(RANGES, self.best, strict=True):
            if out and out[-1][2] == k:
                out[-1] = (out[-1][0], hi, k)
            else:
                out.append((lo, hi, k))
        return out

    @property
    def schedule_text(self) -> str:
        """The schedule as a label value: "1-7:4,8-65536:0" (`schedule_from_text` reads it back)."""
        return ",".join(f"{lo}-{hi}:{k}" for lo, hi, k in self.schedule)


class SpecGoodput:
    """The speculation estimate of one target, fed one snapshot per scrape."""

    def __init__(self, window: float = WINDOW, margin: float = MARGIN) -> None:
        self.window = window
        self.margin = margin
        self.last: Snapshot | None = None
        self.intervals: deque[tuple[float, int, Totals]] = deque(maxlen=MAX_INTERVALS)
        self.held: dict[int, int] = {}  # range index -> the best k, held until another beats it by margin

    def observe(self, snap: Snapshot) -> None:
        """Take one scrape's snapshot (the same one twice, or an older one, is ignored)."""
        if self.last is not None and snap.t <= self.last.t:
            return
        if self.last is not None:
            got = interval(self.last, snap)
            if got is not None:
                self.intervals.append((snap.t, *got))
        self.last = snap
        while self.intervals and self.intervals[0][0] < snap.t - self.window:
            self.intervals.popleft()

    def estimate(self) -> Estimate | None:
        """The estimate from the window; None without enough drafts or without two cost points."""
        on: dict[int, Totals] = {}
        off: dict[int, Totals] = {}  # intervals without a draft: what the range gives without speculation
        matchless: dict[int, Totals] = {}  # those of them while vLLM speculated (it counts draft positions)
        for _, where, sums in self.intervals:
            (on if sums.drafts > 0 else off).setdefault(where, Totals()).add(sums)
            if sums.drafts <= 0 and sums.positions:
                matchless.setdefault(where, Totals()).add(sums)
        drafting = Totals()
        for sums in on.values():
            drafting.add(sums)
        if drafting.drafts < MIN_DRAFTS or drafting.request_steps <= 0:
            return _idle(drafting, off.values())
        k_max = max((i + 1 for i, v in enumerate(drafting.per_pos) if v > 0), default=0)
        k_max = max(k_max, min(MAX_K, math.ceil(drafting.draft_tokens / drafting.drafts)))
        f = min(drafting.drafts / drafting.request_steps, 1.0)
        accept = _acceptance(on.values(), drafting.per_pos)
        measured = {i: s for i, s in on.items() if s.steps >= MIN_STEPS and s.request_steps > 0}
        points = sorted({(s.step_tokens / s.steps, s.seconds / s.steps) for s in measured.values()})
        if len(points) < 2:
            return None
        ranges = tuple(
            _calibrated(_range_estimate(i, measured[i], f, accept, k_max, points), off.get(i))
            for i in sorted(measured)
        )
        plain = tuple(i for i, s in off.items() if i not in measured and s.steps >= MIN_STEPS)
        quiet = {i for i in plain if i in matchless and matchless[i].request_steps >= MIN_DRAFTS / IDLE_SHARE}
        self.held.update(dict.fromkeys(quiet, 0))
        return self._decide(ranges, k_max, plain)

    def _decide(self, ranges: tuple[RangeEstimate, ...], k_max: int, plain: tuple[int, ...]) -> Estimate:
        """Hold or move each range's best k, fill the ranges not measured, and weigh the gain (a range that
        ran without drafts only keeps its held k, else the bound its measured neighbours give, `_bounded`;
        one that speculated a window's worth of request-steps without a draft holds 0, set by `estimate`)."""
        for r in ranges:
            best = max(range(k_max + 1), key=lambda k: (r.speedup[k], -k))
            held = self.held.get(r.index)
            if held is None or held > k_max:
                held = min(round(r.current_k), k_max)
            if r.speedup[best] > r.speedup[held] * (1.0 + self.margin):
                held = best
            self.held[r.index] = held
        measured = {r.index: self.held[r.index] for r in ranges}
        known = {i: self.held.get(i, _bounded(measured, i)) for i in plain} | measured
        best_all = tuple(_fill(known, i) for i in range(len(RANGES)))
        total = sum(r.seconds for r in ranges)
        now = sum(r.seconds * _at(r.speedup, r.current_k) for r in ranges) / total
        then = sum(r.seconds * r.speedup[best_all[r.index]] for r in ranges) / total
        return Estimate(ranges, k_max, best_all, then / now if now > 0 else 1.0)


def _idle(drafting: Totals, plain: Iterable[Totals]) -> Estimate | None:
    """Too few drafts to estimate from: None, unless speculation runs (vLLM counts draft positions, or some
    draft tokens were proposed) and drafted for under IDLE_SHARE of a window's worth of request-steps
    (MIN_DRAFTS / IDLE_SHARE of them): then nothing can pay for the proposer, which runs every step, and the
    schedule is k = 0 everywhere, with no gain claimed (what the proposer costs is not in the counters)."""
    others = list(plain)
    steps = drafting.request_steps + sum(s.request_steps for s in others)
    positions = max([drafting.positions, *(s.positions for s in others)])
    if drafting.drafts >= IDLE_SHARE * steps or steps < MIN_DRAFTS / IDLE_SHARE:
        return None
    if positions:
        k_max = min(MAX_K, positions)
    elif drafting.draft_tokens > 0:
        k_max = min(MAX_K, math.ceil(drafting.draft_tokens / drafting.drafts))
    else:
        return None  # no draft and no position counted: this server may not speculate at all
    return Estimate((), k_max, (0,) * len(RANGES), 1.0)


def _acceptance(ranges: Iterable[Totals], accepted: Sequence[float]) -> list[float]:
    """p_i: accepted at position i over the drafts that reached it (a range that drafted k tokens a draft,
    k = draft tokens / drafts, reached positions below k: a schedule drafts fewer at some batch sizes)."""
    reached = [0.0] * MAX_K
    for s in ranges:
        if s.drafts > 0:
            depth = s.draft_tokens / s.drafts
            for i in range(MAX_K):
                reached[i] += s.drafts * min(max(depth - i, 0.0), 1.0)
    return [min(a / d, 1.0) if d > 0 else 0.0 for a, d in zip(accepted, reached, strict=True)]


def _range_estimate(
    index: int, s: Totals, f: float, accept: list[float], k_max: int, points: list[tuple[float, float]]
) -> RangeEstimate:
    b = s.request_steps / s.steps  # requests decoded per step
    n0 = max((s.step_tokens - s.draft_tokens) / s.steps, 1e-9)  # tokens per step without the drafts
    base = step_time(points, n0)
    speedup = [1.0]
    for k in range(1, k_max + 1):
        cost = step_time(points, n0 + b * f * k)
        speedup.append(expected_tokens(f, accept, k) * base / cost if cost > 0 else 1.0)
    current = (s.draft_tokens / s.request_steps) / f if f > 0 else 0.0
    return RangeEstimate(
        index,
        s.seconds,
        s.seconds / s.steps,
        s.generated / s.seconds,
        min(current, float(k_max)),
        tuple(speedup),
    )


def _calibrated(r: RangeEstimate, off: Totals | None) -> RangeEstimate:
    """The model's speedups scaled to what the range measured: where it also ran without drafts (a schedule's
    k = 0, or before a relaunch), goodput with the k that ran over goodput without is S at that k, and what
    the model leaves out (the proposer, the rejection sampler, a draft model's own steps) scales every k >= 1
    alike."""
    if off is None or off.steps < MIN_STEPS or off.seconds <= 0 or off.generated <= 0 or r.current_k < 0.5:
        return r
    measured = r.tokens_per_second / (off.generated / off.seconds)
    model = _at(r.speedup, r.current_k)
    if model <= 0:
        return r
    scaled = (1.0, *(x * measured / model for x in r.speedup[1:]))
    return RangeEstimate(r.index, r.seconds, r.step_seconds, r.tokens_per_second, r.current_k, scaled)


def _at(speedup: Sequence[float], k: float) -> float:
    """S at a fractional k, linear between the whole ones."""
    low = min(int(k), len(speedup) - 1)
    high = min(low + 1, len(speedup) - 1)
    return speedup[low] + (speedup[high] - speedup[low]) * (k - low)


def _bounded(measured: dict[int, int], index: int) -> int:
    """The k of a range that ran without drafts only. The best k falls as the batch grows (a larger batch
    leaves less idle compute to verify drafts with), so the nearest larger measured range's k is a floor for
    it and the nearest smaller one's a ceiling: the floor, the lower of the two; 0 with no larger range
    measured (nothing bounds it from below: a draft may cost there)."""
    above = [i for i in measured if i > index]
    if not above:
        return 0
    below = [i for i in measured if i < index]
    floor = measured[min(above)]
    return min(floor, measured[max(below)]) if below else floor


def _fill(known: dict[int, int], index: int) -> int:
    """A range's k: its own, else its nearest measured lower neighbour's, else its nearest upper one's."""
    for i in range(index, -1, -1):
        if i in known:
            return known[i]
    return known[min(known)]
