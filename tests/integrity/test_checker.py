"""KnownAnswers on a fake engine: learning, checks, confirm, budget, skips, pinned baselines, model change."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from tests.integrity.fake_engine import BIG, TARGET, FakeEngine, Monitor, options
from tests.support.clock import T0
from vllm_watchdog.integrity.baseline import baseline_path, read_baseline
from vllm_watchdog.integrity.checker import KnownAnswers, Readiness
from vllm_watchdog.integrity.config import IntegrityConfig

pytestmark = pytest.mark.anyio


def checker(
    engine: FakeEngine, config: IntegrityConfig = BIG, monitor: Monitor | None = None, **kw: object
) -> KnownAnswers:
    ka = KnownAnswers(config, options(engine, monitor or Monitor(), **kw))  # type: ignore[arg-type]
    ka.apply(config, ["t0"])
    return ka


async def test_learns_then_agrees_then_catches_a_shift_confirmed() -> None:
    engine = FakeEngine()
    ka = checker(engine)
    learnt = await ka.check(TARGET, T0)
    assert learnt.ok is None and "baseline learnt" in learnt.reason
    assert ka.status("t0").state == "learnt" and ka.status("t0").baseline is not None
    per_pass = engine.completions // 3  # learn_probes passes
    agreed = await ka.check(TARGET, T0 + 60)
    assert (agreed.ok, agreed.divergence, agreed.greedy_mismatches) == (True, 0.0, 0)
    engine.shift = 0.05
    before = engine.completions
    wrong = await ka.check(TARGET, T0 + 120)
    assert (
        wrong.ok is False and wrong.divergence == pytest.approx(0.05) and wrong.reason.startswith("confirmed")
    )
    assert engine.completions - before == 2 * per_pass  # the probe and its confirmation
    assert ka.status("t0").checks == {"ok": 1, "diverged": 1, "skipped": 0, "error": 0}


async def test_a_divergence_that_is_not_confirmed_is_not_reported() -> None:
    engine = FakeEngine()
    ka = checker(engine)
    await ka.check(TARGET, T0)
    calls = 0
    answer = engine.answer

    def once_wrong(body: dict[str, object]) -> dict[str, object]:
        nonlocal calls
        calls += 1
        engine.shift = 0.5 if calls == 1 else 0.0
        return answer(body)

    engine.answer = once_wrong  # type: ignore[method-assign]
    ka.config = replace(BIG, confirm=True)
    verdict = await ka.check(TARGET, T0 + 60)
    assert verdict.ok is None or verdict.ok is True  # the first prompt's answer was off, its confirmation not
    assert ka.status("t0").checks["diverged"] == 0


async def test_a_near_tie_greedy_change_is_not_counted_and_a_clear_one_is() -> None:
    engine = FakeEngine(margin=0.001)  # the baseline's top two nearly tie
    ka = checker(engine)
    await ka.check(TARGET, T0)
    engine.greedy_token = "q"
    assert (await ka.check(TARGET, T0 + 60)).ok is True
    engine2 = FakeEngine(margin=1.0)
    ka2 = checker(engine2)
    await ka2.check(TARGET, T0)
    engine2.greedy_token = "q"
    verdict = await ka2.check(TARGET, T0 + 60)
    assert verdict.ok is False and verdict.greedy_mismatches == 4 and verdict.divergence == 0.0


async def test_paused_asleep_or_unhealthy_engines_are_not_probed() -> None:
    engine = FakeEngine()
    monitor = Monitor(Readiness(paused="paused", healthy=True, canary=True))
    ka = checker(engine, monitor=monitor)
    verdict = await ka.check(TARGET, T0)
    assert verdict.ok is None and "paused" in verdict.reason and engine.requests == []
    monitor.ready = Readiness(healthy=False, canary=True)
    assert "health" in (await ka.check(TARGET, T0 + 60)).reason and engine.requests == []
    monitor.ready = Readiness(healthy=True, canary=False)
    assert "canary" in (await ka.check(TARGET, T0 + 120)).reason and engine.completions == 0
    assert ka.status("t0").checks["skipped"] == 2


async def test_the_token_budget_spreads_learning_and_skips_checks() -> None:
    engine = FakeEngine()
    ka = checker(engine)
    await ka.check(TARGET, T0)
    per_pass = ka.status("t0").tokens_total // 3
    tight = replace(BIG, max_tokens_per_minute=max(per_pass, ka._estimate()) + 1)
    engine2 = FakeEngine()
    ka2 = checker(engine2, tight)
    steps = [await ka2.check(TARGET, T0 + 61 * i) for i in range(3)]
    assert [s.reason for s in steps[:2]] == ["learning: 1 of 3 probes", "learning: 2 of 3 probes"]
    assert "baseline learnt" in steps[2].reason
    assert (await ka2.check(TARGET, T0 + 61 * 2 + 10)).reason == "skipped: over max_tokens_per_minute"
    assert (await ka2.check(TARGET, T0 + 61 * 4)).ok is True
    assert ka2.status("t0").checks["skipped"] == 1
    engine2.shift = 1.0  # wrong, but its confirmation would pass the budget: cannot tell yet
    unconfirmed = await ka2.check(TARGET, T0 + 61 * 5)
    assert unconfirmed.ok is None and "over budget" in unconfirmed.reason


async def test_learning_probes_that_disagree_start_again() -> None:
    engine = FakeEngine()
    calls = 0
    answer = engine.answer

    def noisy(body: dict[str, object]) -> dict[str, object]:
        nonlocal calls
        calls += 1
        engine.shift = 0.1 * ((calls - 1) // 4 % 2)  # every other pass of the four prompts
        return answer(body)

    engine.answer = noisy  # type: ignore[method-assign]
    events: list[tuple[str, str]] = []
    ka = checker(engine, on_event=lambda t, e, d: events.append((t, e)))
    verdict = await ka.check(TARGET, T0)
    assert verdict.ok is None and "disagree" in verdict.reason
    assert events == [("t0", "learning_disagreed")] and ka.status("t0").baseline is None


async def test_bad_answers_are_error_verdicts_never_exceptions() -> None:
    for body in (b"not json", b"[]", b'{"choices": [{"text": "x"}]}', b'{"choices": []}', b"x" * (5 << 20)):
        engine = FakeEngine(body=body)
        ka = checker(engine)
        verdict = await ka.check(TARGET, T0)
        assert verdict.ok is None and math.isnan(verdict.divergence)
        assert "France" not in verdict.reason  # never the prompt's text
    engine = FakeEngine(status=500)
    assert "HTTP status 500" in (await checker(engine).check(TARGET, T0)).reason


async def test_the_baseline_is_saved_0600_and_found_again_after_a_restart(tmp_path: Path) -> None:
    engine = FakeEngine()
    ka = checker(engine, state_dir=str(tmp_path))
    await ka.check(TARGET, T0)
    identity = ka.status("t0").identity
    assert identity is not None
    path = baseline_path(str(tmp_path), identity.key)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert "France" not in path.read_text()  # prompts are stored as digests only
    restarted = checker(engine, state_dir=str(tmp_path))
    before = engine.completions
    verdict = await restarted.check(TARGET, T0 + 60)
    assert verdict.ok is True and engine.completions - before == 4  # one pass, no learning


async def test_a_model_change_is_an_event_and_a_new_baseline() -> None:
    engine = FakeEngine()
    events: list[tuple[str, str, dict[str, str]]] = []
    ka = checker(engine, on_event=lambda t, e, d: events.append((t, e, dict(d))))
    await ka.check(TARGET, T0)
    old = ka.status("t0").identity
    engine.model, engine.shift = "other", 3.0
    verdict = await ka.check(TARGET, T0 + 60)
    assert "baseline learnt" in verdict.reason
    changed = [e for e in events if e[1] == "model_changed"]
    assert old is not None and changed and changed[0][2]["old"] == old.key


async def test_a_pinned_baseline_is_used_and_never_relearned(tmp_path: Path) -> None:
    engine = FakeEngine()
    ka = checker(engine, state_dir=str(tmp_path))
    await ka.check(TARGET, T0)
    identity = ka.status("t0").identity
    assert identity is not None
    pinned = tmp_path / "pinned.json"
    pinned.write_text(baseline_path(str(tmp_path), identity.key).read_text())
    config = replace(BIG, baseline_file=str(pinned))
    fresh = checker(engine, config)
    assert (await fresh.check(TARGET, T0)).ok is True and fresh.status("t0").state == "pinned"
    engine.model = "other"  # another model: the pinned baseline cannot tell, and nothing is learnt
    verdict = await fresh.check(TARGET, T0 + 60)
    assert verdict.ok is None and "pinned baseline is for model" in verdict.reason
    assert fresh.status("t0").state == "pinned"
    data = json.loads(pinned.read_text())
    data["prompts"][0]["digest"] = "0" * 16
    pinned.write_text(json.dumps(data))
    stale = checker(engine, config)
    assert "learn it again" in (await stale.check(TARGET, T0)).reason
    assert read_baseline(baseline_path(str(tmp_path), identity.key)).identity == identity


async def test_verify_probes_now_never_learns_and_confirms() -> None:
    engine = FakeEngine()
    ka = checker(engine)
    assert (await ka.verify(TARGET, T0)).ok is None and ka.status("t0").baseline is None
    await ka.check(TARGET, T0)
    monitor_paused = ka.options.readiness  # verify asks nothing of the monitor
    assert monitor_paused is not None
    assert (await ka.verify(TARGET, T0 + 1)).ok is True
    engine.shift = 0.2
    bad = await ka.verify(TARGET, T0 + 2)
    assert bad.ok is False and bad.reason.startswith("confirmed")
    last = ka.status("t0").last
    assert last is not None and last.ok is None and "learnt" in last.reason  # verify leaves the series alone


async def test_on_verdict_hears_each_periodic_check() -> None:
    engine = FakeEngine()
    heard: list[tuple[str, bool | None, float]] = []
    ka = checker(engine, on_verdict=lambda t, v, now: heard.append((t, v.ok, now)))
    await ka.check(TARGET, T0)
    await ka.check(TARGET, T0 + 60)
    assert heard == [("t0", True, T0 + 60)]
