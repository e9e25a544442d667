"""The speculation estimate: per batch-size range, from counters an engine with a known cost curve would show."""

from __future__ import annotations

import pytest

from vllm_watchdog.sources.specgoodput import Snapshot, SpecGoodput, step_time
from vllm_watchdog.sources.specranges import RANGES, range_of, schedule_from_text

ACCEPT = (0.8, 0.6, 0.4, 0.3)


def gpu_step(n: float) -> float:
    """Seconds per step: memory-bound (flat) up to 20 tokens, compute-bound (linear) beyond."""
    return max(0.01, 0.0005 * n)


class Engine:
    """Counters of an engine that always drafts k tokens at every batch size it runs."""

    def __init__(
        self, accept: tuple[float, ...] = ACCEPT, overhead: float = 0.0, speculating: bool = True
    ) -> None:
        self.accept = accept
        self.speculating = speculating  # launched with speculation: vLLM counts its draft positions
        self.overhead = overhead  # seconds a step costs more whenever speculation drafts
        self.t = 0.0
        self.c = {"steps": 0.0, "step_tokens": 0.0, "generated": 0.0, "drafts": 0.0, "draft_tokens": 0.0}
        self.accepted = 0.0
        self.per_pos = [0.0] * len(accept)

    def run(self, est: SpecGoodput, batch: int, k: int, seconds: int) -> None:
        """`seconds` one-second scrapes at this batch size and k."""
        for _ in range(seconds):
            n = batch * (1 + k)
            steps = 1.0 / (gpu_step(n) + (self.overhead if k else 0.0))
            self.t += 1.0
            self.c["steps"] += steps
            self.c["step_tokens"] += steps * n
            hits = [steps * batch * p for p in self.accept[:k]]
            self.c["generated"] += steps * batch + sum(hits)
            if k:
                self.c["drafts"] += steps * batch
                self.c["draft_tokens"] += steps * batch * k
            self.accepted += sum(hits)
            for i, h in enumerate(hits):
                self.per_pos[i] += h
            est.observe(self.snap(batch))

    def snap(self, running: float) -> Snapshot:
        per_pos = tuple(self.per_pos) if self.speculating else ()
        return Snapshot(self.t, running, accepted=self.accepted, per_pos=per_pos, **self.c)


def _measured(k: int = 4) -> SpecGoodput:
    est, engine = SpecGoodput(), Engine()
    for batch in (1, 4, 16, 64):
        engine.run(est, batch, k, 30)
    return est


def test_speculation_pays_at_small_batches_and_costs_at_large_ones() -> None:
    est = _measured().estimate()
    assert est is not None
    by = {r.label: r for r in est.ranges}
    assert set(by) == {"1", "4-7", "16-31", "64-127"}
    # batch 1: verifying 5 tokens costs what 1 does, so all 4 drafts pay: 1 + 0.8 + 0.6 + 0.4 + 0.3 = 3.1
    assert by["1"].speedup[4] == pytest.approx(3.1)
    assert by["1"].current_k == pytest.approx(4.0)
    # batch 64: the step is compute-bound, 5x the tokens cost 5x: speculation loses at any k
    assert max(by["64-127"].speedup[1:]) < 1.0
    assert est.best[range_of(1) or 0] == 4
    assert est.best[range_of(64) or 0] == 0
    assert est.best[range_of(16) or 0] == 1  # 1 + 0.8 tokens for 16 -> 32 tokens: 1.8 * 0.01 / 0.016
    assert est.schedule[-1] == (64, RANGES[-1][1], 0)  # unmeasured ranges above take the last measured k
    assert est.schedule[0][0] == 1 and est.schedule[-1][1] == RANGES[-1][1]
    assert est.gain == pytest.approx((3.1 + 3.1 + 1.125 + 1.0) / (3.1 + 3.1 + 0.775 + 0.62), rel=0.02)
    assert schedule_from_text(est.schedule_text) == est.schedule


def test_the_schedule_once_running_gains_nothing_more() -> None:
    est, engine = SpecGoodput(window=119), Engine()  # the second pass alone, once it ran
    for batch in (1, 4, 16, 64):
        engine.run(est, batch, 4, 30)
    first = est.estimate()
    assert first is not None
    for batch in (1, 4, 16, 64):  # now each range runs the k the schedule gave it
        engine.run(est, batch, first.best[range_of(batch) or 0], 30)
    again = est.estimate()
    assert again is not None
    assert again.schedule_text == first.schedule_text
    assert again.gain == pytest.approx(1.0, abs=0.02)


def test_a_near_tie_does_not_move_the_held_k() -> None:
    """Hysteresis: the held k moves only when another beats it by the margin (5%)."""
    est = _measured()
    first = est.estimate()
    assert first is not None
    r16 = range_of(16) or 0
    est.held[r16] = 2  # as if 2 had been chosen before: S(2) = 2.4 * 0.01 / 0.024 = 1.0, S(1) = 1.125
    assert (est.estimate() or first).best[r16] == 1  # 12% better: moves
    est.held[r16] = 2
    est.margin = 0.2
    assert (est.estimate() or first).best[r16] == 2  # under 20% better: held


def test_a_range_measured_without_drafts_too_is_judged_by_what_it_measured() -> None:
    """Each step that drafts costs 40 ms more (a proposer the cost curve cannot see: every drafting step has
    it): the model alone keeps k = 4 at batch 1; goodput measured without drafts there says it loses."""
    model_only, engine = SpecGoodput(), Engine(overhead=0.04)
    for batch in (1, 4):
        engine.run(model_only, batch, 4, 30)
    alone = model_only.estimate()
    assert alone is not None and alone.best[0] == 4
    both = SpecGoodput()
    for batch, k in ((1, 0), (1, 4), (4, 4)):
        engine.run(both, batch, k, 30)
    est = both.estimate()
    assert est is not None
    r1 = next(r for r in est.ranges if r.label == "1")
    # with drafts: 3.1 tokens per 50 ms step; without: 1 per 10 ms
    assert r1.speedup[4] == pytest.approx(3.1 * 0.01 / 0.05)
    assert est.best[0] == 0 and est.schedule[0][::2] == (1, 0)


def test_a_range_that_ran_without_drafts_only_takes_the_bound_its_measured_neighbours_give() -> None:
    """Batch 1 ran only without drafts (one client's requests finish between scrapes while it drafts), batches
    2, 4 and 16 with them: speculation pays more at smaller batches, so batch 1 gets at least 2-3's k. Batch 64
    ran only without drafts too, above every range measured with them: nothing says a draft pays, k = 0."""
    est, engine = SpecGoodput(), Engine()
    for batch, k in ((1, 0), (2, 4), (4, 4), (16, 4), (64, 0)):
        engine.run(est, batch, k, 30)
    got = est.estimate()
    assert got is not None
    assert {r.label for r in got.ranges} == {"2-3", "4-7", "16-31"}
    assert got.best[range_of(2) or 0] == 4 and got.best[range_of(16) or 0] == 1
    assert got.best[range_of(1) or 0] == 4  # the floor 2-3 gives; was 0 ("nothing measured with drafts")
    assert got.best[range_of(8) or 0] == got.best[range_of(4) or 0]  # not run: its lower neighbour's
    assert got.best[range_of(64) or 0] == 0
    est.held[range_of(1) or 0] = 2  # a k held from an earlier measurement with drafts stays
    assert (est.estimate() or got).best[range_of(1) or 0] == 2


def test_a_range_that_speculated_without_a_draft_is_scheduled_off_whatever_its_neighbours_give() -> None:
    """One client sends text ngram finds no match in (the server speculates, batch 1 never drafts), the busy
    hours text it predicts (batches 2, 4 and 16 draft): the floor batch 2 gives would keep the proposer
    running at batch 1 for nothing. With fewer request-steps than a window's worth (MIN_DRAFTS / IDLE_SHARE), batch 1
    is not judged matchless and takes the floor as before; nor is a server that does not speculate."""
    for seconds, speculating, want in ((60, True, 0), (40, True, 4), (60, False, 4)):
        est, engine = SpecGoodput(), Engine()
        engine.speculating = speculating
        engine.run(est, 1, 0, seconds)  # 100 request-steps a second
        engine.speculating = True
        for batch in (2, 4, 16):
            engine.run(est, batch, 4, 30)
        got = est.estimate()
        assert got is not None and {r.label for r in got.ranges} == {"2-3", "4-7", "16-31"}
        assert got.best[range_of(2) or 0] == 4
        assert got.best[0] == want, (seconds, speculating)


def test_speculation_that_almost_never_drafts_is_scheduled_off_without_a_claimed_gain() -> None:
    """Text ngram finds no match in: the server speculates (k = 4) but drafted 20 times in 200 s of batch 4
    (80,000 request-steps, under MIN_DRAFTS): at most 0.1% per draft token to gain, and a proposer that runs
    every step. Without any draft token, and no draft position counted, the server may not speculate at all:
    nothing to say."""

    def feed(est: SpecGoodput, drafts_per_second: float, positions: tuple[float, ...] = ()) -> None:
        for t in range(1, 201):
            est.observe(
                Snapshot(
                    float(t),
                    4.0,
                    steps=100.0 * t,
                    step_tokens=400.0 * t,
                    generated=400.0 * t,
                    drafts=drafts_per_second * t,
                    draft_tokens=4 * drafts_per_second * t,
                    accepted=0.0,
                    per_pos=positions,
                )
            )

    idle = SpecGoodput()
    feed(idle, 0.1)
    got = idle.estimate()
    assert got is not None and got.ranges == ()
    assert got.schedule_text == f"1-{RANGES[-1][1]}:0" and got.gain == 1.0 and got.k_max == 4
    silent = SpecGoodput()
    feed(silent, 0.0)
    assert silent.estimate() is None
    matchless = SpecGoodput()  # not a single draft, but vLLM counts 3 draft positions: it speculates
    feed(matchless, 0.0, (0.0, 0.0, 0.0))
    got = matchless.estimate()
    assert got is not None and got.k_max == 3 and set(got.best) == {0}


def test_no_estimate_without_drafts_or_with_one_cost_point() -> None:
    off = SpecGoodput()
    engine = Engine(speculating=False)
    for batch in (1, 64):
        engine.run(off, batch, 0, 30)
    assert off.estimate() is None  # speculation off: no acceptance to read
    one = SpecGoodput()
    Engine().run(one, 4, 4, 30)
    assert one.estimate() is None  # one batch size: the cost of more tokens is unknown


def test_a_counter_reset_or_an_idle_end_is_no_interval_and_a_range_is_the_mean_batch() -> None:
    est = SpecGoodput()
    est.observe(Snapshot(1.0, 4, 100, 500, 200))
    est.observe(Snapshot(2.0, 4, 10, 50, 20))  # restarted: counters went back
    est.observe(Snapshot(3.0, 0, 20, 100, 40))  # idle at one end
    est.observe(Snapshot(3.0, 16, 30, 150, 60))  # not newer
    assert not est.intervals
    est.observe(Snapshot(4.0, 16, 30, 150, 60))
    est.observe(Snapshot(5.0, 12, 40, 200, 80))  # 16 and 12: a batch of 14
    assert [where for _, where, _ in est.intervals] == [range_of(14)]


def test_step_time_reads_between_and_past_the_points() -> None:
    points = [(5.0, 0.01), (20.0, 0.01), (80.0, 0.04)]
    assert step_time(points, 10) == pytest.approx(0.01)
    assert step_time(points, 50) == pytest.approx(0.025)
    assert step_time(points, 160) == pytest.approx(0.08)
    assert step_time(points, 1) == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("2-4:1", "starts at batch size 1"),
        ("1-4:1,3-8:0", "overlaps"),
        ("1-4:-1", "K >= 0"),
        ("1-4", "not FIRST-LAST:K"),
        ("a-b:1", "not FIRST-LAST:K"),
        ("", "not FIRST-LAST:K"),
    ],
)
def test_a_bad_schedule_text_is_refused(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        schedule_from_text(text)
